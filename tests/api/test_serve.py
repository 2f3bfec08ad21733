"""`isosweep serve`: starts over a real port, answers, stops cleanly on SIGTERM/SIGINT, submits
the demo once; its runner child is started with the agreed command and always stopped; and the
API process never imports torch or Ray."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from api.cli import serve
from api.cli.common import CommandError
from service.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo_spec_is_small_and_valid():
    spec = load_spec(serve.DEMO_SPEC)
    assert spec.name == "demo" and spec.n_trials == 3 * 2 * 3
    assert spec.parameters["dataset"] == "digits"  # ships with scikit-learn: no download
    assert spec.parameters["epochs"] == 10 and spec.parameters["depth"] == [2, 8, 32]


def test_runner_is_started_with_the_agreed_command(monkeypatch):
    seen = {}

    class FakePopen:
        pid = 4242

        def __init__(self, cmd, env=None):
            seen["cmd"], seen["env"] = cmd, env

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setenv("ISOSWEEP_RUNNER_LEASE_S", "30")
    url = "postgresql+psycopg://user:s3cret@db:5432/isosweep"
    serve.start_runner(url)
    # The URL travels in the environment: a password on the command line shows in `ps`.
    assert seen["cmd"] == [sys.executable, "-m", "api.cli.main", "runner"]
    assert seen["env"]["ISOSWEEP_DATABASE_URL"] == url
    assert seen["env"]["ISOSWEEP_RUNNER_LEASE_S"] == "30"  # the rest of serve's environment


def test_the_banner_hides_the_database_password(capsys):
    from service.settings import Settings

    url = "postgresql+psycopg://user:s3cret@db:5432/isosweep"
    serve.announce(Settings(database_url=url), None)
    shown = capsys.readouterr().out
    assert "s3cret" not in shown
    assert "postgresql+psycopg://user:***@db:5432/isosweep" in shown


def _child(ignore_term: bool) -> subprocess.Popen:
    code = "import signal, sys, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_stop_runner_terminates_then_kills():
    assert serve.stop_runner(_child(ignore_term=False), grace_s=10) == -signal.SIGTERM
    stubborn = _child(ignore_term=True)
    assert serve.stop_runner(stubborn, grace_s=0.5) == -signal.SIGKILL
    assert stubborn.poll() is not None


def test_a_taken_port_fails_before_anything_starts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(CommandError, match="--port"):
            serve.check_port_free("127.0.0.1", s.getsockname()[1])


def _serve(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "api.cli.main",
        "serve",
        "--no-runner",
        "--port",
        str(port),
        "--database-url",
        f"sqlite:///{tmp_path / 'serve.db'}",
        *extra,
    ]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"{base}/api/v1/healthz", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("serve did not answer within 60 s")


@pytest.mark.slow
def test_serve_answers_and_stops_cleanly(tmp_path):
    proc, base = _serve(tmp_path, "--demo")
    health = httpx.get(f"{base}/api/v1/healthz").json()
    assert health["status"] == "ok" and health["database"]["backend"] == "sqlite"
    sweeps = httpx.get(f"{base}/api/v1/sweeps").json()
    assert [s["name"] for s in sweeps["data"]] == ["demo"]
    assert httpx.get(f"{base}/").status_code == 200 and httpx.get(f"{base}/docs").status_code == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    output = proc.stdout.read()
    assert f"{base}/" in output and "submitted the demo sweep" in output

    proc, base = _serve(tmp_path, "--demo")  # again: the demo is not submitted twice
    assert httpx.get(f"{base}/api/v1/sweeps").json()["count"] == 1
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert "already submitted" in proc.stdout.read()


NO_TORCH = textwrap.dedent(
    """
    import sys, httpx, numpy as np
    import api.app
    assert "torch" not in sys.modules and "ray" not in sys.modules, "at import"
    from api.server import ServerThread
    from service.settings import Settings
    from service.store import Store
    from service.config import LAYER_METRICS, METRICS

    url = "sqlite:///" + sys.argv[1]
    store = Store(url, settings=Settings(database_url=url))
    with ServerThread(api.app.create_app(Settings(database_url=url), store=store)) as s:
        c = httpx.Client(base_url=s.url + "/api/v1", timeout=60)
        sweep = c.post("/sweeps", json={"name": "t", "parameters": {"depth": 2, "epochs": 0,
                       "batch_size": 4, "norm": "layer", "order": "act_norm"}}).json()
        (t,) = c.get(f"/sweeps/{sweep['id']}/trials").json()["data"]
        rec = {m: (np.ones(2) if m in LAYER_METRICS else 1.0) for m in METRICS}
        store.write_records([(t["id"], {**rec, "epoch": 0, "input_gram": np.eye(4)})])
        for path in ("/theory/activations/tanh", "/theory/activations",
                     f"/sweeps/{sweep['id']}/plots/theory_overlay",
                     f"/sweeps/{sweep['id']}/plots/layer_profile?format=svg",
                     f"/sweeps/{sweep['id']}/metrics?format=parquet", "/healthz"):
            assert c.get(path).status_code == 200, path
    assert "torch" not in sys.modules and "ray" not in sys.modules, "after serving"
    print("clean")
    """
)


@pytest.mark.slow
def test_the_api_process_never_imports_torch_or_ray(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(tmp_path / "t.db")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.strip() == "clean", r.stdout + r.stderr


def test_importing_the_cli_imports_neither_torch_nor_ray():
    code = (
        "import sys; from api.cli.main import build_parser; build_parser(); "
        "import api.cli.serve; "
        "assert 'torch' not in sys.modules and 'ray' not in sys.modules, "
        "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray'))[:5]"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
