"""The JSON form of a figure: what it draws, as numbers and texts a browser chart reads
(docs/api.md, "Plots as JSON"; the dashboard's charts, docs/dashboard.md).

    render("depth_scaling", frame, metric="grad_norm", fmt="json") -> UTF-8 JSON bytes

One builder per kind, called by service.plots.build_with after the checks and defaults the
figure's builder gets (service.plots.kinds): the same series functions (service.plots.series)
with the same pooling, the same scale decision (kinds._choose_scales), the same title and
caption, so a chart and the downloaded PNG/SVG show the same numbers. A chart is

    {kind, title, empty (why there is nothing to draw, else null), ordered (colours follow a
     numeric key), keys (colour slots), panels: [{caption, x, y, legend, stat, band, series,
     grid, rules}]}

with an axis {label, scale ("log" or "linear": the figure's), integer, ticks (category labels
at 0, 1, …, or null), range ([lo, hi], or null: the data's), base (of a log axis)}, a series
{label, style ("line", "dashed", "points", "step", "bars"), key (its colour slot: a prediction
shares its measurement's), color (a fixed colour, or null), shade (0..1 on the chart's colour
map, or null), x, y, lo, hi (its band, or null), count (values pooled per point, or null),
flags (boolean per-point columns of the series, e.g. `unresolved`, or null)}, a grid (a
heatmap's cells) and rules (lines at a fixed x or y). y, lo and hi spell NaN and ±∞ as "NaN",
"Infinity" and "-Infinity" (service.jsonfmt); a chart pins them at the axis edge as the figure
does (service.plots.draw.PINS). api.schemas.ChartPublic is this shape's JSON schema.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from service.errors import InvalidInput
from service.plots.kinds import (
    _choose_scales,
    _counts,
    _epoch_notes,
    _fixed_note,
    _layer_note,
    _pool_notes,
    _series_args,
    _xs,
)
from service.plots.labels import METRIC_LABELS, field_label
from service.plots.pooling import BAND_TEXT, STAT_TEXT
from service.plots.select import (
    THEORY_METRICS,
    Lines,
    check_choice,
    config_columns,
    is_layer_metric,
    metric_rows,
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

STYLES = ("line", "dashed", "points", "step", "bars")
_KNOWN = frozenset(("x", "mean", "lo", "hi", "count", "n_finite", "n_excluded", "value"))

# --- the pieces -----------------------------------------------------------------------------


def reals(values: Any) -> list[float | str]:
    """Floats as JSON holds them: finite ones as numbers, NaN and ±∞ as service.jsonfmt's
    strings (vectorized: a chart may hold 10⁵ points)."""
    a = np.asarray(values, dtype=np.float64).ravel()
    out: list[Any] = a.tolist()
    for i in np.flatnonzero(~np.isfinite(a)):
        v = a[i]
        out[i] = "NaN" if np.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return out


def plain(values: Any) -> list[Any]:
    """Axis values (numbers, or the text of a category) as JSON holds them."""
    a = np.asarray(values)
    if a.dtype.kind == "f":
        return reals(a)
    if a.dtype.kind in "iub":
        return a.tolist()
    return [v if isinstance(v, bool | int | float | str) or v is None else str(v) for v in
            a.tolist()]  # fmt: skip


def axis(
    label: str | None,
    scale: str = "linear",
    *,
    integer: bool = False,
    ticks: list[str] | None = None,
    limits: tuple[float, float] | None = None,
    base: float = 10,
) -> dict[str, Any]:
    return {"label": label, "scale": scale, "integer": integer, "ticks": ticks,
            "range": reals(limits) if limits is not None else None, "base": base}  # fmt: skip


def series(
    label: str,
    x: Any,
    y: Any,
    *,
    style: str = "line",
    key: int = 0,
    lo: Any = None,
    hi: Any = None,
    count: Any = None,
    color: str | None = None,
    shade: float | None = None,
    flags: dict[str, Any] | None = None,
) -> dict[str, Any]:
    band = lo is not None and bool(np.isfinite(np.asarray(lo, dtype=float)).any())
    return {
        "label": label, "style": style, "key": key, "color": color, "shade": shade,
        "x": plain(x), "y": reals(y),
        "lo": reals(lo) if band else None, "hi": reals(hi) if band else None,
        "count": np.asarray(count).astype(int).tolist() if count is not None else None,
        "flags": {k: np.asarray(v, dtype=bool).tolist() for k, v in flags.items()} if flags
        else None,
    }  # fmt: skip


def line_series(label: str, s: pd.DataFrame, key: int, *, style: str = "line",
                y: str = "mean") -> dict[str, Any]:  # fmt: skip
    """One line of a Lines frame (x, mean, lo, hi, count, …; service.plots.select.band_frame) or
    of a prediction frame (x, value); its boolean columns become `flags`, and so does a count of
    the point's seeds with a property (`n_unresolved`: service.plots.series.mark_unresolved) where
    some point has one (flag `unresolved`: at least one seed)."""
    flags = {c: s[c] for c in s.columns if c not in _KNOWN and s[c].dtype == bool}
    for c in s.columns:
        if c.startswith("n_") and c not in _KNOWN and s[c].dtype.kind in "iu" and s[c].any():
            flags[c.removeprefix("n_")] = s[c] > 0
    return series(
        label, s["x"].to_numpy(), s[y].to_numpy(dtype=float), style=style, key=key,
        lo=s["lo"].to_numpy(dtype=float) if "lo" in s else None,
        hi=s["hi"].to_numpy(dtype=float) if "hi" in s else None,
        count=s["count"].to_numpy() if "count" in s else None, flags=flags,
    )  # fmt: skip


def panel(
    caption: str,
    x: dict[str, Any],
    y: dict[str, Any],
    items: list[dict[str, Any]],
    *,
    legend: str | None = None,
    stat: str | None = None,
    band: str | None = None,
    grid: dict[str, Any] | None = None,
    rules: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {"caption": caption, "x": x, "y": y, "legend": legend, "stat": stat, "band": band,
            "series": items, "grid": grid, "rules": rules or []}  # fmt: skip


def rule(axis_name: str, value: float, label: str) -> dict[str, Any]:
    """A line across the axes at x = value (axis "x") or y = value (axis "y")."""
    return {"axis": axis_name, "value": value, "label": label}


def chart(
    title: str, panels: list[dict[str, Any]], *, ordered: bool = False, keys: int = 0,
    empty: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {"title": title, "empty": empty, "ordered": ordered, "keys": keys, "panels": panels}


def no_data(heading: str, reason: str) -> dict[str, Any]:
    """The chart of nothing (the figure's "no data" with its reason)."""
    return chart(heading, [], empty=reason)


def chart_bytes(kind: str, body: dict[str, Any]) -> bytes:
    """The chart as the API sends it: UTF-8 JSON, `kind` first (never a bare NaN token)."""
    return json.dumps({"kind": kind, **body}, allow_nan=False, ensure_ascii=False,
                      separators=(",", ":")).encode()  # fmt: skip


# --- the line kinds -----------------------------------------------------------------------------


def _keys(labels: list[str]) -> dict[str, int]:
    return {lab: i for i, lab in enumerate(dict.fromkeys(labels))}


def _band_text(lines: Lines) -> str | None:
    p = lines.pooling
    shown = any(np.isfinite(s["lo"]).any() for s in lines.values())
    return BAND_TEXT.get((p.stat, p.band)) if shown else None


def lines_panel(
    lines: Lines, keys: dict[str, int], opts: dict[str, Any], caption: str, *, xlabel: str,
    ylabel: str | None, auto_x: bool, integer_x: bool, dashed: dict | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The measured lines (and `dashed` predictions: label → frame(x, value)) on the scales the
    figure chooses (service.plots.kinds._draw)."""
    xs = _xs(lines)
    if dashed:
        xs = np.concatenate([xs, *(v["x"].to_numpy(dtype=float) for v in dashed.values())])
    xscale, yscale = _choose_scales(lines, dashed, opts, xs if auto_x else np.array([]))
    items = [line_series(lab, s, keys[lab]) for lab, s in lines.items()]
    items += [line_series(lab, d, keys[lab], style="dashed", y="value")
              for lab, d in (dashed or {}).items()]  # fmt: skip
    return panel(
        caption, axis(xlabel, xscale, integer=integer_x), axis(ylabel, yscale), items,
        legend=", ".join(lines.by) or None, stat=lines.pooling.stat, band=_band_text(lines),
    )  # fmt: skip


def _caption(frame: pd.DataFrame, notes: list[str]) -> str:
    return " · ".join([*_fixed_note(frame), *notes])


def layer_profile(frame, metric, *, x, group_by, epoch, title, pooling, **opts) -> dict:
    if x is not None:
        check_choice(x, ("layer",), "x")
    lines = layer_profile_series(
        frame, metric, group_by=group_by, epoch=epoch, **_series_args(pooling)
    )
    title = title or f"{metric}: profile over layers"
    if not lines:
        return no_data(title, f"no rows of {metric!r}")
    rows = metric_rows(frame, metric)
    if lines.by[:1] == ["epoch"]:
        n_all, n = rows["epoch"].nunique(), len(epoch_subset(rows["epoch"].to_numpy()))
        notes = [f"{n} of {n_all} recorded epochs"] if epoch is None and n < n_all else []
    else:
        notes = _epoch_notes(rows, epoch)
    keys = _keys(list(lines))
    one = lines_panel(lines, keys, opts, _caption(frame, [*notes, *_pool_notes(lines)]),
                      xlabel=field_label("layer"), ylabel=METRIC_LABELS[metric], auto_x=False,
                      integer_x=True)  # fmt: skip
    return chart(title, [one], ordered=lines.ordered, keys=len(keys))


def depth_scaling(frame, metric, *, x, group_by, epoch, layer, title, pooling, **opts) -> dict:
    x = x or "depth"
    lines = depth_scaling_series(
        frame, metric, x=x, group_by=group_by, epoch=epoch, layer=layer, **_series_args(pooling)
    )
    title = title or f"{metric} against {x}"
    if not lines:
        return no_data(title, f"no rows of {metric!r}")
    rows = metric_rows(frame, metric)
    notes = [*_layer_note(rows, metric, layer), *_epoch_notes(rows, epoch), *_pool_notes(lines)]
    keys = _keys(list(lines))
    one = lines_panel(lines, keys, opts, _caption(frame, notes), xlabel=field_label(x),
                      ylabel=METRIC_LABELS[metric], auto_x=True, integer_x=_counts(x))  # fmt: skip
    return chart(title, [one], ordered=lines.ordered, keys=len(keys))


def training_curves(frame, metrics, *, x, group_by, layer, title, pooling, **opts) -> dict:
    if x is not None:
        check_choice(x, ("epoch",), "x")
    args = _series_args(pooling)
    per_metric = {
        m: training_curves_series(frame, m, group_by=group_by, layer=layer, **args) for m in metrics
    }
    title = title or f"{', '.join(metrics)} during training"
    if not any(per_metric.values()):
        return no_data(title, f"no rows of {', '.join(map(repr, metrics))}")
    keys = _keys([lab for lines in per_metric.values() for lab in lines])
    panels = []
    for i, (m, lines) in enumerate(per_metric.items()):
        last = i == len(per_metric) - 1
        xlabel = field_label("epoch") if last else None
        if not lines:
            empty = axis(xlabel)
            panels.append(panel(f"no rows of {m!r}", empty, axis(METRIC_LABELS[m]), []))
            continue
        notes = [*_layer_note(metric_rows(frame, m), m, layer), *_pool_notes(lines)]
        caption = _caption(frame, notes) if i == 0 else " · ".join(notes)
        one = lines_panel(lines, keys, opts, caption, xlabel=xlabel or "",
                          ylabel=METRIC_LABELS[m], auto_x=False, integer_x=True)  # fmt: skip
        panels.append(one)
    ordered = any(lines.ordered for lines in per_metric.values())
    return chart(title, panels, ordered=ordered, keys=len(keys))


def heatmap(frame, metric, *, x, group_by, epoch, layer, title, pooling, **_) -> dict:
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
        return no_data(title, f"no rows of {metric!r}")
    notes = [] if "epoch" in (x, y) else _epoch_notes(rows, epoch)
    if "layer" not in (x, y):
        notes = [*_layer_note(rows, metric, layer), *notes]
    notes.append(f"cell = {STAT_TEXT[grid.stat]} over seeds")
    if pooling.nonfinite == "exclude" and grid.n_excluded:
        k = grid.n_excluded
        notes.append(f"{k} non-finite value{'s' if k != 1 else ''} excluded")
    cells = {
        "label": METRIC_LABELS[metric], "x": plain(grid.xs), "y": plain(grid.ys),
        "values": [reals(row) for row in grid.values], "present": grid.present.tolist(),
    }  # fmt: skip
    one = panel(_caption(frame, notes), axis(field_label(x)), axis(field_label(y)), [],
                stat=grid.stat, grid=cells)  # fmt: skip
    return chart(title, [one])


def theory_overlay(
    frame, metric, *, x, group_by, epoch, layer, title, theory, pooling, **opts
) -> dict:
    check_choice(metric, THEORY_METRICS, "metric")
    measured, predicted = theory_overlay_series(
        frame, metric, x=x, group_by=group_by, epoch=epoch, layer=layer, theory=theory,
        **_series_args(pooling),
    )  # fmt: skip
    title = title or f"{metric}: measured and mean-field prediction"
    if not measured:
        return no_data(title, f"no rows of {metric!r}")
    rows = metric_rows(frame, metric)
    x = x or default_theory_x(rows)
    notes = _epoch_notes(rows, epoch, default="first")
    notes = [*(_layer_note(rows, metric, layer) if x == "depth" else []), *notes]
    notes += _pool_notes(measured)
    notes.append("dashed: mean-field prediction" if predicted else "no mean-field prediction given")
    keys = _keys([*measured, *predicted])
    dashed = {f"mean field: {k}": v for k, v in predicted.items()}
    keys |= {f"mean field: {k}": keys[k] for k in predicted}
    one = lines_panel(measured, keys, opts, "", xlabel=field_label(x),
                      ylabel=METRIC_LABELS[metric], auto_x=x == "depth", integer_x=True,
                      dashed=dashed)  # fmt: skip
    limits, left = measured_range(measured, dashed, one["y"]["scale"] == "log",
                                  "ℓ" if x == "layer" else x)  # fmt: skip
    if left:
        notes.append(f"y range from the measurements; {left}")
    one["y"]["range"] = reals(limits) if limits is not None else None
    one["caption"] = _caption(frame, notes)
    n = len(dict.fromkeys(keys.values()))
    return chart(title, [one], ordered=measured.ordered, keys=n)


def measured_range(
    measured: Lines, predicted: dict[str, pd.DataFrame], log: bool, x_name: str
) -> tuple[tuple[float, float] | None, str]:
    """The y range of the measured lines (means and bands, 5% padding, in decades on a log
    axis) and the note on where the predictions leave it: the numbers of
    service.plots.draw.clip_to_measured, for a chart that clips as the figure does."""
    parts = [s[c].to_numpy(dtype=float) for s in measured.values() for c in ("mean", "lo", "hi")
             if c in s]  # fmt: skip
    ys = np.concatenate(parts) if parts else np.array([])
    ys = ys[np.isfinite(ys) & ((ys > 0) if log else True)]
    if ys.size == 0:
        return None, ""
    lo, hi = float(ys.min()), float(ys.max())
    if log:
        a, b = np.log10(lo), np.log10(hi)
        pad = max(0.05 * (b - a), 0.05)
        ylim = (float(10 ** (a - pad)), float(10 ** (b + pad)))
    else:
        span = hi - lo
        pad = 0.05 * span if span > 0 else max(0.1 * abs(hi), 0.1)
        ylim = (lo - pad, hi + pad)
    first: dict[str, float] = {}
    far: dict[str, float] = {}
    for d in predicted.values():
        x, v = d["x"].to_numpy(dtype=float), d["value"].to_numpy(dtype=float)
        finite = np.isfinite(v) & ((v > 0) if log else True)
        for word, out in (("below", finite & (v < ylim[0])), ("above", finite & (v > ylim[1]))):
            if not out.any():
                continue
            leaves = out & ~np.concatenate([[False], out[:-1]])
            first[word] = min(first.get(word, np.inf), float(x[leaves][0]))
            extreme = float(v[out].min() if word == "below" else v[out].max())
            pick = min if word == "below" else max
            far[word] = pick(far.get(word, extreme), extreme)
    note = "; ".join(
        f"mean field {word} it from {x_name} = {first[word]:g} (to {far[word]:.2g})"
        for word in first
    )
    return ylim, note


CHART_BUILDERS: dict[str, Any] = {  # kind → its chart builder (service.plots.build_with calls it)
    "layer_profile": layer_profile,
    "depth_scaling": depth_scaling,
    "training_curves": training_curves,
    "heatmap": heatmap,
    "theory_overlay": theory_overlay,
}
