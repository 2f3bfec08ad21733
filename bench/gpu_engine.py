"""The engine on a GPU, without Ray or a database (issue 23): what can run on the lent GPU
machine, which has Python 3.12 and torch but no Ray, SQLAlchemy or pydantic, and takes at most
64 MiB with a command (Ray's wheel alone is larger). bench/gpu_sweep.py is the same check plus
sweeps through the runner, for a GPU machine with the whole install.

Needs torch ≥ 2.11, numpy and the project's pure-Python dependencies of the engine: pydantic and
pydantic-settings (with pydantic-core, annotated-types, typing-inspection, typing-extensions,
python-dotenv), about 3 MB of wheels. Fetch them here, once, into the ignored build/ folder:

    .venv/bin/python -m pip download --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 -d build/gpu-wheels \
        'pydantic==2.14.4' 'pydantic-settings==2.16.3'

and on the GPU machine (the device tool's `run`, carrying build/gpu-wheels):

    pip install -q --no-index --find-links build/gpu-wheels pydantic pydantic-settings && \
        python bench/gpu_engine.py

What it prints (≤ 5 minutes on an H200):
1. CUDA against CPU: epoch-0 records of every family (and float64) through workers.train.fit on
   "cpu" (one thread) and "cuda:0", key by key (CHECK_RTOL: 1e-4 float32, 1e-9 float64). TF32
   off (workers.train.set_cuda_precision). scikit-learn's `digits` where scikit-learn is
   installed, else the synthetic `gaussian` inputs (said so).
1b. A pack on CUDA against its members alone on CUDA, epoch 0 (PACK_RTOL 1e-6).
2. Trials/s of the reference trial (SWEEP: mlp depth 100, width 128, one epoch of `gaussian`) on
   CUDA, packed (fit_packed, PACKED_MEMBERS at once) and unpacked (fit, one after another),
   against the 2-core CPU rate measured on the development machine (`--measure-cpu` writes it to
   bench/gpu_engine_cpu.json, beside this file).

Exit status 1 if a number is outside its tolerance; 0 with a note where there is no CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

try:  # the inputs of the checks: scikit-learn's digits where it is installed
    import sklearn  # noqa: F401

    DATA = "digits"
except ImportError:
    DATA = "gaussian"

CPU_RATE_FILE = Path(__file__).with_name("gpu_engine_cpu.json")
PACKED_MEMBERS = 32  # members of the packed throughput run
UNPACKED_TRIALS = 8  # trials of the unpacked run (a rate: a sample measures it)

SWEEP = {"depth": 100, "width": 128, "epochs": 1, "dataset": "gaussian"}
# configs checked CUDA against CPU at epoch 0: every family, and float64
CHECKS: dict[str, dict[str, Any]] = {
    "mlp d20 gaussian-init": dict(depth=20, width=64, dataset=DATA, init="gaussian"),
    "mlp d20 orthogonal": dict(depth=20, width=64, dataset=DATA, init="orthogonal", seed=1),
    "mlp d100 w128 (the sweep's)": dict(SWEEP, epochs=0, seed=2),
    "mlp d20 layer-norm tanh": dict(
        depth=20, width=64, dataset=DATA, norm="layer", activation="tanh", seed=3
    ),
    "resmlp": dict(model="resmlp", depth=4, width=32, dataset=DATA),
    "cnn": dict(model="cnn", depth=2, width=8, dataset=DATA),
    "transformer": dict(
        model="transformer", depth=2, width=16, heads=2, norm="layer", dataset=DATA
    ),
    "mlp d20 float64": dict(depth=20, width=64, dataset=DATA, dtype="float64"),
}
CHECK_RTOL = {"float32": 1e-4, "float64": 1e-9}
CHECK_ATOL = 1e-6  # values near zero (mean cosines, …): an absolute floor, float32
ACC_ATOL = 1 / 300  # an accuracy: one sample of a few hundred may flip on a near-tie
PACK_RTOL = 1e-6  # a pack's batched epoch-0 losses against its members alone
SKIP = {"epoch", "epoch_time_s", "diverged"}


def numeric(rec: dict[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for k, v in rec.items():
        if k in SKIP or isinstance(v, bool | str) or v is None:
            continue
        out[k] = np.asarray(v, dtype=np.float64)
    return out


def rel_gap(a: np.ndarray, b: np.ndarray, atol: float) -> tuple[float, bool]:
    """max |a − b| / (|b| + atol) over finite entries, and whether the non-finite entries agree."""
    same_pattern = bool(np.array_equal(np.isfinite(a), np.isfinite(b)))
    fin = np.isfinite(a) & np.isfinite(b)
    if not fin.any():
        return 0.0, same_pattern
    diff, den = np.abs(a[fin] - b[fin]), np.abs(b[fin]) + atol
    rel = np.where(den > 0, diff / np.where(den > 0, den, 1.0), np.where(diff > 0, np.inf, 0.0))
    return float(np.max(rel)), same_pattern


# --- 1. CUDA against CPU ------------------------------------------------------------------------


def check_cuda_against_cpu() -> list[str]:
    """Epoch-0 (and one trained epoch, printed only) of each CHECKS config on cpu and cuda:0;
    the failures."""
    from service.config import TrialConfig
    from workers.train import fit

    print("\n## 1. CUDA against CPU (workers.train.fit, epoch 0; CPU on one thread)")
    failures = []
    for label, params in CHECKS.items():
        config = TrialConfig(**{"epochs": 0, **params})
        cpu = numeric(next(iter(fit(config, threads=1))))
        cuda = numeric(next(iter(fit(config, device="cuda:0"))))
        if cpu.keys() != cuda.keys():
            failures.append(f"CUDA vs CPU, {label}: fields {sorted(cpu.keys() ^ cuda.keys())}")
            continue
        rtol = CHECK_RTOL[config.dtype]
        atol = CHECK_ATOL if config.dtype == "float32" else 1e-12
        worst, worst_key, bad, singular = 0.0, "", [], 0.0
        for key, want in cpu.items():
            got = cuda[key]
            if got.shape != want.shape:
                bad.append(f"{key} (shape {got.shape} ≠ {want.shape})")
                continue
            if key.startswith("range_isometry_gap/"):
                # where the Gram is structurally singular (isometry_gap +inf) a conservative rank
                # bound can count an eigenvalue at rounding level: that range gap is rounding
                # (tests/workers/test_packed.py holds packs to the same rule); shown apart
                full = np.isfinite(cpu[key.replace("range_", "", 1)])
                singular = max(singular, rel_gap(got[~full], want[~full], atol)[0])
                got, want = got[full], want[full]
            gap, same = rel_gap(got, want, atol)
            limit = ACC_ATOL if key.endswith("_acc") else rtol
            if key.endswith("_acc"):
                gap = float(np.max(np.abs(cuda[key] - want)))  # absolute, a count's share
            if not same or gap > limit:
                bad.append(f"{key} ({'non-finite differ' if not same else f'{gap:.2e}'})")
            if not key.endswith("_acc") and gap > worst:
                worst, worst_key = gap, key
        status = "ok" if not bad else "FAIL " + ", ".join(bad[:6])
        print(
            f"  {label:28s} max rel gap {worst:.2e} ({worst_key}); tolerance {rtol:g}: {status}"
            f"; range gaps of singular Grams, not checked: {singular:.1e}"
        )
        if bad:
            failures.append(f"CUDA vs CPU, {label}: {', '.join(bad)}")
    trained = TrialConfig(depth=20, width=64, dataset=DATA, epochs=1)
    a, b = (numeric(list(fit(trained, device=d, threads=1))[-1]) for d in ("cpu", "cuda:0"))
    gaps = {k: rel_gap(b[k], v, CHECK_ATOL)[0] for k, v in a.items() if not k.endswith("_acc")}
    top = sorted(gaps.items(), key=lambda kv: -kv[1])[:3]
    print(
        "  after 1 trained epoch (mlp d20, printed only): largest rel gaps "
        + ", ".join(f"{k} {v:.2e}" for k, v in top)
    )
    return failures


def check_pack_on_cuda() -> list[str]:
    """4 members of the sweep's shape packed on cuda:0 against each alone on cuda:0, epoch 0:
    every value within PACK_RTOL (the pack's forward, backward and factorizations are batched
    kernels: bit-identical only where they round alike)."""
    from service.config import TrialConfig
    from workers.packed import fit_packed
    from workers.train import fit

    print("\n## 1b. A pack on CUDA against its members alone on CUDA (epoch 0)")
    configs = [
        TrialConfig(**{**SWEEP, "epochs": 0}, seed=s, init=("gaussian", "orthogonal")[s % 2])
        for s in range(4)
    ]
    packed: dict[int, dict[str, Any]] = {}
    for i, rec in fit_packed(configs, device="cuda:0"):
        packed.setdefault(i, numeric(rec))
    failures, identical, total, worst, worst_key = [], 0, 0, 0.0, ""
    for i, c in enumerate(configs):
        alone = numeric(next(iter(fit(c, device="cuda:0"))))
        for key, want in alone.items():
            got = packed[i][key]
            total += 1
            identical += got.tobytes() == want.tobytes()
            gap, same = rel_gap(got, want, 0.0)
            if gap > worst:
                worst, worst_key = gap, key
            if gap > PACK_RTOL or not same:
                failures.append(f"pack on CUDA, member {i}: {key} {gap:.2e}")
    print(
        f"  bit-identical: {total and identical} of {total} record fields; max rel gap "
        f"{worst:.2e} ({worst_key}); bound {PACK_RTOL:g}: {'FAIL' if failures else 'ok'}"
    )
    return failures


# --- 2. trials/s ------------------------------------------------------------------------------


def reference_configs(n: int) -> list[Any]:
    from service.config import TrialConfig

    inits = ("gaussian", "orthogonal")
    return [TrialConfig(**SWEEP, seed=s, init=inits[s % 2]) for s in range(n)]


def unpacked_rate(device: str, n: int) -> float:
    """Trials/s of `n` reference trials through fit(), one after another."""
    from workers.train import fit

    configs = reference_configs(n)
    list(fit(configs[0], device=device, threads=1))  # warm-up: kernels, data
    start = time.perf_counter()
    for c in configs:
        for _ in fit(c, device=device, threads=1):
            pass
    return n / (time.perf_counter() - start)


def packed_rate(device: str, n: int) -> float:
    """Trials/s of `n` reference trials as one pack (fit_packed)."""
    from workers.packed import fit_packed

    list(fit_packed(reference_configs(2), device=device, threads=1))  # warm-up
    start = time.perf_counter()
    for _ in fit_packed(reference_configs(n), device=device, threads=1):
        pass
    return n / (time.perf_counter() - start)


def measure_cpu() -> dict[str, Any]:
    """The reference trial's rate on this machine's CPU (2 cores: two processes of one thread
    each run at twice one's rate, so the 2-core rate is 2 × one thread's), written beside this
    script for the GPU run to compare against."""
    one = unpacked_rate("cpu", 2)
    packed = packed_rate("cpu", 4)
    out = {
        "what": "reference trial (bench/gpu_engine.SWEEP) trials/s on the 2-core CPU machine",
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "load_average": os.getloadavg()[0],
        "unpacked_one_thread": one,
        "packed_one_thread": packed,
        "two_core_rate": 2 * max(one, packed),
        "measured": time.strftime("%Y-%m-%d"),
    }
    CPU_RATE_FILE.write_text(json.dumps(out, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure-cpu", action="store_true", help="write the CPU's rate")
    parser.add_argument("--members", type=int, default=PACKED_MEMBERS)
    parser.add_argument("--trials", type=int, default=UNPACKED_TRIALS)
    args = parser.parse_args(argv)
    if args.measure_cpu:
        print(json.dumps(measure_cpu(), indent=2))
        return 0
    if not torch.cuda.is_available():
        print(f"no CUDA device here (torch {torch.__version__}): nothing to measure")
        return 0
    from workers.train import set_cuda_precision

    began = time.perf_counter()
    set_cuda_precision("cuda:0")
    props = torch.cuda.get_device_properties(0)
    print(
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), python "
        f"{platform.python_version()}; {torch.cuda.get_device_name(0)}, "
        f"{props.total_memory / 2**30:.0f} GiB; {os.cpu_count()} CPUs; checks on {DATA!r}"
    )
    failures = check_cuda_against_cpu() + check_pack_on_cuda()
    print(f"  [checks took {time.perf_counter() - began:.0f} s]")
    print(f"\n## 2. trials/s of the reference trial {SWEEP}")
    unpacked = unpacked_rate("cuda:0", args.trials)
    packed = packed_rate("cuda:0", args.members)
    print(f"  unpacked on CUDA ({args.trials} trials, one after another): {unpacked:.2f} trials/s")
    print(f"  packed on CUDA ({args.members} members): {packed:.2f} trials/s")
    print(f"  packed / unpacked on CUDA: {packed / unpacked:.2f}×")
    if CPU_RATE_FILE.exists():
        cpu = json.loads(CPU_RATE_FILE.read_text())
        rate = cpu["two_core_rate"]
        print(
            f"  the 2-core CPU machine: {rate:.3f} trials/s (measured {cpu['measured']}); "
            f"packed CUDA / CPU {packed / rate:.1f}×, unpacked CUDA / CPU {unpacked / rate:.1f}×"
        )
    print(f"\n[total {time.perf_counter() - began:.0f} s]")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
