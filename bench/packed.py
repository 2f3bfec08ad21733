"""Packed trials through the runner (issue 13, docs/architecture.md "Packed trials"): trials/s of
a 256-trial init-only sweep (depth 20, width 64, epochs 0, digits; seeds × 2 inits) run by
`workers.driver.run_sweep` on a local Ray of 2 CPUs with the store on SQLite — packed (`pack`
unset, the automatic size, and a fixed size) against unpacked (`pack: 1`, every trial its own
Tune trial) and against a bare `multiprocessing.Pool(2)` of `workers.train.fit`; then a trained
sweep (depth 100, width 128, 1 epoch on `gaussian`) packed against unpacked.

    .venv/bin/python bench/packed.py            # ~4 minutes on 2 idle cores
    .venv/bin/python bench/packed.py --quick    # a smoke run: 64 init-only trials, a small
                                                # trained sweep
    .venv/bin/python bench/packed.py --part init-only --trials 1000 \
        --set epochs=1 --set depth=4 --set width=32   # 1000 one-epoch trials against Pool(2)

Fairness as in bench/runner.py: both sides run 2 trials at a time on one torch thread each, at
Ray's worker niceness (RAY_worker_niceness, 15), the pool's processes started with `spawn` (each
imports torch, as a Ray worker does). A runner side's time is from starting Ray to the sweep's
end (Ray's start is printed apart); the pool's includes starting its processes. Targets: packed
≥ 5× unpacked and ahead of the pool (init-only); packed no slower than unpacked (trained).

To tell where the time goes, the same configs are also timed in this process on one thread:
`fit` per trial and `fit_packed` per member, the compute a runner side cannot avoid; what a side
takes beyond that compute (spread over 2 processes) is Ray's start and Tune's per-trial cost.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.spec import expand, parse_spec  # noqa: E402

PROCESSES = 2
NICENESS = int(os.environ.get("RAY_worker_niceness", "15"))  # noqa: SIM112  (Ray spells it so)
INIT_ONLY = {"depth": 20, "width": 64, "epochs": 0, "dataset": "digits"}
TRAINED = {"depth": 100, "width": 128, "epochs": 1, "dataset": "gaussian"}
TRAINED_QUICK = {"depth": 20, "width": 64, "epochs": 1, "dataset": "digits"}


def make_spec(name: str, params: dict[str, Any], trials: int, pack: int | None) -> dict[str, Any]:
    """`trials` trials: 2 inits × trials/2 seeds, everything else fixed (one pack key)."""
    body: dict[str, Any] = {
        "name": name,
        "parameters": {**params, "init": ["gaussian", "orthogonal"]},
        "seeds": trials // 2,
        "resources": {"cpu": 1, "gpu": 0},
        "rerun": True,
    }
    if pack is not None:
        body["pack"] = pack
    return body


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


# --- the bare pool ------------------------------------------------------------------------------


def bare_trial(config: dict[str, Any]) -> int:
    """One trial in a pool process: fit() on one thread; the number of records."""
    import torch

    from workers.train import fit

    torch.set_num_threads(1)
    return len(list(fit(config)))


def lower_priority() -> None:
    os.nice(NICENESS)


def run_pool(body: dict[str, Any]) -> tuple[float, int]:
    configs = [c.to_dict() for c in expand(parse_spec(body))]
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(PROCESSES, lower_priority) as pool:
        records = pool.map(bare_trial, configs, chunksize=1)
    return time.perf_counter() - start, sum(records)


# --- the runner ---------------------------------------------------------------------------------


def run_runner(body: dict[str, Any]) -> dict[str, float]:
    """One sweep through run_sweep on a fresh local Ray of PROCESSES CPUs: seconds in all, of
    Ray's start, to the first record, and the records stored."""
    import ray

    from service.status import TrialStatus
    from service.store import Store
    from workers.driver import init_ray, run_sweep

    arrivals: list[float] = []  # when each record reached the driver
    with tempfile.TemporaryDirectory() as tmp, Store(f"sqlite:///{Path(tmp) / 'b.db'}") as store:
        sweep = store.create_sweep(parse_spec(body))
        store.claim_sweep("bench-packed", 600, sweep_id=sweep.id)
        start = time.perf_counter()
        init_ray(num_cpus=PROCESSES, num_gpus=0)
        ray_s = time.perf_counter() - start

        def progress(p: Any) -> None:
            if p.event == "record":
                arrivals.append(time.perf_counter() - start)

        cpu = time.process_time()
        try:
            info = run_sweep(store, sweep.id, runner_id="bench-packed", progress=progress)
            elapsed = time.perf_counter() - start
            driver_cpu = time.process_time() - cpu
        finally:
            ray.shutdown()
        assert info.status == "completed", info
        done = info.counts.get(TrialStatus.COMPLETED, 0)
        assert done == sweep.n_trials, info.counts
        records, offset = 0, 0
        while True:
            page, total = store.list_trials(sweep.id, offset=offset, limit=100)
            records += sum(t.records_done for t in page)
            offset += len(page)
            if offset >= total or not page:
                break
    first = arrivals[0] if arrivals else math.nan
    steady = (len(arrivals) - 1) / (arrivals[-1] - first) if len(arrivals) > 1 else math.nan
    return {"s": elapsed, "ray_s": ray_s, "first_s": first, "records": records,
            "steady": steady, "driver_cpu": driver_cpu}  # fmt: skip


# --- in-process compute -------------------------------------------------------------------------


