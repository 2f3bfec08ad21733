"""Matplotlib drawing helpers: lines with CI bands, non-finite markers, grids, bytes.

Object API only (Figure + an Agg `Canvas`): no pyplot state, so figures can be built from
several threads at once (they are drawn one at a time: DRAWING). Imported lazily by
service.plots.render, never at API start-up.

Figures fit at any size (docs/dashboard.md, "Figures that fit"): every figure is a
`FittedFigure` in constrained layout, whose titles, captions, axis labels and legend entries are
re-wrapped (textwrap) to the room they have each time the figure is drawn, and whose legends sit
right of their axes when the figure is wide enough, else below them. The builders set these
texts through `title`, `caption`, `label_axes` and `legend` rather than on the artists.
"""

from __future__ import annotations

import io
import textwrap
import threading
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import PlaceHolderLayoutEngine
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter
from matplotlib.transforms import ScaledTranslation, blended_transform_factory

from service.plots.select import fmt_value, wants_log
from service.plots.series import UNRESOLVED

DPI = 110
STEPS = [1, 2, 5, 10]  # tick steps on integer axes: 0, 5, 10 rather than 0, 8, 16
# Where each kind of point a y axis cannot show is pinned, in axes coordinates (0 = bottom,
# 1 = top): non-finite values, and values ≤ 0 on a log axis ("nonpos").
PINS = {"+inf": (1.0, "^"), "-inf": (0.0, "v"), "nan": (0.06, "X"), "nonpos": (0.0, "d")}
GIDS = {"+inf": "posinf", "-inf": "neginf", "nan": "nan", "nonpos": "nonpos"}  # nonfinite-…
PIN_TEXT = {"+inf": "= +∞", "-inf": "= −∞", "nan": "= NaN", "nonpos": "≤ 0 (log axis)"}
PIN_EDGE = {"+inf": "top edge", "-inf": "bottom edge", "nan": "bottom", "nonpos": "bottom edge"}
CELL_COLORS = {"+inf": "#d62728", "-inf": "#e377c2", "nan": "#7f7f7f"}  # none is in viridis
CELL_TEXT = {"+inf": "+∞", "-inf": "−∞", "nan": "NaN", "nonpos": "≤0"}
LEAVES = {"below": (0.0, "v"), "above": (1.0, "^")}  # a prediction leaving the y range


WIDTH = 8.0  # inches: 880 px at DPI, drawn at the dashboard's content width
SIDE_MIN_WIDTH = 5.5  # inches: narrower figures put their legends below the axes
LEGEND_SHARE = 0.3  # of the figure's width: the most a legend entry beside the axes may take
PAD = 4.0  # px kept clear of the figure's edge
PASSES = 3  # wrap and lay out this often before drawing: the rooms settle as the layout does
LEGEND_SIZE = 8.0  # points
COMPACT = 0.8  # the texts' scale when they do not fit at their size
# Matplotlib's mathtext parser (log-axis tick labels such as 5×10²) keeps pyparsing state shared
# by the whole process and fails when two threads parse at once: one figure is drawn at a time.
DRAWING = threading.RLock()
# One mathtext parser for every figure drawn here (each renderer makes its own, and the parse
# cache is the parser's: every figure parsed its log-axis tick labels afresh, ~9 parses a tenth
# of a PNG's time). Used under DRAWING only, as the shared pyparsing state requires anyway.
_MATHTEXT: dict[Any, Any] = {}


@dataclass
class _Fit:
    """A text re-wrapped at each draw: its artist, its unwrapped text, and the room it has
    along its own direction (px, a function of the laid-out figure)."""

    artist: Text
    raw: str
    room: Callable[[], float]
    size: float = 0.0  # its font size as set (fit_texts scales it down when compact)


@dataclass
class _Legend:
    """A legend placed at each draw: beside its axes (`ax`) or below them; a figure legend
    (`ax` None) goes below the axes, in the layout's bottom margin."""

    ax: Axes | None
    handles: list
    labels: list[str]
    title: str | None
    kwargs: dict = field(default_factory=dict)


