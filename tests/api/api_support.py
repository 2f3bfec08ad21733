"""Helpers for the API tests: small specs, records whose every value is known, and a filler
that writes them through the Store (imported by the test modules as `api_support`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.config import LAYER_METRICS, SCALAR_METRICS


def spec(name: str = "s", seeds: int = 2, **parameters: Any) -> dict[str, Any]:
    """A small SweepSpec as JSON: defaults suited to hand-written records."""
    params = {"epochs": 2, "batch_size": 4, "width": 8, **parameters}
    return {"name": name, "parameters": params, "seeds": seeds}


def value_of(trial_id: int, epoch: int, metric_index: int, layer: int = 0) -> float:
    """The value every hand-made record holds: a known function of where it sits."""
    return 1000.0 * trial_id + 100.0 * epoch + 10.0 * metric_index + layer


def record(trial_id: int, epoch: int, depth: int, **override: Any) -> dict[str, Any]:
    """A full epoch record whose values are value_of(...), then any overrides."""
    rec: dict[str, Any] = {"epoch": epoch, "diverged": False}
    for i, m in enumerate(SCALAR_METRICS):
        rec[m] = value_of(trial_id, epoch, i)
    for j, m in enumerate(LAYER_METRICS):
        i = len(SCALAR_METRICS) + j
        rec[m] = np.array([value_of(trial_id, epoch, i, ell) for ell in range(1, depth + 1)])
    return {**rec, **override}


def unit_gram(n: int, seed: int) -> np.ndarray:
    """A cosine Gram (unit diagonal, PD) of n random inputs."""
    X = np.random.default_rng(seed).standard_normal((n, 2 * n))
    G = X @ X.T
    d = np.sqrt(np.diag(G))
    return G / np.outer(d, d)


def fill(api: Any, sweep_id: int, epochs: int | None = None, gram: bool = True) -> list[dict]:
    """Write every epoch of every trial of the sweep; returns the trials (JSON)."""
    trials = api.get(f"/sweeps/{sweep_id}/trials", params={"limit": 1000}).json()["data"]
    batch = []
    for t in trials:
        c = t["config"]
        for e in range(c["epochs"] + 1 if epochs is None else epochs):
            extra = {"input_gram": unit_gram(c["batch_size"], c["seed"])} if gram and e == 0 else {}
            batch.append((t["id"], record(t["id"], e, c["depth"], **extra)))
    api.store.write_records(batch)
    return trials
