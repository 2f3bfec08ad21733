"""Submitting a 100,000-trial sweep against its floor (issue 23), in one process, interleaved:

- floor: SQLite `executemany` of the very rows the submit writes (their values already bound:
  the statement and the commit alone), into a fresh sweep of the same store;
- submit: what POST /sweeps does less HTTP — `parse_spec` (validation, limits, expansion) then
  `Store.create_sweep` (rows, hashes, reuse look-up, cost, insert, commit);
- REST: the same spec POSTed to a live `isosweep serve --no-runner`, while another client reads
  `GET /sweeps?limit=1` in a loop: the reads' latency during the submit against the same reads
  with nothing else running (the event loop must stay free while a submit expands and writes).

    .venv/bin/python bench/submit.py                 # 100,000 trials, 3 rounds (~1 minute)
    .venv/bin/python bench/submit.py --trials 20000 --rounds 1

Prints each round and the median ratio submit / floor, with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from bench.api_server import free_port, start_server  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.spec import parse_spec  # noqa: E402
from service.store import Store  # noqa: E402
from service.store import sweeps as store_sweeps  # noqa: E402
from service.store.models import SqlSweep, SqlTrial, utcnow  # noqa: E402


def spec_data(n: int) -> dict[str, Any]:
    params = {"depth": 2, "width": 8, "epochs": 0, "dataset": "digits"}
    return {"name": f"submit-{n}", "parameters": params, "seeds": n, "rerun": True}


def floor_s(store: Store, rows: list[dict[str, Any]]) -> float:
    """executemany of `rows` (values bound beforehand, as the DBAPI takes them) and the commit."""
    with store._write() as s:
        sweep = SqlSweep(name="floor", tags=[], spec={}, status="queued", priority=0,
                         cancel_requested=False, created_at=utcnow())  # fmt: skip
        s.add(sweep)
        s.flush()
        conn = s.connection()
        compiled = insert(SqlTrial.__table__).compile(dialect=conn.dialect,
                                                      column_keys=list(rows[0]))  # fmt: skip
        keys = list(compiled.positiontup or ())
        params = [tuple(_bound(sweep.id if k == "sweep_id" else r.get(k)) for k in keys)
                  for r in rows]  # fmt: skip
        t0 = time.perf_counter()
        conn.exec_driver_sql(compiled.string, params)
        s.commit()
        return time.perf_counter() - t0


def _bound(v: Any) -> Any:
    if isinstance(v, str):
        return str(v)
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, dict):
        import json

        return json.dumps(v)
    return v


def submit_s(store: Store, data: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    spec = parse_spec(data, settings=store.settings)
    info = store.create_sweep(spec)
    assert info.n_trials == data["seeds"]
    return time.perf_counter() - t0


def read_latencies(base: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(base_url=base, timeout=120) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            c.get("/sweeps", params={"limit": 1}).raise_for_status()
            out.append(time.perf_counter() - t0)


def rest(url: str, data: dict[str, Any]) -> dict[str, float]:
    """POST the spec to a live server while another client reads: the reads' p50/max during it
    against the same reads alone."""
    port = free_port()
    proc = start_server(url, port)
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        idle: list[float] = []
        stop = threading.Event()
        reader = threading.Thread(target=read_latencies, args=(base, stop, idle))
        reader.start()
        time.sleep(3)
        stop.set()
        reader.join()
        busy: list[float] = []
        stop = threading.Event()
        reader = threading.Thread(target=read_latencies, args=(base, stop, busy))
        reader.start()
        t0 = time.perf_counter()
        r = httpx.post(f"{base}/sweeps", json=data, timeout=600)
        post = time.perf_counter() - t0
        stop.set()
        reader.join()
        assert r.status_code == 201, r.text[:500]
    finally:
        proc.terminate()
        proc.wait(30)
    return {
        "post_s": post,
        "idle_p50_ms": 1e3 * statistics.median(idle),
        "idle_max_ms": 1e3 * max(idle),
        "busy_p50_ms": 1e3 * statistics.median(busy),
        "busy_max_ms": 1e3 * max(busy),
        "reads_during": len(busy),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-rest", action="store_true", help="skip the live-server part")
    args = ap.parse_args()
    data = spec_data(args.trials)
    tmp = tempfile.mkdtemp(prefix="isosweep-bench-submit-")
    url = f"sqlite:///{tmp}/bench.db"
    os.environ["ISOSWEEP_MAX_TRIALS_PER_SWEEP"] = str(max(args.trials, 100_000))
    store = Store(url, settings=Settings(database_url=url, max_trials_per_sweep=args.trials))
    rows = store_sweeps.trial_rows(parse_spec(data, settings=store.settings), store.settings)
    ratios = []
    for k in range(args.rounds):
        f = floor_s(store, rows)
        s = submit_s(store, data)
        ratios.append(s / f)
        print(f"round {k + 1}: submit {s:.2f} s, floor (executemany + commit) {f:.2f} s, "
              f"ratio {s / f:.2f}", flush=True)  # fmt: skip
    store.close()
    print(f"{args.trials} trials: submit / floor = {statistics.median(ratios):.2f} (median of "
          f"{args.rounds}); load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    if not args.no_rest:
        r = rest(url, data)
        print(f"REST POST {r['post_s']:.2f} s; GET /sweeps?limit=1 alone p50 "
              f"{r['idle_p50_ms']:.1f} ms (max {r['idle_max_ms']:.1f}), during the POST p50 "
              f"{r['busy_p50_ms']:.1f} ms (max {r['busy_max_ms']:.1f}, {r['reads_during']} reads)"
              )  # fmt: skip


if __name__ == "__main__":
    main()
