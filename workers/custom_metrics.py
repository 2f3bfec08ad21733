"""Per-tap metrics of one's own (docs/probe.md, "Your own metrics"): `register_metric(name, fn)`
with `fn(features) -> float` of one tap's features — a float64 tensor (n, d), or (n, T, d) for a
token stream, detached, on the tap's device — recorded per tap as an array "name" (L,) by
`isosweep.probe`. Two are built in:

- `effective_rank`: exp of the Shannon entropy of the singular values of H normalized to sum 1
  (Roy & Vetterli 2007), in [1, rank H];
- `stable_rank`: ‖H‖²_F / ‖H‖²₂, in [1, rank H].

Both of H reshaped (n, −1) — the matrix whose sample Gram the isometry gap measures — and NaN for
H = 0. A lab's metrics are registered in a module named by ISOSWEEP_MODEL_MODULES (the one that
registers its models: service.models.load_registered imports it), so every process that
measures knows them. torch is imported only inside the functions: importing this module is
light.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from service.errors import InvalidInput

Metric = Callable[[Any], float]

_REGISTRY: dict[str, Metric] = {}


def effective_rank(H: Any) -> float:
    """exp(−Σ pᵢ log pᵢ), pᵢ = σᵢ / Σσ, the singular values σ of H (n, −1); NaN for H = 0."""
    return _effective_rank(_singular_values(H))


def stable_rank(H: Any) -> float:
    """‖H‖²_F / ‖H‖²₂ of H (n, −1); NaN for H = 0."""
    return _stable_rank(_singular_values(H))


def _singular_values(H: Any) -> Any:
    import torch

    return torch.linalg.svdvals(H.reshape(len(H), -1).to(torch.float64))


def _effective_rank(s: Any) -> float:
    import torch

    total = s.sum()
    if not total > 0:
        return math.nan
    p = s[s > 0] / total
    return float(torch.exp(-(p * torch.log(p)).sum()))


def _stable_rank(s: Any) -> float:
    top = s.max() if s.numel() else s.sum()
    if not top > 0:
        return math.nan
    return float((s / top).square().sum())


BUILT_IN: dict[str, Metric] = {"effective_rank": effective_rank, "stable_rank": stable_rank}


def register_metric(name: str, fn: Metric, *, replace: bool = False) -> None:
    """Record `fn(features)` per tap under `name` (an identifier that is no other metric's or
    record key's name). Registering a name again raises unless `replace`."""
    from service.metric_names import METRICS, RECORD_KEYS, SPECTRUM_KEYS

    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a metric name is an identifier, not {name!r}")
    if name in (*METRICS, *RECORD_KEYS, *SPECTRUM_KEYS, *BUILT_IN):
        raise ValueError(f"{name!r} is a built-in metric or record key; choose another name")
    if not callable(fn):
        raise ValueError(f"metric {name!r}: fn must be callable, not {type(fn).__name__}")
    if name in _REGISTRY and not replace and _REGISTRY[name] is not fn:
        raise ValueError(f"metric {name!r} is registered already (replace=True replaces it)")
    _REGISTRY[name] = fn


def metric_names() -> tuple[str, ...]:
    """The built-in per-tap metrics, then the registered ones by name."""
    return (*BUILT_IN, *sorted(registered()))


def registered() -> dict[str, Metric]:
    """The lab's metrics, once the configured modules are imported (load_registered)."""
    from service.models import load_registered

    load_registered()
    return dict(_REGISTRY)


def tap_metrics(taps: list[Any]) -> dict[str, Any]:
    """Every metric of metric_names() at each tap: name → float64 array (len(taps),)."""
    import numpy as np
    import torch

    fns = registered()
    out = {}
    with torch.no_grad():
        features = [t.detach().to(torch.float64) for t in taps]
        sigma = [_singular_values(H) for H in features]  # one SVD per tap for both built-ins
        out["effective_rank"] = np.array([_effective_rank(s) for s in sigma])
        out["stable_rank"] = np.array([_stable_rank(s) for s in sigma])
        for name, fn in fns.items():
            values = np.empty(len(features))
            for i, H in enumerate(features):
                values[i] = _value(name, fn, H, i)
            out[name] = values
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
