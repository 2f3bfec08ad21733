"""`GET /sweeps/{id}/plots/{kind}`: a figure of a stored sweep as PNG or SVG (docs/plots.md), or
its numbers and texts as JSON for a browser chart (`format=json`: api.schemas.ChartPublic,
service.plots.charts; docs/api.md, "Plots as JSON").

Drawn off the event loop within the heavy-read bound and the plot time limit
(api/limits.py). The default metric of each kind is service.plots.defaults, which the
dashboard's default plots use too. `stat`, `band`, `nonfinite`, `xscale`, `yscale` choose how
seeds are pooled and axes scaled (service.plots.PLOT_OPTIONS); an unknown value is a 422 naming
the parameter with its allowed values."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from api.cache import sweep_version
from api.errors import ERROR_RESPONSES
from api.limits import PLOT_RESPONSES, HeavyReads, get_heavy_reads
from api.routes.deps import (
    INT32_MAX,
    CacheDep,
    ConfigFilters,
    EpochText,
    MetricName,
    StoreDep,
    SweepId,
    frozen,
    parse_epoch,
)
from api.schemas import ChartPublic
from service.errors import InvalidInput, NotFound
from service.plots import PLOT_KINDS, PLOT_OPTIONS
from service.plots.charts_search import make_search_chart
from service.plots.defaults import DEFAULT_METRIC, default_metric
from service.plots.search import SEARCH_PARAMETERS, SEARCH_PLOT_KINDS, make_search_plot
from service.plots.stored import make_plot

router = APIRouter(tags=["plots"])
__all__ = ["DEFAULT_METRIC", "router"]

MEDIA = {"png": "image/png", "svg": "image/svg+xml", "json": "application/json"}
# The figure (the images first: a client generator reads the first media type it knows), its
# chart (format=json, after them), or one of the errors (503 busy, 504 too slow included).
IMAGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the figure (png, svg), or its chart's numbers and texts (json)",
        "model": ChartPublic,
        "content": {
            "image/png": {"schema": {"type": "string", "format": "binary"}},
            "image/svg+xml": {"schema": {"type": "string"}},
        },
    },
    **ERROR_RESPONSES,
    **PLOT_RESPONSES,
}
FORMAT_TEXT = "png or svg: the figure; json: its chart (api.schemas.ChartPublic)"
OPTION_TEXT = {
    "stat": "pool seeds by mean, geomean (exp of the mean log) or median; default: geomean for "
    "a gap or gradient norm against depth or layer, else mean",
    "band": "ci (95%; in log space for geomean), std, iqr or none; default ci (median: iqr)",
    "nonfinite": "propagate (default: a +inf seed makes the pooled value +inf, pinned) or "
    "exclude (drop NaN/±inf values of a point and count them in the figure)",
    "xscale": "auto, log or linear; default auto",
    "yscale": "auto, log or linear; default log for a gap or gradient norm against depth or "
    "layer, else auto",
}


def _option(name: str) -> Any:
    """A pooling or scale option's Query: text, checked by service.plots (a 422 naming it, with
    its allowed values and a suggestion), its values listed in the OpenAPI document."""
    return Query(
        description=OPTION_TEXT[name], json_schema_extra={"enum": list(PLOT_OPTIONS[name])}
    )


StatQuery = Annotated[str | None, _option("stat")]
BandQuery = Annotated[str | None, _option("band")]
NonfiniteQuery = Annotated[str | None, _option("nonfinite")]
XscaleQuery = Annotated[str | None, _option("xscale")]
YscaleQuery = Annotated[str | None, _option("yscale")]
ALL_KINDS = (*PLOT_KINDS, *SEARCH_PLOT_KINDS)  # the search kinds: service/plots/search.py
Kind = Annotated[
    str,
    Path(description=f"one of {', '.join(ALL_KINDS)}", json_schema_extra={"enum": list(ALL_KINDS)}),
]


@router.get("/sweeps/{sweep_id}/plots/{kind}", response_class=Response, responses=IMAGE_RESPONSES)
async def read_plot(
    sweep_id: SweepId,
    kind: Kind,
    store: StoreDep,
    cache: CacheDep,
    heavy: Annotated[HeavyReads, Depends(get_heavy_reads)],
    filters: ConfigFilters,
    metric: Annotated[
        list[MetricName] | None,
        Query(description="the metric (several for training_curves); default per kind"),
    ] = None,
    format: Annotated[Literal["png", "svg", "json"], Query(description=FORMAT_TEXT)] = "png",
    x: Annotated[
        str | None, Query(description="the x axis: a config field, epoch or layer")
    ] = None,
    group_by: Annotated[str | None, Query(description="one line (or row) per value of")] = None,
    epoch: Annotated[EpochText | None, Query(description="a recorded epoch, or `last`")] = None,
    layer: Annotated[
        int | None,
        Query(ge=-INT32_MAX, le=INT32_MAX, description="layer ℓ ≥ 1, or −k: k-th from the end"),
    ] = None,
    trial: Annotated[
        int | None, Query(ge=1, le=INT32_MAX, description="draw only this trial of the sweep")
    ] = None,
    stat: StatQuery = None,
    band: BandQuery = None,
    nonfinite: NonfiniteQuery = None,
    xscale: XscaleQuery = None,
    yscale: YscaleQuery = None,
    mode: Annotated[
        Literal["min", "max"] | None,
        Query(description="the search kinds' objective: min or max (default: the search's)"),
    ] = None,
) -> Response:
    """A plot of a sweep: layer_profile, depth_scaling, training_curves, heatmap, theory_overlay;
    of its search: search_history, search_slice, parallel_coordinates, param_importances,
    halving_rungs (docs/plots.md, "Searches you can read")."""
    if kind not in ALL_KINDS:
        raise NotFound(f"no plot kind {kind!r} (kinds: {', '.join(ALL_KINDS)})")
    at = None if epoch is None else "last" if epoch == "last" else parse_epoch(epoch)
    info = await run_in_threadpool(store.get_sweep, sweep_id)
    version = sweep_version(info)
    if kind in SEARCH_PLOT_KINDS:
        objective = list(metric or [])
        others = {"x": x, "group_by": group_by, "trial": trial, "stat": stat, "band": band,
                  "nonfinite": nonfinite, "xscale": xscale, "yscale": yscale}  # fmt: skip
        search_draw = _search_draw(
            store, sweep_id, kind, objective, format, filters, at, layer, mode, others
        )
        asked: tuple = (kind, str(objective), format, at, layer, mode, yscale, frozen(filters))
        image = await heavy.cached(
            cache, ("plot", sweep_id, version, asked), search_draw, final=version[0],
            timeout_s=heavy.plot_timeout_s, what="the plot",
        )  # fmt: skip
        return Response(image, media_type=MEDIA[format])
    if mode is not None:
        raise InvalidInput(f"{kind} does not take this parameter", field="mode")
    metrics = list(metric) if metric else default_metric(kind, info.spec)  # make_plot checks kind
    options = {"stat": stat, "band": band, "nonfinite": nonfinite, "xscale": xscale,
               "yscale": yscale}  # fmt: skip
    asked = (kind, str(metrics), format, x, group_by, at, layer, trial, frozen(filters),
             tuple(options.values()))  # fmt: skip

    def draw() -> bytes:
        return make_plot(
            store, sweep_id, kind, metric=metrics, where=filters, fmt=format, x=x,
            group_by=group_by, epoch=at, layer=layer, trial_id=trial, **options,
        )  # fmt: skip

    key = ("plot", sweep_id, version, asked)
    image = await heavy.cached(
        cache, key, draw, final=version[0], timeout_s=heavy.plot_timeout_s, what="the plot"
    )
    return Response(image, media_type=MEDIA[format])


def _search_draw(
    store: Any, sweep_id: int, kind: str, metrics: list[str], fmt: str, filters: Any,
    epoch: Any, layer: int | None, mode: str | None, others: dict[str, Any],
) -> Any:  # fmt: skip
    """The drawing of a search kind (service.plots.search), after refusing (422) what it does
    not take: a parameter of the other kinds, or more than one metric."""
    for name, value in others.items():
        if value is not None and name not in SEARCH_PARAMETERS[kind]:
            allowed = sorted(SEARCH_PARAMETERS[kind])
            raise InvalidInput(f"{kind} does not take this parameter", field=name, allowed=allowed)
    if len(metrics) > 1:
        raise InvalidInput(f"{kind} draws one objective, got {len(metrics)}", field="metric")

    def draw() -> bytes:
        args: dict[str, Any] = dict(
            metric=metrics[0] if metrics else None, mode=mode, epoch=epoch, layer=layer,
            yscale=others["yscale"], where=filters,
        )  # fmt: skip
        if fmt == "json":
            return make_search_chart(store, sweep_id, kind, **args)
        return make_search_plot(store, sweep_id, kind, fmt=fmt, **args)

    return draw
