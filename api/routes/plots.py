"""`GET /sweeps/{id}/plots/{kind}`: a figure of a stored sweep as PNG or SVG (docs/plots.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from api.errors import ERROR_RESPONSES
from api.routes.cache import sweep_version
from api.routes.deps import (
    INT32_MAX,
    CacheDep,
    ConfigFilters,
    MetricName,
    StoreDep,
    SweepId,
    frozen,
    parse_epoch,
)
from service.figures import make_plot
from service.plots import PLOT_KINDS

router = APIRouter(tags=["plots"])

MEDIA = {"png": "image/png", "svg": "image/svg+xml"}
DEFAULT_METRIC: dict[str, str | list[str]] = {
    "layer_profile": "isometry_gap/act",
    "depth_scaling": "grad_norm",
    "training_curves": ["train_loss", "test_acc"],
    "heatmap": "isometry_gap/act",
    "theory_overlay": "isometry_gap/norm",
}
RESPONSES = {
    200: {
        "description": "the figure",
        "content": {
            "image/png": {"schema": {"type": "string", "format": "binary"}},
            "image/svg+xml": {"schema": {"type": "string"}},
        },
    },
    **ERROR_RESPONSES,
}
Kind = Annotated[
    str,
    Path(
        description=f"one of {', '.join(PLOT_KINDS)}", json_schema_extra={"enum": list(PLOT_KINDS)}
    ),
]


@router.get("/sweeps/{sweep_id}/plots/{kind}", response_class=Response, responses=RESPONSES)
def read_plot(
    sweep_id: SweepId,
    kind: Kind,
    store: StoreDep,
    cache: CacheDep,
    filters: ConfigFilters,
    metric: Annotated[
        list[MetricName] | None,
        Query(description="the metric (several for training_curves); default per kind"),
    ] = None,
    format: Annotated[Literal["png", "svg"], Query(description="png or svg")] = "png",
    x: Annotated[
        str | None, Query(description="the x axis: a config field, epoch or layer")
    ] = None,
    group_by: Annotated[str | None, Query(description="one line (or row) per value of")] = None,
    epoch: Annotated[str | None, Query(description="a recorded epoch, or `last`")] = None,
    layer: Annotated[
        int | None,
        Query(ge=-INT32_MAX, le=INT32_MAX, description="layer ℓ ≥ 1, or −k: k-th from the end"),
    ] = None,
    trial: Annotated[
        int | None, Query(ge=1, le=INT32_MAX, description="draw only this trial of the sweep")
    ] = None,
) -> Response:
    """A plot of a sweep: layer_profile, depth_scaling, training_curves, heatmap, theory_overlay."""
    metrics = list(metric) if metric else DEFAULT_METRIC.get(kind, [])  # make_plot checks kind
    at = None if epoch is None else "last" if epoch == "last" else parse_epoch(epoch)
    version = sweep_version(store.get_sweep(sweep_id))
    asked = (kind, str(metrics), format, x, group_by, at, layer, trial, frozen(filters))
    options = dict(fmt=format, x=x, group_by=group_by, epoch=at, layer=layer, trial_id=trial)

    def draw() -> bytes:
        return make_plot(store, sweep_id, kind, metric=metrics, where=filters, **options)

    image = cache.get(("plot", sweep_id, version, asked), draw, final=version[0])
    return Response(image, media_type=MEDIA[format])
