"""Latency of reading one trial's 1000-layer × 100-epoch isometry-gap history
(Store.trial_history(trial, "isometry_gap/act"), 100,000 values) from a store holding ≥ 10
million values, on SQLite and Postgres.

The store is filled through write_records with 100 trials × 100 epochs of depth-1000 records
(by default two per-layer metrics: 20 million values). The baseline, measured in the same
process, reads the same history from the naive one-row-per-value table (filled with fewer
trials, so it is smaller, which only flatters it).

    .venv/bin/python bench/read_latency.py [--backend sqlite|postgres|both] [--reps 200]

Target: p50 ≤ 50 ms.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from ingest import DEPTH, NAIVE_UPSERT, backends, create_naive, make_sweep, naive_rows, record
from sqlalchemy import text

from service.config import LAYER_METRICS
from service.store import Store

TARGET_MS = 50.0
METRIC = "isometry_gap/act"
NAIVE_READ = (
    "SELECT epoch, layer, value FROM naive WHERE trial_id = :t AND metric = :m "
    "ORDER BY epoch, layer"
)


def fill(store: Store, ids: list[int], epochs: int, metrics: tuple[str, ...]) -> float:
    """Write every trial's records, one epoch of all trials per batch; returns seconds."""
    rng = np.random.default_rng(1)
    start = time.perf_counter()
    for e in range(epochs):
        store.write_records([(t, record(e, DEPTH, rng, metrics)) for t in ids])
    return time.perf_counter() - start


def fill_naive(store: Store, ids: list[int], epochs: int) -> None:
    create_naive(store)
    rng = np.random.default_rng(1)
    stmt = text(NAIVE_UPSERT)
    for e in range(epochs):
        rows = [r for t in ids for r in naive_rows(t, record(e, DEPTH, rng, (METRIC,)), (METRIC,))]
        with store.engine.begin() as conn:
            conn.execute(stmt, rows)


def percentiles(times: list[float]) -> tuple[float, float]:
    ms = 1000 * np.asarray(times)
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def time_store(store: Store, ids: list[int], reps: int, epochs: int) -> list[float]:
    rng = np.random.default_rng(2)
    times = []
    for t in rng.choice(ids, size=reps):
        start = time.perf_counter()
        e, v = store.trial_history(int(t), METRIC)
        times.append(time.perf_counter() - start)
        assert v.shape == (epochs, DEPTH) and e[-1] == epochs - 1
    return times


def time_naive(store: Store, ids: list[int], reps: int, epochs: int) -> list[float]:
    rng = np.random.default_rng(2)
    times = []
    with store.engine.connect() as conn:
        for t in rng.choice(ids, size=reps):
            start = time.perf_counter()
            rows = conn.execute(text(NAIVE_READ), {"t": int(t), "m": METRIC}).all()
            v = np.array([r[2] for r in rows], dtype=np.float64).reshape(epochs, DEPTH)
            times.append(time.perf_counter() - start)
            assert v.shape == (epochs, DEPTH)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="both", choices=["sqlite", "postgres", "both"])
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--metrics", type=int, default=2, help="per-layer metrics per record (1-5)")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--naive-trials", type=int, default=5)
    args = p.parse_args()
    metrics = (METRIC, *(m for m in LAYER_METRICS if m != METRIC))[: args.metrics]
    n_values = args.trials * args.epochs * DEPTH * len(metrics)
    print(f"read latency: one {args.epochs} × {DEPTH} history from {n_values:,} stored values")
    with backends(args.backend) as found:
        for name, url in found:
            with Store(url) as store:
                ids = make_sweep(store, args.trials, DEPTH, args.epochs - 1)
                secs = fill(store, ids, args.epochs, metrics)
                p50, p99 = percentiles(time_store(store, ids, args.reps, args.epochs))
                naive_ids = ids[: args.naive_trials]
                fill_naive(store, naive_ids, args.epochs)
                n50, n99 = percentiles(time_naive(store, naive_ids, args.reps // 4, args.epochs))
            verdict = "ok" if p50 <= TARGET_MS else "OVER TARGET"
            print(
                f"  {name:8s} fill {n_values / secs:12,.0f} values/s | trial_history p50 "
                f"{p50:6.1f} ms p99 {p99:6.1f} ms ({verdict}: target {TARGET_MS:.0f} ms) | naive "
                f"p50 {n50:7.1f} ms p99 {n99:7.1f} ms | ratio {n50 / p50:5.1f}×"
            )


if __name__ == "__main__":
    main()
