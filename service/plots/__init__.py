"""Plots of tidy metric frames (docs/architecture.md, "The tidy frame") as PNG or SVG bytes.

    render("depth_scaling", frame, metric="grad_norm", group_by="init", layer=1) -> bytes

Kinds: layer_profile, depth_scaling, training_curves, heatmap, theory_overlay (docs/plots.md).
The search kinds (SEARCH_PLOT_KINDS: search_history, search_slice, parallel_coordinates,
param_importances, halving_rungs) read a stored sweep's trials, not a frame:
service.plots.search.make_search_plot.
Seeds are pooled by `stat` (mean, geomean, median) with a `band` (ci, std, iqr, none), non-finite
values excluded or propagated (`nonfinite`), on `xscale`/`yscale` auto, log or linear
(service.plots.pooling; PLOT_OPTIONS). Unset, they follow the field (service.plots.defaults).
The series functions return the numbers each kind draws. Matplotlib is imported only when a
figure is built, so importing this package costs the API nothing at start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import pandas as pd

from service.config import METRICS
from service.errors import InvalidInput
from service.plots import memo
from service.plots.defaults import default_pooling, field_default
from service.plots.labels import METRIC_LABELS, field_label
from service.plots.pooling import BANDS, NONFINITE, SCALES, STATS
from service.plots.search import SEARCH_PLOT_KINDS
from service.plots.select import (
    GAP_METRICS,
    Lines,
    Pooling,
    check_choice,
    check_frame,
    check_metric,
    wants_log,
)
from service.plots.series import (
    Grid,
    depth_scaling_series,
    heatmap_axes,
    heatmap_series,
    layer_profile_series,
    theory_lines,
    theory_overlay_series,
    training_curves_series,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "FORMATS",
    "GAP_METRICS",
    "METRIC_LABELS",
    "PLOT_KINDS",
    "PLOT_OPTIONS",
    "PLOT_PARAMETERS",
    "SEARCH_PLOT_KINDS",
    "Grid",
    "Lines",
    "PlotArgs",
    "Pooling",
    "PoolingArgs",
    "build_figure",
    "depth_scaling_series",
    "field_label",
    "heatmap_axes",
    "heatmap_series",
    "layer_profile_series",
    "render",
    "theory_lines",
    "theory_overlay_series",
    "training_curves_series",
    "wants_log",
]

PLOT_KINDS: tuple[str, ...] = (
    "layer_profile",
    "depth_scaling",
    "training_curves",
    "heatmap",
    "theory_overlay",
)
# png and svg are figures; json is the figure's numbers, texts and axes for a browser chart
# (service.plots.charts; docs/api.md, "Plots as JSON")
FORMATS: tuple[str, ...] = ("png", "svg", "json")

# How seeds are pooled and axes scaled: option → its values (None, not given: the field's
# default, service.plots.defaults.default_pooling).
PLOT_OPTIONS: dict[str, tuple[str, ...]] = {
    "stat": STATS,
    "band": BANDS,
    "nonfinite": NONFINITE,
    "xscale": SCALES,
    "yscale": SCALES,
}
_LINES = frozenset(PLOT_OPTIONS)
_CELLS = frozenset({"stat", "nonfinite"})  # a heatmap pools cells; it has no band or y scale

# The optional parameters each kind reads; passing another one is an error, not ignored.
PLOT_PARAMETERS: dict[str, frozenset[str]] = {
    "layer_profile": frozenset({"x", "group_by", "epoch"}) | _LINES,
    "depth_scaling": frozenset({"x", "group_by", "epoch", "layer"}) | _LINES,
    "training_curves": frozenset({"x", "group_by", "layer"}) | _LINES,
    "heatmap": frozenset({"x", "group_by", "epoch", "layer"}) | _CELLS,
    "theory_overlay": frozenset({"x", "group_by", "epoch", "layer", "theory"}) | _LINES,
}


class PoolingArgs(TypedDict, total=False):
    """How seeds are pooled and axes scaled: PLOT_OPTIONS (None or absent: the field's default,
    service.plots.defaults.default_pooling)."""

    stat: str | None
    band: str | None
    nonfinite: str | None
    xscale: str | None
    yscale: str | None


class PlotArgs(PoolingArgs, total=False):
    """The optional arguments of every kind (PLOT_PARAMETERS: which kind takes which)."""

    x: str | None
    group_by: str | None
    epoch: int | None
    layer: int | None
    title: str | None
    theory: dict | None


_GIVEN = ("x", "group_by", "epoch", "layer", "theory")  # what a builder takes as it is given


def render(
    kind: str, frame: pd.DataFrame, *, metric: str | list[str], fmt: str = "png",
    **args: Unpack[PlotArgs],
) -> bytes:  # fmt: skip
    """Draw one plot of a tidy frame and return it as PNG or SVG bytes, or its chart as JSON
    (fmt "json": service.plots.charts, the same numbers and texts).

    An empty frame (or one without rows of the metric) gives a figure saying "no data".
    A drawing of the same frame with the same arguments is drawn once (service.plots.memo).
    `stat`, `band`, `nonfinite`, `xscale`, `yscale`: PLOT_OPTIONS; None = the default:
    geomean on a log y axis for a gap or gradient norm against depth or layer
    (service.plots.defaults.default_pooling), else mean on "auto" axes; the statistic's band
    (ci; iqr for median); non-finite values propagated.

    Raises:
        InvalidInput: an unknown kind, metric or format, a parameter the kind does not take,
            or one the frame cannot serve (a missing column, an unrecorded epoch or layer);
            `field` names it and the message lists the allowed values.
    """
    check_choice(fmt, FORMATS, "format")
    key = memo.key_of(frame, kind, fmt, metric, sorted(args.items()))
    return memo.drawn(key, lambda: _draw(kind, frame, metric, fmt, args))


def _draw(kind: str, frame: pd.DataFrame, metric: Any, fmt: str, args: Any) -> bytes:
    if fmt == "json":
        from service.plots.charts import CHART_BUILDERS, chart_bytes, no_data

        chart = build_with(CHART_BUILDERS, no_data, kind, frame, metric=metric, **args)
        return chart_bytes(kind, chart)
    fig = build_figure(kind, frame, metric=metric, **args)
    from service.plots.draw import to_bytes

    return to_bytes(fig, fmt)


def build_figure(
    kind: str, frame: pd.DataFrame, *, metric: str | list[str], **args: Unpack[PlotArgs]
) -> Figure:
    """The matplotlib Figure that `render` saves (same arguments, no format)."""
    from service.plots import draw
    from service.plots.kinds import BUILDERS

    return build_with(BUILDERS, draw.no_data, kind, frame, metric=metric, **args)


def build_with(
    builders: Mapping[str, Callable[..., Any]],
    no_data: Callable[[str, str], Any],
    kind: str,
    frame: pd.DataFrame,
    *,
    metric: str | list[str],
    **args: Unpack[PlotArgs],
) -> Any:
    """The checks and defaults of every kind, then `builders[kind]` (a figure's, or a chart's:
    service.plots.charts), or `no_data(heading, reason)` for an empty frame: one path, so a
    figure and its JSON refuse the same requests with the same message."""
    for name in args.keys() - PlotArgs.__annotations__.keys():  # as a signature would
        raise TypeError(f"build_with() got an unexpected keyword argument {name!r}")
    check_choice(kind, PLOT_KINDS, "kind")
    metrics = _metrics(kind, metric)
    given: dict[str, Any] = {name: args.get(name) for name in _GIVEN}
    options: dict[str, Any] = {name: args.get(name) for name in PLOT_OPTIONS}
    for name, value in {**given, **options}.items():
        if value is not None and name not in PLOT_PARAMETERS[kind]:
            msg = f"{kind} does not take this parameter"
            raise InvalidInput(msg, field=name, allowed=sorted(PLOT_PARAMETERS[kind]))
    for name, value in options.items():
        if value is not None:
            check_choice(value, PLOT_OPTIONS[name], name)
    x, group_by, title = given["x"], given["group_by"], args.get("title")
    defaults = default_pooling(kind, metrics[0], x, group_by)
    pooling = Pooling.of(
        options["stat"] or defaults["stat"], options["band"], options["nonfinite"] or "propagate"
    )
    field_log = field_default(kind, metrics[0], x, group_by)
    if frame.empty:
        return no_data(title or f"{kind}: {', '.join(metrics)}", "the frame is empty")
    check_frame(frame)
    first = metrics if kind == "training_curves" else metrics[0]
    return builders[kind](
        frame, first, **given, title=title, pooling=pooling, xscale=options["xscale"],
        yscale=options["yscale"], field_log=field_log,
    )  # fmt: skip


def _metrics(kind: str, metric: str | list[str]) -> list[str]:
    metrics = [metric] if isinstance(metric, str) else list(metric)
    if not metrics:
        raise InvalidInput("no metric given", field="metric", allowed=METRICS)
    for m in metrics:
        check_metric(m)
    if len(metrics) > 1 and kind != "training_curves":
        raise InvalidInput(f"{kind} draws one metric, got {len(metrics)}", field="metric")
    return metrics