def compute_costs(body: dict[str, Any], pack: int, sample: int) -> tuple[float, float]:
    """CPU seconds (this process's, robust to a shared machine's load) per trial of fit() (the
    first `sample` trials, after one warm-up) and per member of fit_packed() over the first
    `pack` trials, on one thread."""
    import torch

    from workers.packed import fit_packed
    from workers.train import fit

    configs = expand(parse_spec({**body, "pack": None}))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        list(fit(configs[0]))
        start = time.process_time()
        for c in configs[:sample]:
            list(fit(c))
        alone = (time.process_time() - start) / min(sample, len(configs))
        members = configs[:pack]
        start = time.process_time()
        list(fit_packed(members))
        packed = (time.process_time() - start) / len(members)
    finally:
        torch.set_num_threads(before)
    return alone, packed


def auto_size(body: dict[str, Any]) -> int:
    """What the driver chooses for `pack` unset here: auto_pack_size with the slots of a local
    Ray of PROCESSES CPUs at 1 CPU per trial (workers.driver.pack_size)."""
    from service.packs import auto_pack_size

    configs = expand(parse_spec(body))
    return auto_pack_size(configs[0], trials_left=len(configs), slots=PROCESSES)


# --- the comparisons ----------------------------------------------------------------------------


def side_label(pack: int | None, auto: int) -> str:
    if pack is None:
        return f"packed (auto = {auto})"
    return "unpacked (pack 1)" if pack == 1 else f"packed (pack {pack})"


def sweep_sides(
    title: str, params: dict[str, Any], trials: int, packs: list[int | None], pool: bool
) -> dict[str, float]:
    """Run each side once; print and return trials/s by label."""
    auto = auto_size(make_spec("x", params, trials, None))
    print(f"\n## {title}: {trials} trials, {params} × init × seeds, {PROCESSES} at a time")
    rates: dict[str, float] = {}
    expected = None
    if pool:
        print(f"  [{load()}]")
        seconds, records = run_pool(make_spec("pool", params, trials, 1))
        rates["pool"] = trials / seconds
        expected = records
        print(
            f"  Pool({PROCESSES}) of bare fit():  {seconds:6.1f} s = {rates['pool']:6.2f} "
            f"trials/s ({records} records)"
        )
    for pack in packs:
        label = side_label(pack, auto)
        print(f"  [{load()}]")
        r = run_runner(make_spec(f"bench-{pack}", params, trials, pack))
        rates[label] = trials / r["s"]
        if expected is not None:
            assert r["records"] == expected, (
                f"{label} stored {r['records']} records, not {expected}"
            )
        expected = r["records"]
        print(
            f"  {label + ':':28s}{r['s']:6.1f} s = {rates[label]:6.2f} trials/s ({r['records']} "
            f"records; Ray start {r['ray_s']:.1f} s, first record at {r['first_s']:.1f} s; "
            f"{trials / (r['s'] - r['ray_s']):.2f} trials/s after Ray's start; {r['steady']:.1f} "
            f"records/s from the first to the last; the driver's CPU {r['driver_cpu']:.1f} s)"
        )
    print(f"  [{load()}]")
    return rates


def report_ratios(rates: dict[str, float], targets: list[tuple[str, str, float]]) -> None:
    for num, den, target in targets:
        if num in rates and den in rates:
            ratio = rates[num] / rates[den]
            mark = "met" if ratio >= target else "MISSED"
            print(f"  {num} / {den}: {ratio:.2f}× (target ≥ {target:g}×: {mark})")


def phases(title: str, params: dict[str, Any], trials: int, pack: int, sample: int) -> None:
    body = make_spec("x", params, trials, None)
    alone, packed = compute_costs(body, pack, sample)
    print(
        f"  {title} compute in-process, 1 thread, CPU time: fit {alone * 1e3:.1f} ms/trial, "
        f"fit_packed({pack}) {packed * 1e3:.1f} ms/member ({alone / packed:.2f}×); "
        f"{trials} trials on {PROCESSES} processes: ≥ {trials * alone / PROCESSES:.1f} s "
        f"unpacked, ≥ {trials * packed / PROCESSES:.1f} s packed [{load()}]"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 init-only trials, small training")
    parser.add_argument("--trials", type=int, default=256, help="init-only trials (default 256)")
    parser.add_argument("--pack", type=int, default=64, help="the fixed pack size (default 64)")
    parser.add_argument("--trained", type=int, default=16, help="trained trials (default 16)")
    parser.add_argument(
        "--part", choices=("all", "init-only", "trained"), default="all", help="what to run"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a field of the first sweep (repeatable), e.g. --set epochs=1 --set depth=4",
    )
    args = parser.parse_args(argv)
    first = dict(INIT_ONLY)
    for item in args.overrides:
        key, _, value = item.partition("=")
        first[key] = int(value) if value.lstrip("-").isdigit() else value
    trials = 64 if args.quick else args.trials
    trained = 4 if args.quick else args.trained
    trained_params = TRAINED_QUICK if args.quick else TRAINED
    print(f"bench/packed.py on {os.cpu_count()} CPUs; {load()}")

    if args.part in ("all", "init-only"):
        init_packs: list[int | None] = [None, args.pack, 1]
        auto = auto_size(make_spec("x", first, trials, None))
        if args.pack == auto:  # the auto size is this one already: show a smaller fixed size
            init_packs[1] = max(1, args.pack // 4)
        rates = sweep_sides("init-only", first, trials, init_packs, pool=True)
        packed = side_label(None, auto)
        report_ratios(rates, [(packed, "unpacked (pack 1)", 5.0), (packed, "pool", 1.0)])
        phases("init-only", first, trials, auto, sample=16)
    if args.part in ("all", "trained"):
        t_auto = auto_size(make_spec("x", trained_params, trained, None))
        t_rates = sweep_sides("trained", trained_params, trained, [None, 1], pool=False)
        report_ratios(t_rates, [(side_label(None, t_auto), "unpacked (pack 1)", 1.0)])
        phases("trained", trained_params, trained, t_auto, sample=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
