"""Heavy reads and big submissions against a real uvicorn server (run through
bench/api_latency.py: `--phase mixed` or `--phase submit`).

mixed: a SQLite file (or --database-url) holding api_server's completed 200-trial sweep
(≈ 0.5 M stored values). Then, twice in this process (three times with --before-tree, a
checkout of the code before, served first), a fresh server and --clients (default 40)
loopback client threads, each making --requests requests and stopping: plots (layer_profile,
heatmap, depth_scaling, each a different cache key), metrics JSON and CSV (every fourth one the
whole sweep, the others one seed) and GET /healthz in between. The first server has the
heavy-read limit off (ISOSWEEP_MAX_HEAVY_READS above the client count, no plot time limit);
the second runs with the settings' defaults. With --plots page the plots are asked as the
dashboard asks them (chart data, format=json, and one in four a PNG download); otherwise every
one is a PNG. A client waits out a 503's Retry-After and asks again, so a latency is the time
to the final answer. Prints, for each, plot p99 / max, healthz p99 / max, the answers by
status (a "+503" if a 503 came first), each kind's p50/p99 (plots also split by format), the
server's peak RSS (VmHWM) and its RSS 5 s after the load, and the on/off ratios.

submit: POST one 5,000-trial spec with epochs = 100,000 alone, then six at once (their own
names, so nothing is reused); prints each status and time, and the six's slowest as a multiple
of the single one.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx
import numpy as np
from api_server import ROOT, completed_sweep, free_port, start_server

from service.settings import Settings
from service.store import Store

OFF = {"ISOSWEEP_MAX_HEAVY_READS": "1000", "ISOSWEEP_PLOT_TIMEOUT_S": "3600"}
KINDS = ("layer_profile", "heatmap", "depth_scaling")
SETTLE_S = 5.0
MAX_RETRIES = 100
RETRIES: Counter = Counter()  # 503s waited out, by the path's last part
RETRIES_LOCK = threading.Lock()
BIG_SUBMIT = {
    "parameters": {
        "depth": list(range(1, 101)),
        "width": [8, 16, 32, 64, 128],
        "epochs": 100_000,
        "norm": "none",
    },
    "seeds": 10,
}


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def request_of(sweep_id: int, j: int, page: bool = False) -> tuple[str, str, dict[str, Any]]:
    """The j-th request of the mix: (kind, path, params); `page`: plots as the dashboard asks."""
    base = f"/sweeps/{sweep_id}"
    slot = j % 8
    if slot % 2 == 1:
        return "healthz", "/healthz", {}
    one_seed = {} if (j // 8) % 4 == 0 else {"seed": (j // 8) % 10}
    if slot == 2:
        return "metrics", f"{base}/metrics", one_seed
    if slot == 4:
        return "csv", f"{base}/metrics", {**one_seed, "format": "csv"}
    kind = KINDS[(j // 8) % 3]
    image = not page or (j // 8) % 4 == 3
    params: dict[str, Any] = {"seed": j % 10, "format": "png" if image else "json"}
    if kind == "layer_profile":
        params["epoch"] = (j // 8) % 11
    if kind == "heatmap":  # a cell per (depth, activation)
        params.update(x="depth", group_by="activation")
    return "plot", f"{base}/plots/{kind}", params


def get_retrying(c: httpx.Client, path: str, params: dict) -> Any:
    """GET, waiting out each 503's Retry-After as a polite client does (at most MAX_RETRIES
    times); the last status ("+503" appended if a 503 came first), "503+" if it never got
    through."""
    for attempt in range(MAX_RETRIES):
        try:
            r = c.get(path, params=params)
        except httpx.HTTPError as exc:
            return type(exc).__name__
        wait = r.headers.get("Retry-After")
        if r.status_code != 503 or wait is None:
            return f"{r.status_code}+503" if attempt else r.status_code
        with RETRIES_LOCK:
            RETRIES[path.rsplit("/", 1)[-1]] += 1
        time.sleep(float(wait))
    return "503+"


def mixed_load(
    base: str, sweep_id: int, clients: int, requests: int, page: bool
) -> dict[str, list]:
    """kind → [(seconds, status)], every client making `requests` requests."""
    out: dict[str, list] = {
        k: [] for k in ("plot", "plot json", "plot png", "metrics", "csv", "healthz")
    }
    lock = threading.Lock()

    def client(k: int) -> None:
        with httpx.Client(base_url=base, timeout=600) as c:
            for i in range(requests):
                kind, path, params = request_of(sweep_id, k * requests + i, page)
                start = time.perf_counter()
                status = get_retrying(c, path, params)
                with lock:
                    out[kind].append((time.perf_counter() - start, status))
                    if kind == "plot":
                        out[f"plot {params['format']}"].append(out[kind][-1])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def one_run(
    url: str,
    sweep_id: int,
    clients: int,
    requests: int,
    page: bool,
    env: dict,
    root: Path = ROOT,
) -> dict:
    port = free_port()
    server = start_server(url, port, env, root)
    try:
        start_kb = rss_kb(server.pid)
        begun = time.perf_counter()
        RETRIES.clear()
        base = f"http://127.0.0.1:{port}/api/v1"
        answers = mixed_load(base, sweep_id, clients, requests, page)
        wall = time.perf_counter() - begun
        peak_kb = rss_kb(server.pid, "VmHWM")
        time.sleep(SETTLE_S)
        final_kb = rss_kb(server.pid)
    finally:
        server.terminate()
        server.wait(30)
    retries = dict(RETRIES)
    return dict(
        answers=answers, start=start_kb, peak=peak_kb, final=final_kb, wall=wall, retries=retries
    )


def figures(run: dict) -> dict[str, float]:
    plots = [s for s, _ in run["answers"]["plot"]]
    health = [s for s, _ in run["answers"]["healthz"]]
    return {
        "plot p99 s": float(np.percentile(plots, 99)),
        "plot max s": max(plots),
        "healthz p99 s": float(np.percentile(health, 99)),
        "healthz max s": max(health),
        "peak RSS MiB": run["peak"] / 1024,
        "final RSS MiB": run["final"] / 1024,
        "wall s": run["wall"],
    }


def print_run(name: str, run: dict) -> dict[str, float]:
    fig = figures(run)
    print(f"-- {name}: server RSS at start {run['start'] / 1024:.0f} MiB")
    print(f"   503s waited out (Retry-After), by route: {run['retries'] or 'none'}")
    print("   " + "  ".join(f"{k} {v:.2f}" for k, v in fig.items()))
    for kind, got in run["answers"].items():
        if not got:
            continue
        codes = Counter(str(c) for _, c in got)
        p50 = np.percentile([s for s, _ in got], 50)
        p99 = np.percentile([s for s, _ in got], 99)
        codes_text = dict(sorted(codes.items()))
        print(f"   {kind:<9} n={len(got):<4} p50 {p50:6.2f} s  p99 {p99:6.2f} s  {codes_text}")
    return fig


def mixed(args: Any) -> int:
    clients = args.clients or 40
    with TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        with Store(url, settings=Settings(database_url=url)) as store:
            t0 = time.perf_counter()
            sweep_id = completed_sweep(store)
            print(f"stored a 200-trial sweep in {time.perf_counter() - t0:.1f} s ({url})")
        plots = "chart JSON, 1 in 4 PNG" if args.plots == "page" else "PNG"
        print(
            f"{clients} clients × {args.requests} requests ({plots} plots, metrics, CSV, healthz)"
        )
        load = (url, sweep_id, clients, args.requests, args.plots == "page")
        before = None
        if args.before_tree:
            before = print_run(f"before ({args.before_tree})", one_run(*load, {}, args.before_tree))
        off = print_run("limit off", one_run(*load, OFF))
        on = print_run("limit on (defaults)", one_run(*load, {}))
    for name, base in (("on / off", off), ("on / before", before)):
        if base is not None:
            print(f"-- {name}")
            print("   " + "  ".join(f"{k} {on[k] / base[k]:.2f}×" for k in on if base[k]))
    return 0


def post_big(base: str, name: str) -> tuple[float, Any]:
    start = time.perf_counter()
    try:
        with httpx.Client(base_url=base, timeout=600) as c:
            status = c.post("/sweeps", json={**BIG_SUBMIT, "name": name}).status_code
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    return time.perf_counter() - start, status


def submit_run(url: str, root: Path) -> tuple[float, list[tuple[float, Any]]]:
    """One big submit alone, then six at once, against a fresh server of `root`."""
    port = free_port()
    server = start_server(url, port, None, root)
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        single, status = post_big(base, f"alone-{root.name}")
        print(f"   one 5,000-trial, 100,000-epoch submit: {single:.2f} s, status {status}")
        got: list[tuple[float, Any]] = []
        threads = [
            threading.Thread(target=lambda i=i: got.append(post_big(base, f"six-{root.name}-{i}")))
            for i in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.terminate()
        server.wait(30)
    times = sorted(s for s, _ in got)
    print(f"   six at once: statuses {sorted(str(c) for _, c in got)}")
    print("   times " + ", ".join(f"{s:.2f}" for s in times) + " s")
    print(f"   slowest / single: {times[-1] / single:.2f}×")
    return single, got


def submit(args: Any) -> int:
    roots = [("before", args.before_tree)] if args.before_tree else []
    results = {}
    with TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        Store(url, settings=Settings(database_url=url)).close()  # migrated
        for name, root in [*roots, ("now", ROOT)]:
            print(f"-- {name} ({root})")
            results[name] = submit_run(url, root)
    if "before" in results:
        (b1, b6), (n1, n6) = results["before"], results["now"]
        print(
            f"-- now / before: single {n1 / b1:.3f}×, slowest of six "
            f"{max(s for s, _ in n6) / max(s for s, _ in b6):.3f}×"
        )
    return 0 if all(c == 201 for _, c in results["now"][1]) else 1


def main(args: Any) -> int:
    return mixed(args) if args.phase == "mixed" else submit(args)
