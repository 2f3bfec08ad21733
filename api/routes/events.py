"""`GET /sweeps/{id}/events`: a sweep's progress and finished trials as server-sent events
(docs/api.md, "Live").

The server polls the store every POLL_S seconds (one sweep read; the sweep's finished trials only
when their count changed) and sends

    event: progress     data: the sweep, as GET /sweeps/{id} answers it (status, counts,
                        progress, eta_s, …), first at once, then whenever it changes
    event: trial        data: a trial that finished since the stream began, as GET
                        /trials/{id} answers it (status, summary, last_epoch, …)
    event: end          data: the final sweep, when it is completed, cancelled or failed;
                        then the stream closes

and a comment line (`: keep-alive`) every KEEPALIVE_S seconds of silence, so that a proxy does
not drop an idle stream. Events carry `id:` numbers in order. At most MAX_STREAMS streams are
open at once (a 503 beyond); a stream ends when its client goes away. The route is in the
OpenAPI document (a text/event-stream answer) and described in docs/api.md; the property-based
client of the document (tests/api/test_fuzz.py) leaves it out, since it reads each answer to
its end and a stream of an unfinished sweep has none.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from api.errors import ERROR_RESPONSES
from api.routes.deps import StoreDep, SweepId
from api.routes.sweeps import sweep_public, trial_public
from service import jsonfmt
from service.status import SweepStatus, TrialStatus
from service.store import Store

router = APIRouter(tags=["sweeps"])

POLL_S = 1.0  # how often a stream reads the store
KEEPALIVE_S = 15.0  # a comment line after this long without an event
MAX_STREAMS = 64  # open event streams, over every sweep
FINISHED = tuple(s.value for s in TrialStatus if s.is_finished())
EVENTS_RESPONSES = {
    200: {
        "description": "text/event-stream: `progress`, `trial` and `end` events (JSON data)",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    **ERROR_RESPONSES,
    503: {"description": f"{MAX_STREAMS} event streams are open already; retry later"},
}

_open = 0
_lock = threading.Lock()


def _take() -> None:
    global _open
    with _lock:
        if _open >= MAX_STREAMS:
            raise HTTPException(
                503,
                f"{MAX_STREAMS} event streams are open, the most this server keeps; retry later "
                "or poll GET /sweeps/{id}",
                headers={"Retry-After": "5"},
            )
        _open += 1


def _give() -> None:
    global _open
    with _lock:
        _open -= 1


def event(name: str, data: Any, seq: int) -> bytes:
    """One server-sent event: `id`, `event` and one `data` line of JSON (NaN/±inf as the API
    spells them)."""
    text = jsonfmt.dumps(data) if not isinstance(data, str) else json.dumps(data)
    return f"id: {seq}\nevent: {name}\ndata: {text}\n\n".encode()


def _finished_trials(store: Store, sweep_id: int) -> list[dict[str, Any]]:
    """Every finished trial of the sweep, as the API describes it, page by page."""
    size = store.settings.max_page_size
    out: list[dict[str, Any]] = []
    for status in FINISHED:
        offset = 0
        while True:
            page, total = store.list_trials(sweep_id, status=status, offset=offset, limit=size)
            out += [trial_public(t).model_dump(mode="json") for t in page]
            offset += len(page)
            if offset >= total or not page:
                break
    return out


def _sweep_json(store: Store, sweep_id: int) -> dict[str, Any]:
    return sweep_public(store.get_sweep(sweep_id)).model_dump(mode="json")


@router.get("/sweeps/{sweep_id}/events", response_class=StreamingResponse,
            responses=EVENTS_RESPONSES)  # fmt: skip
async def sweep_events(sweep_id: SweepId, request: Request, store: StoreDep) -> StreamingResponse:
    """A sweep's progress and its newly finished trials as server-sent events, until it ends."""
    first = await run_in_threadpool(_sweep_json, store, sweep_id)  # a 404 before the stream
    _take()
    return StreamingResponse(
        _stream(store, sweep_id, first, request),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _stream(
    store: Store, sweep_id: int, sweep: dict[str, Any], request: Request
) -> AsyncIterator[bytes]:
    seq = 0
    try:
        seen = {t["id"] for t in await run_in_threadpool(_finished_trials, store, sweep_id)}
        done = _n_finished(sweep)
        yield event("progress", sweep, seq := seq + 1)
        last = _version(sweep)
        quiet = 0.0
        while not SweepStatus(sweep["status"]).is_finished():
            await asyncio.sleep(POLL_S)
            if await request.is_disconnected():
                return
            sweep = await run_in_threadpool(_sweep_json, store, sweep_id)
            if _n_finished(sweep) != done:
                done = _n_finished(sweep)
                for t in await run_in_threadpool(_finished_trials, store, sweep_id):
                    if t["id"] not in seen:
                        seen.add(t["id"])
                        yield event("trial", t, seq := seq + 1)
                        quiet = 0.0
            if _version(sweep) != last:
                last = _version(sweep)
                yield event("progress", sweep, seq := seq + 1)
                quiet = 0.0
            else:
                quiet += POLL_S
                if quiet >= KEEPALIVE_S:
                    yield b": keep-alive\n\n"
                    quiet = 0.0
        yield event("end", sweep, seq := seq + 1)
    finally:
        _give()


def _n_finished(sweep: dict[str, Any]) -> int:
    return sum(sweep["counts"].get(s, 0) for s in FINISHED)


def _version(sweep: dict[str, Any]) -> tuple:
    return (sweep["status"], tuple(sorted(sweep["counts"].items())), sweep["progress"],
            sweep["cancel_requested"])  # fmt: skip
