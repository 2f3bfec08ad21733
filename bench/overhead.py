"""One measurement (probe_metrics) in training steps, against its floor, for this tree and for a
baseline revision in the same process.

The two reference trials of issue 23: mlp, depth 100, width = batch = 128, the synthetic
`gaussian` set, float32, untrained — tanh with BatchNorm, and ReLU without normalization (whose
rank-deficient taps need their top-r spectrum). For each, timed in one process at a fixed thread
count, in repetitions that rotate the order (so machine load hits each alike):

- one SGD step of the same network (forward, backward, optimizer step, as `Trial.train_epoch`
  runs it; on a copy, reset each repetition, so the measured network stays untrained);
- one measurement of this tree and of the baseline's (`--baseline REV`: workers/structure.py,
  factors.py, gaps.py and metrics.py as committed at REV — those that exist there —, loaded as
  a package of their own);
- each one's floor: the probe's forward/backward as probe_metrics runs it, plus the
  factorizations the definition needs — every LU, QR, formed-Gram eigendecomposition and SVD
  that its routes call, replayed on the very matrices they factored; and the all-LU floor (one
  n × n LU per Gram, as if every Gram were square and regular).

Printed in training steps (median over repetitions, [min–max]), with the floor's parts and the
load average, by the wall clock and by this thread's CPU time (which the machine's load hardly
moves: one torch thread does all of it). Then this tree's route of the rank-deficient taps
against the SVD on the very matrices a measurement hands it, and the records of the two
implementations side by side: the largest relative difference per metric, for the float32
trials and their float64 twins. With --deep, also one measurement at depth 1000 × width 100.

    .venv/bin/python bench/overhead.py [--reps 9] [--baseline HEAD] [--trained 0] [--deep]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F

from service.config import TrialConfig
from workers import factors, gaps, metrics
from workers.train import Trial

REFERENCE = dict(model="mlp", depth=100, width=128, batch_size=128, dataset="gaussian")
TRIALS = {
    "tanh + BatchNorm": dict(activation="tanh", norm="batch"),
    "relu, no norm": dict(activation="relu", norm="none"),
}
MEASUREMENT = ("structure", "factors", "gaps", "metrics")  # imported in this order
STEPS_PER_TIMING = 4
ROUTES = {  # a route's function → the factorization it needs, replayed on its argument
    "_lu_log_det": ("LU", lambda M: torch.linalg.lu_factor_ex(M.mT)),
    "_qr_log_det": ("QR", lambda M: torch.geqrf(M.mT)),
    "gram_eigh_gaps_and_errors": ("Gram eigh", lambda M: torch.linalg.eigvalsh(gram(M))),
    "_svd_gaps_and_errors": ("SVD", lambda M: torch.linalg.svdvals(M)),
}


def gram(M: torch.Tensor) -> torch.Tensor:
    """The Grams of a stack M (B, m, c) on its smaller side."""
    return M @ M.mT if M.shape[1] <= M.shape[2] else M.mT @ M


def clocked(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) seconds of fn: this thread's CPU time, which the machine's load hardly moves
    (one torch thread: the work is this thread's)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - wall, time.thread_time() - cpu


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def baseline_measurement(rev: str) -> ModuleType | None:
    """workers/{structure,gaps,metrics}.py as committed at `rev` (those that exist there), as
    the package `baseline_measure` (their imports of each other rewritten); its metrics module,
    or None if git cannot show metrics.py at `rev`."""
    root = Path(__file__).resolve().parents[1]
    pkg = Path(tempfile.mkdtemp()) / "baseline_measure"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    sources = {}
    for name in MEASUREMENT:
        show = ["git", "show", f"{rev}:workers/{name}.py"]
        done = subprocess.run(show, cwd=root, capture_output=True, text=True)
        if done.returncode == 0:
            sources[name] = done.stdout
    if "metrics" not in sources:
        return None
    for name, text in sources.items():
        for other in sources:
            text = text.replace(f"workers.{other} import", f"baseline_measure.{other} import")
        (pkg / f"{name}.py").write_text(text)
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module("baseline_measure.metrics")


class Reference:
    """One reference trial: the measured network, a copy that takes the SGD steps, and what a
    measurement of the network factored, per implementation (`routes`)."""

    def __init__(self, config: TrialConfig, trained: int, impls: dict[str, ModuleType]) -> None:
        self.trial = Trial(config)
        for _ in range(trained):
            self.trial.train_epoch()
        self.stepper = Trial(config)
        self.start = {k: v.detach().clone() for k, v in self.trial.params.items()}
        self.at = 0
        self.args = (self.trial.net, self.trial.params, self.trial.state, *self.trial.probe)
        self.routes = {
            key: capture_routes(lambda m=m: m.probe_metrics(*self.args), route_modules(m))
            for key, m in impls.items()
        }

    def reset_stepper(self) -> None:
        with torch.no_grad():
            for k, v in self.stepper.params.items():
                v.copy_(self.start[k])

    def steps(self) -> None:
        """STEPS_PER_TIMING SGD steps, each as `Trial.train_epoch` takes one."""
        t = self.stepper
        X, y, bs = t.data.X_train, t.data.y_train, t.config.batch_size
        for _ in range(STEPS_PER_TIMING):
            idx = slice(self.at * bs, (self.at + 1) * bs)
            self.at = (self.at + 1) % (len(X) // bs)
            saved = t._state_buffer.clone()
            logits, _ = t.net.forward(t.params, t.state, X[idx], "train")
            loss = F.cross_entropy(logits, y[idx])
            if not np.isfinite(loss.item()):
                t._state_buffer.copy_(saved)
            t.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            t.optimizer.step()

    def forward_backward(self) -> None:
        """The probe's forward and backward as probe_metrics runs them (taps kept, no gaps)."""
        net, params, state, x, y = self.args
        names = metrics._weight_names(net)
        p = {k: v.detach().requires_grad_(k in names) for k, v in params.items()}
        with torch.enable_grad():
            logits, _ = net.forward(p, state, x, "batch", taps=True)
            metrics._grads(F.cross_entropy(logits, y), [p[k] for k in names], names)


