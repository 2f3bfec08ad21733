"""The drawings already made, by what they were drawn from: `render`'s kind, format and
arguments and the content of its frame (every cell, the column names and dtypes, the index, in
order). Requests that read the same rows draw the same figure: a filter that every trial of the
sweep passes (`where optimizer=sgd` on a sweep of SGD trials), a trial page's figure that the
sweep page drew, a PNG asked for again after its request's cache entry expired. The figure
depends on nothing else (matplotlib's settings are the module's, fixed at import), so a
drawing made once serves them all, in any process-wide order.

Bounded in bytes, least recently used first; concurrent requests for one drawing draw it
once (service.single_flight). A frame that cannot be hashed (an object column of
unhashable values pandas cannot stringify) is drawn each time.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pandas as pd

from service.single_flight import SingleFlightCache

MAX_BYTES = 64 * 2**20
MAX_ITEM_BYTES = 8 * 2**20  # a bigger drawing is not kept
# Every drawing is kept as final: a figure of a frame's content does not go stale.
cache = SingleFlightCache(max_bytes=MAX_BYTES, max_item_bytes=MAX_ITEM_BYTES)
_lock = threading.Lock()
_bypass = 0  # > 0: draw everything (bypassed())


def key_of(frame: pd.DataFrame, *parts: Any) -> bytes | None:
    """A digest of the frame's content and `parts` (picklable), or None when it has none."""
    try:
        rows = pd.util.hash_pandas_object(frame, index=True).to_numpy()
        head = pickle.dumps(
            (parts, list(map(str, frame.columns)), list(map(str, frame.dtypes)), frame.shape),
            protocol=5,
        )
    except (TypeError, ValueError, AttributeError, pickle.PicklingError):
        return None
    return hashlib.blake2b(head + rows.tobytes(), digest_size=20).digest()


def drawn(key: bytes | None, draw: Callable[[], bytes]) -> bytes:
    """The bytes drawn for `key` before (or being drawn now, by another thread), else
    `draw()`, kept when it fits."""
    if key is None or _bypass:
        return draw()
    return cache.get(key, draw, final=True)


def clear() -> None:
    cache.clear()


@contextmanager
def bypassed() -> Iterator[None]:
    """Within: every render draws (tests and benchmarks of the drawing itself), in any thread."""
    global _bypass
    with _lock:
        _bypass += 1
    try:
        yield
    finally:
        with _lock:
            _bypass -= 1