class FittedFigure(Figure):
    """A constrained-layout Figure that fits its texts to its size whenever it is drawn (on
    screen, to PNG or to SVG, at any figsize): see the module's docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fits: list[_Fit] = []
        self.fitted_legends: list[_Legend] = []
        self.legend_size = LEGEND_SIZE
        self._fitted_at: tuple | None = None
        self.legend_columns: dict[tuple, int] = {}  # _below's bisections, by legend and width

    def draw(self, renderer: Any) -> None:
        with DRAWING:
            _share_mathtext(renderer)
            if self.get_visible() and not self._laid_out():
                fit_texts(self, renderer)
                self._fitted_at = self._at()
            super().draw(renderer)

    def _at(self) -> tuple:
        return (self.dpi, *self.bbox.size)

    def _laid_out(self) -> bool:
        """Whether this draw is savefig's second: savefig lays the figure out in a first draw
        and draws it again with the layout engine off (a placeholder); at the same size and
        resolution, the texts fitted in the first draw still fit, and fitting them again would
        only repeat its work (a fifth of the time of the bench's mix of plots)."""
        engine = self.get_layout_engine()
        return isinstance(engine, PlaceHolderLayoutEngine) and self._fitted_at == self._at()


class Canvas(FigureCanvasAgg):
    """The Agg canvas of every figure drawn here, whose renderer is the process's one for its
    size and resolution (`_RENDERERS`, the few last used). Matplotlib caches text extents per
    renderer, so a renderer per figure measured every tick label and title afresh, a sixth of
    a PNG's time. One renderer's pixels serve one figure at a time: `to_bytes` draws and
    encodes under DRAWING."""

    def get_renderer(self) -> RendererAgg:
        w, h = self.get_width_height(physical=True)
        key = (w, h, self.figure.dpi)
        with DRAWING:
            renderer = _RENDERERS.pop(key, None) or RendererAgg(w, h, self.figure.dpi)
            _RENDERERS[key] = renderer  # the last used last
            while len(_RENDERERS) > RENDERERS_KEPT:
                del _RENDERERS[next(iter(_RENDERERS))]
        self.renderer = renderer
        return renderer


RENDERERS_KEPT = 8  # ~1.7 MB of pixels each at the default size
_RENDERERS: dict[tuple, RendererAgg] = {}


def _share_mathtext(renderer: Any) -> None:
    """Give `renderer` (Agg: its own parser and its text-to-path's; SVG: the latter) the
    process's one mathtext parser (`_MATHTEXT`): a parse cached for one figure serves the
    next; one per kind of output a parser makes (all "path" in this matplotlib)."""
    for owner in (renderer, getattr(renderer, "_text2path", None)):
        parser = getattr(owner, "mathtext_parser", None)
        if owner is not None and parser is not None:
            kind = (type(parser), getattr(parser, "_output_type", None))
            owner.mathtext_parser = _MATHTEXT.setdefault(kind, parser)


def new_figure(nrows: int = 1, height: float = 4.4) -> tuple[Figure, list[Axes]]:
    size = (WIDTH, height * nrows if nrows > 1 else height)
    fig = FittedFigure(figsize=size, layout="constrained")
    Canvas(fig)
    axes = fig.subplots(nrows, 1, sharex=True, squeeze=False)[:, 0]
    return fig, list(axes)


def wrap(text: str, width: int = 50) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


# --- texts that fit ---------------------------------------------------------------------------


def fit(fig: Figure, artist: Text, text: str, room: Callable[[], float]) -> Text:
    """Set `artist`'s text, re-wrapped at each draw to `room()` px (a FittedFigure; any other
    figure keeps the text as given)."""
    artist.set_text(text)
    if isinstance(fig, FittedFigure):
        fig.fits.append(_Fit(artist, text, room))
    return artist


def title(fig: Figure, text: str) -> None:
    """The figure's title (its lines kept, each wrapped to the figure's width)."""
    fit(fig, fig.suptitle(text), text, lambda: 0.96 * fig.bbox.width)


def caption(ax: Axes, text: str) -> None:
    """The small grey note above the axes, left-aligned, wrapped to the axes' width."""
    note = ax.set_title(text, fontsize=8, loc="left", color="0.3")
    fit(ax.get_figure(), note, text, lambda: ax.bbox.width)  # type: ignore[arg-type]


def label_axes(ax: Axes, xlabel: str | None = None, ylabel: str | None = None) -> None:
    """Axis labels wrapped to the axes' width (x) and height (y)."""
    fig = ax.get_figure()
    if xlabel is not None:
        fit(fig, ax.xaxis.label, xlabel, lambda: ax.bbox.width)  # type: ignore[arg-type]
    if ylabel is not None:
        fit(fig, ax.yaxis.label, ylabel, lambda: ax.bbox.height)  # type: ignore[arg-type]


def legend(ax: Axes, handles: list, *, title: str | None = None, **kwargs: Any) -> None:
    """A legend of `handles` beside the axes (re-placed below them at each draw when the figure
    is narrow or the legend too tall; see place_legends)."""
    labels = [h.get_label() for h in handles]
    ax.legend(handles, labels, title=title, **_side(kwargs))
    fig = ax.get_figure()
    if isinstance(fig, FittedFigure):
        fig.fitted_legends.append(_Legend(ax, handles, labels, title, kwargs))


def figure_legend(fig: Figure, handles: list) -> None:
    """A legend of the whole figure, below the axes, in as many columns as fit."""
    labels = [h.get_label() for h in handles]
    fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize=8)
    if isinstance(fig, FittedFigure):
        fig.fitted_legends.append(_Legend(None, handles, labels, None))


