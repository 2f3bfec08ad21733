"""One bound, for the whole process, on the heavy reads: metric frames (JSON, CSV, Parquet) and
plots. At most Settings.max_heavy_reads of them compute at once, each on a worker thread of
their own pool (never on the event loop, never in the threadpool the light routes share), so
/healthz, status and paging answer while they run. Up to Settings.heavy_read_queue more wait
for a slot, first come first served (a dashboard page asks for several charts at once, and a
burst of them should be answered late rather than refused); past that, a 503 with Retry-After
at once, not a queue that grows with the load. A plot that takes over Settings.plot_timeout_s
(waiting included) is a 504; its work goes on in the background, still counted against the
bound, and lands in the read cache for the retry.

Throttles (`Throttle`): failed logins per client address and in all (the login form and wrong
bearer tokens, api/guards.py and api/dashboard/login.py: a 429 with Retry-After, nothing
compared while it lasts), and `rate_limited(...)`, the same mechanism as a dependency for any
route that wants its callers bounded.

A cached answer (or one another request is computing: the cache's single flight) costs no
slot. When the last heavy read ends, the C heap's free pages go back to the OS
(malloc_trim(0) on glibc), so that the process's RSS falls back after a burst.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request
from starlette.exceptions import HTTPException

from api.cache import SingleFlightCache
from service.settings import Settings

T = TypeVar("T")
RETRY_AFTER_S = 2  # what a refused heavy read is told to wait
LIGHT_ROWS = 10_000  # a cached frame this small is served without a slot

BUSY_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: {
        "description": "the database is unreachable, or ISOSWEEP_MAX_HEAVY_READS heavy reads "
        "are running and ISOSWEEP_HEAVY_READ_QUEUE more are waiting (then with Retry-After)"
    },
}
PLOT_RESPONSES: dict[int | str, dict[str, Any]] = {
    **BUSY_RESPONSES,
    504: {"description": "the plot took over ISOSWEEP_PLOT_TIMEOUT_S; retry shortly"},
}


def _malloc_trim() -> Callable[[], Any] | None:
    """glibc's malloc_trim(0), or None on another C library."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


MALLOC_TRIM = _malloc_trim()


class HeavyReads:
    """At most `limit` heavy reads compute at once (slots), on a pool of `limit` threads; up to
    `queue` more wait for a slot in the pool's queue; one more is refused (503)."""

    def __init__(self, limit: int, plot_timeout_s: float, queue: int = 0):
        self.limit, self.queue = limit, queue
        self.plot_timeout_s = plot_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="isosweep-heavy")
        self._slots = threading.Semaphore(limit)  # held while computing (or streaming)
        self._lock = threading.Lock()
        self.admitted = 0  # computing, streaming, or waiting for a slot
        self.refused = 0  # 503s so far (tests count them)
        self.trims = 0  # malloc_trim calls so far

    def _refuse(self) -> HTTPException:
        self.refused += 1
        return HTTPException(
            503,
            f"the server is busy: {self.limit} heavy reads (metrics, CSV, Parquet, plots) are "
            f"running and {self.queue} more waiting, the most ISOSWEEP_MAX_HEAVY_READS and "
            f"ISOSWEEP_HEAVY_READ_QUEUE allow; retry after {RETRY_AFTER_S} s",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    def _submit(self, fn: Callable[[], T], *, hold: bool) -> tuple[Future, Callable[[], None]]:
        """Admit fn (or raise the 503) and queue it for a slot. Returns its job and the slot's
        release (idempotent, from any thread), which the job calls itself when fn fails or,
        unless `hold`, when fn returns."""
        with self._lock:
            if self.admitted >= self.limit + self.queue:
                raise self._refuse()
            self.admitted += 1
        once = threading.Lock()

        def leave() -> None:
            with self._lock:
                self.admitted -= 1
                idle = self.admitted == 0
            if idle and MALLOC_TRIM is not None:
                MALLOC_TRIM()
                self.trims += 1

        def release() -> None:
            if once.acquire(blocking=False):  # the first call only, whichever thread makes it
                self._slots.release()
                leave()

        def in_slot() -> T:
            self._slots.acquire()  # a pool thread waits here only while streams hold slots
            try:
                result = fn()
            except BaseException:
                release()
                raise
            if not hold:
                release()
            return result

        try:
            job = self._pool.submit(in_slot)
        except BaseException:
            leave()
            raise
        return job, release

    async def run_holding(self, fn: Callable[[], T]) -> tuple[T, Callable[[], None]]:
        """fn() on a heavy-read worker once a slot is free, as `run`, but the slot stays held
        after fn returns, until the returned release is called (idempotent): a streamed CSV
        holds it until its last chunk is sent."""
        job, release = self._submit(fn, hold=True)
        try:
            result = await asyncio.shield(asyncio.wrap_future(job))
        except asyncio.CancelledError:  # the request went away: the slot goes back once taken
            job.add_done_callback(lambda _: release())
            raise
        return result, release

    async def run(
        self, fn: Callable[[], T], *, timeout_s: float | None = None, what: str = "the read"
    ) -> T:
        """fn() on a heavy-read worker, once a slot is free (waiting in the queue until then)."""
        job, _ = self._submit(fn, hold=False)
        return await self.wait(job, timeout_s, what)

    async def wait(self, job: Future, timeout_s: float | None, what: str) -> Any:
        """The job's result; past timeout_s a 504 (the job itself goes on)."""
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job)), timeout_s)
        except TimeoutError:
            raise HTTPException(
                504,
                f"{what} took over {timeout_s:g} s (ISOSWEEP_PLOT_TIMEOUT_S); it goes on in the "
                "background and is cached when done: retry shortly, or narrow it (filters, one "
                "epoch, one layer)",
            ) from None

    async def cached(
        self,
        cache: SingleFlightCache,
        key: Hashable,
        compute: Callable[[], Any],
        *,
        final: bool,
        timeout_s: float | None = None,
        what: str = "the read",
    ) -> Any:
        """cache.get(key, compute) with a slot only for a miss: a hit, or a key another request
        is computing, is waited for on the event loop."""
        state, found = cache.peek(key)
        if state == "hit":
            return found
        if state == "flight":
            return await self.wait(found, timeout_s, what)
        return await self.run(
            lambda: cache.get(key, compute, final=final), timeout_s=timeout_s, what=what
        )


