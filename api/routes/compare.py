"""`GET /compare/metrics` and `GET /compare/plots/{kind}`: several sweeps in one table or one
figure (docs/api.md, "Comparing sweeps"; service.plots.compare).

The sweeps are repeated `sweep` parameters (`?sweep=3&sweep=4`, at most
service.plots.compare.MAX_COMPARED), each sweep's rows labelled by the `sweep` column: "sweep 3
(norm=batch)", the spec parameters that differ between them. Config filters, metric, epoch and
layer apply to every sweep; each sweep's read is bounded as `GET /sweeps/{id}/metrics` is, and the
whole answer is a heavy read (api/limits.py), cached while the sweeps' versions stand.
"""

from __future__ import annotations

from typing import Annotated, Literal

import pandas as pd
from fastapi import APIRouter, Depends, Path, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import Field

from api.cache import sweep_version
from api.limits import HeavyReads, get_heavy_reads
from api.routes.deps import (
    INT32_MAX,
    CacheDep,
    ConfigFilters,
    EpochQuery,
    EpochText,
    MetricName,
    Offset,
    PooledStat,
    StoreDep,
    frozen,
    parse_epoch,
    parse_epochs,
)
from api.routes.metrics import RESPONSES, Layer, _json_limit, _narrow, frame_answer
from api.routes.plots import (
    FORMAT_TEXT,
    IMAGE_RESPONSES,
    MEDIA,
    BandQuery,
    NonfiniteQuery,
    StatQuery,
    XscaleQuery,
    YscaleQuery,
)
from service.errors import LimitExceeded
from service.plots.compare import (
    COMPARE_KINDS,
    MAX_COMPARED,
    check_compare_kind,
    check_sweep_ids,
    compare_frame,
    compare_metric,
    make_compare_plot,
)
from service.store import Store

router = APIRouter(tags=["compare"])

SweepIds = Annotated[
    list[Annotated[int, Field(ge=1, le=INT32_MAX)]],
    Query(
        description=f"the sweeps compared, repeated: sweep=3&sweep=4 (at most {MAX_COMPARED})",
    ),
]
CompareKind = Annotated[
    str,
    Path(
        description=f"one of {', '.join(COMPARE_KINDS)}",
        json_schema_extra={"enum": list(COMPARE_KINDS)},
    ),
]


async def _versions(store: Store, ids: list[int]) -> tuple[tuple, bool]:
    """Every compared sweep's version (api.cache.sweep_version) and whether all are final."""
    infos = [await run_in_threadpool(store.get_sweep, sid) for sid in ids]
    versions = tuple(sweep_version(info) for info in infos)
    return versions, all(v[0] for v in versions)


@router.get("/compare/metrics", response_model=None, responses=RESPONSES)
async def compare_metrics(
    store: StoreDep,
    cache: CacheDep,
    heavy: Annotated[HeavyReads, Depends(get_heavy_reads)],
    filters: ConfigFilters,
    sweep: SweepIds,
    metric: Annotated[
        list[MetricName] | None, Query(description="metric names (repeatable)")
    ] = None,
    epoch: EpochQuery = None,
    layer: Annotated[list[Layer] | None, Query(description="layers ℓ ≥ 1 (repeatable)")] = None,
    aggregate: Annotated[
        bool, Query(description="pool seeds per sweep: mean, std, ci95, count")
    ] = False,
    stat: PooledStat = "mean",
    format: Annotated[
        Literal["json", "csv", "parquet"], Query(description="json, csv or parquet")
    ] = "json",
    offset: Offset = 0,
    limit: Annotated[int | None, Query(ge=1, description="rows per page (as /metrics)")] = None,
) -> Response:
    """The tidy rows of several sweeps, stacked, with `sweep_id` and `sweep` (its label)."""
    ids = check_sweep_ids(sweep)
    epochs = parse_epochs(epoch)
    if format == "json":
        limit = _json_limit(limit)
    versions, final = await _versions(store, ids)
    asked = (tuple(metric or ()), str(epochs), tuple(layer or ()), frozen(filters), aggregate, stat)
    key = ("compare-metrics", tuple(ids), versions, asked)

    def read() -> pd.DataFrame:
        try:
            frame = compare_frame(
                store, ids, metrics=metric, epoch=epochs, layers=layer, where=filters,
                aggregate=aggregate, stat=stat,
            )  # fmt: skip
        except LimitExceeded as exc:
            raise _narrow(exc) from None
        frame["sweep"] = frame["sweep"].astype(str)  # the label as text in every format
        return frame

    name = "compare-" + "-".join(str(s) for s in ids)
    return await frame_answer(cache, heavy, key, read, final, offset, limit, format, name)


@router.get("/compare/plots/{kind}", response_class=Response, responses=IMAGE_RESPONSES)
async def compare_plot(
    kind: CompareKind,
    store: StoreDep,
    cache: CacheDep,
    heavy: Annotated[HeavyReads, Depends(get_heavy_reads)],
    filters: ConfigFilters,
    sweep: SweepIds,
    metric: Annotated[
        list[MetricName] | None,
        Query(description="the metric (several for training_curves); default per kind"),
    ] = None,
    format: Annotated[Literal["png", "svg", "json"], Query(description=FORMAT_TEXT)] = "png",
    x: Annotated[str | None, Query(description="the x axis (depth_scaling: a field)")] = None,
    group_by: Annotated[
        str | None, Query(description="one line per value of (default: sweep)")
    ] = None,
    epoch: Annotated[EpochText | None, Query(description="a recorded epoch, or `last`")] = None,
    layer: Annotated[
        int | None,
        Query(ge=-INT32_MAX, le=INT32_MAX, description="layer ℓ ≥ 1, or −k: k-th from the end"),
    ] = None,
    stat: StatQuery = None,
    band: BandQuery = None,
    nonfinite: NonfiniteQuery = None,
    xscale: XscaleQuery = None,
    yscale: YscaleQuery = None,
) -> Response:
    """One figure of several sweeps (layer_profile, depth_scaling, training_curves), a line per
    sweep labelled by what differs between their specs."""
    check_compare_kind(kind)
    ids = check_sweep_ids(sweep)
    at = None if epoch is None else "last" if epoch == "last" else parse_epoch(epoch)
    versions, final = await _versions(store, ids)
    metrics = list(metric) if metric else await run_in_threadpool(compare_metric, store, ids, kind)
    options = {"stat": stat, "band": band, "nonfinite": nonfinite, "xscale": xscale,
               "yscale": yscale}  # fmt: skip
    asked = (kind, str(metrics), format, x, group_by, at, layer, frozen(filters),
             tuple(options.values()))  # fmt: skip

    def draw() -> bytes:
        return make_compare_plot(
            store, ids, kind, metric=metrics, fmt=format, x=x, group_by=group_by, epoch=at,
            layer=layer, where=filters, **options,
        )  # fmt: skip

    key = ("compare-plot", tuple(ids), versions, asked)
    image = await heavy.cached(
        cache, key, draw, final=final, timeout_s=heavy.plot_timeout_s, what="the plot"
    )
    return Response(image, media_type=MEDIA[format])