def route_modules(metrics_module: ModuleType) -> tuple[ModuleType, ...]:
    """The modules of a measurement (this tree's or the baseline's) that hold its routes."""
    package = metrics_module.__name__.rsplit(".", 1)[0]
    return tuple(
        sys.modules[m] for m in (f"{package}.gaps", f"{package}.factors") if m in sys.modules
    )


def capture_routes(
    measure: Callable[[], object], modules: tuple[ModuleType, ...]
) -> dict[str, list[torch.Tensor]]:
    """The matrices each route factored in one measurement: route → its argument stacks (in
    the measurement's `modules` — workers/gaps.py calls the routes, workers/factors.py's fall
    back to the SVD —: each call counts once)."""
    got: dict[str, list[torch.Tensor]] = {kind: [] for kind, _ in ROUTES.values()}
    patched = [
        (mod, name, getattr(mod, name)) for name in ROUTES for mod in modules
        if hasattr(mod, name)
    ]  # fmt: skip

    def spy(name: str, fn: Callable) -> Callable:
        def call(M: torch.Tensor, *a: object, **k: object) -> object:
            got[ROUTES[name][0]].append(M.detach().to(torch.float64).clone())
            return fn(M, *a, **k)

        return call

    try:
        for mod, name, fn in patched:
            setattr(mod, name, spy(name, fn))
        measure()
    finally:
        for mod, name, fn in patched:
            setattr(mod, name, fn)
    return got


def replay(routes: dict[str, list[torch.Tensor]]) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds each route's factorizations take on the captured matrices."""
    kernels = {kind: fn for kind, fn in ROUTES.values()}
    return {
        kind: clocked(lambda ms=ms, f=kernels[kind]: [f(M) for M in ms])
        for kind, ms in routes.items()
    }