def _side(kwargs: dict, size: float = 8.0) -> dict:
    return dict(loc="upper left", bbox_to_anchor=(1.05, 1.0), fontsize=size, title_fontsize=size,
                frameon=False) | kwargs  # fmt: skip


def fit_texts(fig: FittedFigure, renderer: Any) -> None:
    """Wrap every registered text and place every legend for the figure as it is now, lay it
    out, and again with the laid-out axes (their rooms are only known then), PASSES times.
    When the texts still do not fit (a small figure with a long legend), do it all again with
    the registered texts and the legends at COMPACT times their size."""
    for f in fig.fits:
        f.size = f.size or float(f.artist.get_fontsize())
    for scale in (1.0, COMPACT):
        fig.legend_size = LEGEND_SIZE * scale
        for f in fig.fits:
            f.artist.set_fontsize(f.size * scale)
        with warnings.catch_warnings():  # a layout that cannot fit yet: the next try shrinks
            warnings.filterwarnings("ignore", "constrained_layout not applied")
            for _ in range(PASSES):
                rooms = _rooms(fig)
                for f in fig.fits:
                    _rewrap(f.artist, f.raw, f.room(), renderer)
                place_legends(fig, renderer)
                engine = fig.get_layout_engine()
                if engine is None:
                    return
                engine.execute(fig)
                if _rooms(fig) == rooms:  # the layout gave the rooms it was wrapped for
                    break
        if _fits(fig, renderer):
            return


def _rooms(fig: FittedFigure) -> tuple:
    """What a pass of fit_texts wraps and places for: each text's room and each axes' box, to
    the half pixel; a pass that leaves them as they were is the last one needed."""
    rooms = tuple(round(2 * f.room()) for f in fig.fits)
    return rooms + tuple(round(2 * v) for ax in fig.axes for v in ax.bbox.bounds)


def _fits(fig: FittedFigure, renderer: Any) -> bool:
    """Whether everything drawn lies inside the figure and no axes was squeezed below a quarter
    of its share of the height (constrained layout gives up on an axes it cannot fit)."""
    box = fig.get_tightbbox(renderer)  # inches
    w, h = fig.get_size_inches()
    tol = 1.0 / fig.dpi
    inside = box.x0 >= -tol and box.y0 >= -tol and box.x1 <= w + tol and box.y1 <= h + tol
    main = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    share = fig.bbox.height / max(len(main), 1)
    return inside and all(ax.bbox.height >= 0.25 * share for ax in main)


