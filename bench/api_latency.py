"""Latency of the REST API under polling, and the time to submit a big sweep.

A uvicorn server (its own process, one worker, a real loopback port) serves a SQLite file
(or Postgres, --database-url) holding 200-trial sweeps with stored records: 4 depths × 5
activations × 10 seeds, depth ≤ 100, 11 recorded epochs (≈ 0.5 M values each). Then:

1. baseline: GET /healthz from one client, sequentially (the same machine, the same moment);
2. load on a completed sweep: 20 client threads poll for --seconds, each alternating
   GET /sweeps/{id} (status) and a dashboard-style metrics query (per-layer isometry gap at
   each trial's last epoch, pooled over seeds), pausing --interval seconds between polls;
3. the same on a running sweep while a writer (another process, as the runner's driver would)
   stores one epoch of all 200 trials every second, so cached answers keep going stale;
4. submission: POST of a 1,000-trial spec, timed from the client, 3 times.

Prints p50/p99 of each, and each p50/p99 as a multiple of the baseline's p50, so that figures
compare across machines. Targets: status p99 ≤ 50 ms on the completed sweep, submission ≤ 1 s
(the exit code says whether both were met); the running sweep is reported for information.

    .venv/bin/python bench/api_latency.py [--clients 20] [--seconds 15] [--interval 0.5]

`--phase mixed` (bench/api_mixed.py) instead measures the heavy reads: 40 clients, each a
bounded number of requests mixing plots, metrics JSON, CSV and healthz, against a server with
the heavy-read limit off (a limit above the client count) and then on (the settings' default),
in the same process; it prints plot p99/max, healthz p99, the server's peak and final RSS, and
the on/off ratios; `--plots page` asks for the plots as the dashboard does (chart data as JSON,
one in four a PNG download) instead of every one as a PNG. `--phase submit` posts six
5,000-trial, 100,000-epoch specs at once.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
from api_server import EPOCHS, SWEEP, completed_sweep, epoch_batch, free_port, start_server

from service.settings import Settings
from service.spec import parse_spec
from service.store import Store

STATUS_P99_MS = 50.0
SUBMIT_S = 1.0
METRICS_QUERY = {"metric": "isometry_gap/act", "epoch": "last", "aggregate": "true"}
METRICS_ARGS = {"metrics": "isometry_gap/act", "epoch": "last", "aggregate": True}
BIG = {
    "name": "bench-1000",
    "parameters": {
        "depth": [2, 4, 8, 16, 32, 64, 128, 256, 512, 1000],
        "init": ["gaussian", "orthogonal"],
        "activation": ["relu", "tanh", "sin", "identity", "gelu"],
        "epochs": 100,
    },
    "seeds": 10,
}


def running_sweep(store: Store, epochs: int) -> tuple[int, list]:
    """A claimed (running) 200-trial sweep with its first `epochs` epochs stored."""
    spec = parse_spec({**SWEEP, "name": "bench-running", "rerun": True}, settings=store.settings)
    sweep = store.create_sweep(spec)
    assert store.claim_sweep("bench-writer", 600).id == sweep.id
    trials, _ = store.list_trials(sweep.id, limit=1000)
    for t in trials:
        store.start_trial(t.id)
    rng = np.random.default_rng(1)
    for e in range(epochs):
        store.write_records(epoch_batch(trials, e, rng))
    return sweep.id, trials


def writer(url: str, trials: list[tuple[int, int]], first: int, stop: Any) -> None:
    """Store one epoch of every trial each second, as a runner's driver would. Runs in a
    process of its own, so that its work does not slow down the clients' timing."""
    rng = np.random.default_rng(2)
    shaped = [SimpleNamespace(id=i, config={"depth": d}) for i, d in trials]
    with Store(url, settings=Settings(database_url=url)) as store:
        for e in range(first, EPOCHS + 1):
            if stop.wait(1.0):
                return
            store.write_records(epoch_batch(shaped, e, rng))


def timed(client: httpx.Client, path: str, params: dict | None = None) -> float:
    start = time.perf_counter()
    r = client.get(path, params=params)
    elapsed = time.perf_counter() - start
    r.raise_for_status()
    return elapsed


def baseline(base: str, n: int = 300) -> list[float]:
    with httpx.Client(base_url=base) as c:
        for _ in range(20):
            timed(c, "/healthz")  # warm up
        return [timed(c, "/healthz") for _ in range(n)]


