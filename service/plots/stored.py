"""Plots of stored sweeps: store → tidy frame → (mean-field predictions) → service.plots.render.

    make_plot(store, 3, "depth_scaling", metric="grad_norm", fmt="svg", group_by="init")

Reads are bounded by the store (Settings.max_points) and narrowed to what the kind draws: one
epoch when the plot shows one, each trial's last epoch for `last`, epoch 0 for the theory
overlay's default; one layer of each trial when the plot shows one. For `theory_overlay` each
measured line gets `service.theory.predict`'s values of the same metric, from its trials'
stored input Grams and moments, averaged over seeds (service.plots.overlay; a key predict cannot
give is a 422 naming why); `grad_norm` is drawn relative to each trial's last block, as
predicted. `theory_inputs` and THEORY_SETTING serve `isosweep theory --trial` (the LayerNorm
theorem of Joudaki et al. 2023, Thm 5.1). docs/science.md derives the theory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np
import pandas as pd

from service.config import DATASET_SHAPES, FILTER_FIELDS, TrialConfig
from service.errors import InvalidInput, NotFound
from service.param_columns import column_of
from service.plots import (
    FORMATS,
    GAP_METRICS,
    PLOT_KINDS,
    PoolingArgs,
    heatmap_axes,
    render,
)
from service.plots.defaults import default_axes
from service.plots.overlay import overlay_predictions, relative_to_last_block
from service.plots.select import check_choice
from service.plots.series import error_metric
from service.spec import determined_fields, swept_values_of

if TYPE_CHECKING:  # the store imports SQLAlchemy; plots are drawn without it
    from service.store import Store

# The theory's Gram of each recorded sub-layer (service.theory.STAGES: linear, norm, act).
STAGE_OF = {m: m.removeprefix("isometry_gap/") for m in GAP_METRICS}
# What the mean-field theorem assumes, field → the values it covers (layer_scale: centered=False).
THEORY_SETTING: dict[str, tuple[str, ...]] = {
    "norm": ("layer", "layer_scale"),
    "order": ("act_norm",),
    "init": ("gaussian", "xavier", "kaiming", "orthogonal"),  # each init's variance: theory_inputs
}
EpochArg = int | str | None  # a number, "last", or None (the kind's default)


def make_plot(
    store: Store,
    sweep_id: int,
    kind: str,
    *,
    metric: str | list[str],
    fmt: str = "png",
    x: str | None = None,
    group_by: str | None = None,
    epoch: EpochArg = None,
    layer: int | None = None,
    trial_id: int | None = None,
    where: dict[str, Any] | None = None,
    **options: Unpack[PoolingArgs],
) -> bytes:
    """One plot of a stored sweep as PNG or SVG bytes (docs/plots.md for the kinds).

    Args:
        store: a service.store.Store.
        metric: one metric, or several for training_curves.
        epoch: a recorded epoch, "last" (the latest recorded), or None (the kind's default).
        trial_id: draw only this trial of the sweep (the per-trial views).
        where: config filters, as Store.read_metrics takes them.
        options: stat, band, nonfinite, xscale, yscale — how seeds are pooled and axes scaled
            (service.plots.PLOT_OPTIONS; None: the field's default, as service.plots.render).

    Raises:
        NotFound: unknown kind (the message lists them), sweep or trial, or a trial of
            another sweep.
        InvalidInput: as service.plots.render, naming the field.
        LimitExceeded: the read would be over Settings.max_points.
    """
    if kind not in PLOT_KINDS:
        raise NotFound(f"no plot kind {kind!r} (kinds: {', '.join(PLOT_KINDS)})")
    check_choice(fmt, FORMATS, "format")
    metrics = [metric] if isinstance(metric, str) else list(metric)
    if not metrics:
        raise InvalidInput("no metric given", field="metric")
    where = dict(where or {})
    if trial_id is not None:
        where = _one_trial(store, sweep_id, trial_id, where)
    spec = store.get_sweep(sweep_id).spec  # read once: defaults, depths, tied fields
    if (
        trial_id is None
        and x is None
        and group_by is None
        and kind in ("heatmap", "theory_overlay")
    ):
        chosen, held = default_axes(kind, spec, metrics[0], where=where)
        x, group_by, where = chosen.get("x"), chosen.get("group_by"), {**held, **where}
    depths = _sweep_depths(spec) if draws_one_layer(kind, x, group_by) else []
    frame = store.read_metrics(
        sweep_id,
        metrics=[*metrics, *error_bars_to_read(kind, metrics)],
        epoch=epochs_to_read(kind, epoch, x, group_by),
        layers=layers_to_read(kind, layer, x, group_by, depths),
        where=where,
        trial=trial_id,  # by id too: trials that differ only in a document parameter
    )
    # a derived or linked field follows the fields it is tied to: it draws no line of its own
    tied = determined_fields(spec, keep=(x, group_by))
    frame = frame.drop(columns=[c for c in tied if c in frame.columns])
    at = _plot_epoch(frame, epoch)
    theory = title = None
    if kind == "theory_overlay" and not frame.empty:  # service.plots.overlay
        if metrics[0] == "grad_norm":  # drawn relative to the last block's, as predicted
            frame = relative_to_last_block(frame)
        theory, title = overlay_predictions(
            store, frame, metrics[0], x=x, group_by=group_by, epoch=at, layer=layer
        )
    return render(
        kind, frame, metric=metrics if len(metrics) > 1 else metrics[0], fmt=fmt, x=x,
        group_by=group_by, epoch=at, layer=layer, title=title, theory=theory, **options,
    )  # fmt: skip


def error_bars_to_read(kind: str, metrics: list[str]) -> list[str]:
    """The error bars of the isometry gaps a line plot draws (its unresolved points are marked:
    service.plots.series.mark_unresolved)."""
    if kind not in ("layer_profile", "depth_scaling", "training_curves", "theory_overlay"):
        return []
    bars = (error_metric(m) for m in metrics)
    return [b for b in dict.fromkeys(bars) if b is not None and b not in metrics]


def epochs_to_read(kind: str, epoch: EpochArg, x: str | None, group_by: str | None) -> Any:
    """The store's epoch filter for a plot: only the epochs the kind can draw."""
    if kind == "training_curves" or _epoch_is_heatmap_axis(kind, x, group_by):
        return None
    if epoch is not None:
        return epoch if epoch == "last" else [epoch]
    if kind in ("depth_scaling", "heatmap"):
        return "last"  # their default epoch is the last recorded one
    if kind == "theory_overlay":
        return [0]  # its default is the untrained network; epoch 0 is always recorded
    return None  # layer_profile may draw one line per recorded epoch


def _epoch_is_heatmap_axis(kind: str, x: str | None, group_by: str | None) -> bool:
    return kind == "heatmap" and "epoch" in heatmap_axes(x, group_by)


def draws_one_layer(kind: str, x: str | None, group_by: str | None) -> bool:
    """Whether the kind draws one layer of each trial (service.plots.select.select_layer)."""
    if kind in ("training_curves", "depth_scaling"):
        return True
    if kind == "theory_overlay":
        return x == "depth"  # x = None may still be "layer": that depends on the rows read
    return kind == "heatmap" and "layer" not in heatmap_axes(x, group_by)


def layers_to_read(
    kind: str, layer: int | None, x: str | None, group_by: str | None, depths: Iterable[int]
) -> list[int] | None:
    """The store's layer filter for a plot: only the layers the kind can draw (None: all).

    A kind that draws one layer of each trial reads that layer — ℓ = `layer`, or depth + 1 +
    `layer` for each depth of the sweep when it counts from the end (None: the last) — and
    also each depth's last layer ℓ = L, so that plots.select.select_layer still finds every
    trial's depth (and the same error for a layer a trial does not have). `depths`: every
    depth of the sweep (more is harmless).
    """
    if layer == 0 or not draws_one_layer(kind, x, group_by):
        return None  # layer 0 matches nothing: select_layer says so, naming the allowed ones
    ds = {int(d) for d in depths}
    if not ds:
        return None
    if layer is None or layer < 0:
        back = -1 if layer is None else layer
        wanted = {d + 1 + back for d in ds}
    else:
        wanted = {layer}
    return sorted(ell for ell in wanted | ds if ell >= 1)


def _sweep_depths(spec: dict[str, Any]) -> list[int]:
    """Every depth of a sweep, from its stored spec (an axis, linked, derived or fixed); none
    for a sampled depth (layers_to_read then reads every layer)."""
    swept = swept_values_of(spec).get("depth")  # an axis, a linked axis or a derived depth
    if swept:
        return [int(d) for d in swept]
    depth = (spec.get("parameters") or {}).get("depth", TrialConfig.model_fields["depth"].default)
    return [int(depth)] if isinstance(depth, int) else []  # sampled: every layer is read


def _plot_epoch(frame: pd.DataFrame, epoch: EpochArg) -> int | None:
    if epoch != "last":
        return epoch  # type: ignore[return-value]
    return int(frame["epoch"].max()) if not frame.empty else None


def _one_trial(store: Store, sweep_id: int, trial_id: int, where: dict[str, Any]) -> dict[str, Any]:
    """Config filters that select exactly one trial of the sweep (its whole config), kept
    consistent with any filters already given (a clash selects nothing)."""
    t = store.get_trial(trial_id)
    if t.sweep_id != sweep_id:
        raise NotFound(f"trial {trial_id} belongs to sweep {t.sweep_id}, not to sweep {sweep_id}")
    out = dict(where)
    for f in FILTER_FIELDS:
        value = t.config.get(f)
        given = where.get(f)
        accepted = given is None or value in (given if isinstance(given, list) else [given])
        out[f] = [value] if accepted else []
    for name, value in (t.config.get("model_params") or {}).items():  # service.param_columns
        if column_of(name) not in out and not isinstance(value, list | dict):
            out[column_of(name)] = [value]  # trials that differ only in a model parameter
    return out


# --- the LayerNorm theorem's inputs (`isosweep theory --trial`) -------------------------------


def theory_inputs(
    config: dict[str, Any], gram: np.ndarray, moments: np.ndarray | None
) -> tuple[float, np.ndarray, np.ndarray | None]:
    """(gain, first-layer covariance, its diagonal) for service.theory.mean_field_gaps.

    A Linear with init gain g multiplies the mean square of its input by s·g², s =
    service.theory.weight_variance_scale(init, fan_in, fan_out); the hidden layers' inputs are
    normalized (mean square 1), so their pre-activations have variance s_h·g² and the recursion's
    gain is α·g·√s_h. The first layer's pre-activation covariance, in units of (g²·s_h), is
    Q_ij = (s₁/s_h)·√(mᵢmⱼ)·ρᵢⱼ + v_b/(g²·s_h), mᵢ = ‖xᵢ‖²/d_in (the stored input moments), ρ the
    input Gram, v_b = 1/(3·d_in) for torch's uniform bias init (else 0). Without moments (older
    trials) the Gram is returned as it is and the first layer is taken at unit variance.
    """
    from service.theory import unit_gram, weight_variance_scale

    scaled = config["init"] != "orthogonal" or config.get("orthogonal_gain", True)
    g = config["init_gain"] if scaled else 1.0
    d_in, width = DATASET_SHAPES[config["dataset"]][0], config["width"]
    s_h = weight_variance_scale(config["init"], width, width)
    gain = config["activation_gain"] * g * float(np.sqrt(s_h))
    if moments is None:
        return gain, gram, None
    m = np.asarray(moments, dtype=np.float64)
    if m.shape != (np.shape(gram)[0],):
        raise InvalidInput(
            f"has shape {m.shape}, the input Gram {np.shape(gram)}", field="input_moments"
        )
    s_1 = weight_variance_scale(config["init"], d_in, width)
    Q = s_1 / s_h * np.sqrt(np.outer(m, m)) * unit_gram(gram)
    if config.get("bias") and config.get("bias_init") == "torch":
        Q = Q + 1.0 / (3.0 * d_in) / (g**2 * s_h)
    return gain, Q, np.diag(Q).copy()