def _rewrap(artist: Text, raw: str, room: float, renderer: Any) -> None:
    """Each line of `raw` broken at spaces so that, as `artist` draws it, no line is wider than
    `room` px (a single word wider than that stays whole)."""
    room -= PAD
    if room <= 0 or "$" in raw:
        artist.set_text(raw)
        return
    prop = artist.get_fontproperties()

    def width(text: str) -> float:
        return text_width(renderer, prop, text)

    out: list[str] = []
    for line in raw.split("\n"):
        if width(line) <= room:
            out.append(line)
            continue
        current = ""
        for word in line.split(" "):
            candidate = f"{current} {word}" if current else word
            if current and width(candidate) > room:
                out.append(current)
                current = word
            else:
                current = candidate
        out.append(current)
    artist.set_text("\n".join(out))


# Text widths measured so far, by renderer kind and resolution, font and text: a figure is
# wrapped PASSES times per scale and its legend entries again per placement, mostly the same
# texts at the same sizes (and a sweep's figures share their labels). Read and written under
# DRAWING; emptied when it reaches WIDTHS_KEPT.
_WIDTHS: dict[tuple, float] = {}
WIDTHS_KEPT = 100_000


def text_width(renderer: Any, prop: Any, text: str) -> float:
    """The width in px of `text` as `renderer` draws it in font `prop` (memoized)."""
    key = (type(renderer).__name__, getattr(renderer, "dpi", None), hash(prop), text)
    got = _WIDTHS.get(key)
    if got is None:
        if len(_WIDTHS) >= WIDTHS_KEPT:
            _WIDTHS.clear()
        got = _WIDTHS[key] = renderer.get_text_width_height_descent(text, prop, ismath=False)[0]
    return got


def _wrapped_labels(labels: list[str], room: float, renderer: Any, size: float) -> list[str]:
    probe = Text(text="", fontsize=size)
    out = []
    for label in labels:
        _rewrap(probe, label, room, renderer)
        out.append(probe.get_text())
    return out


def place_legends(fig: FittedFigure, renderer: Any) -> None:
    """Each legend beside its axes if the figure is at least SIDE_MIN_WIDTH wide and the legend
    fits between the axes' top and the figure's bottom, its entries wrapped to LEGEND_SHARE of
    the width; else below (the x axis's labels), in as many columns as the width takes."""
    width, height = fig.bbox.width, fig.bbox.height
    for spec in fig.fitted_legends:
        old = spec.ax.get_legend() if spec.ax is not None else None
        if spec.ax is None:
            for leg in list(fig.legends):
                leg.remove()
        elif old is not None:
            old.remove()
        if spec.ax is not None and fig.get_size_inches()[0] >= SIDE_MIN_WIDTH:
            labels = _wrapped_labels(spec.labels, LEGEND_SHARE * width, renderer, fig.legend_size)
            leg = spec.ax.legend(
                spec.handles, labels, title=spec.title, **_side(spec.kwargs, fig.legend_size)
            )
            box = leg.get_window_extent(renderer)
            if box.height <= min(spec.ax.bbox.y1, height) - PAD:
                continue
            leg.remove()
        _below(fig, spec, renderer, width)


def _below(fig: FittedFigure, spec: _Legend, renderer: Any, width: float) -> None:
    """The legend below the axes in the most columns whose width fits the figure's: found by
    bisection (a legend widens with its columns), so a legend of n entries is built about
    log₂ n times rather than up to n."""
    size = fig.legend_size
    labels = _wrapped_labels(spec.labels, 0.45 * width, renderer, size)
    if spec.ax is None:
        at = None
    else:
        below = spec.ax.xaxis.get_tightbbox(renderer)  # its tick labels and label, if shown
        drop = (spec.ax.bbox.y0 - below.y0 if below is not None else 0.0) + PAD  # px
        down = spec.ax.transAxes + ScaledTranslation(0, -drop / fig.dpi, fig.dpi_scale_trans)
        at = blended_transform_factory(fig.transFigure, down)  # centred in the figure

    def build(ncols: int) -> Any:
        if spec.ax is None:
            return fig.legend(spec.handles, labels, loc="outside lower center", ncols=ncols,
                              fontsize=size)  # fmt: skip
        return spec.ax.legend(spec.handles, labels, title=spec.title, loc="upper center",
                              bbox_to_anchor=(0.5, 0.0), bbox_transform=at, ncols=ncols,
                              fontsize=size, title_fontsize=size, frameon=False)  # fmt: skip

    def fits(leg: Any) -> bool:
        return leg.get_window_extent(renderer).width <= width - 2 * PAD

    key = (id(spec), tuple(labels), round(width), size)
    known = fig.legend_columns.get(key)
    if known is not None:  # a later pass of fit_texts, at the same width: no bisection again
        build(known)
        return
    lo, hi = 1, max(len(labels), 1)  # 1 column is kept whatever its width
    leg, built = build(hi), hi
    if fits(leg):
        fig.legend_columns[key] = hi
        return
    while hi - lo > 1:  # invariant: lo columns fit (or lo = 1), hi do not
        leg.remove()
        mid = (lo + hi) // 2
        leg, built = build(mid), mid
        lo, hi = (mid, hi) if fits(leg) else (lo, mid)
    if built != lo:
        leg.remove()
        build(lo)
    fig.legend_columns[key] = lo


