"""The runner's fixed costs, paid once (issue 23): a running Runner (one local Ray instance, as
`isosweep serve` keeps it) takes sweep after sweep of 2 init-only trials (depth 2, width 8,
digits); for each, the time from its submission to its first trial's record and to its end,
against the trials' own compute (`fit()` of the same 2 trials in this process, measured first).

    .venv/bin/python bench/runner_warm.py             # 4 sweeps (~1 minute)
    .venv/bin/python bench/runner_warm.py --sweeps 6 --pause 0.5   # idle 0.5 s between

The first sweep pays Ray's start and the workers' imports; the later ones should start in
about a second (the target). Prints each sweep and the ratio of a later sweep's submit→end to
the first's, with the load average.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from service.settings import Settings  # noqa: E402
from service.spec import expand, parse_spec  # noqa: E402
from service.store import Store  # noqa: E402

PARAMS = {"depth": 2, "width": 8, "epochs": 0, "dataset": "digits"}


def spec(k: int) -> dict:
    return {"name": f"warm-{k}", "parameters": dict(PARAMS), "seeds": 2, "rerun": True}


def fit_seconds(url: str) -> float:
    """The 2 trials' own compute: fit() in this process (torch imported, data cached first)."""
    from workers.train import fit

    configs = expand(parse_spec(spec(0), settings=Settings(database_url=url)))
    for c in configs:  # warm: imports, dataset
        list(fit(c))
    t0 = time.perf_counter()
    for c in configs:
        list(fit(c))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweeps", type=int, default=4)
    ap.add_argument("--pause", type=float, default=0.0, help="idle seconds between sweeps")
    args = ap.parse_args()
    from workers.runner import Runner

    url = f"sqlite:///{tempfile.mkdtemp(prefix='isosweep-bench-warm-')}/bench.db"
    store = Store(url, settings=Settings(database_url=url, runner_poll_s=0.05))
    compute = fit_seconds(url)
    runner = Runner(store, poll_s=0.05, num_cpus=2, beat=lambda: None)
    thread = threading.Thread(target=runner.run_forever, daemon=True)
    thread.start()
    ends = []
    try:
        for k in range(args.sweeps):
            time.sleep(args.pause if k else 0.0)
            t0 = time.monotonic()
            sid = store.create_sweep(parse_spec(spec(k), settings=store.settings)).id
            first = None
            while True:
                info = store.get_sweep(sid)
                if first is None and info.progress > 0:
                    first = time.monotonic() - t0
                if info.status == "completed":
                    break
                time.sleep(0.02)
            end = time.monotonic() - t0
            ends.append(end)
            print(f"sweep {k + 1}: first record {first if first is not None else end:.2f} s, "
                  f"completed {end:.2f} s after its submit", flush=True)  # fmt: skip
    finally:
        runner.stop()
        thread.join(120)
    later = statistics.median(ends[1:]) if len(ends) > 1 else float("nan")
    print(f"fit() of the 2 trials: {compute:.2f} s; later sweeps (median) {later:.2f} s "
          f"= {later / ends[0]:.2f} of the first ({ends[0]:.2f} s); load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
