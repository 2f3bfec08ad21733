"""The server and the stored sweep that the API benchmarks share (bench/api_latency.py and
bench/api_mixed.py): a uvicorn server as `isosweep serve --no-runner` runs it, on a free
loopback port, and a finished 200-trial sweep with every epoch stored (4 depths × 5
activations × 10 seeds, depth ≤ 100, 11 recorded epochs: ≈ 0.5 M values)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from service.config import LAYER_METRICS, SCALAR_METRICS
from service.spec import parse_spec
from service.store import Store

ROOT = Path(__file__).resolve().parents[1]

EPOCHS = 10
SWEEP = {
    "name": "bench-200",
    "parameters": {
        "depth": [10, 25, 50, 100],
        "activation": ["relu", "tanh", "sin", "identity", "gelu"],
        "epochs": EPOCHS,
        "width": 64,
        "batch_size": 64,
    },
    "seeds": 10,
}


def epoch_batch(trials: list, e: int, rng: np.random.Generator) -> list:
    batch = []
    for t in trials:
        rec = {"epoch": e, **{m: float(rng.random()) for m in SCALAR_METRICS}}
        rec.update({m: rng.random(t.config["depth"]) for m in LAYER_METRICS})
        batch.append((t.id, rec))
    return batch


def completed_sweep(store: Store) -> int:
    """A finished 200-trial sweep, every epoch of every trial stored; returns its id."""
    sweep = store.create_sweep(parse_spec(SWEEP, settings=store.settings))
    trials, _ = store.list_trials(sweep.id, limit=1000)
    for t in trials:
        store.start_trial(t.id)  # an attempt starts from no stored results: start, then write
    rng = np.random.default_rng(0)
    for e in range(EPOCHS + 1):
        store.write_records(epoch_batch(trials, e, rng))
    for t in trials:
        store.finish_trial(t.id, "completed")
    assert store.finish_sweep(sweep.id).status == "completed"
    return sweep.id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    url: str, port: int, env_extra: dict[str, str] | None = None, root: Path = ROOT
) -> subprocess.Popen:
    """The API as `isosweep serve --no-runner` runs it (api.server.serve_api), quietly, from
    the source tree `root` (another checkout: a baseline)."""
    env = {**os.environ, "ISOSWEEP_DATABASE_URL": url, "ISOSWEEP_PORT": str(port)}
    env.update(env_extra or {})
    if root != ROOT:
        env["PYTHONPATH"] = str(root)
    code = "from api.server import serve_api; serve_api(log_level='warning', access_log=False)"
    cmd = [sys.executable, "-c", code]
    proc = subprocess.Popen(cmd, cwd=root, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=1).raise_for_status()
            return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")