def make_heavy_reads(settings: Settings) -> HeavyReads:
    return HeavyReads(
        settings.max_heavy_reads, settings.plot_timeout_s, queue=settings.heavy_read_queue
    )


async def get_heavy_reads(request: Request) -> HeavyReads:
    """The app's HeavyReads, made on first use (on the event loop: no race)."""
    state = request.app.state
    heavy = getattr(state, "heavy_reads", None)
    if heavy is None:
        heavy = state.heavy_reads = make_heavy_reads(state.settings)
    return heavy


# --- throttles: failed logins, and any route that wants a bound on its callers ---------------


class Throttle:
    """Events (failed logins, or requests) per key — a client's address — in a sliding window
    of `window_s`: at `per_key` events of one key, or `total` of all keys together, the key
    must wait until the oldest event that counts leaves the window. Each key keeps at most
    `per_key` times and the whole at most `total` (deques), and at most `max_keys` keys are
    remembered (the least recently seen forgotten first): memory stays bounded whatever the
    number of addresses. Thread-safe.

        t = Throttle(per_key=10, total=100, window_s=60)
        if (wait := t.retry_after(address)) is not None: refuse, Retry-After: wait
        ...; t.failed(address)   # or t.succeeded(address), which forgets the key's events
    """

    def __init__(
        self,
        per_key: int,
        total: int,
        window_s: float,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.per_key, self.total, self.window_s = per_key, total, window_s
        self.max_keys, self.clock = max_keys, clock
        self._keys: OrderedDict[str, deque[float]] = OrderedDict()
        self._all: deque[float] = deque(maxlen=total)
        self._lock = threading.Lock()
        self.refused = 0  # 429s so far

    def _trim(self, times: deque[float], now: float) -> None:
        while times and times[0] <= now - self.window_s:
            times.popleft()

    def retry_after(self, key: str) -> int | None:
        """Whole seconds `key` must wait (≥ 1), or None when it may go on now."""
        with self._lock:
            now = self.clock()
            self._trim(self._all, now)
            waits = []
            if len(self._all) >= self.total:
                waits.append(self._all[0] + self.window_s - now)
            times = self._keys.get(key)
            if times is not None:
                self._trim(times, now)
                if len(times) >= self.per_key:
                    waits.append(times[0] + self.window_s - now)
            if not waits:
                return None
            self.refused += 1
            return max(1, math.ceil(max(waits)))

    def failed(self, key: str) -> None:
        """Count one event of `key`."""
        with self._lock:
            now = self.clock()
            times = self._keys.pop(key, None)
            if times is None:
                times = deque(maxlen=self.per_key)
            times.append(now)
            self._keys[key] = times  # most recently seen last
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
            self._all.append(now)

    hit = failed  # a rate limit counts every request, not only failures

    def succeeded(self, key: str) -> None:
        """Forget `key`'s own events (its right token came); the count of all keeps them."""
        with self._lock:
            self._keys.pop(key, None)

    def failures(self, key: str) -> list[float]:
        with self._lock:
            return list(self._keys.get(key, ()))

    def keys(self) -> int:
        with self._lock:
            return len(self._keys)


def too_many(what: str, retry_after_s: int) -> HTTPException:
    """The 429 a throttled request gets (Retry-After in whole seconds)."""
    return HTTPException(
        429,
        f"{what}: retry after {retry_after_s} s",
        headers={"Retry-After": str(retry_after_s)},
    )


def login_throttle(settings: Settings) -> Throttle:
    """The throttle of failed logins (the login form and wrong bearer tokens share it)."""
    return Throttle(
        settings.login_failures_per_address, settings.login_failures_total, settings.login_window_s
    )


def client_key(request_or_scope: Request | MutableMapping[str, Any]) -> str:
    """The key a throttle counts a request under: its client's address."""
    client = (
        request_or_scope.client
        if isinstance(request_or_scope, Request)
        else request_or_scope.get("client")
    )
    if client is None:
        return "?"
    return str(client[0] if isinstance(client, tuple | list) else client.host)


def rate_limited(name: str, per_key: int, total: int, window_s: float) -> Callable[[Request], Any]:
    """A dependency that bounds a route's callers: each request counts (by client address), and
    past `per_key` from one address or `total` from all within `window_s` it is a 429 with
    Retry-After. One throttle per `name` and app (app.state.throttles).

        @router.post("/sweeps", dependencies=[Depends(rate_limited("submit", 30, 300, 60))])
    """

    async def check(request: Request) -> None:
        state = request.app.state
        throttles = getattr(state, "throttles", None)
        if throttles is None:
            throttles = state.throttles = {}
        throttle = throttles.get(name)
        if throttle is None:
            throttle = throttles[name] = Throttle(per_key, total, window_s)
        key = client_key(request)
        wait = throttle.retry_after(key)
        if wait is not None:
            raise too_many(f"too many {name} requests", wait)
        throttle.hit(key)

    return check
