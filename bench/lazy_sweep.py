"""Sweeps of any size (issue 12): submit time, time to the first trial, a small sweep queued behind
a big one, cancel latency and the runner's memory, for a 1,000- and a 100,000-trial sweep of
init-only trials (depth 2, width 8, epochs 0, digits); and, at 400 trials, the lazy driver
against the one it replaced (Ray Tune's `grid_search` over every trial, the driver at git HEAD
when that is still the old one, else `--old-ref`), both run in the same process.

    .venv/bin/python bench/lazy_sweep.py                 # ~6 minutes on 2 busy cores
    .venv/bin/python bench/lazy_sweep.py --sizes 1000    # the small size only

- submit: parse_spec + Store.create_sweep on SQLite (what POST /sweeps does, less HTTP), with
  its parts: one `service.spec.expand` (parse_spec and create_sweep expand once each), and the
  trial rows' insert against the insert it replaced (`insert(SqlTrial)` in 500-row chunks).
- run (a child process per size, so that its memory is the runner's alone, on the parent's
  local Ray instance of 2 CPUs): a Runner (default turn, workers.driver.YIELD_AFTER_S) claims
  the big sweep; after WARM trials a 2-trial sweep is submitted behind it; once that completed
  and the big one has run WARM more, the big one is cancelled. Reported: claim → first trial
  start, the small sweep's submit → completed, cancel request → sweep cancelled, the runner's
  RSS (VmRSS) just before the cancel and its peak (ru_maxrss).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

WARM = 20  # trials completed before the next step
PARAMS = {"depth": 2, "width": 8, "epochs": 0, "dataset": "digits"}


def spec_data(name: str, n: int) -> dict[str, Any]:
    return {"name": name, "parameters": dict(PARAMS), "seeds": n, "rerun": True}  # no reuse


def settings_for(url: str):
    from service.settings import Settings

    return Settings(database_url=url, max_trials_per_sweep=1_000_000)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb() -> float:
    """VmHWM: this process image's peak RSS (ru_maxrss would count the parent's, from the fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_for(condition, timeout_s: float = 900.0, step: float = 0.05) -> float:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the bench waited too long")
        time.sleep(step)
    return time.monotonic()


# --- submit ---------------------------------------------------------------------------------


def submit(url: str, n: int) -> dict[str, float]:
    from sqlalchemy import insert

    from service.spec import expand, parse_spec
    from service.store import Store
    from service.store import sweeps as store_sweeps
    from service.store.models import SqlSweep, SqlTrial, utcnow

    settings = settings_for(url)
    store = Store(url, settings=settings)
    t0 = time.perf_counter()
    spec = parse_spec(spec_data(f"submit-{n}", n), settings=settings)
    info = store.create_sweep(spec)
    total = time.perf_counter() - t0
    assert info.n_trials == n
    t0 = time.perf_counter()
    expand(spec)
    one_expand = time.perf_counter() - t0
    rows = store_sweeps.trial_rows(spec, settings)
    with store._write() as s:  # the insert it replaced, rolled back
        sweep = SqlSweep(name="x", tags=[], spec={}, status="queued", priority=0,
                         cancel_requested=False, created_at=utcnow())  # fmt: skip
        s.add(sweep)
        s.flush()
        full = [store_sweeps._with_source(r, sweep.id, None, utcnow()) for r in rows]
        t0 = time.perf_counter()
        for k in range(0, len(full), 500):
            s.execute(insert(SqlTrial), full[k : k + 500])
        old_insert = time.perf_counter() - t0
        s.rollback()
    with store._write() as s:
        sweep = SqlSweep(name="y", tags=[], spec={}, status="queued", priority=0,
                         cancel_requested=False, created_at=utcnow())  # fmt: skip
        s.add(sweep)
        s.flush()
        full = [store_sweeps._with_source(r, sweep.id, None, utcnow()) for r in rows]
        t0 = time.perf_counter()
        for k in range(0, len(full), store_sweeps.INSERT_ROWS):
            store_sweeps.insert_many(s, SqlTrial.__table__, full[k : k + store_sweeps.INSERT_ROWS])
        new_insert = time.perf_counter() - t0
        s.rollback()
    store.close()
    return {"submit_s": total, "expand_s": one_expand, "insert_s": new_insert,
            "old_insert_s": old_insert}  # fmt: skip


