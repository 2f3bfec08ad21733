"""`GET /sweeps/{id}/metrics`: the tidy frame of a sweep, filtered, optionally pooled over seeds,
as JSON rows (paged), streamed CSV or Parquet. Every answer is bounded: the store refuses a
query over ISOSWEEP_MAX_POINTS values, and a JSON page holds at most MAX_JSON_ROWS rows. Reading
the frame, and encoding (or streaming) one over LIGHT_ROWS rows, is a heavy read: within
ISOSWEEP_MAX_HEAVY_READS for the whole process, off the event loop (api/limits.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterator
from typing import Annotated, Any, Literal

import pandas as pd
from fastapi import APIRouter, Depends, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse
from pydantic import Field

from api.cache import SingleFlightCache, sweep_version
from api.errors import ERROR_RESPONSES
from api.limits import BUSY_RESPONSES, LIGHT_ROWS, HeavyReads, get_heavy_reads
from api.routes.deps import (
    INT32_MAX,
    CacheDep,
    ConfigFilters,
    EpochQuery,
    MetricName,
    Offset,
    PooledStat,
    StoreDep,
    SweepId,
    frozen,
    parse_epochs,
)
from api.schemas import MetricsPublic
from api.tables import csv_chunks, json_rows, parquet_bytes
from service.errors import LimitExceeded
from service.jsonfmt import to_jsonable
from service.param_columns import FIELD as PARAMS

router = APIRouter(tags=["metrics"])

DEFAULT_JSON_ROWS = 10_000
MAX_JSON_ROWS = 100_000
PARQUET = "application/vnd.apache.parquet"

Layer = Annotated[int, Field(ge=1, le=INT32_MAX)]

RESPONSES = {
    200: {
        "model": MetricsPublic,
        "description": "JSON rows (format=json), CSV (format=csv) or Parquet (format=parquet)",
        "content": {
            "text/csv": {"schema": {"type": "string"}},
            PARQUET: {"schema": {"type": "string", "format": "binary"}},
        },
    },
    **ERROR_RESPONSES,
    **BUSY_RESPONSES,
}


@router.get("/sweeps/{sweep_id}/metrics", response_model=None, responses=RESPONSES)
async def read_metrics(
    sweep_id: SweepId,
    store: StoreDep,
    cache: CacheDep,
    heavy: Annotated[HeavyReads, Depends(get_heavy_reads)],
    filters: ConfigFilters,
    metric: Annotated[
        list[MetricName] | None, Query(description="metric names (repeatable)")
    ] = None,
    epoch: EpochQuery = None,
    layer: Annotated[list[Layer] | None, Query(description="layers ℓ ≥ 1 (repeatable)")] = None,
    aggregate: Annotated[bool, Query(description="pool seeds: mean, std, ci95, count")] = False,
    stat: PooledStat = "mean",
    trial: Annotated[
        int | None, Query(ge=1, le=INT32_MAX, description="this trial of the sweep only")
    ] = None,
    format: Annotated[
        Literal["json", "csv", "parquet"], Query(description="json, csv or parquet")
    ] = "json",
    offset: Offset = 0,
    limit: Annotated[
        int | None,
        Query(
            ge=1,
            description=f"rows per page (JSON: default {DEFAULT_JSON_ROWS}, ≤ {MAX_JSON_ROWS})",
        ),
    ] = None,
) -> Response:
    """Tidy rows of a sweep filtered by config, metric, epoch and layer: JSON, CSV or Parquet."""
    epochs = parse_epochs(epoch)
    if format == "json":
        limit = _json_limit(limit)
    version = sweep_version(await run_in_threadpool(store.get_sweep, sweep_id))
    asked = (tuple(metric or ()), str(epochs), tuple(layer or ()), frozen(filters), aggregate, stat,
             trial)  # fmt: skip
    key = ("metrics", sweep_id, version, asked)  # one store (and one cache) per app

    def read() -> pd.DataFrame:
        try:
            return store.read_metrics(
                sweep_id,
                metrics=metric,
                epoch=epochs,
                layers=layer,
                where=filters,
                aggregate=aggregate,
                stat=stat,
                trial=trial,
            )
        except LimitExceeded as exc:
            raise _narrow(exc) from None

    name = f"sweep-{sweep_id}-metrics"
    return await frame_answer(cache, heavy, key, read, version[0], offset, limit, format, name)


async def frame_answer(
    cache: SingleFlightCache,
    heavy: HeavyReads,
    key: Hashable,
    read: Callable[[], pd.DataFrame],
    final: bool,
    offset: int,
    limit: int | None,
    format: str,
    name: str,
) -> Response:
    """The page [offset, offset + limit) of the frame read() gives (cached under `key`), as
    CSV (streamed), Parquet or JSON. A small cached page is answered without a heavy-read
    slot; a miss or a big page is read and encoded in one slot, so that a request waiting in
    the heavy-read queue holds no frame."""

    def page(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
        return frame.iloc[offset : offset + limit if limit is not None else None], len(frame)

    state, found = cache.peek(key)
    if state == "flight":  # another request is reading it: wait for that, holding no slot
        found, state = await heavy.wait(found, None, "the read"), "hit"
    if state == "hit":
        rows, total = page(found)
        if len(rows) <= LIGHT_ROWS:
            return await _answer(rows, total, format, name)
        del found, rows  # not held while this request waits for a slot

    def frame_of() -> tuple[pd.DataFrame, int]:
        return page(cache.get(key, read, final=final))

    if format == "csv":
        (rows, total), release = await heavy.run_holding(frame_of)
        return _csv_response(csv_chunks(rows), total, name, release)
    body, total = await heavy.run(lambda: _encoded(*frame_of(), format))
    return _body_response(body, total, format, name)


async def _answer(frame: pd.DataFrame, total: int, format: str, name: str) -> Response:
    """A small page (≤ LIGHT_ROWS) as CSV (streamed), Parquet or JSON, on the light routes'
    threadpool."""
    if format == "csv":
        return _csv_response(csv_chunks(frame), total, name)
    body, _ = await run_in_threadpool(_encoded, frame, total, format)
    return _body_response(body, total, format, name)


def _encoded(frame: pd.DataFrame, total: int, format: str) -> tuple[bytes, int]:
    return (parquet_bytes(frame) if format == "parquet" else _json(frame, total)), total


def _csv_response(
    chunks: Iterator[bytes], total: int, name: str, release: Callable[[], None] | None = None
) -> Response:
    """The CSV stream; with `release`, it holds a heavy-read slot until it ends."""
    headers = {"X-Total-Count": str(total)}
    headers["Content-Disposition"] = f'attachment; filename="{name}.csv"'
    if release is None:
        return StreamingResponse(chunks, media_type="text/csv", headers=headers)
    return _HeldResponse(_Held(chunks, release), headers)


class _HeldResponse(StreamingResponse):
    """A stream of _Held chunks whose slot is given back when the response ends, however it
    ends: sent, failed, or cut short by a client that hung up (Starlette then stops iterating
    without closing the iterator, which would keep the slot until a garbage collection)."""

    def __init__(self, held: _Held, headers: dict[str, str]):
        super().__init__(held, media_type="text/csv", headers=headers)
        self.held = held

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.held.release()


def _body_response(body: bytes, total: int, format: str, name: str) -> Response:
    headers = {"X-Total-Count": str(total)}
    if format == "parquet":
        headers["Content-Disposition"] = f'attachment; filename="{name}.parquet"'
        return Response(body, media_type=PARQUET, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


def _json(frame: pd.DataFrame, total: int) -> bytes:
    rows = json_rows(frame)
    if PARAMS in frame.columns:  # its canonical JSON text (service.param_columns) as an object
        documents = {text: to_jsonable(json.loads(text)) for text in frame[PARAMS].unique()}
        for row in rows:
            row[PARAMS] = documents[row[PARAMS]]
    body: dict[str, Any] = {"data": rows, "count": total}
    body["columns"] = list(frame.columns)
    text = json.dumps(body, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return text.encode()


class _Held:
    """The chunks, holding a heavy-read slot until the last is sent or the stream is dropped
    (closed, its _HeldResponse ended, or collected unstarted). Sync, so Starlette iterates it
    off the event loop."""

    def __init__(self, chunks: Iterator[bytes], release: Callable[[], None]):
        self._chunks = chunks
        self.release = release  # idempotent

    def __iter__(self) -> _Held:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._chunks)
        except BaseException:
            self.release()
            raise

    def close(self) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def _json_limit(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_JSON_ROWS
    if limit > MAX_JSON_ROWS:
        raise LimitExceeded(
            f"{limit} rows is over the JSON page limit of {MAX_JSON_ROWS}; page with offset, "
            "or ask for format=csv or parquet",
            field="limit",
        )
    return limit


def _narrow(exc: LimitExceeded) -> LimitExceeded:
    """The store's bound, said in this route's own parameter names."""
    head = exc.message.removeprefix("max_points: ").split("; narrow")[0]
    return LimitExceeded(
        f"{head}; narrow it with metric=…, epoch=last (or numbers), layer=… or config filters "
        "(e.g. depth=…, seed=0)",
        field="max_points",
    )
