"""The GPU path, for a machine that has one (issue 13, docs/architecture.md "Packed trials"):
CUDA's numbers against the CPU's, then one sweep run through the runner (workers.driver.run_sweep
on a local Ray) packed and unpacked with `resources: {cpu: 1, gpu: 0.25}` (four Tune trials
share the GPU) and on the 2-core CPU runner, printing trials/s and where each trial ran.

    .venv/bin/python bench/gpu_sweep.py          # checks + the 64-trial sweep: ~3 minutes (H200)
    .venv/bin/python bench/gpu_sweep.py --all    # and the 1024-trial packed sweep: ≲ 8 minutes

1. CUDA against CPU, and a pack on CUDA against its members alone: bench/gpu_engine.py's checks
   (imported from it: the engine-only half of this script, for a GPU machine without Ray).
2. The sweep (SWEEP: depth 100, width 128, 1 epoch on `gaussian`, seeds × 2 inits): packed
   (`pack` unset: the automatic size) and unpacked (`pack: 1`) on `gpu: 0.25`, and the first
   `--cpu-trials` of it on a local Ray of 2 CPUs without a GPU, packed and unpacked (the CPU
   runner; trials/s is a rate, so a sample of the same trials measures it). Times are run_sweep's
   (Ray already started; its start is printed apart).
3. `--all`: the same trial shape as a 1024-trial packed sweep, against the rates of 2 (targets:
   ≥ 50× the 2-core CPU runner, ≥ 10× unpacked gpu 0.25). Sized down — and said so — when the
   packed rate measured in 2 predicts more than the time left of `--budget-s`.

Exit status 1 if a trial given a GPU did not run on CUDA (its DEVICE_KEY, recorded in the
sweep's progress) or a CUDA number is outside its tolerance; on a machine without a CUDA device
it says so and exits 0 (nothing to measure).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from gpu_engine import SWEEP, check_cuda_against_cpu, check_pack_on_cuda  # noqa: E402

from service.spec import parse_spec  # noqa: E402

GPU_SHARE = 0.25


# --- 2. sweeps through the runner ---------------------------------------------------------------


def sweep_spec(name: str, trials: int, *, gpu: float, pack: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "parameters": {**SWEEP, "init": ["gaussian", "orthogonal"]},
        "seeds": max(trials // 2, 1),
        "resources": {"cpu": 1, "gpu": gpu},
        "rerun": True,
    }
    if pack is not None:
        body["pack"] = pack
    return body


def auto_pack(trials: int, cpus: float, gpu: float) -> int:
    """The pack size the driver picks for `pack` unset (workers.driver.pack_size): slots are
    the trials a local Ray of `cpus` CPUs (and one GPU when `gpu` > 0) runs at once."""
    from service.config import TrialConfig
    from service.packs import auto_pack_size

    slots = min(cpus, 1 / gpu) if gpu > 0 else cpus
    return auto_pack_size(TrialConfig(**SWEEP), trials_left=trials, slots=max(1, int(slots)))


def start_ray(num_cpus: int, num_gpus: int) -> float:
    import ray

    from workers.driver import init_ray

    if ray.is_initialized():
        ray.shutdown()
    start = time.perf_counter()
    init_ray(num_cpus=num_cpus, num_gpus=num_gpus)
    return time.perf_counter() - start


def run(store: Any, body: dict[str, Any]) -> dict[str, Any]:
    """One sweep through run_sweep on the Ray instance up: seconds, trials, where each ran."""
    from service.status import TrialStatus
    from workers.driver import run_sweep

    sweep = store.create_sweep(parse_spec(body))
    store.claim_sweep("bench-gpu", 600, sweep_id=sweep.id)
    devices: dict[int, str] = {}
    start = time.perf_counter()
    info = run_sweep(
        store, sweep.id, runner_id="bench-gpu", progress=lambda p: devices.update(p.devices)
    )
    elapsed = time.perf_counter() - start
    n = sweep.n_trials
    completed = info.counts.get(TrialStatus.COMPLETED, 0)
    return {
        "s": elapsed,
        "n": n,
        "rate": n / elapsed,
        "completed": completed,
        "status": info.status,
        "devices": devices,
    }


def show(label: str, r: dict[str, Any]) -> None:
    where = dict(Counter(r["devices"].values()))
    missing = r["n"] - len(r["devices"])
    print(
        f"  {label:34s} {r['n']:5d} trials in {r['s']:7.1f} s = {r['rate']:8.2f} trials/s; "
        f"{r['completed']} completed ({r['status']}); ran on {where}"
        + (f", {missing} never reported" if missing else "")
    )


def gpu_failures(label: str, r: dict[str, Any]) -> list[str]:
    """The sweep given a GPU: every trial completed and reported a CUDA device."""
    out = []
    not_cuda = {t: d for t, d in r["devices"].items() if not d.startswith("cuda")}
    if not_cuda:
        out.append(f"{label}: {len(not_cuda)} trials given a GPU ran on {set(not_cuda.values())}")
    if len(r["devices"]) < r["n"]:
        out.append(f"{label}: {r['n'] - len(r['devices'])} trials never reported a device")
    if r["completed"] != r["n"]:
        out.append(f"{label}: {r['completed']} of {r['n']} trials completed ({r['status']})")
    return out


def rate(r: dict[str, Any]) -> float:
    """Trials/s of a sweep whose trials all completed, else NaN (no rate to compare)."""
    return r["rate"] if r["completed"] == r["n"] else math.nan


def ratio(name: str, num: float, den: float, target: float | None = None) -> None:
    if not (math.isfinite(num) and math.isfinite(den)):
        print(f"  {name}: n/a (a side did not complete)")
        return
    verdict = ""
    if target is not None:
        verdict = f" (target ≥ {target:g}×: {'met' if num / den >= target else 'MISSED'})"
    print(f"  {name}: {num / den:.2f}×{verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="add the 1024-trial packed sweep")
    parser.add_argument("--trials", type=int, default=64, help="the sweep's trials (default 64)")
    parser.add_argument("--cpu-trials", type=int, default=8, help="of them on the CPU runner")
    parser.add_argument("--big-trials", type=int, default=1024, help="--all's sweep (1024)")
    parser.add_argument("--big-pack", type=int, default=None, help="--all's pack (default auto)")
    parser.add_argument("--cpus", type=int, default=8, help="CPUs of the GPU sweeps' Ray")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="the whole run's time; --all's sweep is sized to what is left",
    )
    parser.add_argument("--skip-checks", action="store_true", help="no CUDA-vs-CPU checks")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    if not torch.cuda.is_available():
        print(
            f"no CUDA device here (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda}): nothing to measure (run this on a GPU machine)"
        )
        return 0
    import ray

    from service.store import Store
    from workers.train import set_cuda_precision

    set_cuda_precision("cuda:0")
    props = torch.cuda.get_device_properties(0)
    print(
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), ray {ray.__version__}, "
        f"python {platform.python_version()}; {torch.cuda.get_device_name(0)}, "
        f"{props.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} device(s); "
        f"{os.cpu_count()} CPUs; TF32 matmul {torch.backends.cuda.matmul.allow_tf32}, "
        f"cudnn {torch.backends.cudnn.allow_tf32} "
        f"(ISOSWEEP_ALLOW_TF32={os.environ.get('ISOSWEEP_ALLOW_TF32', 'unset')})"
    )
    failures: list[str] = []
    if not args.skip_checks:
        failures += check_cuda_against_cpu()
        failures += check_pack_on_cuda()
        print(f"  [checks took {time.perf_counter() - began:.0f} s]")

    n = args.trials
    print(f"\n## 2. {n} trials of {SWEEP} × init × seeds through run_sweep")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, Store(f"sqlite:///{Path(tmp) / 'g.db'}") as store:
        ray_s = start_ray(args.cpus, 1)
        print(f"  [a local Ray of {args.cpus} CPUs and 1 GPU started in {ray_s:.1f} s]")
        print(
            f"  [pack unset → {auto_pack(n, args.cpus, GPU_SHARE)} on the GPU, "
            f"{auto_pack(args.cpu_trials, 2, 0)} on the CPU runner]"
        )
        for label, pack in (("packed gpu 0.25", None), ("unpacked gpu 0.25", 1)):
            r = run(store, sweep_spec(label, n, gpu=GPU_SHARE, pack=pack))
            results[label] = r
            show(label, r)
            failures += gpu_failures(label, r)
        ray_s = start_ray(2, 0)
        print(f"  [a local Ray of 2 CPUs, no GPU, started in {ray_s:.1f} s]")
        for label, pack in (("CPU runner packed", None), ("CPU runner unpacked", 1)):
            r = run(store, sweep_spec(label, args.cpu_trials, gpu=0.0, pack=pack))
            results[label] = r
            show(label, r)
        cpu_rates = [rate(results[k]) for k in ("CPU runner packed", "CPU runner unpacked")]
        cpu_rate = max((x for x in cpu_rates if math.isfinite(x)), default=math.nan)
        packed, unpacked = rate(results["packed gpu 0.25"]), rate(results["unpacked gpu 0.25"])
        ratio("packed gpu / unpacked gpu 0.25", packed, unpacked)
        ratio("packed gpu / the CPU runner (its faster side)", packed, cpu_rate)
        ratio("unpacked gpu 0.25 / the CPU runner", unpacked, cpu_rate)

        if args.all:
            left = args.budget_s - (time.perf_counter() - began) - 30.0  # Ray's start, the end
            measured = packed if math.isfinite(packed) else results["packed gpu 0.25"]["rate"]
            fits = int(left * measured * 0.8)  # the packed rate of 2, with a margin
            big = min(args.big_trials, max(fits // 2 * 2, 2))
            size = args.big_pack or f"auto = {auto_pack(big, args.cpus, GPU_SHARE)}"
            print(f"\n## 3. {big} trials packed (pack {size}, gpu 0.25), the same trial shape")
            if big < args.big_trials:
                print(
                    f"  (sized down from {args.big_trials}: {left:.0f} s left of --budget-s at "
                    f"{measured:.2f} trials/s; rerun with a larger --budget-s for the full size)"
                )
            ray_s = start_ray(args.cpus, 1)
            print(f"  [a local Ray of {args.cpus} CPUs and 1 GPU started in {ray_s:.1f} s]")
            label = f"{big} packed gpu 0.25"
            r = run(store, sweep_spec(label, big, gpu=GPU_SHARE, pack=args.big_pack))
            show(label, r)
            failures += gpu_failures(label, r)
            ratio("big packed / the 2-core CPU runner", rate(r), cpu_rate, 50.0)
            ratio("big packed / unpacked gpu 0.25", rate(r), unpacked, 10.0)
        ray.shutdown()
    print(f"\n[total {time.perf_counter() - began:.0f} s]")
    if failures:
        for f in failures:
            print(f"FAIL: {f}", file=sys.stderr)
        return 1
    print("all checks passed: every trial given a GPU ran on CUDA; CUDA numbers within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