# --- run (child process) -----------------------------------------------------------------------


def run_child(url: str, n: int) -> dict[str, Any]:
    """The Runner on the n-trial sweep submitted in `url` (the parent's), a small sweep behind
    it, then a cancel. This process does nothing else: its memory is the runner's."""
    from service.spec import parse_spec
    from service.store import Store
    from workers.runner import Runner

    settings = settings_for(url)
    store = Store(url, settings=settings)
    (big,), _ = store.list_sweeps(status="queued")
    assert big.n_trials == n
    claims: dict[int, float] = {}
    starts: dict[int, float] = {}
    real_claim = store.claim_sweep

    def claim(*a, **k):
        got = real_claim(*a, **k)
        if got is not None:
            claims.setdefault(got.id, time.monotonic())
        return got

    store.claim_sweep = claim  # type: ignore[method-assign]

    rss_at_start: list[float] = []

    def progress(p) -> None:
        if p.event == "start" and p.sweep_id not in starts:
            starts[p.sweep_id] = time.monotonic()
            rss_at_start.append(rss_mb())

    rss_before = rss_mb()
    runner = Runner(store, runner_id="bench", poll_s=0.2, progress=progress)
    thread = threading.Thread(target=runner.run_forever, daemon=True)
    thread.start()
    done = lambda sid: store.get_sweep(sid).counts["completed"]  # noqa: E731
    wait_for(lambda: done(big.id) >= WARM)
    small = store.create_sweep(parse_spec(spec_data(f"small-behind-{n}", 2), settings=settings))
    t_small = time.monotonic()
    t_small_done = wait_for(lambda: store.get_sweep(small.id).status == "completed", step=0.2)
    before = done(big.id)
    wait_for(lambda: done(big.id) >= before + WARM, step=0.2)
    rss_at_cancel, peak_at_cancel = rss_mb(), peak_mb()
    t_cancel = time.monotonic()
    store.request_cancel(big.id)
    t_cancelled = wait_for(lambda: store.get_sweep(big.id).status == "cancelled")
    runner.stop()
    thread.join(300)
    info = store.get_sweep(big.id)
    store.close()
    return {
        "n": n,
        "first_trial_s": starts[big.id] - claims[big.id],
        "small_behind_s": t_small_done - t_small,
        "cancel_s": t_cancelled - t_cancel,
        "rss_before_mb": rss_before,
        "rss_first_trial_mb": rss_at_start[0],
        "rss_at_cancel_mb": rss_at_cancel,
        "peak_mb": peak_at_cancel,
        "completed": info.counts["completed"],
        "cancelled": info.counts["cancelled"],
    }


