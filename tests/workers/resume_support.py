"""A runner SIGKILLed mid-sweep and a second one started on the same database, for the resume
tests of tests/workers/test_runner.py, test_packed_runner.py and test_search_runner.py: the
runner subprocess, its session killed to the last Ray process, the trials before the kill and
after the resume, and the checks every resume shares (docs/architecture.md, "The runner")."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from expected_rows import expected_keys, row_keys
from support import isosweep_command, session_pids

from service.store import Store

ROOT = Path(__file__).resolve().parents[2]
SAME_RUN = ("attempts", "started_at", "finished_at")  # what a trial not run again keeps


def wait_until(condition, timeout_s, what, proc=None):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the runner exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the runner and every process of its session, until none is left."""
    deadline = time.monotonic() + 30
    while pids := session_pids(proc.pid):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # it died meanwhile
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            pytest.fail(f"processes {pids} of the runner's session survive SIGKILL")
        time.sleep(0.2)
    proc.wait()


def start_runner(url: str, log: Path) -> subprocess.Popen:
    cmd = [*isosweep_command(), "runner", "--database-url", url]
    cmd += ["--lease-s", "3", "--poll-s", "0.5", "--num-cpus", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("w") as f:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )


@dataclass
class Resumed:
    """The sweep's trials (by id) when the first runner was killed and after the second
    finished, and the second runner's log."""

    before: dict
    after: dict
    log: str

    @property
    def completed(self) -> set[int]:
        """The trials completed before the kill."""
        return {i for i, t in self.before.items() if t.status == "completed"}


def kill_and_resume(
    store: Store, sweep_id: int, tmp_path: Path, partway: Callable[[], bool], what: str
) -> Resumed:
    """Start a runner on the store's database, SIGKILL its whole session once `partway()` holds
    (`what` names that moment), then run a second runner until the sweep is completed and stop it
    with SIGTERM; it must exit 0."""
    url = store.url
    first = start_runner(url, tmp_path / "first.log")
    try:
        wait_until(partway, 300, what, proc=first)
    finally:
        kill_session(first)
    assert session_pids(first.pid) == []
    before = {t.id: t for t in store.list_trials(sweep_id)[0]}

    second = start_runner(url, tmp_path / "second.log")
    try:
        wait_until(
            lambda: store.get_sweep(sweep_id).status == "completed", 300, "the resume", second
        )
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            code = second.wait(60)
        finally:
            kill_session(second)
    log = (tmp_path / "second.log").read_text()
    assert code == 0, log[-3000:]
    after = {t.id: t for t in store.list_trials(sweep_id)[0]}
    return Resumed(before, after, log)


def assert_resumed_exactly(
    store: Store, sweep_id: int, resumed: Resumed, same: tuple[str, ...] = SAME_RUN
) -> None:
    """Every trial completed; those completed before the kill not run again (`same` unchanged);
    every row stored once, none missing, none extra."""
    after = resumed.after
    assert {t.status for t in after.values()} == {"completed"}
    for i in resumed.completed:  # not run again
        b, a = resumed.before[i], after[i]
        assert [getattr(a, f) for f in same] == [getattr(b, f) for f in same]
    keys = row_keys(store.read_metrics(sweep_id))
    assert len(keys) == len(set(keys))  # no row twice
    assert set(keys) == expected_keys(after.values())  # none missing, none extra