def all_lu(count: int, n: int) -> tuple[float, float]:
    """(wall, CPU) seconds of `count` LUs of n × n float64 matrices in chunks of gaps' CPU
    size."""
    step = gaps._chunk_size((n, n), torch.device("cpu"))
    M = torch.randn(min(step, count), n, n, dtype=torch.float64)
    full, rest = divmod(count, len(M))
    return clocked(
        lambda: (
            [torch.linalg.lu_factor_ex(M.mT) for _ in range(full)]
            + ([torch.linalg.lu_factor_ex(M[:rest].mT)] if rest else [])
        )
    )


def bench_trial(name: str, ref: Reference, impls: dict[str, ModuleType], reps: int) -> None:
    """Steps, measurements, forward/backward and each implementation's factorizations, timed
    in rotating order; printed in training steps, by the wall clock and by CPU time."""
    jobs: dict[str, Callable[[], object]] = {"step": ref.steps, "fb": ref.forward_backward}
    jobs |= {k: (lambda m=m: m.probe_metrics(*ref.args)) for k, m in impls.items()}
    parts: dict[str, list[dict[str, tuple[float, float]]]] = {k: [] for k in impls}
    jobs |= {f"{k} routes": (lambda k=k: parts[k].append(replay(ref.routes[k]))) for k in impls}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in jobs}
    for job in jobs.values():
        job()  # warm-up: allocator, thread pools, caches
    for p in parts.values():
        p.clear()
    order = list(jobs)
    for r in range(reps):
        ref.reset_stepper()
        for key in order[r % len(order) :] + order[: r % len(order)]:
            times[key].append(clocked(jobs[key]))
    print(f"\n{name}: {load()}")
    for c, clock in enumerate(("wall", "CPU")):
        step = [t[c] / STEPS_PER_TIMING for t in times["step"]]
        per = statistics.median(step)
        fb = statistics.median(t[c] for t in times["fb"]) / per
        print(f"  {clock}: one SGD step {per * 1e3:.1f} ms (median of {reps})")
        for key in impls:
            kinds = {k: statistics.median(p[k][c] for p in parts[key]) / per for k in parts[key][0]}
            counts = {k: sum(len(M) for M in ms) for k, ms in ref.routes[key].items()}
            floor = fb + sum(kinds.values())
            ratio = [t[c] / s for t, s in zip(times[key], step, strict=True)]
            med = statistics.median(t[c] for t in times[key]) / per
            shown = ", ".join(f"{k} ×{counts[k]} {v:.2f}" for k, v in kinds.items() if counts[k])
            print(
                f"    {key:9s}: one measurement {med:5.2f} steps [{min(ratio):.2f}–"
                f"{max(ratio):.2f}] = {med / floor:.2f}× its floor {floor:.2f}"
                f" (forward/backward {fb:.2f}, {shown})"
            )
        grams = sum(len(M) for ms in ref.routes["this tree"].values() for M in ms)
        lu = fb + all_lu(grams, ref.trial.config.batch_size)[c] / per
        print(f"    all-LU floor {lu:.2f} steps (one LU for each of the {grams} Grams)")


def compare_records(name: str, config: TrialConfig, baseline: ModuleType) -> None:
    """The largest relative difference per record key, this tree against the baseline."""
    trial = Trial(config)
    args = (trial.net, trial.params, trial.state, *trial.probe)
    new, old = metrics.probe_metrics(*args), baseline.probe_metrics(*args)
    worst: dict[str, float] = {}
    flips = 0
    for key in sorted(set(new) & set(old)):
        a, b = np.asarray(new[key], float), np.asarray(old[key], float)
        flips += int((np.isfinite(a) != np.isfinite(b)).sum())
        both = np.isfinite(a) & np.isfinite(b) & (b != 0)
        if both.any():
            worst[key] = float(np.max(np.abs(a[both] - b[both]) / np.abs(b[both])))
    top = sorted(worst.items(), key=lambda kv: -kv[1])[:4]
    text = ", ".join(f"{k} {v:.1e}" for k, v in top)
    print(f"  {name} ({config.dtype}): largest relative differences {text}; {flips} finite↔not")


