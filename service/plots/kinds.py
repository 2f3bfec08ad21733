"""One figure builder per plot kind: take the series (service.plots.series), draw them, label
the axes with the metric's definition, and say in a note what was chosen (epoch, layer, seeds,
how they were pooled, non-finite values excluded or propagated).

Every builder takes `pooling` (service.plots.select.Pooling), `xscale` and `yscale` ("auto",
"log", "linear", or None: the field's default, `field_log`) from service.plots.build_figure."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from service.errors import InvalidInput
from service.plots import draw
from service.plots.labels import METRIC_LABELS, field_label, layer_text
from service.plots.pooling import BAND_TEXT, STAT_TEXT
from service.plots.select import (
    THEORY_METRICS,
    Lines,
    Pooling,
    absent_note,
    check_choice,
    config_columns,
    is_layer_metric,
    metric_rows,
    resolve_epoch,
    resolve_scale,
)
from service.plots.series import (
    default_theory_x,
    depth_scaling_series,
    epoch_subset,
    heatmap_axes,
    heatmap_series,
    layer_profile_series,
    theory_overlay_series,
    training_curves_series,
)


def _seeds_note(lines: Lines) -> str:
    """How the seeds of each point were pooled: the statistic, its band, how many seeds."""
    p = lines.pooling
    n = np.concatenate([(s["count"] - s["n_excluded"]).to_numpy() for s in lines.values()])
    stat = STAT_TEXT[p.stat]
    if n.max() <= 1:
        return "one seed per point (no CI)" if p.stat == "mean" else f"one seed per point ({stat})"
    span = f"{n.min()}" if n.min() == n.max() else f"{n.min()}–{n.max()}"
    if p.band == "none":
        return f"{stat} over {span} seeds"
    return f"{stat} and {BAND_TEXT[(p.stat, p.band)]} over {span} seeds"


def _nonfinite_note(lines: Lines) -> list[str]:
    """What happened to non-finite values, when there were any: excluded (and how many) or
    propagated into the pooled value."""
    if lines.pooling.nonfinite == "exclude":
        k = lines.n_excluded
        return [f"{k} non-finite value{'s' if k != 1 else ''} excluded"] if k else []
    k = lines.n_nonfinite
    return [f"{k} non-finite value{'s' if k != 1 else ''} propagated"] if k else []


def _pool_notes(lines: Lines) -> list[str]:
    return [_seeds_note(lines), *_nonfinite_note(lines)]


def _series_args(pooling: Pooling) -> dict[str, str]:
    return {"stat": pooling.stat, "band": pooling.band, "nonfinite": pooling.nonfinite}


def _epoch_notes(rows: pd.DataFrame, epoch: int | None, default: str = "last") -> list[str]:
    ep = resolve_epoch(rows, epoch, default)
    return [f"epoch {ep}", *filter(None, [absent_note(rows, ep)])]


def _layer_note(rows: pd.DataFrame, metric: str, layer: int | None) -> list[str]:
    return [layer_text(layer)] if is_layer_metric(rows, metric) else []


def _fixed_note(frame: pd.DataFrame) -> list[str]:
    """The swept fields this figure holds at one value (a filter chose it): say which."""
    fixed = [c for c in config_columns(frame) if c != "seed" and frame[c].nunique() == 1]
    return [", ".join(f"{c} = {frame[c].iloc[0]}" for c in fixed)] if fixed else []


def _finish(fig: Figure, ax, title: str, notes: list[str], frame: pd.DataFrame) -> Figure:
    draw.title(fig, title)
    draw.caption(ax, " · ".join([*_fixed_note(frame), *notes]))
    return fig


def _ys(lines: Lines) -> np.ndarray:
    """Every measured y value a figure draws, finite or not, for the scale decision (a
    prediction drawn beside them does not decide: theory_overlay's range is the measurements')."""
    ys = [s["mean"].to_numpy(dtype=float) for s in lines.values()]
    return np.concatenate(ys) if ys else np.array([])


def _plot_lines(ax, lines: Lines, colors: dict | None = None, dashed: dict | None = None, *,
                ylog: bool = False) -> None:  # fmt: skip
    """Draw the measured lines (and any `dashed` prediction lines, label → frame(x, value)) with
    the legend; on a log y axis (`ylog`) values ≤ 0 are pinned at the bottom edge."""
    colors = colors or draw.palette(list(lines), lines.ordered)
    stat = lines.pooling.stat
    pinned = draw.draw_lines(ax, lines, colors, ylog=ylog, stat=stat)
    if dashed:
        pinned += draw.draw_lines(ax, dashed, colors, y="value", dashed=True, ylog=ylog)
    band = any(np.isfinite(s["lo"]).any() for s in lines.values())
    band_text = BAND_TEXT.get((stat, lines.pooling.band)) if band else None
    draw.finish_lines(ax, pinned, title=", ".join(lines.by) or None, band=band_text, stat=stat)


def _choose_scales(lines: Lines, dashed: dict | None, opts: dict, xs: np.ndarray
                   ) -> tuple[str, str]:  # fmt: skip
    """(xscale, yscale), each "log" or "linear", from opts (xscale, yscale, field_log; see
    select.resolve_scale). `xs`: the x values "auto" may turn log (empty: auto is linear)."""
    yscale = resolve_scale(opts.get("yscale"), _ys(lines), 100.0,
                           opts.get("field_log", False))  # fmt: skip
    xscale = resolve_scale(opts.get("xscale") or "auto", xs, 10.0, False)
    return xscale, yscale


def _draw(ax, lines: Lines, opts: dict, *, auto_x: bool, integer_x: bool,
          colors: dict | None = None, dashed: dict | None = None) -> None:  # fmt: skip
    """Choose the scales, draw the lines, set the scales. `auto_x`: "auto" may turn x log
    (a swept field spanning decades); else x is linear unless log is asked for."""
    xs = _xs(lines)
    if dashed:
        xs = np.concatenate([xs, *(v["x"].to_numpy(dtype=float) for v in dashed.values())])
    xscale, yscale = _choose_scales(lines, dashed, opts, xs if auto_x else np.array([]))
    _plot_lines(ax, lines, colors, dashed, ylog=yscale == "log")
    draw.set_scales(ax, xs, integer_x=integer_x, xscale=xscale, yscale=yscale)


def _counts(name: str) -> bool:
    return name in ("epoch", "layer", "depth", "width", "batch_size", "epochs", "seed")


def _xs(lines: dict[str, pd.DataFrame]) -> np.ndarray:
    return np.concatenate([s["x"].to_numpy(dtype=float) for s in lines.values()])


def layer_profile(frame, metric, *, x, group_by, epoch, title, pooling, **opts) -> Figure:
    if x is not None:
        check_choice(x, ("layer",), "x")
    lines = layer_profile_series(
        frame, metric, group_by=group_by, epoch=epoch, **_series_args(pooling)
    )
    title = title or f"{metric}: profile over layers"
    if not lines:
        return draw.no_data(title, f"no rows of {metric!r}")
    rows = metric_rows(frame, metric)
    if lines.by[:1] == ["epoch"]:
        n_all, n = rows["epoch"].nunique(), len(epoch_subset(rows["epoch"].to_numpy()))
        notes = [f"{n} of {n_all} recorded epochs"] if epoch is None and n < n_all else []
    else:
        notes = _epoch_notes(rows, epoch)
    fig, (ax,) = draw.new_figure()
    _draw(ax, lines, opts, auto_x=False, integer_x=True)  # ℓ is a position: linear unless asked
    draw.label_axes(ax, field_label("layer"), METRIC_LABELS[metric])
    return _finish(fig, ax, title, [*notes, *_pool_notes(lines)], frame)


def depth_scaling(frame, metric, *, x, group_by, epoch, layer, title, pooling, **opts) -> Figure:
    x = x or "depth"
    lines = depth_scaling_series(
        frame, metric, x=x, group_by=group_by, epoch=epoch, layer=layer, **_series_args(pooling)
    )
    title = title or f"{metric} against {x}"
    if not lines:
        return draw.no_data(title, f"no rows of {metric!r}")
    rows = metric_rows(frame, metric)
    notes = [*_layer_note(rows, metric, layer), *_epoch_notes(rows, epoch), *_pool_notes(lines)]
    fig, (ax,) = draw.new_figure()
    _draw(ax, lines, opts, auto_x=True, integer_x=_counts(x))
    draw.label_axes(ax, field_label(x), METRIC_LABELS[metric])
    return _finish(fig, ax, title, notes, frame)


def training_curves(frame, metrics, *, x, group_by, layer, title, pooling, **opts) -> Figure:
    if x is not None:
        check_choice(x, ("epoch",), "x")
    args = _series_args(pooling)
    per_metric = {
        m: training_curves_series(frame, m, group_by=group_by, layer=layer, **args) for m in metrics
    }
    title = title or f"{', '.join(metrics)} during training"
    if not any(per_metric.values()):
        return draw.no_data(title, f"no rows of {', '.join(map(repr, metrics))}")
    labels = list(dict.fromkeys(lab for lines in per_metric.values() for lab in lines))
    ordered = any(lines.ordered for lines in per_metric.values())
    colors = draw.palette(labels, ordered)  # one colour per configuration across panels
    fig, axes = draw.new_figure(len(metrics), height=3.4 if len(metrics) > 1 else 4.4)
    for ax, (m, lines) in zip(axes, per_metric.items(), strict=True):
        draw.label_axes(ax, ylabel=METRIC_LABELS[m])
        if not lines:
            ax.text(0.5, 0.5, f"no rows of {m!r}", transform=ax.transAxes, ha="center")
            continue
        _draw(ax, lines, opts, auto_x=False, integer_x=True, colors=colors)
        notes = [*_layer_note(metric_rows(frame, m), m, layer), *_pool_notes(lines)]
        if ax is axes[0]:
            notes = [*_fixed_note(frame), *notes]
        draw.caption(ax, " · ".join(notes))
    draw.label_axes(axes[-1], field_label("epoch"))
    draw.title(fig, title)
    return fig


def heatmap(frame, metric, *, x, group_by, epoch, layer, title, pooling, **_) -> Figure:
    rows = metric_rows(frame, metric)
    x, y = heatmap_axes(x, group_by)
    if not rows.empty and "layer" in (x, y) and not is_layer_metric(rows, metric):
        allowed = [c for c in ("epoch", *config_columns(rows)) if c != x]
        msg = f"{metric!r} has no layers: choose the heatmap's second axis"
        raise InvalidInput(msg, field="group_by", allowed=allowed)
    grid = heatmap_series(
        frame, metric, x=x, y=y, epoch=epoch, layer=layer, stat=pooling.stat,
        nonfinite=pooling.nonfinite,
    )  # fmt: skip
    title = title or f"{metric} over {y} × {x}"
    if grid is None:
        return draw.no_data(title, f"no rows of {metric!r}")
    notes = [] if "epoch" in (x, y) else _epoch_notes(rows, epoch)
    if "layer" not in (x, y):
        notes = [*_layer_note(rows, metric, layer), *notes]
    fig, (ax,) = draw.new_figure(height=4.8)
    draw.draw_grid(fig, ax, grid, METRIC_LABELS[metric])
    draw.label_axes(ax, field_label(x), field_label(y))
    cell = [f"cell = {STAT_TEXT[grid.stat]} over seeds"]
    if pooling.nonfinite == "exclude" and grid.n_excluded:
        k = grid.n_excluded
        cell.append(f"{k} non-finite value{'s' if k != 1 else ''} excluded")
    return _finish(fig, ax, title, [*notes, *cell], frame)


def theory_overlay(
    frame, metric, *, x, group_by, epoch, layer, title, theory, pooling, **opts
) -> Figure:
    check_choice(metric, THEORY_METRICS, "metric")
    measured, predicted = theory_overlay_series(
        frame, metric, x=x, group_by=group_by, epoch=epoch, layer=layer, theory=theory,
        **_series_args(pooling),
    )  # fmt: skip
    title = title or f"{metric}: measured and mean-field prediction"
    if not measured:
        return draw.no_data(title, f"no rows of {metric!r}")
    rows = metric_rows(frame, metric)
    x = x or default_theory_x(rows)
    notes = _epoch_notes(rows, epoch, default="first")
    notes = [*(_layer_note(rows, metric, layer) if x == "depth" else []), *notes]
    notes += _pool_notes(measured)
    notes.append("dashed: mean-field prediction" if predicted else "no mean-field prediction given")
    # A prediction labelled like a measured line (e.g. "relu") takes that line's colour.
    colors = draw.palette(list(dict.fromkeys([*measured, *predicted])), measured.ordered)
    dashed = {f"mean field: {k}": v for k, v in predicted.items()}
    colors |= {f"mean field: {k}": colors[k] for k in predicted}
    fig, (ax,) = draw.new_figure()
    _draw(ax, measured, opts, auto_x=x == "depth", integer_x=True, colors=colors, dashed=dashed)
    left = draw.clip_to_measured(ax, measured, dashed, colors, "ℓ" if x == "layer" else x)
    if left:
        notes.append(f"y range from the measurements; {left}")
    draw.label_axes(ax, field_label(x), METRIC_LABELS[metric])
    return _finish(fig, ax, title, notes, frame)


BUILDERS: dict[str, Callable[..., Figure]] = {  # kind → its figure builder
    "layer_profile": layer_profile,
    "depth_scaling": depth_scaling,
    "training_curves": training_curves,
    "heatmap": heatmap,
    "theory_overlay": theory_overlay,
}
