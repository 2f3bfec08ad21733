"""Real Ray clusters on this machine for tests/test_cluster.py (one head) and
tests/test_multinode.py (a head and a second node): each node a `ray start` in a process
session of its own (its daemons share it; stop() ends it), on loopback, every port its own,
token auth (one token for every node and client)."""

from __future__ import annotations

import contextlib
import json
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
from support import free_port

BIN = Path(sys.executable).parent


def ray_env(*, nodes: int = 1) -> dict[str, str]:
    """The environment of a cluster's `ray start`s and clients: this interpreter's `ray`,
    token auth with a fresh token, no usage stats, no inherited RAY_ADDRESS.

    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER "0" (a single-node instance on loopback, as the other Ray
    tests start) refuses a second node: with `nodes` > 1 it is "1"; the nodes still bind their
    Ray addresses to 127.0.0.1, and the token guards them."""
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1" if nodes > 1 else "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    return env


class RayNode:
    """One `ray start` with `cpus` CPUs and no GPU: the head when `head` is None, else a node
    joining head's cluster; `label` a custom resource (1) naming the node."""

    def __init__(
        self,
        env: dict[str, str],
        *,
        cpus: int,
        label: str | None = None,
        head: RayNode | None = None,
    ):
        self.env = env
        self.temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: socket paths
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        ports = [
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
        ]
        if head is None:
            role = [
                "--head",
                f"--port={self.gcs_port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={free_port()}",
            ]
        else:
            role = [f"--address={head.address}"]
        resources = [f"--resources={json.dumps({label: 1})}"] if label else []
        self.proc = subprocess.Popen(
            [
                str(BIN / "ray"),
                "start",
                *role,
                "--node-ip-address=127.0.0.1",
                *ports,
                f"--num-cpus={cpus}",
                "--num-gpus=0",
                *resources,
                f"--temp-dir={self.temp_dir}",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # the node's daemons share this session: stop() kills it
        )
        out, _ = self.proc.communicate(timeout=180)
        if self.proc.returncode != 0:
            self.stop()
            name = label or ("head" if head is None else "node")
            pytest.fail(f"ray start ({name}) failed:\n{out[-3000:]}")

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
        assert not self.session_pids(), "a Ray node's processes outlived the test"