def old_driver(ref: str):
    """workers/driver.py at `ref` (the grid_search driver), as a module of its own."""
    text = subprocess.run(
        ["git", "show", f"{ref}:workers/driver.py"], cwd=ROOT, check=True, capture_output=True,
        text=True,
    ).stdout  # fmt: skip
    if "grid_search" not in text:
        raise SystemExit(f"workers/driver.py at {ref} is not the grid_search driver; --old-ref")
    path = Path(tempfile.mkdtemp()) / "driver_grid.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("driver_grid", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def compare_child(url: str, n: int, ref: str) -> dict[str, Any]:
    """Claim → first trial start and cancel → return for the lazy and the old driver, n trials."""
    from service.spec import parse_spec
    from service.store import Store
    from workers import driver

    settings = settings_for(url)
    store = Store(url, settings=settings)
    out: dict[str, Any] = {"n": n}
    for name, module in (("lazy", driver), ("grid", old_driver(ref))):
        sweep = store.create_sweep(parse_spec(spec_data(f"{name}-{n}", n), settings=settings))
        first: dict[str, float] = {}

        def progress(p, first=first) -> None:
            if p.event == "start":
                first.setdefault("t", time.monotonic())

        def cancel_after_warm(sid=sweep.id, first=first) -> None:
            wait_for(lambda: store.get_sweep(sid).counts["completed"] >= WARM, step=0.2)
            first["cancel"] = time.monotonic()
            store.request_cancel(sid)

        canceller = threading.Thread(target=cancel_after_warm, daemon=True)
        assert store.claim_sweep("bench", 600).id == sweep.id
        t0 = time.monotonic()
        canceller.start()
        info = module.run_sweep(store, sweep.id, runner_id="bench", progress=progress)
        t_end = time.monotonic()
        out[name] = {"first_trial_s": first["t"] - t0, "cancel_s": t_end - first["cancel"],
                     "status": info.status}  # fmt: skip
    out["first_trial_ratio_grid_over_lazy"] = (
        out["grid"]["first_trial_s"] / out["lazy"]["first_trial_s"]
    )
    store.close()
    return out


def child(kind: str, url: str, n: int, ref: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--child", kind, "--url", url, "--n", str(n), "--old-ref", ref]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, check=False)
    if proc.returncode:
        raise SystemExit(f"{kind} child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,100000")
    ap.add_argument("--old-n", default="400,800")
    ap.add_argument("--old-ref", default="HEAD")
    ap.add_argument("--child", choices=["run", "compare"])
    ap.add_argument("--url")
    ap.add_argument("--n", type=int)
    args = ap.parse_args()
    if args.child:
        import ray

        ray.init(address=os.environ["RAY_ADDRESS"])
        fn = run_child if args.child == "run" else compare_child
        res = fn(args.url, args.n) if args.child == "run" else fn(args.url, args.n, args.old_ref)
        print(json.dumps(res))
        return

    import ray

    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-lazy-"))
    print("submit (parse_spec + create_sweep, SQLite):")
    for n in sizes:
        r = submit(f"sqlite:///{work / f'submit-{n}.db'}", n)
        print(f"  {n:>7} trials: {r['submit_s']:6.2f} s  (one expand {r['expand_s']:.2f} s; "
              f"rows insert {r['insert_s']:.2f} s, the insert it replaced "
              f"{r['old_insert_s']:.2f} s)")  # fmt: skip
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    print("run (a Runner in a child process; the parent's local Ray, 2 CPUs):")
    for n in sizes:
        r = child("run", f"sqlite:///{work / f'submit-{n}.db'}", n, args.old_ref)
        print(f"  {n:>7} trials: first trial {r['first_trial_s']:.1f} s after the claim; a 2-trial "
              f"sweep submitted behind it completed in {r['small_behind_s']:.1f} s; cancel took "
              f"{r['cancel_s']:.1f} s; runner RSS {r['rss_before_mb']:.0f} MB before the claim, "
              f"{r['rss_first_trial_mb']:.0f} MB at the first trial, {r['rss_at_cancel_mb']:.0f}"
              f" MB at the cancel (peak {r['peak_mb']:.0f} MB); "
              f"{r['completed']} completed, {r['cancelled']} cancelled")  # fmt: skip
    for n in (int(x) for x in args.old_n.split(",")):
        r = child("compare", f"sqlite:///{work / f'compare-{n}.db'}", n, args.old_ref)
        print(f"lazy vs grid_search driver ({args.old_ref}), {n} trials, same process:")
        for name in ("lazy", "grid"):
            x = r[name]
            print(f"  {name:>4}: first trial {x['first_trial_s']:.1f} s after run_sweep began; "
                  f"cancel → return {x['cancel_s']:.1f} s ({x['status']})")  # fmt: skip
        print(f"  first-trial ratio grid / lazy: {r['first_trial_ratio_grid_over_lazy']:.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
