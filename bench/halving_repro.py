"""Same spec, same stops? Successive halving run twice with the asynchronous rule (ASHA, the
default) and twice with the synchronous one (`synchronous: true`), on one local Ray instance:
how many trials' statuses differ between the two runs of each rule, the epochs each rule
trained, and the wall time (docs/api.md, "Early stopping").

    .venv/bin/python bench/halving_repro.py               # ~2 minutes on 2 busy cores
    .venv/bin/python bench/halving_repro.py --cpus 4 --pack 1 --seeds 4

The spec: `LRS` × seeds MLPs (depth 2, width 8, BatchNorm ReLU, digits, batch 32, 4 epochs),
`early_stop: {metric: test_loss, grace_epochs: 1, reduction: 2}` (rungs at epochs 1, 2, 4),
each trial alone (`pack: 1`, one CPU) unless --pack says otherwise. A status is a trial's
(status, last epoch): two runs differ at a trial when it stopped in one and not in the other,
or stopped at another rung. The epochs trained count every epoch a worker trained: once per
trial for the asynchronous rule; for the synchronous one, a trial going on past a rung trains
again from epoch 0 (1 + 2 + 4 = 7 epochs for a trial that completes).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LRS = [0.3, 1e-3, 0.05, 3e-3, 0.1, 0.01]  # good and bad ones interleaved
PARAMS = {"dataset": "digits", "depth": 2, "width": 8, "batch_size": 32, "norm": "batch"}
EPOCHS = 4


def spec(synchronous: bool, seeds: int, pack: int | None) -> dict[str, Any]:
    stop = {"kind": "successive_halving", "metric": "test_loss", "grace_epochs": 1}
    out: dict[str, Any] = {
        "name": f"halving-{'sync' if synchronous else 'async'}",
        "parameters": {**PARAMS, "epochs": EPOCHS, "lr": LRS},
        "seeds": seeds,
        "early_stop": {**stop, "reduction": 2, "synchronous": synchronous},
    }
    if pack is not None:
        out["pack"] = pack
    return out


def run(body: dict[str, Any], db: Path) -> dict[str, Any]:
    """One run in a fresh store: each trial's (status, last epoch) by index, the wall time."""
    from service.spec import parse_spec
    from service.store import Store
    from workers.driver import run_sweep

    with Store(f"sqlite:///{db}") as store:
        sweep = store.create_sweep(parse_spec(body))
        store.claim_sweep("bench:1", 60, sweep_id=sweep.id)
        t0 = time.monotonic()
        info = run_sweep(store, sweep.id, runner_id="bench:1")
        wall = time.monotonic() - t0
        trials, _ = store.list_trials(sweep.id, limit=1000)
    assert info.status == "completed", info
    return {"status": {t.index: (t.status, t.last_epoch) for t in trials}, "wall_s": wall}


def trained(status: dict[int, tuple[str, int]], synchronous: bool) -> int:
    """Epochs a worker trained: each trial's last epoch (asynchronous), or the caps of every
    stage it ran in (synchronous: 1 + 2 + … up to its last epoch)."""
    if not synchronous:
        return sum(last for _, last in status.values())
    caps = [1, 2, 4]
    return sum(sum(c for c in caps if c <= last) for _, last in status.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", type=int, default=2, help="the local Ray instance's CPUs")
    ap.add_argument("--seeds", type=int, default=4, help="seeds per lr (6 lrs)")
    ap.add_argument("--pack", type=int, default=1, help="the spec's pack (0: unset, automatic)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    import ray

    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False)
    pack = args.pack or None
    out: dict[str, Any] = {"cpus": args.cpus, "trials": len(LRS) * args.seeds, "pack": pack,
                           "load_before": os.getloadavg()[0]}  # fmt: skip
    rules = {"async": False, "sync": True}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {  # interleaved (async, sync, async, sync): Ray's warm-up falls on the first
            (rule, k): run(spec(sync, args.seeds, pack), Path(tmp) / f"{rule}-{k}.db")
            for k in "ab"
            for rule, sync in rules.items()
        }
    for rule, sync in rules.items():
        a, b = runs[rule, "a"], runs[rule, "b"]
        differ = sorted(i for i in a["status"] if a["status"][i] != b["status"][i])
        r = out[rule] = {
            "differ": len(differ),
            "differing_trials": {i: [a["status"][i], b["status"][i]] for i in differ},
            "stopped": [sum(s == "stopped" for s, _ in x["status"].values()) for x in (a, b)],
            "epochs_trained": [trained(x["status"], sync) for x in (a, b)],
            "wall_s": [round(x["wall_s"], 1) for x in (a, b)],
        }
        print(f"{rule}: {len(differ)} of {out['trials']} statuses differ between two runs; "
              f"stopped {r['stopped']}, epochs trained {r['epochs_trained']}, "
              f"wall {r['wall_s']} s", flush=True)  # fmt: skip
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))
    ray.shutdown()


if __name__ == "__main__":
    main()