def route_check(name: str, config: TrialConfig) -> None:
    """The rank-deficient taps' range gaps by this tree's route (the formed Gram's
    eigenvalues, or the SVD where that loses more than the tap's rounding) against the SVD's,
    on the very matrices a measurement hands it."""
    trial = Trial(config)
    calls: list[tuple] = []
    route = factors.gram_eigh_gaps_and_errors

    def spy(M: torch.Tensor, ranks: torch.Tensor, eps: float, rounding: float) -> tuple:
        calls.append((M.clone(), ranks.clone(), eps, rounding))
        return route(M, ranks, eps, rounding)

    gaps.gram_eigh_gaps_and_errors = spy
    try:
        metrics.probe_metrics(trial.net, trial.params, trial.state, *trial.probe)
    finally:
        gaps.gram_eigh_gaps_and_errors = route
    resolved, unresolved = [], []
    for M, ranks, eps, rounding in calls:
        got, _ = route(M, ranks, eps, rounding)
        for i, r in enumerate(ranks.tolist()):
            want, bar = factors._svd_gaps_and_errors(M[i : i + 1], r, eps, rounding)
            diff = abs(float(got[i] - want[0]))
            if np.isfinite(float(bar[0])):
                resolved.append(diff / float(bar[0]))
            else:
                unresolved.append(diff / abs(float(want[0])))
    print(
        f"  {name} ({config.dtype}): {len(resolved) + len(unresolved)} rank-deficient taps;"
        f" resolved by the SVD {len(resolved)}: |route − SVD| ≤"
        f" {max(resolved, default=0):.1e} × the SVD's bar; unresolved {len(unresolved)}:"
        f" relative difference ≤ {max(unresolved, default=0):.1e}"
    )


def deep_pass(impls: dict[str, ModuleType], reps: int = 3) -> None:
    """One measurement at depth 1000, width = batch = 100 (tanh, orthogonal, gain exponent
    0.4), each implementation's best of `reps`, interleaved."""
    config = TrialConfig(
        depth=1000, width=100, batch_size=100, dataset="gaussian", activation="tanh",
        gain_exponent=0.4, init="orthogonal",
    )  # fmt: skip
    trial = Trial(config)
    args = (trial.net, trial.params, trial.state, *trial.probe)
    best = {k: float("inf") for k in impls}
    for _ in range(reps):
        for key, m in impls.items():
            best[key] = min(best[key], clocked(lambda m=m: m.probe_metrics(*args))[0])
    text = ", ".join(f"{k} {v:.2f} s" for k, v in best.items())
    print(f"\none measurement at depth 1000 × width 100, batch 100 (best of {reps}): {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--baseline", default="HEAD", help="git revision of the measurement")
    parser.add_argument("--trained", type=int, default=0, help="epochs before measuring")
    parser.add_argument("--deep", action="store_true", help="also depth 1000 × width 100")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    baseline = baseline_measurement(args.baseline)
    print(f"torch {torch.__version__}, {args.threads} thread(s), baseline {args.baseline}")
    if baseline is None:
        print(f"(no baseline: git cannot show {args.baseline}:workers/metrics.py)")
    configs = {k: TrialConfig(**REFERENCE, **v) for k, v in TRIALS.items()}
    impls = {"this tree": metrics} | ({"baseline": baseline} if baseline else {})
    for name, config in configs.items():
        bench_trial(name, Reference(config, args.trained, impls), impls, args.reps)
    if args.deep:
        deep_pass(impls)
    print("\nrank-deficient taps, this tree's route against the SVD:")
    for name, config in configs.items():
        for dtype in ("float32", "float64"):
            route_check(name, config.model_copy(update={"dtype": dtype}))
    if baseline is None:
        return
    print("\nrecords, this tree against the baseline (the same network and probe batch):")
    for name, config in configs.items():
        for dtype in ("float32", "float64"):
            compare_records(name, config.model_copy(update={"dtype": dtype}), baseline)


if __name__ == "__main__":
    main()
