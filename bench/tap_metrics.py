"""What the per-tap metrics cost (TrialConfig.tap_metrics; docs/probe.md): one measurement of
the probe batch (workers.metrics.probe_metrics) with and without them, and the always-on update
ratio (Trial.update_ratios), against one training step of the same network, timed interleaved
in one process at one torch thread, so machine load hits all alike. Medians over --reps.

    .venv/bin/python bench/tap_metrics.py [--reps 7]

The reference MLP is bench/overhead.py's (depth 100, width 128, batch 128, gaussian data); the
other families at CPU scale. The per-tap metrics are one batched float64 SVD of each block's
output (the token stream for the transformer).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.config import TrialConfig
from workers.metrics import probe_metrics
from workers.train import Trial

CASES = {
    "mlp (reference)": dict(
        depth=100, width=128, batch_size=128, dataset="gaussian", activation="relu"
    ),
    "resmlp": dict(model="resmlp", depth=32, width=128, batch_size=128, dataset="gaussian"),
    "cnn": dict(model="cnn", depth=8, width=16, batch_size=64, dataset="digits"),
    "transformer": dict(
        model="transformer", depth=4, width=64, heads=4, batch_size=64, dataset="digits"
    ),
}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(name: str, kw: dict, reps: int) -> None:
    trial = Trial(TrialConfig(epochs=1, **kw))
    X, y = trial.data.X_train, trial.data.y_train
    g = torch.Generator().manual_seed(0)

    def step() -> None:
        idx = torch.randint(0, len(X), (trial.config.batch_size,), generator=g)
        logits, _ = trial.net.forward(trial.params, trial.state, X[idx], "train")
        loss = F.cross_entropy(logits, y[idx])
        trial.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        trial.optimizer.step()

    def probe(tap_metrics: bool):
        return lambda: probe_metrics(
            trial.net, trial.params, trial.state, *trial.probe, tap_metrics=tap_metrics
        )

    trial.update_ratios()  # the first keeps the weights; later ones compare
    fns = {"step": step, "plain": probe(False), "tap": probe(True), "ratio": trial.update_ratios}
    times: dict[str, list[float]] = {k: [] for k in fns}
    step()  # warm-up: the optimizer's first step builds its state
    for _ in range(reps):
        for k, fn in fns.items():
            times[k].append(timed(fn))
    m = {k: statistics.median(v) for k, v in times.items()}
    extra = m["tap"] - m["plain"]
    print(
        f"{name:16s} step {m['step'] * 1e3:7.1f} ms | measurement {m['plain'] * 1e3:7.1f} ms, "
        f"with tap_metrics {m['tap'] * 1e3:7.1f} ms: +{extra / m['step']:5.2f} steps "
        f"(+{100 * extra / m['plain']:3.0f}% of a measurement) | update ratio "
        f"{m['ratio'] / m['step']:.3f} steps"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f}, one torch thread, medians of {args.reps}")
    for name, kw in CASES.items():
        measure(name, kw, args.reps)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
