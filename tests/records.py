"""Hand-made epoch records whose every value is known from where it sits, so that a test can say
what the store, the API or the dashboard must show without running a network."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.config import LAYER_METRICS, METRICS


def value_of(trial_id: int, epoch: int, metric_index: int, layer: int = 0) -> float:
    """The value a record holds: metric_index is the metric's place in METRICS, layer 1..depth
    for per-layer metrics and 0 for scalars."""
    return 1000.0 * trial_id + 100.0 * epoch + 10.0 * metric_index + layer


def record(
    trial_id: int, epoch: int, depth: int, *, scale: float = 1.0, **override: Any
) -> dict[str, Any]:
    """A full epoch record of every metric: scale · value_of(...), then any overrides
    (`diverged`, `input_gram`, a metric). trial_id only enters the values: tests that need no
    per-trial values pass 0."""
    rec: dict[str, Any] = {"epoch": epoch, "diverged": False}
    for i, m in enumerate(METRICS):
        if m in LAYER_METRICS:
            layers = range(1, depth + 1)
            rec[m] = scale * np.array([value_of(trial_id, epoch, i, ell) for ell in layers])
        else:
            rec[m] = scale * value_of(trial_id, epoch, i)
    return {**rec, **override}


def unit_gram(n: int, seed: int) -> np.ndarray:
    """A cosine Gram (unit diagonal, PD) of n random inputs."""
    X = np.random.default_rng(seed).standard_normal((n, 2 * n))
    G = X @ X.T
    d = np.sqrt(np.diag(G))
    return G / np.outer(d, d)


def bits(a) -> np.ndarray:
    """The IEEE-754 bit patterns of float64 values (little-endian): equal bits, not equal values,
    so NaN payloads and −0.0 count."""
    return np.ascontiguousarray(a, dtype="<f8").view("<u8")
