"""isosweep on a real Ray cluster: a head started with `ray start` on loopback (token auth, one
token for the head and every client), then (1) `ray job submit … -- isosweep run SPEC
--database-url postgresql…` through Ray's own job CLI, and (2) the service's runner pointed at
the cluster through RAY_ADDRESS. Both check the rows in Postgres, then the head is stopped."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from expected_rows import expected_keys, row_keys
from support import free_port, isosweep_command

from service.spec import load_spec
from service.store import Store

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SPEC = "examples/init-depth-smoke.yaml"  # trials measured at initialization, seconds each


class RayHead:
    """A head node of its own: its own ports, temp dir, token and process session."""

    def __init__(self):
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self.temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: socket paths
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keep every listener on loopback
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(16),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        self.env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                "--node-ip-address=127.0.0.1",
                f"--port={self.gcs_port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}",
                "--num-cpus=2",
                "--num-gpus=0",
                f"--temp-dir={self.temp_dir}",
            ],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # the head's daemons share this session: stop() kills it
        )
        out, _ = self.proc.communicate(timeout=120)
        if self.proc.returncode != 0:
            self.stop()
            pytest.fail(f"ray start failed:\n{out[-3000:]}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def session_pids(self) -> list[int]:
        out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
        pairs = (line.split() for line in out.splitlines())
        return [int(p) for p, s in pairs if int(s) == self.proc.pid]

    def stop(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            for pid in self.session_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while self.session_pids() and time.monotonic() < deadline:
                time.sleep(0.2)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        assert not self.session_pids(), "the Ray head's processes outlived the test"


@pytest.fixture(scope="module")
def ray_head():
    head = RayHead()
    try:
        yield head
    finally:
        head.stop()


def _check_sweep_stored(url: str, sweep_id: int) -> None:
    with Store(url, migrate=False) as store:
        sweep = store.get_sweep(sweep_id)
        assert sweep.status == "completed", sweep
        trials, total = store.list_trials(sweep_id, limit=1000)
        assert total == load_spec(ROOT / SPEC).n_trials
        assert {t.status for t in trials} == {"completed"}
        keys = row_keys(store.read_metrics(sweep_id))
        assert len(keys) == len(set(keys)) and set(keys) == expected_keys(trials)


def test_ray_job_submit_runs_a_sweep_into_postgres(ray_head, postgres_url):
    result = subprocess.run(
        [
            str(BIN / "ray"),
            "job",
            "submit",
            "--address",
            ray_head.dashboard,
            "--working-dir",
            str(ROOT),
            "--",
            "isosweep",
            "run",
            SPEC,
            "--database-url",
            postgres_url,
            "--quiet",
        ],
        env=ray_head.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "succeeded" in log and "Connecting to existing Ray cluster" in log
    _check_sweep_stored(postgres_url, 1)


def test_runner_on_an_existing_cluster_through_ray_address(ray_head, postgres_url):
    with Store(postgres_url) as store:
        sweep = store.create_sweep(load_spec(ROOT / SPEC))
    result = subprocess.run(
        [*isosweep_command(), "runner", "--once", "--database-url", postgres_url],
        env={**ray_head.env, "RAY_ADDRESS": ray_head.address},
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "Connecting to existing Ray cluster" in log, log[-2000:]
    assert "Started a local Ray instance" not in log
    _check_sweep_stored(postgres_url, sweep.id)