def palette(labels: list[str], sequential: bool) -> dict[str, tuple]:
    """Colours per line: ordered (viridis) for a numeric key such as epoch or depth, else tab10
    (past its 10 colours they repeat, and line_styles tells the repeats apart)."""
    if sequential and len(labels) > 1:
        cmap = matplotlib.colormaps["viridis"]
        return {lab: cmap(0.9 * i / (len(labels) - 1)) for i, lab in enumerate(labels)}
    cycle = matplotlib.colormaps["tab10"].colors  # type: ignore[attr-defined]  # a ListedColormap
    return {lab: cycle[i % len(cycle)] for i, lab in enumerate(labels)}


# (line style, marker) of a line's k-th use of its colour: the first solid with dots, then
# others, so that lines sharing a colour differ in both. "--" is left out: a theory prediction's
# dashed line is drawn in its measurement's colour.
LINE_STYLES: tuple[tuple[Any, str], ...] = (
    ("-", "o"),
    ("-.", "s"),
    (":", "^"),
    ((0, (6, 2, 1, 2, 1, 2)), "D"),
    ((0, (1, 3)), "v"),
    ((0, (8, 3)), "P"),
)


def line_styles(colors: dict) -> dict[str, dict[str, Any]]:
    """The style of each line of `colors` (label → colour, in drawing order): the k-th line of a
    colour gets LINE_STYLES[k], so (colour, style) pairs stay distinct for up to
    len(LINE_STYLES) × the palette's colours lines (60 with tab10)."""
    seen: Counter = Counter()
    out = {}
    for label, color in colors.items():
        key = mcolors.to_hex(color, keep_alpha=True) if color is not None else None
        linestyle, marker = LINE_STYLES[seen[key] % len(LINE_STYLES)]
        seen[key] += 1
        out[label] = {"linestyle": linestyle, "marker": marker}
    return out


def draw_lines(
    ax: Axes,
    lines: dict[str, pd.DataFrame],
    colors: dict,
    *,
    y: str = "mean",
    dashed: bool = False,
    ylog: bool = False,
    stat: str = "mean",
) -> Counter:
    """Each line: its drawable points joined, its band shaded, the others pinned: non-finite
    values, and on a log y axis (`ylog`) values ≤ 0 (a geometric mean of seeds with a 0)."""
    pinned: Counter = Counter()
    styles = line_styles(colors)
    for label, s in lines.items():
        x = s["x"].to_numpy(dtype=float)  # (k,)
        m = s[y].to_numpy(dtype=float)  # (k,)
        c = colors.get(label, "black")
        own = styles.get(label, {"linestyle": "-", "marker": "o"})
        style = dict(linestyle="--", marker=None) if dashed else dict(**own, ms=3)
        shown = np.isfinite(m) & ((m > 0) if ylog else True)
        ax.plot(x, np.where(shown, m, np.nan), color=c, label=label, **style)
        if "lo" in s and np.isfinite(s["lo"]).any():
            ax.fill_between(x, s["lo"], s["hi"], color=c, alpha=0.2, lw=0, gid="band")
        pinned += pin_nonfinite(ax, x, m, c, ylog=ylog)
        if "n_unresolved" in s and not dashed:
            pinned["unresolved"] += mark_unresolved(ax, x, m, s["n_unresolved"].to_numpy(), c,
                                                    shown)  # fmt: skip
    return pinned


