"""What measuring costs: epoch time with the measurements over epoch time without them.

Reference trial: depth 100, width 128, batch 128, the synthetic `gaussian` set (4000 training
samples → 31 steps an epoch, 1000 test samples), ReLU, BatchNorm. A measured epoch is the
training steps plus everything a recorded epoch adds (probe forward/backward, every Gram and its
eigenvalues, weight gaps, test-set evaluation). Repetitions interleave the two kinds of epoch in
one process with a fixed thread count, so machine load hits both alike. Target: ratio ≤ 1.10.

Also prints one measurement (probe_metrics) in training steps of the same network — its time
over one step's (plain epoch time / steps) — for this tree's workers/metrics.py and for the one
committed at git HEAD (`--baseline REV`, loaded into a temporary module), timed alternately in this
process. Target: ≤ 3 steps. Then where this tree's measurement spends it: the probe's
forward/backward, the batched LU/QR factorizations, the float64 singular values, and the rest.
And times one measurement pass at depth 1000, width 100 (batch 100).

    .venv/bin/python bench/overhead.py [--reps 6] [--threads 1] [--baseline HEAD]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from service.config import TrialConfig
from workers import metrics, nn
from workers.train import Trial

REFERENCE = dict(depth=100, width=128, batch_size=128, dataset="gaussian", activation="relu")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def baseline_metrics(rev: str) -> ModuleType | None:
    """workers/metrics.py as committed at `rev`, imported as a module of its own (None if git
    cannot show it)."""
    root = Path(__file__).resolve().parents[1]
    try:
        src = subprocess.run(
            ["git", "show", f"{rev}:workers/metrics.py"],
            cwd=root,
            capture_output=True,
            check=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / "baseline_metrics.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("baseline_metrics", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_metrics"] = module
    spec.loader.exec_module(module)
    return module


def step_equivalents(trial: Trial, step_s: float, baseline: ModuleType | None, reps: int) -> None:
    """One probe_metrics call in training steps, this tree's and the baseline's, interleaved."""
    args = (trial.spec, trial.params, trial.state, *trial.probe)
    impls = {"this tree": metrics} | ({"baseline": baseline} if baseline else {})
    times: dict[str, list[float]] = {k: [] for k in impls}
    for _ in range(reps):
        for name, module in impls.items():
            times[name].append(timed(lambda m=module: m.probe_metrics(*args)))
    for name, ts in times.items():
        best = min(ts)
        print(f"    one measurement, {name:9s} {best * 1e3:8.1f} ms = {best / step_s:5.2f} steps")


def probe_backward(trial: Trial) -> None:
    """The probe's own forward/backward, as probe_metrics runs it (taps kept, no gaps)."""
    spec, x, y = trial.spec, *trial.probe
    names = [f"W{ell}" for ell in range(1, spec.depth + 1)] + ["W_head"]
    p = {k: v.detach().requires_grad_(k in names) for k, v in trial.params.items()}
    with torch.enable_grad():
        logits, _ = nn.forward(spec, p, trial.state, x, "batch", taps=True)
        torch.autograd.grad(F.cross_entropy(logits, y), [p[k] for k in names])


def breakdown(trial: Trial, step_s: float) -> None:
    """Where one measurement (this tree's) spends its time: the probe's forward/backward, the
    batched LU and QR factorizations, the float64 singular values, and the rest (conversions,
    norms, solves, bookkeeping); best of 3, each in ms and in training steps."""
    hooks = [(torch.linalg, "lu_factor_ex", "LU/QR"), (torch, "geqrf", "LU/QR")]
    hooks.append((torch.linalg, "svdvals", "SVD"))
    spent = {"LU/QR": 0.0, "SVD": 0.0}

    def wrap(fn, key):
        def timed_call(*a, **k):
            start = time.perf_counter()
            out = fn(*a, **k)
            spent[key] += time.perf_counter() - start
            return out

        return timed_call

    args = (trial.spec, trial.params, trial.state, *trial.probe)
    best: dict[str, float] = {"total": float("inf")}
    originals = [getattr(owner, name) for owner, name, _ in hooks]
    for _ in range(3):
        spent.update({"LU/QR": 0.0, "SVD": 0.0})
        for (owner, name, key), fn in zip(hooks, originals, strict=True):
            setattr(owner, name, wrap(fn, key))
        try:
            total = timed(lambda: metrics.probe_metrics(*args))
        finally:
            for (owner, name, _), fn in zip(hooks, originals, strict=True):
                setattr(owner, name, fn)
        if total < best["total"]:
            best = {"total": total, **spent}
    fb = min(timed(lambda: probe_backward(trial)) for _ in range(3))
    parts = {"forward/backward": fb, "LU/QR": best["LU/QR"], "SVD": best["SVD"]}
    parts["rest"] = best["total"] - sum(parts.values())
    text = ", ".join(f"{k} {v * 1e3:.1f} ms ({v / step_s:.2f})" for k, v in parts.items())
    print(f"    of it (steps): {text}")


