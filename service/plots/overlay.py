"""The theory overlay's predictions for a stored sweep: every measured line gets
`service.theory.predict`'s values of the same metric (docs/plots.md, "theory_overlay"; the
theory: docs/science.md, "Predictions for a trial"). predict is the one source of the numbers.

A line's prediction is the mean over its seeds (at most MAX_THEORY_SEEDS) of predict for each
seed's trial, started from that trial's stored input Gram and input moments (K_ij = √(mᵢmⱼ)·ρᵢⱼ,
the kernel of the inputs as the first Linear sees them; unit variance for trials recorded
before moments existed), without labels (the head's backward kernel is then I). Against the
layer (x = layer) it is the profile of the line's depth; against depth (x = depth) the value at
the plotted layer of each depth's own prediction. `grad_norm` is drawn relative to the last
block's, as predict gives it: each trial's measured ‖∂ℒ/∂W_ℓ‖ is divided by its own ‖∂ℒ/∂W_L‖
before the seeds are pooled (`relative_to_last_block`).

A transformer's prediction (uniform attention, service.theory.attention) starts from its
probe's tokens, which a trial does not store (only the n × n Gram of the flattened inputs): the
overlay draws what does not depend on them — without skips, the rank-one collapse of every
sequence (token_cosine 1, token_isometry_gap +∞) — and refuses the rest, naming why.

A metric predict cannot give for a line's config is a 422 naming predict's reason; a line
whose recursion fails (a gain past the quadrature's range, no Gram stored yet) gets no
prediction, and the title says why.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from service.config import TrialConfig, parse_trial_config
from service.errors import InvalidInput
from service.plots.select import THEORY_METRICS, line_label, metric_rows, resolve_epoch
from service.plots.series import default_theory_x, theory_overlay_series

if TYPE_CHECKING:
    from service.store import Store, TrialInfo

MAX_THEORY_SEEDS = 10  # seeds whose predictions are averaged into one line
_CACHE: OrderedDict[tuple, dict[str, Any] | None] = OrderedDict()
_CACHE_SIZE = 512
_LOCK = threading.Lock()


def relative_to_last_block(frame: pd.DataFrame, metric: str = "grad_norm") -> pd.DataFrame:
    """`frame` with each trial's `metric` rows divided, epoch by epoch, by its value at the
    trial's last layer read (the last block's, as layers_to_read always reads it)."""
    rows = metric_rows(frame, metric)
    if rows.empty:
        return frame
    keys = ["trial_id", "epoch"]
    last = rows.loc[rows.groupby(keys)["layer"].idxmax(), [*keys, "value"]]
    joined = rows[keys].merge(last.rename(columns={"value": "last"}), on=keys, how="left")
    out = frame.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        out.loc[rows.index, "value"] = rows["value"].to_numpy("float64") / joined["last"].to_numpy(
            "float64"
        )
    return out


def overlay_predictions(
    store: Store,
    frame: pd.DataFrame,
    metric: str,
    *,
    x: str | None,
    group_by: str | None,
    epoch: int | None,
    layer: int | None,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], str]:
    """label → (x values, predicted values) for every measured line of the overlay, and its
    title (module docstring).

    Raises:
        InvalidInput: `metric` is not one the theory draws, or predict cannot give it for a
            line's config (field "metric", the message predict's reason, `allowed` what it can
            give for every line).
    """
    if metric not in THEORY_METRICS:
        raise InvalidInput(f"unknown value {metric!r}", field="metric", allowed=THEORY_METRICS)
    measured, _ = theory_overlay_series(
        frame, metric, x=x, group_by=group_by, epoch=epoch, layer=layer
    )
    rows = metric_rows(frame, metric)
    rows = rows[rows["epoch"] == resolve_epoch(rows, epoch, default="first")]
    x = x or default_theory_x(rows)
    keys = list(measured.by)
    groups = rows.groupby(keys, sort=False, dropna=False) if keys else [((), rows)]
    lines: list[tuple[str, list[TrialInfo]]] = []
    for key, part in groups:
        label = line_label(key if isinstance(key, tuple) else (key,))
        if label in measured:
            lines.append((label, [store.get_trial(int(t)) for t in pd.unique(part["trial_id"])]))
    configs = {_config_key(t.config): t.config for _, ts in lines for t in ts}
    _check_predictable([parse_trial_config(dict(c)) for c in configs.values()], metric)
    theory, skipped = {}, []
    for label, trials in lines:
        try:
            predicted = line_prediction(store, trials, metric, x, layer)
        except _NoPrediction as exc:
            skipped.append(f"{label} ({exc})")
            continue
        except InvalidInput as exc:  # a stored Gram predict refuses (a zero input: NaN)
            skipped.append(f"{label} ({exc.message})")
            continue
        if predicted is None:
            skipped.append(f"{label} (no input Gram stored yet)")
        else:
            theory[label] = predicted
    return theory, _title(metric, list(configs.values()), skipped)


def _config_key(config: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in config.items() if k != "seed"}, sort_keys=True)


def predicted_metrics(configs: list[TrialConfig]) -> list[str]:
    """The metrics the overlay can draw for every one of these configs (THEORY_METRICS' order):
    recorded by each, and predicted from what a trial stores (docs/plots.md)."""
    return [m for m in THEORY_METRICS if all(_why_not(c, m) is None for c in configs)]


def _why_not(c: TrialConfig, metric: str) -> str | None:
    """Why the overlay has no prediction of `metric` for a config (predict's reason), or None."""
    from service.models import layer_metrics
    from service.theory.attention import input_free
    from service.theory.predict import unpredictable

    if metric not in layer_metrics(c):
        return f"a {c.model} of this sweep does not record it"
    never = unpredictable(c)
    if metric in never:
        return never[metric]
    if c.model == "transformer" and metric not in input_free(c):
        return (
            "a transformer's prediction of it starts from the probe's tokens, and a trial "
            "stores only the n × n Gram of its flattened inputs; isosweep.predict(config, "
            "inputs) gives it from the probe batch (docs/science.md)"
        )
    return None


def _check_predictable(configs: list[TrialConfig], metric: str) -> None:
    """A 422 naming predict's reason when `metric` has no prediction for one of the configs."""
    for c in configs:
        why = _why_not(c, metric)
        if why is not None:
            raise InvalidInput(
                f"no mean-field prediction of {metric!r}: {why}",
                field="metric",
                allowed=predicted_metrics(configs),
            )


def _layer_at(depth: int, layer: int | None) -> int:
    """The layer ℓ a depth_scaling-style line plots for a trial of this depth."""
    if layer is None:
        return depth
    return layer if layer > 0 else depth + 1 + layer


def line_prediction(
    store: Store, trials: list[TrialInfo], metric: str, x: str = "layer", layer: int | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """(x values, the mean over seeds of the predicted values) of one line — its trials — or
    None when no seed has a stored Gram. x = "layer": the profile of each seed's deepest trial;
    x = "depth": each depth's prediction at the plotted layer (`layer`: None the last, k > 0
    the k-th, k < 0 counted from the end)."""
    by_seed: dict[int, list[TrialInfo]] = {}
    for t in trials:
        by_seed.setdefault(t.config["seed"], []).append(t)
    seeds = sorted(by_seed)[:MAX_THEORY_SEEDS]
    values: dict[int, list[float]] = {}  # x → one value per seed
    for s in seeds:
        ts = sorted(by_seed[s], key=lambda t: t.config["depth"])
        deepest = ts[-1]
        if x == "layer":
            p = trial_prediction(store, deepest, metric)
            if p is not None:
                for ell, v in enumerate(p, start=1):
                    values.setdefault(ell, []).append(float(v))
            continue
        for t in ts:  # x = depth: each depth's own prediction at the plotted layer
            D = t.config["depth"]
            same = metric != "grad_norm" and _config_key({**t.config, "depth": 0}) == _config_key(
                {**deepest.config, "depth": 0}
            )
            p = trial_prediction(store, deepest if same else t, metric)
            ell = _layer_at(D, layer)
            if p is not None and 1 <= ell <= D:
                values.setdefault(D, []).append(float(p[ell - 1]))
    if not values:
        return None
    xs = np.array(sorted(values), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        mean = np.array([np.mean(values[int(v)]) for v in xs])  # +∞ stays +∞
    return xs, mean


def trial_prediction(store: Store, trial: TrialInfo, metric: str) -> np.ndarray | None:
    """predict's values of `metric` (depth,) for a stored trial, or None without a stored Gram.
    Cached: the Gram and moments are recorded with epoch 0 and fixed by the trial."""
    grad = metric == "grad_norm"
    key = (store.url, trial.results_from or trial.id, grad)
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            got = _CACHE[key]
            return None if got is None else _value(got, metric)
    got = stored_prediction(store, trial, gradients=grad)
    if got is None:
        return None  # not cached: the Gram may arrive later
    with _LOCK:
        _CACHE[key] = got
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return _value(got, metric)


def stored_prediction(
    store: Store, trial: TrialInfo, *, gradients: bool = True, **kw: Any
) -> dict[str, Any] | None:
    """predict of a stored trial: its own config on its stored input kernel (a transformer's on
    orthonormal tokens, without gradients: the uniform limit does not give them); None while
    its input Gram is not stored (it is recorded with epoch 0). `kw`: predict's samples, seed."""
    from service.theory.predict import predict

    c = parse_trial_config(dict(trial.config))
    if c.model == "transformer":
        return predict(c, gradients=False, **kw)
    K = stored_input_kernel(store, trial.id)
    return None if K is None else predict(c, input_kernel=K, gradients=gradients, **kw)


class _NoPrediction(Exception):
    """predict left a line's metric unpredicted (its recursion failed): the reason."""


def _value(got: dict[str, Any], metric: str) -> np.ndarray:
    if metric not in got:
        raise _NoPrediction(got.get("unpredicted", {}).get(metric, "not predicted"))
    return got[metric]


def stored_input_kernel(store: Store, trial_id: int) -> np.ndarray | None:
    """The kernel XXᵀ/d_in of a trial's probe inputs as the first Linear sees them, from its
    stored cosine Gram ρ and moments mᵢ = ‖xᵢ‖²/d_in: √(mᵢmⱼ)·ρᵢⱼ (ρ alone without moments)."""
    from service.isometry import unit_gram

    gram = store.input_gram(trial_id)
    if gram is None:
        return None
    rho = unit_gram(gram)
    moments = store.input_moments(trial_id)
    if moments is None:
        return rho
    m = np.asarray(moments, dtype=np.float64)
    if m.shape != (rho.shape[0],):
        raise InvalidInput(
            f"has shape {m.shape}, the input Gram {rho.shape}", field="input_moments"
        )
    return np.sqrt(np.outer(m, m)) * rho


def _title(metric: str, configs: list[dict[str, Any]], skipped: list[str]) -> str:
    title = f"{metric}: measured and mean-field prediction"
    if metric == "grad_norm":
        title += "\nrelative to the last block's ‖∂ℒ/∂W_L‖ (each trial's own)"
    if any(c.get("model") == "transformer" for c in configs):
        title += "\nattention taken uniform (softmax = 11ᵀ/T; docs/science.md)"
    if skipped:
        text = "; ".join(skipped)
        title += "\nno prediction for " + (text if len(text) <= 120 else text[:117] + "…")
    return title