def mark_unresolved(
    ax: Axes, x: np.ndarray, m: np.ndarray, n: np.ndarray, color, shown: np.ndarray
) -> int:
    """A hollow ring around each drawn point that has an unresolved seed (`n` > 0: its gap's
    error bar ≥ UNRESOLVED or +∞; series.mark_unresolved); returns how many were marked."""
    mask = (n > 0) & shown
    if mask.any():
        ax.plot(
            x[mask], m[mask], linestyle="none", marker="o", ms=9, markerfacecolor="none",
            markeredgecolor=color, markeredgewidth=1.3, gid="unresolved", label="_nolegend_",
            zorder=4,
        )  # fmt: skip
    return int(mask.sum())


def pin_nonfinite(ax: Axes, x: np.ndarray, m: np.ndarray, color, *, ylog: bool = False) -> Counter:
    """Mark +∞ at the top edge, −∞ at the bottom edge and NaN just above it, at their x; on a log
    axis also finite values ≤ 0, at the bottom edge."""
    edge = blended_transform_factory(ax.transData, ax.transAxes)  # x in data, y in axes
    masks = {"+inf": m == np.inf, "-inf": m == -np.inf, "nan": np.isnan(m)}
    if ylog:
        masks["nonpos"] = np.isfinite(m) & (m <= 0)
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


def finish_lines(
    ax: Axes, pinned: Counter, *, title: str | None, band: str | None, stat: str = "mean"
) -> None:
    """Legend: the lines, the band (its description: `band`, None for no band), and one entry
    per kind of pinned point with its count, naming the statistic (`stat`) pinned."""
    handles, _ = ax.get_legend_handles_labels()
    if band:
        handles.append(Patch(color="0.6", alpha=0.4, label=f"{band} over seeds"))
    for kind, n in pinned.items():
        if kind == "unresolved":
            if n:
                text = (f"unresolved (error bar ≥ {UNRESOLVED:.0%} or +∞ for a seed): "
                        f"{n} point{'s' if n != 1 else ''}")  # fmt: skip
                handles.append(Line2D([], [], linestyle="none", marker="o", ms=8, color="0.3",
                                      markerfacecolor="none", label=text))  # fmt: skip
            continue
        y, marker = PINS[kind]
        text = (
            f"{stat} {PIN_TEXT[kind]}: {n} point{'s' if n != 1 else ''} (at the {PIN_EDGE[kind]})"
        )
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
        legend(ax, handles, title=title)


def add_to_legend(ax: Axes, handle: Any) -> None:
    """One more entry in the axes' legend (made by `legend`)."""
    fig = ax.get_figure()
    specs = [s for s in getattr(fig, "fitted_legends", []) if s.ax is ax]
    if not specs:
        legend(ax, [handle])
        return
    spec = specs[0]
    spec.handles.append(handle)
    spec.labels.append(handle.get_label())
    ax.legend(spec.handles, spec.labels, title=spec.title, **_side(spec.kwargs))


