"""A short-lived cache for the expensive reads (metric frames, rendered plots), so that many
dashboards polling one sweep cost one computation, not one each.

An entry is keyed by the request *and* the sweep's version (status, trial counts, progress),
so a new record, a finished trial or a status change makes a new key at once. A finished sweep
(completed, cancelled, failed) no longer changes: its entries live until evicted. Otherwise an
entry lives TTL_S, the most an answer can lag a change the version does not show (an epoch
rewritten in place by a retried trial). Concurrent misses of one key compute it once ("single
flight"); the others wait for that result or its error. Bounded in bytes; least recently used
entries go first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

from service.status import SweepStatus
from service.store import SweepInfo

TTL_S = 2.0  # the most a cached answer may lag a change the version does not show
MAX_BYTES = 128 * 2**20
MAX_ITEM_BYTES = 32 * 2**20
FOREVER = -1.0  # the time stamp of an entry that does not expire


def sweep_version(info: SweepInfo) -> tuple:
    """What changes whenever a sweep's stored results or states do (from a SweepInfo); its
    first item says whether the sweep is finished (its entries never expire)."""
    counts = tuple(sorted(info.counts.items()))
    done = SweepStatus(info.status).is_finished()
    return (done, info.status, counts, info.progress, info.n_trials)


def size_of(value: Any) -> int:
    if isinstance(value, bytes | bytearray):
        return len(value)
    usage = getattr(value, "memory_usage", None)  # a pandas DataFrame
    if usage is not None:
        return int(usage(index=True, deep=True).sum())
    return 1024


class SingleFlightCache:
    """key → value for TTL_S seconds; `get(key, compute)` computes a missing key once."""

    def __init__(self, ttl_s: float = TTL_S, max_bytes: int = MAX_BYTES):
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[float, int, Any]] = OrderedDict()
        self._inflight: dict[Hashable, Future] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0  # answers that did not compute (tests count them)

    def peek(self, key: Hashable) -> tuple[str, Any]:
        """Without computing: ("hit", value), ("flight", the Future of the computation under
        way) or ("miss", None)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self._live(entry):
                self._entries.move_to_end(key)
                self.hits += 1
                return "hit", entry[2]
            flight = self._inflight.get(key)
            if flight is not None:
                self.hits += 1
                return "flight", flight
        return "miss", None

    def _live(self, entry: tuple[float, int, Any]) -> bool:
        return entry[0] == FOREVER or time.monotonic() - entry[0] < self.ttl_s

    def get(self, key: Hashable, compute: Callable[[], Any], *, final: bool = False) -> Any:
        """The cached value of `key`, or compute() once. `final`: the value cannot go stale
        (a finished sweep's), so it does not expire."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self._live(entry):
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[2]
            found = self._inflight.get(key)
            owner = found is None
            if found is None:
                flight: Future = Future()
                self._inflight[key] = flight
            else:
                flight = found
                self.hits += 1
        if not owner:
            return flight.result()
        try:
            value = compute()
        except BaseException as exc:
            self._land(key)
            flight.set_exception(exc)
            raise
        self._put(key, value, FOREVER if final else time.monotonic())
        self._land(key)
        flight.set_result(value)
        return value

    def _land(self, key: Hashable) -> None:
        with self._lock:
            self._inflight.pop(key, None)

    def _put(self, key: Hashable, value: Any, stamp: float) -> None:
        size = size_of(value)
        if size > MAX_ITEM_BYTES:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (stamp, size, value)
            self._bytes += size
            while self._bytes > self.max_bytes and self._entries:
                _, (_, dropped, _) = self._entries.popitem(last=False)
                self._bytes -= dropped
