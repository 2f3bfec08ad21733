"""The GPU path, for a machine that has one: the same small sweep run twice through the runner
on a local Ray instance — with `resources: {cpu: 1, gpu: 0.25}` (four trials share the GPU) and
with `{cpu: 1, gpu: 0}` (CPU only) — printing where each trial ran and trials/s of both.

    .venv/bin/python bench/gpu_sweep.py [--cpus 4] [--epochs 5]

It exits with status 1 if any GPU-side trial did not run on CUDA (the check the GPU path needs);
on a machine without a CUDA device it says so and exits 0 (nothing to measure).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from service.spec import expand, parse_spec
from service.store import Store


def spec(name: str, gpu: float, epochs: int) -> dict[str, Any]:
    """16 trials: 2 depths × 2 inits × 4 seeds, wide enough that a GPU has work to do."""
    return {
        "name": name,
        "parameters": {
            "depth": [32, 64],
            "init": ["gaussian", "orthogonal"],
            "width": 512,
            "batch_size": 256,
            "norm": "batch",
            "dataset": "gaussian",
            "epochs": epochs,
        },
        "seeds": 4,
        "resources": {"cpu": 1, "gpu": gpu},
        "rerun": True,
    }


def run(store: Store, body: dict[str, Any], num_cpus: int, num_gpus: int) -> tuple[float, Counter]:
    from workers.driver import init_ray, run_sweep

    sweep = store.create_sweep(parse_spec(body))
    store.claim_sweep("bench-gpu", 600, sweep_id=sweep.id)
    init_ray(num_cpus=num_cpus, num_gpus=num_gpus)
    devices: dict[int, str] = {}
    start = time.perf_counter()
    info = run_sweep(
        store, sweep.id, runner_id="bench-gpu", progress=lambda p: devices.update(p.devices)
    )
    elapsed = time.perf_counter() - start
    assert info.status == "completed", info
    return elapsed, Counter(devices.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--cpus", type=int, default=4, help="CPUs given to the local Ray")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing to measure (run this on a GPU machine)")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    gpu_spec, cpu_spec = spec("gpu", 0.25, args.epochs), spec("cpu", 0.0, args.epochs)
    n_trials = len(expand(parse_spec(gpu_spec)))  # the same grid in both
    with tempfile.TemporaryDirectory() as tmp, Store(f"sqlite:///{Path(tmp) / 'g.db'}") as store:
        gpu_s, gpu_devices = run(store, gpu_spec, args.cpus, 1)
        cpu_s, cpu_devices = run(store, cpu_spec, args.cpus, 1)
    for label, secs, where in (("gpu 0.25", gpu_s, gpu_devices), ("cpu only", cpu_s, cpu_devices)):
        rate = f"{n_trials / secs:6.2f} trials/s"
        print(f"{label}: {n_trials} trials in {secs:6.1f} s = {rate} on {dict(where)}")
    print(f"ratio (GPU trials/s over CPU trials/s): {cpu_s / gpu_s:.2f}")
    if not gpu_devices or not all(d.startswith("cuda") for d in gpu_devices):
        print("FAIL: some GPU trials did not run on CUDA", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
