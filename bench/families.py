"""The measurement cost of each model family: one probe measurement (`probe_metrics`: gaps of
every tap, weight gaps, gradient norms, rms, cosines, token metrics) and one whole epoch record
(`Trial.record`: the measurement plus the test set) against one training step (forward,
backward, SGD step on a batch), same trial, same process, one thread.

    .venv/bin/python bench/families.py [--reps 20] [--depth 8]

Prints, per family, the median times and the ratios measurement/step and record/step (the
issue's "measurement cost per recorded epoch relative to a training step").
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from service.config import TrialConfig
from workers.metrics import probe_metrics
from workers.train import Trial

FAMILIES = {
    "mlp": dict(width=64),
    "resmlp": dict(model="resmlp", width=64),
    "cnn": dict(model="cnn", width=16),
    "transformer": dict(model="transformer", width=32, heads=4),
}


def timed(fn, reps: int) -> float:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def step_of(trial: Trial):
    X, y = trial.probe

    def step() -> None:
        logits, _ = trial.net.forward(trial.params, trial.state, X, "train")
        loss = F.cross_entropy(logits, y)
        trial.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        trial.optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--depth", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"depth {args.depth}, digits, batch 100, norm batch, one thread; medians of {args.reps}")
    print(f"{'model':12} {'step ms':>8} {'probe ms':>9} {'record ms':>10} {'probe/step':>11} "
          f"{'record/step':>12}")  # fmt: skip
    for name, kw in FAMILIES.items():
        trial = Trial(TrialConfig(depth=args.depth, epochs=1, **kw))
        step = timed(step_of(trial), args.reps)
        probe = timed(lambda t=trial: probe_metrics(t.net, t.params, t.state, *t.probe), args.reps)
        stats = trial.initial_stats()
        record = timed(lambda t=trial, s=stats: t.record(1, s), args.reps)
        print(f"{name:12} {step * 1e3:8.1f} {probe * 1e3:9.1f} {record * 1e3:10.1f} "
              f"{probe / step:11.2f} {record / step:12.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