def load(base: str, sweep_id: int, clients: int, seconds: float, interval: float, warmup: float):
    """Latencies of the polls that start after `warmup` seconds (the first polls of every
    client miss the cache at once: a start-up transient, not the steady state)."""
    status: list[float] = []
    metrics: list[float] = []
    lock = threading.Lock()
    counted = time.monotonic() + warmup
    stop = counted + seconds

    def poll(k: int) -> None:
        time.sleep(interval * k / clients)  # spread the first polls over one interval
        with httpx.Client(base_url=base, timeout=60) as c:
            while time.monotonic() < stop:
                begun = time.monotonic()
                s = timed(c, f"/sweeps/{sweep_id}")
                m = timed(c, f"/sweeps/{sweep_id}/metrics", METRICS_QUERY)
                if begun >= counted:
                    with lock:
                        status.append(s)
                        metrics.append(m)
                time.sleep(interval)

    threads = [threading.Thread(target=poll, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return status, metrics


def submit(base: str, reps: int = 3) -> list[float]:
    times = []
    with httpx.Client(base_url=base, timeout=120) as c:
        for i in range(reps):
            body = {**BIG, "name": f"{BIG['name']}-{i}"}
            start = time.perf_counter()
            r = c.post("/sweeps", json=body)
            times.append(time.perf_counter() - start)
            assert r.status_code == 201 and r.json()["n_trials"] == 1000, r.text
    return times


def ms(times: list[float], q: float) -> float:
    return 1000 * float(np.percentile(times, q))


def report(name: str, times: list[float], base_p50: float, target: float | None = None) -> bool:
    p50, p99 = ms(times, 50), ms(times, 99)
    line = (
        f"{name:<28} n={len(times):<6} p50 {p50:7.1f} ms  p99 {p99:7.1f} ms"
        f"   ({p50 / base_p50:5.1f}× / {p99 / base_p50:5.1f}× baseline p50)"
    )
    ok = target is None or p99 <= target
    if target is not None:
        line += f"   target p99 ≤ {target:.0f} ms: {'met' if ok else 'MISSED'}"
    print(line)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, help="default 20 (polling), 40 (mixed)")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--interval", type=float, default=0.5, help="pause between polls (s)")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds not counted (s)")
    ap.add_argument("--database-url", help="default: a fresh SQLite file")
    ap.add_argument("--phase", choices=["polling", "mixed", "submit"], default="polling")
    ap.add_argument("--requests", type=int, default=8, help="per client (mixed)")
    ap.add_argument(
        "--plots",
        choices=["png", "page"],
        default="png",
        help="mixed: every plot a PNG, or as the dashboard asks (chart JSON, one in 4 a PNG)",
    )
    ap.add_argument("--before-tree", type=Path, help="mixed, submit: also serve this checkout")
    args = ap.parse_args()
    if args.phase != "polling":
        import api_mixed

        return api_mixed.main(args)
    args.clients = args.clients or 20
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        with Store(url, settings=Settings(database_url=url)) as store:
            t0 = time.perf_counter()
            done_id = completed_sweep(store)
            run_id, trials = running_sweep(store, epochs=3)
            rows = len(store.read_metrics(done_id, **METRICS_ARGS))
            assert rows > 0, "the completed sweep has no stored results"
            print(f"stored two 200-trial sweeps in {time.perf_counter() - t0:.1f} s ({url})")
            print(f"the metrics query returns {rows} rows")
        port = free_port()
        server = start_server(url, port)
        spawn = multiprocessing.get_context("spawn")
        stop = spawn.Event()
        try:
            base = f"http://127.0.0.1:{port}/api/v1"
            ref = baseline(base)
            base_p50 = ms(ref, 50)
            print(
                f"{args.clients} clients polling for {args.seconds:g} s after a "
                f"{args.warmup:g} s warm-up, pause {args.interval:g} s"
            )
            poll = (args.clients, args.seconds, args.interval, args.warmup)
            done = load(base, done_id, *poll)
            shapes = [(t.id, t.config["depth"]) for t in trials]
            writing = spawn.Process(target=writer, args=(url, shapes, 3, stop))
            writing.start()
            running = load(base, run_id, *poll)
            stop.set()
            writing.join()
            subs = submit(base)
        finally:
            stop.set()
            server.terminate()
            server.wait(30)
    report("baseline GET /healthz", ref, base_p50)
    print("-- completed sweep (the target)")
    ok = report("GET /sweeps/{id}", done[0], base_p50, STATUS_P99_MS)
    report("GET /sweeps/{id}/metrics", done[1], base_p50)
    print("-- running sweep, one write per second (for information)")
    report("GET /sweeps/{id}", running[0], base_p50)
    report("GET /sweeps/{id}/metrics", running[1], base_p50)
    worst = max(subs)
    print(
        f"{'POST 1,000-trial sweep':<28} n={len(subs):<6} median {1000 * np.median(subs):7.1f} ms"
        f"  max {1000 * worst:7.1f} ms   target ≤ {SUBMIT_S:.0f} s: "
        f"{'met' if worst <= SUBMIT_S else 'MISSED'}"
    )
    return 0 if ok and worst <= SUBMIT_S else 1


if __name__ == "__main__":
    sys.exit(main())