def clip_to_measured(
    ax: Axes, measured: dict[str, pd.DataFrame], predicted: dict[str, pd.DataFrame],
    colors: dict, x_name: str = "ℓ",
) -> str:  # fmt: skip
    """Set the y range from the measured lines (their means and bands, 5% padding, in decades
    on a log axis), so that a prediction falling far below them (an exponential decay to 1e-13)
    does not squash them; the predictions (label → frame(x, value)) are clipped to that range
    and marked by an open triangle at the edge where they leave it (each point outside whose
    predecessor is inside), with a legend entry. Returns a note saying from where and how far
    they leave ("" when none does)."""
    log = ax.get_yscale() == "log"
    parts = [s[c].to_numpy(dtype=float) for s in measured.values() for c in ("mean", "lo", "hi")
             if c in s]  # fmt: skip
    ys = np.concatenate(parts) if parts else np.array([])
    ys = ys[np.isfinite(ys) & ((ys > 0) if log else True)]
    if ys.size == 0:
        return ""
    lo, hi = float(ys.min()), float(ys.max())
    if log:
        a, b = np.log10(lo), np.log10(hi)
        pad = max(0.05 * (b - a), 0.05)
        ylim = (10 ** (a - pad), 10 ** (b + pad))
    else:
        span = hi - lo
        pad = 0.05 * span if span > 0 else max(0.1 * abs(hi), 0.1)
        ylim = (lo - pad, hi + pad)
    ax.set_ylim(*ylim)
    edge = blended_transform_factory(ax.transData, ax.transAxes)
    first: dict[str, float] = {}  # direction → the smallest x where a prediction leaves
    far: dict[str, float] = {}  # direction → the farthest predicted value outside
    for label, d in predicted.items():
        x, v = d["x"].to_numpy(dtype=float), d["value"].to_numpy(dtype=float)
        finite = np.isfinite(v) & ((v > 0) if log else True)  # ≤ 0 on log: pinned already
        for word, out in (("below", finite & (v < ylim[0])), ("above", finite & (v > ylim[1]))):
            if not out.any():
                continue
            leaves = out & ~np.concatenate([[False], out[:-1]])  # (k,) the exits
            y, marker = LEAVES[word]
            ax.plot(
                x[leaves], np.full(leaves.sum(), y), linestyle="none", marker=marker, ms=7,
                markerfacecolor="none", markeredgecolor=colors.get(label, "black"),
                markeredgewidth=1.2, transform=edge, clip_on=False, gid=f"prediction-{word}",
                label="_nolegend_", zorder=4,
            )  # fmt: skip
            first[word] = min(first.get(word, np.inf), float(x[leaves][0]))
            extreme = float(v[out].min() if word == "below" else v[out].max())
            far[word] = min(far.get(word, extreme), extreme) if word == "below" else max(
                far.get(word, extreme), extreme)  # fmt: skip
    if not first:
        return ""
    mark = Line2D([], [], linestyle="none", marker="v", markerfacecolor="none",
                  markeredgecolor="0.3", label="mean field leaves the y range")  # fmt: skip
    add_to_legend(ax, mark)
    return "; ".join(
        f"mean field {word} it from {x_name} = {first[word]:g} (to {far[word]:.2g})"
        for word in first
    )


def set_scales(
    ax: Axes, xs: np.ndarray, *, integer_x: bool = False, xscale: str = "linear",
    yscale: str = "linear",
) -> None:  # fmt: skip
    """Set the chosen scales ("log" or "linear"; service.plots.select.resolve_scale decides);
    a log x axis of few values (swept depths) is labelled at exactly those values, and on a
    linear x axis of counts (epoch, layer, depth) ticks fall on integers."""
    if xscale == "log":
        ax.set_xscale("log")
        ticks = np.unique(xs[np.isfinite(xs) & (xs > 0)])
        if len(ticks) <= 12:  # few swept values (depths): label exactly those, nothing between
            ax.xaxis.set_major_locator(FixedLocator(ticks.tolist()))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
    elif integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=STEPS))
    if yscale == "log":
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
    bar = fig.colorbar(im, ax=ax)
    fit(fig, bar.ax.yaxis.label, label, lambda: bar.ax.bbox.height)
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
        figure_legend(fig, handles)
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


def no_data(heading: str, reason: str) -> Figure:
    fig, (ax,) = new_figure()
    ax.set_axis_off()
    note = ax.text(0.5, 0.5, "", ha="center", va="center", fontsize=13, color="0.3")
    fit(fig, note, f"no data\n{reason}", lambda: 0.9 * fig.bbox.width)
    title(fig, heading)
    return fig


def to_bytes(fig: Figure, fmt: str) -> bytes:
    buf = io.BytesIO()
    meta = {"Date": None} if fmt == "svg" else None  # reproducible SVG
    with DRAWING:  # drawn and encoded while the shared renderer is this figure's (Canvas)
        fig.savefig(buf, format=fmt, dpi=DPI, metadata=meta)
    return buf.getvalue()
