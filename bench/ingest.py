"""Ingest rate of per-layer values through Store.write_records, on SQLite and Postgres.

Depth-1000 records (5 per-layer vectors = 5000 values each) are written in batches the way the
driver's Tune callback writes them: one batch = one epoch of every trial, one transaction. The
baseline, measured in the same process on the same database, is the naive schema: one row per
(trial, metric, epoch, layer) value, upserted with executemany in one transaction per batch.

    .venv/bin/python bench/ingest.py [--backend sqlite|postgres|both] [--trials 20] [--epochs 20]

Target: ≥ 200,000 values/s on each backend. The helpers above main() (scratch databases that are
created and dropped, synthetic records, the naive schema) are shared with read_latency.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator

import numpy as np
from sqlalchemy import text

from service.config import LAYER_METRICS
from service.spec import parse_spec
from service.store import Store

DEPTH = 1000
TARGET = 200_000

POSTGRES_URL = os.environ.get(
    "ISOSWEEP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
NAIVE_DDL = """CREATE TABLE naive (
    trial_id INTEGER NOT NULL, metric VARCHAR(64) NOT NULL, epoch INTEGER NOT NULL,
    layer INTEGER NOT NULL, value {float} ,
    PRIMARY KEY (trial_id, metric, epoch, layer))"""


@contextlib.contextmanager
def sqlite_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="isosweep-bench-") as d:
        yield f"sqlite:///{d}/bench.db"


@contextlib.contextmanager
def postgres_url() -> Iterator[str | None]:
    """A scratch database on the server of POSTGRES_URL, dropped afterwards (None if down)."""
    import psycopg

    admin_url = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    admin_url = admin_url.rsplit("/", 1)[0] + "/postgres"
    try:
        admin = psycopg.connect(admin_url, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        print(f"  postgres: skipped ({str(exc).strip().splitlines()[0]})")
        yield None
        return
    name = f"isosweep_bench_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@contextlib.contextmanager
def backends(which: str) -> Iterator[list[tuple[str, str]]]:
    """(name, url) of the requested backends that are reachable."""
    with contextlib.ExitStack() as stack:
        out = []
        if which in ("sqlite", "both"):
            out.append(("sqlite", stack.enter_context(sqlite_url())))
        if which in ("postgres", "both"):
            url = stack.enter_context(postgres_url())
            if url is not None:
                out.append(("postgres", url))
        yield out


def make_sweep(store: Store, n_trials: int, depth: int, epochs: int) -> list[int]:
    """A sweep of n_trials trials (seeds) of the given depth; returns their ids."""
    spec = parse_spec(
        {
            "name": "bench",
            "parameters": {"depth": depth, "width": 100, "epochs": epochs, "norm": "batch"},
            "seeds": n_trials,
        }
    )
    sweep = store.create_sweep(spec)
    trials, _ = store.list_trials(sweep.id, limit=min(n_trials, 1000))
    return [t.id for t in trials]


def record(epoch: int, depth: int, rng: np.random.Generator, metrics=LAYER_METRICS) -> dict:
    """A record with the given per-layer metrics (depth values each) and two scalars."""
    rec: dict = {"epoch": epoch, "train_loss": float(rng.random()), "test_acc": 0.5}
    for m in metrics:
        v = rng.random(depth)
        v[::97] = np.inf  # singular Grams happen; they cost the same to store
        rec[m] = v
    return rec


def naive_rows(trial_id: int, rec: dict, metrics=LAYER_METRICS) -> list[dict]:
    """The naive schema's rows for one record: one per (metric, layer) value."""
    return [
        {"t": trial_id, "m": m, "e": rec["epoch"], "l": i + 1, "v": float(x)}
        for m in metrics
        for i, x in enumerate(rec[m])
    ]


def create_naive(store: Store) -> None:
    kind = "DOUBLE PRECISION" if store.dialect == "postgresql" else "REAL"
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS naive"))
        conn.execute(text(NAIVE_DDL.format(float=kind)))


NAIVE_UPSERT = (
    "INSERT INTO naive (trial_id, metric, epoch, layer, value) VALUES (:t, :m, :e, :l, :v) "
    "ON CONFLICT (trial_id, metric, epoch, layer) DO UPDATE SET value = excluded.value"
)


def blob_rate(store: Store, trial_ids: list[int], epochs: int) -> float:
    """Per-layer values per second written by write_records (records built beforehand)."""
    rng = np.random.default_rng(0)
    batches = [[(t, record(e, DEPTH, rng)) for t in trial_ids] for e in range(epochs)]
    start = time.perf_counter()
    for batch in batches:
        store.write_records(batch)
    elapsed = time.perf_counter() - start
    return len(trial_ids) * epochs * len(LAYER_METRICS) * DEPTH / elapsed


def naive_rate(store: Store, trial_ids: list[int], epochs: int) -> float:
    """The same, one row per value (executemany of single-row upserts, one transaction/batch)."""
    create_naive(store)
    rng = np.random.default_rng(0)
    batches = [
        [row for t in trial_ids for row in naive_rows(t, record(e, DEPTH, rng))]
        for e in range(epochs)
    ]
    stmt = text(NAIVE_UPSERT)
    start = time.perf_counter()
    for rows in batches:
        with store.engine.begin() as conn:
            conn.execute(stmt, rows)
    elapsed = time.perf_counter() - start
    return sum(len(rows) for rows in batches) / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="both", choices=["sqlite", "postgres", "both"])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--epochs", type=int, default=20, help="batches (one epoch of every trial)")
    p.add_argument("--naive-epochs", type=int, default=3, help="batches for the baseline")
    args = p.parse_args()
    print(f"ingest: {args.trials} trials × depth {DEPTH} × {len(LAYER_METRICS)} per-layer metrics")
    with backends(args.backend) as found:
        for name, url in found:
            with Store(url) as store:
                ids = make_sweep(store, args.trials, DEPTH, args.epochs)
                rate = blob_rate(store, ids, args.epochs)
                base = naive_rate(store, ids, args.naive_epochs)
            verdict = "ok" if rate >= TARGET else "BELOW TARGET"
            print(
                f"  {name:8s} write_records {rate:12,.0f} values/s ({verdict}: target {TARGET:,})"
                f" | naive row-per-value {base:10,.0f} values/s | ratio {rate / base:6.1f}×"
            )


if __name__ == "__main__":
    main()
