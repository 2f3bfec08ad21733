"""Per-tap metrics (docs/probe.md, "Your own metrics"; docs/science.md, "Per-layer measures"):
functions of one tap's features, the per-block update ratio and the attention entropy, recorded
by `isosweep.probe` (workers/probe.py), by `fit` (workers/metrics.py, workers/train.py) and by
a pack's members (workers/packed.py) with the same code.

`register_metric(name, fn)` with `fn(features) -> float` of one tap's features — a float64
tensor (n, d), or (n, T, d) for a token stream, detached, on the tap's device — records it per
tap as an array "name" (L,). Two are built in:

- `effective_rank`: exp of the Shannon entropy of the singular values of H normalized to sum 1
  (Roy & Vetterli 2007), in [1, rank H];
- `stable_rank`: ‖H‖²_F / ‖H‖²₂, in [1, rank H].

Both of H reshaped (n, −1) — the matrix whose sample Gram the isometry gap measures — and NaN for
H = 0; one batched float64 SVD per group of equal-shaped taps serves both. A lab's metrics are
registered in a module named by ISOSWEEP_MODEL_MODULES (the one that registers its models:
service.models.load_registered imports it), so every process that measures — and the server,
which checks and serves their names (service.metric_names) — knows them. torch is imported only
inside the functions: importing this module is light.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from service.errors import InvalidInput
from service.metric_names import TAP_METRICS, register_lab_metric
from service.models import lab_metrics

Metric = Callable[[Any], float]


def effective_rank(H: Any) -> float:
    """exp(−Σ pᵢ log pᵢ), pᵢ = σᵢ / Σσ, the singular values σ of H (n, −1); NaN for H = 0."""
    return float(_effective_ranks(_singular_values(H)[None])[0])


def stable_rank(H: Any) -> float:
    """‖H‖²_F / ‖H‖²₂ of H (n, −1); NaN for H = 0."""
    return float(_stable_ranks(_singular_values(H)[None])[0])


def _singular_values(H: Any) -> Any:
    import torch

    return torch.linalg.svdvals(H.reshape(len(H), -1).to(torch.float64))


def _effective_ranks(s: Any) -> Any:
    """Of singular values s (B, k), each row: exp(−Σ p log p), p = s/Σs (0 log 0 = 0); NaN
    where Σs = 0."""
    import torch

    total = s.sum(dim=-1, keepdim=True)
    p = s / torch.where(total > 0, total, 1.0)
    h = -torch.where(p > 0, p * torch.log(p), 0.0).sum(dim=-1)
    return torch.where(total[..., 0] > 0, torch.exp(h), math.nan)


def _stable_ranks(s: Any) -> Any:
    """Of singular values s (B, k), each row: Σ(s/s_max)²; NaN where s_max = 0."""
    import torch

    top = s.amax(dim=-1, keepdim=True) if s.shape[-1] else s.sum(dim=-1, keepdim=True)
    ratio = (s / torch.where(top > 0, top, 1.0)).square().sum(dim=-1)
    return torch.where(top[..., 0] > 0, ratio, math.nan)


BUILT_IN: dict[str, Metric] = {"effective_rank": effective_rank, "stable_rank": stable_rank}
assert tuple(BUILT_IN) == TAP_METRICS


def register_metric(name: str, fn: Metric, *, replace: bool = False) -> None:
    """Record `fn(features)` per tap under `name` (an identifier that is no other metric's or
    record key's name). Registering a name again raises unless `replace`."""
    if name in BUILT_IN:
        raise ValueError(f"{name!r} is a built-in metric or record key; choose another name")
    if not callable(fn):
        raise ValueError(f"metric {name!r}: fn must be callable, not {type(fn).__name__}")
    register_lab_metric(name, fn, replace=replace)


def metric_names() -> tuple[str, ...]:
    """The built-in per-tap metrics, then the registered ones by name."""
    return (*BUILT_IN, *sorted(registered()))


def registered() -> dict[str, Metric]:
    """The lab's metrics, once the configured modules are imported (load_registered)."""
    return lab_metrics()


def tap_metrics(taps: Sequence[Any], per: int | None = None) -> dict[str, Any]:
    """Every metric of metric_names() at each tap: name → float64 array (len(taps),). The
    built-ins from one batched SVD per group of equal-shaped taps; each registered metric
    called once per tap. `per`: taps per network (several networks' taps in a row, a pack's
    members), so that an error names the tap within its network."""
    import numpy as np
    import torch

    fns = registered()
    L = len(taps)
    out = {name: np.empty(L) for name in BUILT_IN}
    with torch.no_grad():
        features = [t.detach().to(torch.float64) for t in taps]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, H in enumerate(features):
            groups.setdefault(tuple(H.shape), []).append(i)
        for idx in groups.values():
            s = torch.linalg.svdvals(torch.stack([features[i].reshape(len(features[i]), -1)
                                                  for i in idx]))  # fmt: skip
            out["effective_rank"][idx] = _effective_ranks(s).cpu().numpy()
            out["stable_rank"][idx] = _stable_ranks(s).cpu().numpy()
        for name, fn in fns.items():
            out[name] = np.array(
                [_value(name, fn, H, i % (per or L)) for i, H in enumerate(features)]
            )
    return out


def _value(name: str, fn: Metric, H: Any, i: int) -> float:
    try:
        v = fn(H)
    except Exception as exc:
        raise InvalidInput(
            f"metric {name!r} raised {type(exc).__name__} at tap {i} (features "
            f"{tuple(H.shape)}): {exc}",
            field="metrics",
        ) from exc
    try:
        return float(v)
    except (TypeError, ValueError):
        raise InvalidInput(
            f"metric {name!r} returned {type(v).__name__} at tap {i}, not a number",
            field="metrics",
        ) from None


# --- attention entropy ------------------------------------------------------------------------


def attention_entropy(a: Any) -> Any:
    """Per head, the Shannon entropy −Σ_s a log a (0 log 0 = 0) of each query's attention
    distribution, mean over the queries and the batch: a (n, heads, T, S) or (heads, T, S),
    rows summing to 1 → float64 (heads,). log S for uniform attention, 0 for one-hot."""
    import torch

    a = a.detach().to(torch.float64)
    a = a if a.ndim == 4 else a[None]
    ent = -torch.where(a > 0, a * torch.log(a), 0.0).sum(dim=-1)  # (n, heads, T)
    return ent.mean(dim=(0, 2))


def attention_record(per_tap: Sequence[Any | None]) -> dict[str, Any]:
    """ "attention_entropy_heads" (L, heads) — each tap's `attention_entropy` of its attention
    weights (None: a tap that is no attention layer, a NaN row; fewer heads: NaN-padded) — and
    "attention_entropy" (L,), its mean over the tap's heads. No keys if no tap has weights."""
    import numpy as np

    rows = [None if a is None else attention_entropy(a).cpu().numpy() for a in per_tap]
    heads = max((len(r) for r in rows if r is not None), default=0)
    if not heads:
        return {}
    table = np.full((len(rows), heads), math.nan)
    mean = np.full(len(rows), math.nan)
    for i, r in enumerate(rows):
        if r is not None:
            table[i, : len(r)] = r
            mean[i] = r.mean()
    return {"attention_entropy": mean, "attention_entropy_heads": table}


# --- update ratio -----------------------------------------------------------------------------


def update_ratios(
    layer_weights: Sequence[Sequence[str]],
    head: str | None,
    params: dict[str, Any],
    previous: dict[str, Any],
) -> dict[str, Any]:
    """ "update_ratio" per layer and "head_update_ratio" (if `head`): ‖θ − θ_prev‖_F /
    ‖θ_prev‖_F over the layer's listed weights together (NaN for a layer without one, or 0/0;
    +∞ from a zero θ_prev). Each weight's difference is taken in its dtype (a float32
    difference rounds by at most u₃₂ relative) and its squares summed in float64; one sync
    for all.

    Raises:
        InvalidInput (field "previous"): a weight `previous` lacks, or one of another shape.
    """
    import numpy as np
    import torch

    groups = [list(ws) for ws in layer_weights] + ([[head]] if head is not None else [])
    names = list(dict.fromkeys(k for ws in groups for k in ws))
    for k in names:
        if k not in previous:
            raise InvalidInput(f"previous has no parameter {k!r}", field="previous")
        if tuple(previous[k].shape) != tuple(params[k].shape):
            raise InvalidInput(
                f"previous[{k!r}] has shape {tuple(previous[k].shape)}, the parameter "
                f"{tuple(params[k].shape)}",
                field="previous",
            )
    squares: dict[str, tuple[float, float]] = {}
    if names:
        f64 = torch.float64
        with torch.no_grad():
            norms = []  # per weight ‖θ − θ_prev‖, ‖θ_prev‖ (0-d, on the weight's device)
            for k in names:
                now = params[k].detach()
                then = previous[k].detach().to(device=now.device, dtype=now.dtype)
                norms.append(torch.linalg.vector_norm(now - then, dtype=f64))
                norms.append(torch.linalg.vector_norm(then, dtype=f64))
            values = torch.stack([t.to("cpu") for t in norms]).tolist()  # one sync
        squares = {k: (values[2 * i] ** 2, values[2 * i + 1] ** 2) for i, k in enumerate(names)}

    def ratio(ws: list[str]) -> float:
        if not ws:
            return math.nan
        step = math.sqrt(sum(squares[k][0] for k in ws))
        size = math.sqrt(sum(squares[k][1] for k in ws))
        return step / size if size > 0 else (math.nan if step == 0 else math.inf)

    out: dict[str, Any] = {
        "update_ratio": np.array([ratio(ws) for ws in groups[: len(layer_weights)]])
    }
    if head is not None:
        out["head_update_ratio"] = ratio([head])
    return out


def snapshot(params: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """Detached copies of the named parameters: what a later `update_ratios` compares with."""
    return {k: params[k].detach().clone() for k in names}
