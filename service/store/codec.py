"""Float vectors as bytes: little-endian IEEE-754 float64, so NaN, +inf and −inf (and the NaN's
payload bits) survive any backend that stores bytes unchanged."""

from __future__ import annotations

import numpy as np

F8 = np.dtype("<f8")


def encode(values: np.ndarray | list[float] | float) -> bytes:
    """A scalar or a vector as float64 little-endian bytes (a scalar is a 1-vector)."""
    return np.ascontiguousarray(np.atleast_1d(np.asarray(values, dtype=F8))).tobytes()


def decode(data: bytes) -> np.ndarray:
    """The (n,) float64 vector (native byte order) stored by encode."""
    return np.frombuffer(data, dtype=F8).astype(np.float64)


def decode_many(blobs: list[bytes]) -> np.ndarray:
    """Concatenated vectors of many rows, decoded in one pass."""
    if not blobs:
        return np.empty(0, dtype=np.float64)
    return np.frombuffer(b"".join(blobs), dtype=F8).astype(np.float64)
