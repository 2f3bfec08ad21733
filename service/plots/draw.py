"""Matplotlib drawing helpers: lines with CI bands, non-finite markers, grids, bytes.

Object API only (Figure + FigureCanvasAgg): no pyplot state, so figures can be drawn from
several threads at once. Imported lazily by service.plots.render, never at API start-up.
"""

from __future__ import annotations

import io
import textwrap
from collections import Counter
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter
from matplotlib.transforms import blended_transform_factory

from service.plots.select import fmt_value, wants_log

DPI = 110
STEPS = [1, 2, 5, 10]  # tick steps on integer axes: 0, 5, 10 rather than 0, 8, 16
# Where each kind of non-finite point is pinned, in axes coordinates (0 = bottom, 1 = top).
PINS = {"+inf": (1.0, "^"), "-inf": (0.0, "v"), "nan": (0.06, "X")}
GIDS = {"+inf": "posinf", "-inf": "neginf", "nan": "nan"}  # SVG ids: nonfinite-posinf, …
PIN_TEXT = {"+inf": "mean = +∞", "-inf": "mean = −∞", "nan": "mean = NaN"}
PIN_EDGE = {"+inf": "top edge", "-inf": "bottom edge", "nan": "bottom"}
CELL_COLORS = {"+inf": "#d62728", "-inf": "#e377c2", "nan": "#7f7f7f"}  # none is in viridis
CELL_TEXT = {"+inf": "+∞", "-inf": "−∞", "nan": "NaN"}


def new_figure(nrows: int = 1, height: float = 4.4) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(8.0, height * nrows if nrows > 1 else height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, 1, sharex=True, squeeze=False)[:, 0]
    return fig, list(axes)


def wrap(text: str, width: int = 50) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def palette(labels: list[str], sequential: bool) -> dict[str, tuple]:
    """Colours per line: ordered (viridis) for a numeric key such as epoch or depth, else tab10."""
    if sequential and len(labels) > 1:
        cmap = matplotlib.colormaps["viridis"]
        return {lab: cmap(0.9 * i / (len(labels) - 1)) for i, lab in enumerate(labels)}
    cycle = matplotlib.colormaps["tab10"].colors  # type: ignore[attr-defined]  # a ListedColormap
    return {lab: cycle[i % len(cycle)] for i, lab in enumerate(labels)}


def draw_lines(
    ax: Axes, lines: dict[str, pd.DataFrame], colors: dict, *, y: str = "mean", dashed: bool = False
) -> Counter:
    """Each line: its finite points joined, its 95% band shaded, its non-finite points pinned."""
    pinned: Counter = Counter()
    for label, s in lines.items():
        x = s["x"].to_numpy(dtype=float)  # (k,)
        m = s[y].to_numpy(dtype=float)  # (k,)
        c = colors.get(label, "black")
        style = dict(linestyle="--", marker=None) if dashed else dict(marker="o", ms=3)
        ax.plot(x, np.where(np.isfinite(m), m, np.nan), color=c, label=label, **style)
        if "lo" in s and np.isfinite(s["lo"]).any():
            ax.fill_between(x, s["lo"], s["hi"], color=c, alpha=0.2, lw=0, gid="ci95")
        pinned += pin_nonfinite(ax, x, m, c)
    return pinned


def pin_nonfinite(ax: Axes, x: np.ndarray, m: np.ndarray, color) -> Counter:
    """Mark +∞ at the top edge, −∞ at the bottom edge and NaN just above it, at their x."""
    edge = blended_transform_factory(ax.transData, ax.transAxes)  # x in data, y in axes
    masks = {"+inf": m == np.inf, "-inf": m == -np.inf, "nan": np.isnan(m)}
    counts: Counter = Counter()
    for kind, mask in masks.items():
        if mask.any():
            y, marker = PINS[kind]
            ax.plot(
                x[mask], np.full(mask.sum(), y), linestyle="none", marker=marker, ms=7,
                color=color, markeredgecolor="black", markeredgewidth=0.6, transform=edge,
                clip_on=False, gid=f"nonfinite-{GIDS[kind]}", label="_nolegend_", zorder=5,
            )  # fmt: skip
            counts[kind] += int(mask.sum())
    return counts


def finish_lines(ax: Axes, pinned: Counter, *, title: str | None, band: bool) -> None:
    """Legend: the lines, the CI band, and one entry per kind of pinned point with its count."""
    handles, _ = ax.get_legend_handles_labels()
    if band:
        handles.append(Patch(color="0.6", alpha=0.4, label="95% CI over seeds (t-interval)"))
    for kind, n in pinned.items():
        y, marker = PINS[kind]
        text = f"{PIN_TEXT[kind]}: {n} point{'s' if n != 1 else ''} (at the {PIN_EDGE[kind]})"
        handles.append(Line2D([], [], linestyle="none", marker=marker, color="0.5", label=text))
        ax.text(
            1.005,
            y,
            CELL_TEXT[kind],
            transform=ax.transAxes,
            ha="left",
            va="center",
            fontsize=9,
            color="0.25",
            gid=f"pin-text-{GIDS[kind]}",
            clip_on=False,
        )  # fmt: skip  (just right of the pinned row, outside the axes)
    if handles:
        ax.legend(
            handles=handles, title=title, loc="upper left", bbox_to_anchor=(1.05, 1.0),
            fontsize=8, title_fontsize=8, frameon=False,
        )  # fmt: skip


