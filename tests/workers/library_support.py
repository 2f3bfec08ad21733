"""What tests/workers/test_model_timm.py and test_model_hf.py share: a guard against any network
access, numpy's isometry gap, and the float64 comparison (1e-9 relative)."""

from __future__ import annotations

import socket

import numpy as np
import pytest

RTOL = 1e-9


@pytest.fixture
def offline(monkeypatch):
    """Every connection attempt (and name lookup) raises: a code path that reaches for the
    network — the hub, a download — fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    with pytest.raises(AssertionError, match="network access"):  # the guard is on
        socket.create_connection(("127.0.0.1", 9))


def gap_of(H: np.ndarray) -> float:
    """−log of the isometry of H Hᵀ from numpy's float64 singular values (n ≤ features)."""
    lam = np.linalg.svd(H.reshape(len(H), -1), compute_uv=False) ** 2
    return float(np.log(lam.mean()) - np.log(lam).mean())


def close(a, b, rtol=RTOL) -> None:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a.shape == b.shape
    np.testing.assert_array_equal(np.isfinite(a), np.isfinite(b))
    fin = np.isfinite(a)
    np.testing.assert_allclose(a[fin], b[fin], rtol=rtol, atol=1e-13)
