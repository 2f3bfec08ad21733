"""The runner's overhead: 16 trials through `Runner` (Ray Tune, the store on SQLite) against the
same 16 trials through `multiprocessing.Pool(2)` calling the bare `fit()` (records kept in memory).

    .venv/bin/python bench/runner.py            # ~2 minutes on 2 cores
    .venv/bin/python bench/runner.py --quick    # a smoke run: 2 epochs per trial

Both sides run 2 trials at a time with one torch thread each, at the same scheduling priority:
Ray runs its workers at niceness 15 (RAY_worker_niceness), so the pool's processes take the same,
and on a machine that others use both get the same share. The runner's time includes starting a
local Ray instance and its workers' imports; the pool's includes starting 2 `spawn` processes,
each importing torch, as a Ray worker does. Target: runner / pool ≤ 1.3.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from service.spec import expand, parse_spec

PROCESSES = 2
NICENESS = int(os.environ.get("RAY_worker_niceness", "15"))  # noqa: SIM112  (Ray spells it so)


def make_spec(epochs: int) -> dict[str, Any]:
    """2 depths × 2 inits × 4 seeds; a trial trains for a few seconds on one thread."""
    return {
        "name": "bench-runner",
        "parameters": {
            "depth": [16, 32],
            "init": ["gaussian", "orthogonal"],
            "width": 128,
            "batch_size": 128,
            "norm": "batch",
            "dataset": "gaussian",
            "epochs": epochs,
        },
        "seeds": 4,
        "resources": {"cpu": 1, "gpu": 0},
        "rerun": True,
    }


def bare_trial(config: dict[str, Any]) -> list[dict[str, Any]]:
    """One trial in a pool process: fit() on one thread, every record returned."""
    import torch

    from workers.train import fit

    torch.set_num_threads(1)
    return list(fit(config))


def lower_priority() -> None:
    os.nice(NICENESS)


def run_pool(spec: dict[str, Any]) -> tuple[float, int]:
    configs = [c.to_dict() for c in expand(parse_spec(spec))]
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(PROCESSES, lower_priority) as pool:
        records = pool.map(bare_trial, configs, chunksize=1)
    return time.perf_counter() - start, sum(len(r) for r in records)


def run_runner(spec: dict[str, Any], db: Path) -> tuple[float, float, int]:
    from service.store import Store
    from workers.runner import Runner

    with Store(f"sqlite:///{db}") as store:
        sweep = store.create_sweep(parse_spec(spec))
        runner = Runner(store, runner_id="bench", num_cpus=PROCESSES)
        start = time.perf_counter()
        runner.start_ray()
        ray_s = time.perf_counter() - start
        info = runner.run_once()
        elapsed = time.perf_counter() - start
        runner.shutdown()
        assert info is not None and info.status == "completed", info
        trials, _ = store.list_trials(sweep.id)
        return elapsed, ray_s, sum(t.records_done for t in trials)


def timed(side: str, spec: dict[str, Any]) -> tuple[float, int]:
    """One side's wall time and record count, printed."""
    if side == "pool":
        seconds, records = run_pool(spec)
        print(f"  Pool({PROCESSES}) of bare fit():   {seconds:6.1f} s  ({records} records)")
        return seconds, records
    with tempfile.TemporaryDirectory() as tmp:
        seconds, ray_s, records = run_runner(spec, Path(tmp) / "bench.db")
    print(
        f"  Runner (Ray Tune + SQLite): {seconds:6.1f} s  ({records} records stored; "
        f"{ray_s:.1f} s of it starting Ray)"
    )
    return seconds, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 epochs per trial, one round")
    parser.add_argument("--epochs", type=int, default=20, help="epochs per trial (default 20)")
    parser.add_argument("--rounds", type=int, default=2, help="pool/runner rounds (default 2)")
    args = parser.parse_args()
    spec = make_spec(2 if args.quick else args.epochs)
    rounds = 1 if args.quick else args.rounds
    print(f"{len(expand(parse_spec(spec)))} trials, {PROCESSES} at a time, {spec['parameters']}")
    total = {"pool": 0.0, "runner": 0.0}
    for r in range(rounds):
        # alternate the order, so that a change in the machine's load hits both sides alike
        counts = set()
        for side in ("pool", "runner") if r % 2 == 0 else ("runner", "pool"):
            seconds, records = timed(side, spec)
            total[side] += seconds
            counts.add(records)
        assert len(counts) == 1, f"the runner stored another number of records: {counts}"
    print(
        f"total over {rounds} round(s): pool {total['pool']:.1f} s, runner "
        f"{total['runner']:.1f} s; ratio runner / pool: {total['runner'] / total['pool']:.2f} "
        "(target ≤ 1.3, Ray start-up included)"
    )


if __name__ == "__main__":
    main()
