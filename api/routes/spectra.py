"""A trial's stored spectra (service.store.spectra) and their plots:

- `GET /trials/{id}/spectra`: the arrays as JSON, `{"data": [...], "count": N}`;
- `GET /trials/{id}/plots/{kind}`: `spectrum` or `jacobian_spectrum` as PNG or SVG, or as a
  chart's JSON (`format=json`, service.plots.charts_search).

Spectra are per trial (a (rows, columns) array per epoch), not rows of a sweep's tidy frame, so
their plots are trial-scoped; `compare` draws more trials (other depths) beside the first.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel, Field

from api.errors import ERROR_RESPONSES
from api.limits import HeavyReads, get_heavy_reads
from api.routes.deps import INT32_MAX, CacheDep, EpochText, StoreDep, TrialId, parse_epoch
from api.routes.plots import FORMAT_TEXT, IMAGE_RESPONSES, MEDIA
from api.schemas import Real
from service import jsonfmt
from service.config import SPECTRUM_KEYS
from service.plots.charts_search import make_spectrum_chart
from service.plots.spectra import SPECTRUM_PLOT_KINDS, make_spectrum_plot
from service.status import TrialStatus

router = APIRouter(tags=["spectra"])

# trial statuses whose results no longer change (a failed trial may run again)
STABLE = (
    TrialStatus.COMPLETED,
    TrialStatus.DIVERGED,
    TrialStatus.CANCELLED,
    TrialStatus.STOPPED,
)

Name = Annotated[
    str | None,
    Query(
        description=f"one of {', '.join(SPECTRUM_KEYS)} (default: all)",
        json_schema_extra={"enum": list(SPECTRUM_KEYS)},
    ),
]
Epoch = Annotated[EpochText | None, Query(description="a stored epoch, or `last` (default: all)")]


class SpectrumPublic(BaseModel):
    """One stored array: rows are layers ℓ = 1..L (`spectrum/*`: eigenvalues of each Gram,
    descending) or probe samples (`jacobian_singular_values`, descending); one row, that
    `layer`'s, when a layer was asked for."""

    name: str
    epoch: int
    layer: int | None = Field(description="the layer of the single row, when one was chosen")
    shape: list[int] = Field(description="[rows, columns] of `values`")
    values: list[list[Real]]


class SpectraPublic(BaseModel):
    """A trial's stored spectra by name then epoch, and how many."""

    data: list[SpectrumPublic]
    count: int


@router.get("/trials/{trial_id}/spectra", response_model=SpectraPublic, responses=ERROR_RESPONSES)
def read_spectra(
    trial_id: TrialId,
    store: StoreDep,
    name: Name = None,
    epoch: Epoch = None,
    layer: Annotated[
        int | None, Query(ge=1, le=INT32_MAX, description="only layer ℓ of each spectrum/*")
    ] = None,
) -> Response:
    """Gram eigenvalue spectra and input–output Jacobian singular values of a trial."""
    found = store.spectra(trial_id, name=name, epoch=_epoch(epoch), layer=layer)
    data = [
        {
            "name": s.name,
            "epoch": s.epoch,
            "layer": s.layer,
            "shape": list(s.values.shape),
            "values": s.values.tolist(),
        }
        for s in found
    ]
    text = jsonfmt.dumps({"data": data, "count": len(data)}, separators=(",", ":"))
    return Response(text.encode(), media_type="application/json")


Kind = Annotated[
    str,
    Path(
        description=f"one of {', '.join(SPECTRUM_PLOT_KINDS)}",
        json_schema_extra={"enum": list(SPECTRUM_PLOT_KINDS)},
    ),
]


@router.get("/trials/{trial_id}/plots/{kind}", response_class=Response, responses=IMAGE_RESPONSES)
async def read_spectrum_plot(
    trial_id: TrialId,
    kind: Kind,
    store: StoreDep,
    cache: CacheDep,
    heavy: Annotated[HeavyReads, Depends(get_heavy_reads)],
    name: Name = None,
    epoch: Annotated[
        EpochText | None, Query(description="a stored epoch, or `last` (default)")
    ] = None,
    layer: Annotated[
        list[Annotated[int, Field(ge=1, le=INT32_MAX)]] | None,
        Query(description="spectrum: the layers drawn (repeatable; default up to 6)"),
    ] = None,
    compare: Annotated[
        list[Annotated[int, Field(ge=1, le=INT32_MAX)]] | None,
        Query(description="jacobian_spectrum: more trials drawn beside this one (repeatable)"),
    ] = None,
    format: Annotated[Literal["png", "svg", "json"], Query(description=FORMAT_TEXT)] = "png",
) -> Response:
    """A trial's Gram spectra per layer (spectrum) or its Jacobian singular values, with those
    of the `compare` trials (jacobian_spectrum)."""
    at = _epoch(epoch)
    ids = [trial_id, *(compare or [])]
    infos = await run_in_threadpool(lambda: [store.get_trial(t) for t in ids])  # or 404
    version = tuple((i.id, i.status, i.attempts, i.epochs_done, i.last_epoch) for i in infos)
    final = all(i.status in STABLE for i in infos)
    asked = (kind, name, at, tuple(layer or ()), format)

    def draw() -> bytes:
        args: dict[str, Any] = dict(name=name, epoch=at, layers=layer, compare=compare or ())
        if format == "json":
            return make_spectrum_chart(store, trial_id, kind, **args)
        return make_spectrum_plot(store, trial_id, kind, fmt=format, **args)

    image = await heavy.cached(
        cache, ("spectrum-plot", version, asked), draw, final=final,
        timeout_s=heavy.plot_timeout_s, what="the plot",
    )  # fmt: skip
    return Response(image, media_type=MEDIA[format])


def _epoch(value: str | None) -> int | str | None:
    if value is None or value == "last":
        return value
    return parse_epoch(value)
