"""Wall time of `isosweep trial --set depth=10 --set epochs=0`: an init-only trial on digits, as
the papers' init-only sweeps run thousands of them. Filed at 4.4 s for 22 ms of work.

Runs `python -m api.cli.main trial …` in a subprocess for each tree — this working tree and a
baseline checkout (`git archive REV`, unpacked into a temporary directory: the working tree and
git state are untouched) — alternately, so machine load hits both alike; prints the median of
each, the ratio, and whether the records agree (epoch_time_s aside).

Also times, in this process, epoch 0's training-set pass (Trial.initial_stats) on a CIFAR-sized
training set (50,000 synthetic samples of 3072 features) against the trial's measurement
(Trial.record without the test set), whole (epoch0_train_samples = None, what the baseline
did) and bounded (the default).

    .venv/bin/python bench/trial_cli.py [--reps 5] [--baseline 1fe18b0] [--baseline 71b81bb]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARGS = ["-m", "api.cli.main", "trial", "--set", "depth=10", "--set", "epochs=0"]


def checkout(rev: str, into: Path) -> Path:
    """The tree of `rev`, unpacked with `git archive` (no worktree, no git state changed)."""
    tree = into / rev
    tree.mkdir()
    archive = into / f"{rev}.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "-C", str(REPO), "archive", rev], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def run_once(tree: Path) -> tuple[float, list[dict]]:
    """Wall time of one `isosweep trial` in `tree` (its code first on the path) and its records."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, *ARGS], cwd=tree, env=env, capture_output=True, text=True, check=True
    )
    elapsed = time.perf_counter() - start
    return elapsed, [json.loads(line) for line in out.stdout.splitlines()]


def same_records(a: list[dict], b: list[dict]) -> str:
    """ "identical", or the keys whose values differ (epoch_time_s aside)."""
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} records"
    differ = sorted(
        {k for ra, rb in zip(a, b, strict=True) for k in ra.keys() | rb.keys()
         if k != "epoch_time_s" and ra.get(k) != rb.get(k)}
    )  # fmt: skip
    return "identical" if not differ else "differ in " + ", ".join(differ)


def cli(reps: int, baselines: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="isosweep-bench-") as tmp:
        trees = {"working tree": REPO, **{rev: checkout(rev, Path(tmp)) for rev in baselines}}
        times: dict[str, list[float]] = {name: [] for name in trees}
        records: dict[str, list[dict]] = {}
        for _ in range(reps):
            for name, tree in trees.items():
                elapsed, records[name] = run_once(tree)
                times[name].append(elapsed)
    print(f"isosweep trial {' '.join(ARGS[3:])}: median of {reps} wall times (s)")
    new = statistics.median(times["working tree"])
    print(f"  working tree  {new:6.2f}   {' '.join(f'{t:.2f}' for t in times['working tree'])}")
    for rev in baselines:
        old = statistics.median(times[rev])
        agree = same_records(records[rev], records["working tree"])
        print(
            f"  {rev:<12}  {old:6.2f}   {' '.join(f'{t:.2f}' for t in times[rev])}   "
            f"ratio working/{rev} = {new / old:.3f}   records: {agree}"
        )


def epoch0_pass(reps: int) -> None:
    """Epoch 0's training-set pass on 50,000 samples, whole and bounded, in measurements."""
    import torch

    from service.config import TrialConfig
    from workers import train
    from workers.data import Dataset

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    big = Dataset(
        torch.randn(50_000, 3072, generator=g),
        torch.randint(0, 10, (50_000,), generator=g),
        torch.randn(100, 3072, generator=g),  # a small test set: the measurement is the probe's
        torch.randint(0, 10, (100,), generator=g),
    )
    real = train.load_dataset
    train.load_dataset = lambda name, data_dir=None: big
    try:
        kw = dict(depth=10, width=100, batch_size=100, dataset="cifar10", epochs=0)
        whole = train.Trial(TrialConfig(**kw, epoch0_train_samples=None))
        bounded = train.Trial(TrialConfig(**kw))
    finally:
        train.load_dataset = real
    t = {"whole": [], "bounded": [], "measure": []}
    for _ in range(reps):
        for name, fn in (
            ("whole", whole.initial_stats),
            ("bounded", bounded.initial_stats),
            ("measure", lambda: whole.record(0, train.EpochStats(0.0, 0.0, 0.0))),
        ):
            start = time.perf_counter()
            fn()
            t[name].append(time.perf_counter() - start)
    m = {k: statistics.median(v) for k, v in t.items()}
    k = bounded.epoch0_rows.numel()
    per = {name: m[name] / m["measure"] for name in ("whole", "bounded")}
    print(f"epoch 0's training pass, 50,000 × 3072 inputs, depth 10, width 100 (median of {reps}):")
    print(f"  whole       {m['whole'] * 1e3:7.1f} ms = {per['whole']:.2f} measurements")
    print(f"  {k} rows  {m['bounded'] * 1e3:7.1f} ms = {per['bounded']:.2f} measurements")
    print(f"  ratio bounded/whole = {m['bounded'] / m['whole']:.3f}")
    print(f"  one measurement (record, 100 test samples) {m['measure'] * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--baseline", action="append", help="git revision (repeatable)")
    args = parser.parse_args()
    cli(args.reps, args.baseline or ["HEAD"])
    epoch0_pass(args.reps)


if __name__ == "__main__":
    main()