def set_scales(ax: Axes, xs: np.ndarray, ys: np.ndarray, *, integer_x: bool = False) -> None:
    """Log x when positive x spans more than a decade, log y when positive y spans more than two;
    on a linear x axis of counts (epoch, layer, depth) ticks fall on integers."""
    if wants_log(xs, 10.0):
        ax.set_xscale("log")
        ticks = np.unique(xs[np.isfinite(xs) & (xs > 0)])
        if len(ticks) <= 12:  # few swept values (depths): label exactly those, nothing between
            ax.xaxis.set_major_locator(FixedLocator(ticks.tolist()))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
    elif integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=STEPS))
    if wants_log(ys, 100.0):
        ax.set_yscale("log")


def draw_grid(fig: Figure, ax: Axes, grid, label: str) -> None:
    """A heatmap of finite cells, with +∞ / −∞ / NaN cells in their own colours on top."""
    v, present = grid.values, grid.present  # (ny, nx)
    finite = present & np.isfinite(v)
    shown = np.ma.masked_array(np.where(finite, v, 0.0), mask=~finite)
    norm = _norm(v[finite])
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad=(0, 0, 0, 0))
    extent = _extent(grid)
    kw: dict[str, Any] = dict(origin="lower", aspect="auto", interpolation="nearest", extent=extent)
    im = ax.imshow(shown, cmap=cmap, norm=norm, **kw)
    fig.colorbar(im, ax=ax, label=wrap(label, 45))
    overlay = np.zeros((*v.shape, 4))  # (ny, nx, RGBA), transparent where finite or absent
    masks = {"+inf": v == np.inf, "-inf": v == -np.inf, "nan": present & np.isnan(v)}
    handles = []
    for kind, mask in masks.items():
        if mask.any():
            overlay[mask] = mcolors.to_rgba(CELL_COLORS[kind])
            handles.append(Patch(color=CELL_COLORS[kind], label=_cells(CELL_TEXT[kind], mask)))
    if handles:
        ax.imshow(overlay, gid="nonfinite-cells", **kw)
    if (~present).any():
        hole = Patch(facecolor="white", edgecolor="0.5", label=_cells("no record", ~present))
        handles.append(hole)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    if extent is None:
        _ticks(ax, grid.xs, "x")
        _ticks(ax, grid.ys, "y")
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=STEPS))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, steps=STEPS))


def _even(values: np.ndarray) -> float | None:
    """The spacing of evenly spaced numeric values (≥ 2 of them), else None."""
    if values.size < 2 or not np.issubdtype(values.dtype, np.number):
        return None
    step = np.diff(values.astype(float))
    return float(step[0]) if np.allclose(step, step[0]) else None


def _extent(grid) -> tuple[float, float, float, float] | None:
    """Cells centred on their values when both axes are evenly spaced numbers (epoch, layer),
    so ordinary ticks apply; otherwise None and cells sit at index positions."""
    dx, dy = _even(grid.xs), _even(grid.ys)
    if dx is None or dy is None:
        return None
    return (grid.xs[0] - dx / 2, grid.xs[-1] + dx / 2, grid.ys[0] - dy / 2, grid.ys[-1] + dy / 2)


def _cells(text: str, mask: np.ndarray) -> str:
    n = int(mask.sum())
    return f"{text} ({n} cell{'s' if n != 1 else ''})"


def _norm(finite: np.ndarray) -> mcolors.Normalize:
    if finite.size == 0:
        return mcolors.Normalize(0.0, 1.0)
    lo, hi = float(finite.min()), float(finite.max())
    if wants_log(finite, 100.0):
        return mcolors.LogNorm(lo, hi)
    return mcolors.Normalize(lo, hi if hi > lo else lo + 1.0)


def _ticks(ax: Axes, values: np.ndarray, axis: str, most: int = 12) -> None:
    """Cells sit at index positions; label them with their values (at most `most` ticks)."""
    pos = np.unique(np.linspace(0, values.size - 1, min(most, values.size)).round().astype(int))
    labels = [fmt_value(values[p]) for p in pos]
    if axis == "x":
        ax.set_xticks(pos, labels, rotation=45 if max(map(len, labels)) > 4 else 0)
    else:
        ax.set_yticks(pos, labels)


def no_data(title: str, reason: str) -> Figure:
    fig, (ax,) = new_figure()
    ax.set_axis_off()
    ax.text(0.5, 0.5, f"no data\n{reason}", ha="center", va="center", fontsize=13, color="0.3")
    fig.suptitle(title)
    return fig


def to_bytes(fig: Figure, fmt: str) -> bytes:
    buf = io.BytesIO()
    meta = {"Date": None} if fmt == "svg" else None  # reproducible SVG
    fig.savefig(buf, format=fmt, dpi=DPI, metadata=meta)
    return buf.getvalue()
