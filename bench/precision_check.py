"""What the precision check costs (TrialConfig.precision_check; workers/precision.py): the float64
re-run of epoch 0's probe — building the float64 network, casting the parameters, its forward,
backward and every Gram's factorization — in training steps of the same float32 trial, and beside
the float32 probe measurement it accompanies. All timed alternately in one process at a fixed
thread count (median of the repetitions), so machine load hits each alike. It is paid once per
trial (epoch 0 only).

Trials: overhead.py's reference (depth 100, width 128, batch 128, gaussian, ReLU, BatchNorm), the
deep float32 BatchNorm net of the check's test (leaky_relu, batch_scale, depth 40, d = n = 16),
and the default trial (depth 10, width 100, batch 100, digits).

    .venv/bin/python bench/precision_check.py [--reps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from service.config import TrialConfig
from workers.metrics import probe_metrics
from workers.precision import precision_check
from workers.train import Trial

TRIALS = {
    "reference (L=100, d=n=128)": dict(depth=100, width=128, batch_size=128, dataset="gaussian"),
    "deep BN (L=40, d=n=16)": dict(
        depth=40, width=16, batch_size=16, activation="leaky_relu", norm="batch_scale"
    ),
    "default (L=10, d=n=100)": dict(),
}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def step(t: Trial) -> None:
    """One training step on a minibatch (as Trial.train_epoch takes it)."""
    X, y = t.data.X_train[: t.config.batch_size], t.data.y_train[: t.config.batch_size]
    logits, _ = t.net.forward(t.params, t.state, X, "train")
    loss = F.cross_entropy(logits, y)
    t.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    t.optimizer.step()


def costs(t: Trial, reps: int) -> tuple[float, float, float]:
    """Median seconds of (one training step, one precision check, one float32 probe)."""
    probe32 = probe_metrics(t.net, t.params, t.state, *t.probe)

    def check() -> None:
        precision_check(t.config, t.params, t.state, t.probe, probe32)

    def measure() -> None:
        probe_metrics(t.net, t.params, t.state, *t.probe)

    def one_step() -> None:
        step(t)

    steps: list[float] = []
    checks: list[float] = []
    probes: list[float] = []
    step(t)  # warm-up (the optimizer's first build, allocator)
    check()
    for _ in range(reps):
        steps.append(min(timed(one_step) for _ in range(5)))
        checks.append(timed(check))
        probes.append(timed(measure))
    s, c, p = (statistics.median(v) for v in (steps, checks, probes))
    return s, c, p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, load average {os.getloadavg()[0]:.2f}")
    for name, fields in TRIALS.items():
        s, c, p = costs(Trial(TrialConfig(**fields, epochs=1, precision_check=True, lr=1e-4)),
                        args.reps)  # fmt: skip
        print(
            f"{name}: step {s * 1e3:.1f} ms, float32 probe {p * 1e3:.1f} ms, precision check "
            f"{c * 1e3:.1f} ms = {c / s:.1f} steps ({c / p:.1f}× the probe)"
        )


if __name__ == "__main__":
    main()
