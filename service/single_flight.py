"""A thread-safe cache that computes a missing key once ("single flight": concurrent misses
of one key wait for the one computation, its result or its error), bounded in bytes, least
recently used entries first. An entry expires after `ttl_s` unless it was stored as final.

Used by the API's read cache (api/cache.py: frames and plots per sweep version) and by the
drawings of service.plots.memo (every entry final: a figure of a frame's content never goes
stale).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

TTL_S = 2.0  # a non-final entry's life, by default
MAX_BYTES = 128 * 2**20
MAX_ITEM_BYTES = 32 * 2**20  # a bigger value is computed but not kept
FOREVER = -1.0  # the time stamp of an entry that does not expire


def size_of(value: Any) -> int:
    if isinstance(value, bytes | bytearray):
        return len(value)
    usage = getattr(value, "memory_usage", None)  # a pandas DataFrame
    if usage is not None:
        return int(usage(index=True, deep=True).sum())
    return 1024


class SingleFlightCache:
    """key → value for TTL_S seconds; `get(key, compute)` computes a missing key once."""

    def __init__(
        self, ttl_s: float = TTL_S, max_bytes: int = MAX_BYTES, max_item_bytes: int = MAX_ITEM_BYTES
    ):
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.max_item_bytes = max_item_bytes
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
        if size > self.max_item_bytes:
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

    def clear(self) -> None:
        """Every entry dropped (computations under way still land)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
