"""One figure builder per plot kind: take the series (service.plots.series), draw them, label
the axes with the metric's definition, and say in a note what was chosen (epoch, layer, seeds)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from service.errors import InvalidInput
from service.plots import draw
from service.plots.labels import METRIC_LABELS, field_label, layer_text
from service.plots.select import (
    GAP_METRICS,
    Lines,
    absent_note,
    check_choice,
    config_columns,
    is_layer_metric,
    metric_rows,
    resolve_epoch,
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


def _seeds_note(lines: dict[str, pd.DataFrame]) -> str:
    n = np.concatenate([s["count"].to_numpy() for s in lines.values()])
    if n.max() <= 1:
        return "one seed per point (no CI)"
    span = f"{n.min()}" if n.min() == n.max() else f"{n.min()}–{n.max()}"
    return f"mean and 95% CI over {span} seeds"


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
    fig.suptitle(title)
    notes = [*_fixed_note(frame), *notes]
    ax.set_title(draw.wrap(" · ".join(notes), 110), fontsize=8, loc="left", color="0.3")
    return fig


def _plot_lines(ax, lines: Lines, colors: dict | None = None, dashed: dict | None = None):
    """Draw the measured lines (and any `dashed` prediction lines, label → frame(x, value)) with
    the legend; return every y value drawn, finite or not, for the scale decision."""
    colors = colors or draw.palette(list(lines), lines.ordered)
    pinned = draw.draw_lines(ax, lines, colors)
    ys = [s["mean"].to_numpy() for s in lines.values()]
    if dashed:
        pinned += draw.draw_lines(ax, dashed, colors, y="value", dashed=True)
        ys += [s["value"].to_numpy() for s in dashed.values()]
    band = any(np.isfinite(s["lo"]).any() for s in lines.values())
    draw.finish_lines(ax, pinned, title=", ".join(lines.by) or None, band=band)
    return np.concatenate(ys)


def _counts(name: str) -> bool:
    return name in ("epoch", "layer", "depth", "width", "batch_size", "epochs", "seed")


def _xs(lines: dict[str, pd.DataFrame]) -> np.ndarray:
    return np.concatenate([s["x"].to_numpy(dtype=float) for s in lines.values()])


def layer_profile(frame, metric, *, x, group_by, epoch, title, **_) -> Figure:
    if x is not None:
        check_choice(x, ("layer",), "x")
    lines = layer_profile_series(frame, metric, group_by=group_by, epoch=epoch)
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
    ys = _plot_lines(ax, lines)
    draw.set_scales(ax, np.array([]), ys, integer_x=True)  # ℓ is a position: linear
    ax.set_xlabel(draw.wrap(field_label("layer")))
    ax.set_ylabel(draw.wrap(METRIC_LABELS[metric]))
    return _finish(fig, ax, title, [*notes, _seeds_note(lines)], frame)


def depth_scaling(frame, metric, *, x, group_by, epoch, layer, title, **_) -> Figure:
    x = x or "depth"
    lines = depth_scaling_series(frame, metric, x=x, group_by=group_by, epoch=epoch, layer=layer)
    title = title or f"{metric} against {x}"
    if not lines:
        return draw.no_data(title, f"no rows of {metric!r}")
    rows = metric_rows(frame, metric)
    notes = [*_layer_note(rows, metric, layer), *_epoch_notes(rows, epoch), _seeds_note(lines)]
    fig, (ax,) = draw.new_figure()
    ys = _plot_lines(ax, lines)
    draw.set_scales(ax, _xs(lines), ys, integer_x=_counts(x))
    ax.set_xlabel(draw.wrap(field_label(x)))
    ax.set_ylabel(draw.wrap(METRIC_LABELS[metric]))
    return _finish(fig, ax, title, notes, frame)


def training_curves(frame, metrics, *, x, group_by, layer, title, **_) -> Figure:
    if x is not None:
        check_choice(x, ("epoch",), "x")
    per_metric = {
        m: training_curves_series(frame, m, group_by=group_by, layer=layer) for m in metrics
    }
    title = title or f"{', '.join(metrics)} during training"
    if not any(per_metric.values()):
        return draw.no_data(title, f"no rows of {', '.join(map(repr, metrics))}")
    labels = list(dict.fromkeys(lab for lines in per_metric.values() for lab in lines))
    ordered = any(lines.ordered for lines in per_metric.values())
    colors = draw.palette(labels, ordered)  # one colour per configuration across panels
    fig, axes = draw.new_figure(len(metrics), height=3.4 if len(metrics) > 1 else 4.4)
    for ax, (m, lines) in zip(axes, per_metric.items(), strict=True):
        ax.set_ylabel(draw.wrap(METRIC_LABELS[m], 40))
        if not lines:
            ax.text(0.5, 0.5, f"no rows of {m!r}", transform=ax.transAxes, ha="center")
            continue
        ys = _plot_lines(ax, lines, colors)
        draw.set_scales(ax, np.array([]), ys, integer_x=True)
        notes = [*_layer_note(metric_rows(frame, m), m, layer), _seeds_note(lines)]
        if ax is axes[0]:
            notes = [*_fixed_note(frame), *notes]
        ax.set_title(draw.wrap(" · ".join(notes), 110), fontsize=8, loc="left", color="0.3")
    axes[-1].set_xlabel(field_label("epoch"))
    fig.suptitle(title)
    return fig


def heatmap(frame, metric, *, x, group_by, epoch, layer, title, **_) -> Figure:
    rows = metric_rows(frame, metric)
    x, y = heatmap_axes(x, group_by)
    if not rows.empty and "layer" in (x, y) and not is_layer_metric(rows, metric):
        allowed = [c for c in ("epoch", *config_columns(rows)) if c != x]
        msg = f"{metric!r} has no layers: choose the heatmap's second axis"
        raise InvalidInput(msg, field="group_by", allowed=allowed)
    grid = heatmap_series(frame, metric, x=x, y=y, epoch=epoch, layer=layer)
    title = title or f"{metric} over {y} × {x}"
    if grid is None:
        return draw.no_data(title, f"no rows of {metric!r}")
    notes = [] if "epoch" in (x, y) else _epoch_notes(rows, epoch)
    if "layer" not in (x, y):
        notes = [*_layer_note(rows, metric, layer), *notes]
    fig, (ax,) = draw.new_figure(height=4.8)
    draw.draw_grid(fig, ax, grid, METRIC_LABELS[metric])
    ax.set_xlabel(draw.wrap(field_label(x)))
    ax.set_ylabel(draw.wrap(field_label(y)))
    return _finish(fig, ax, title, [*notes, "cell = mean over seeds"], frame)


def theory_overlay(frame, metric, *, x, group_by, epoch, layer, title, theory, **_) -> Figure:
    check_choice(metric, GAP_METRICS, "metric")
    measured, predicted = theory_overlay_series(
        frame, metric, x=x, group_by=group_by, epoch=epoch, layer=layer, theory=theory
    )
    title = title or f"{metric}: measured and mean-field prediction"
    if not measured:
        return draw.no_data(title, f"no rows of {metric!r}")
    rows = metric_rows(frame, metric)
    x = x or default_theory_x(rows)
    notes = _epoch_notes(rows, epoch, default="first")
    notes = [*(_layer_note(rows, metric, layer) if x == "depth" else []), *notes]
    notes.append(_seeds_note(measured))
    notes.append("dashed: mean-field prediction" if predicted else "no mean-field prediction given")
    # A prediction labelled like a measured line (e.g. "relu") takes that line's colour.
    colors = draw.palette(list(dict.fromkeys([*measured, *predicted])), measured.ordered)
    dashed = {f"mean field: {k}": v for k, v in predicted.items()}
    colors |= {f"mean field: {k}": colors[k] for k in predicted}
    fig, (ax,) = draw.new_figure()
    ys = _plot_lines(ax, measured, colors, dashed)
    xs = np.concatenate([_xs(measured), *(v["x"].to_numpy() for v in predicted.values())])
    draw.set_scales(ax, xs if x == "depth" else np.array([]), ys, integer_x=True)
    ax.set_xlabel(draw.wrap(field_label(x)))
    ax.set_ylabel(draw.wrap(METRIC_LABELS[metric]))
    return _finish(fig, ax, title, notes, frame)


BUILDERS: dict[str, Callable[..., Figure]] = {  # kind → its figure builder
    "layer_profile": layer_profile,
    "depth_scaling": depth_scaling,
    "training_curves": training_curves,
    "heatmap": heatmap,
    "theory_overlay": theory_overlay,
}