def overhead(reps: int, baseline: ModuleType | None = None) -> None:
    trial = Trial(TrialConfig(**REFERENCE, epochs=2 * reps + 2))
    trial.record(1, trial.train_epoch())  # warm-up: allocator, thread pools, caches
    plain, measured = [], []
    for r in range(reps):  # interleaved, alternating which kind goes first
        for kind in ("plain", "measured") if r % 2 == 0 else ("measured", "plain"):
            if kind == "plain":
                plain.append(timed(trial.train_epoch))
            else:
                measured.append(timed(lambda: trial.record(1, trial.train_epoch())))
    probe = min(
        timed(lambda: metrics.probe_metrics(trial.spec, trial.params, trial.state, *trial.probe))
        for _ in range(3)
    )
    test = min(
        timed(lambda: trial.evaluate(trial.data.X_test, trial.data.y_test, "running"))
        for _ in range(3)
    )
    p, m = statistics.mean(plain), statistics.mean(measured)
    steps = len(trial.data.X_train) // REFERENCE["batch_size"]
    print(f"reference trial {REFERENCE}, {steps} steps/epoch, {reps} interleaved repetitions")
    print(f"  epoch without measurements   {p * 1e3:8.1f} ms")
    print(f"  epoch with measurements      {m * 1e3:8.1f} ms")
    print(f"    probe metrics (best of 3)  {probe * 1e3:8.1f} ms")
    print(f"    test evaluation (best of 3){test * 1e3:8.1f} ms")
    print(f"  ratio                        {m / p:8.3f}   (target ≤ 1.10)")
    print(
        f"  one measurement ≈ {(m - p) / p * steps:.1f} training steps; "
        f"with record_every=k the ratio is 1 + {m / p - 1:.3f}/k"
    )
    print(f"  one training step            {p / steps * 1e3:8.1f} ms (plain epoch / {steps})")
    print("  untrained (epoch 0):")
    fresh = Trial(TrialConfig(**REFERENCE))
    step_equivalents(fresh, p / steps, baseline, max(3, reps))
    breakdown(fresh, p / steps)
    print(f"  trained ({2 * reps + 1} epochs):")
    step_equivalents(trial, p / steps, baseline, max(3, reps))
    breakdown(trial, p / steps)


def deep_pass() -> None:
    trial = Trial(
        TrialConfig(
            depth=1000,
            width=100,
            batch_size=100,
            dataset="gaussian",
            activation="tanh",
            gain_exponent=0.4,
            init="orthogonal",
        )
    )
    args = (trial.spec, trial.params, trial.state, *trial.probe)
    metrics.probe_metrics(*args)  # warm-up
    t = min(timed(lambda: metrics.probe_metrics(*args)) for _ in range(3))
    print(f"one measurement pass, depth 1000 × width 100, batch 100: {t:.2f} s (best of 3)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--baseline", default="HEAD", help="git revision of workers/metrics.py")
    parser.add_argument("--no-deep", action="store_true", help="skip the depth-1000 pass")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    baseline = baseline_metrics(args.baseline)
    if baseline is None:
        print(f"(no baseline: git cannot show {args.baseline}:workers/metrics.py)")
    overhead(args.reps, baseline)
    if args.no_deep:
        return
    deep_pass()


if __name__ == "__main__":
    main()
