"""The runner under `isosweep serve`: started, watched, restarted with back-off when it dies,
reported to the API (GET /api/v1/healthz), and stopped with every process it started.

    supervisor = RunnerSupervisor(database_url, store=store).start()
    supervisor.status()      # {"state": "running", "pid": …, "restarts": 0, …}
    supervisor.stop()        # SIGTERM, SIGKILL after the grace, then its whole session

The runner leads a session of its own (start_new_session), and Ray's processes (GCS, raylet,
agents, workers) stay in it: a runner killed outright leaves them running, re-parented, so when
the runner dies, and when serve stops, whatever is left of its session is killed (found through
/proc; elsewhere its process group). When it dies, the sweeps it held are released at once (it
is dead, its session gone: nothing of it writes any more), so the restarted runner resumes them
without waiting for the lease to run out. Nothing here imports Ray.

The runner is bound to its service:

- It dies with it: the kernel sends it SIGTERM when the thread that started it dies
  (PR_SET_PDEATHSIG, set between fork and exec; Linux), so a SIGKILLed serve leaves no runner
  holding its sweep; its watchdog (workers.runner.watch_supervisor, on ISOSWEEP_SUPERVISOR_PID)
  does the same elsewhere and kills its session if it has not stopped ORPHAN_GRACE_S later.
- A restarted serve ends what a previous one left: each runner is recorded in a pid file in
  the data directory, one per database (`runner-<hash of the URL>.json`: pid, its start time,
  runner id), and `start()` ends a runner still alive there (the same pid *and* start time:
  never a process that reused the pid) — SIGTERM, SIGKILL after the grace, then its session —
  and releases its sweeps, before starting its own.
- A stuck runner is restarted: its loop beats (the mtime of ISOSWEEP_RUNNER_BEAT, touched at
  every turn of the idle loop and every step of the driver's; workers.runner.LoopBeat), and a
  runner whose beat is older than `stall_s` (ISOSWEEP_RUNNER_STALL_S) is ended and restarted
  like a dead one. The beat comes from the loop, not from a thread: the lease's heartbeat
  thread may well go on while the loop is stuck.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.status import SweepStatus

log = logging.getLogger("isosweep.serve")

RUNNER_GRACE_S = 20.0  # the runner's time to stop its trials before it is killed
BACKOFF_S = 1.0  # the first restart comes this long after a death; each next one twice as late
MAX_BACKOFF_S = 60.0
STABLE_S = 60.0  # a runner that lived this long before dying is restarted after BACKOFF_S again
CHECK_S = 1.0  # how often the runner's beat is looked at
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
BEAT_ENV = "ISOSWEEP_RUNNER_BEAT"  # workers.runner.BEAT_ENV (not imported: that imports Ray)
SUPERVISOR_ENV = "ISOSWEEP_SUPERVISOR_PID"  # workers.runner.SUPERVISOR_ENV


def _prctl() -> Any:
    """libc's prctl (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


PRCTL = _prctl()  # resolved here, so that the child calls it between fork and exec at no cost


def die_with(parent_pid: int) -> Callable[[], None] | None:
    """A preexec_fn that asks the kernel for SIGTERM when the thread that forks the child dies
    (PR_SET_PDEATHSIG), and exits at once if the parent is gone already; None off Linux."""
    prctl = PRCTL
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:  # it died before the request was made
            os._exit(1)

    return preexec


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22), or None
    when it is not alive (or a zombie, or there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def record_path(state_dir: Path, database_url: str) -> Path:
    """The pid file of the runner of `database_url`'s serve in `state_dir`."""
    key = hashlib.sha256(database_url.encode()).hexdigest()[:16]
    return state_dir / f"runner-{key}.json"


def runner_command() -> list[str]:
    """`isosweep runner`, by this Python (the database URL goes in the environment)."""
    return [sys.executable, "-m", "api.cli.main", "runner"]


def runner_id_of(pid: int) -> str:
    """The id a runner started without --runner-id takes in the store (workers.runner's
    default_runner_id: host:pid)."""
    return f"{socket.gethostname()}:{pid}"


@dataclass
class RunnerStatus:
    """How the supervised runner stands, as healthz reports it."""

    state: str = "starting"  # starting | running | restarting | stopped
    pid: int | None = None
    runner_id: str | None = None
    restarts: int = 0
    last_exit_code: int | None = None
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    next_start_in_s: float | None = None  # while restarting

    @property
    def ok(self) -> bool:
        return self.state == "running"


class RunnerSupervisor:
    """Runs `isosweep runner` as a child, restarts it when it dies (after BACKOFF_S, doubling up
    to MAX_BACKOFF_S while it keeps dying sooner than STABLE_S), and stops it with its session.

    Args:
        database_url: given to the runner as ISOSWEEP_DATABASE_URL (not in its argv, where `ps`
            shows it).
        store: the serve process's Store: a dead runner's sweeps are released through it.
        command: the runner's command line (default `runner_command()`).
    """

    def __init__(
        self,
        database_url: str,
        *,
        store: Any = None,
        command: list[str] | None = None,
        backoff_s: float = BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        stable_s: float = STABLE_S,
        grace_s: float = RUNNER_GRACE_S,
        stall_s: float | None = None,
        check_s: float = CHECK_S,
        state_dir: str | Path | None = None,
    ):
        self.database_url, self.store = database_url, store
        self.command = command or runner_command()
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.stable_s, self.grace_s = stable_s, grace_s
        self.stall_s, self.check_s = stall_s, check_s
        self.record = record_path(Path(state_dir), database_url) if state_dir else None
        beat_dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="isosweep-"))
        self.beat_path = (
            self.record.with_suffix(".beat") if self.record else beat_dir / "runner.beat"
        )
        self.proc: subprocess.Popen | None = None
        self.started = 0.0  # time.monotonic() of the last start
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.current = RunnerStatus()
        self.thread = threading.Thread(target=self._watch, name="runner-supervisor", daemon=True)

    # --- what serve and the API call ------------------------------------------------------

    def start(self) -> RunnerSupervisor:
        self.end_previous()
        self._spawn()
        self.thread.start()
        return self

    def status(self) -> dict[str, Any]:
        """A snapshot for healthz: state, ok, pid, runner_id, restarts, last_exit_code, since,
        next_start_in_s."""
        with self.lock:
            s = self.current
            return {**asdict(s), "ok": s.ok}

    def stop(self) -> int | None:
        """Stop supervising and stop the runner: SIGTERM, SIGKILL after grace_s, then whatever
        is left of its session. Returns its exit code (None when none was running)."""
        with self.lock:
            self.stopping.set()
            proc = self.proc
        code = None
        if proc is not None:
            code = terminate(proc, self.grace_s)
            kill_session(proc.pid)
        if self.thread.is_alive():
            self.thread.join(self.grace_s + 5)
        self._set(state="stopped", pid=None, next_start_in_s=None)
        if self.record is not None and proc is not None:
            with contextlib.suppress(OSError):
                if json.loads(self.record.read_text()).get("pid") == proc.pid:
                    self.record.unlink()
        with contextlib.suppress(OSError):
            self.beat_path.unlink()
        return code

    # --- what a previous serve left ----------------------------------------------------------

    def end_previous(self) -> None:
        """End the runner a previous supervisor of this database and data directory recorded,
        if it is still alive (the same pid and start time), with its session; release its
        sweeps either way (a runner SIGKILLed with its serve left them under its lease)."""
        if self.record is None:
            return
        try:
            found = json.loads(self.record.read_text())
            pid, started, runner_id = int(found["pid"]), found.get("start"), found["runner_id"]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the unreadable runner record %s: %s", self.record, exc)
            return
        if started is not None and process_start(pid) == started:
            log.warning("a runner (pid %d) left by an earlier serve of this database is still "
                        "running: ending it before starting this one's", pid)  # fmt: skip
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + self.grace_s
            while process_start(pid) == started and time.monotonic() < deadline:
                time.sleep(0.05)
            if process_start(pid) == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            kill_session(pid)
        elif process_start(pid) is None:
            kill_session(pid)  # nothing has its pid now: what is left of its session is its own
        self._release(runner_id)
        with contextlib.suppress(OSError):
            self.record.unlink()

    def _write_record(self, pid: int) -> None:
        if self.record is None:
            return
        found = {"pid": pid, "start": process_start(pid), "runner_id": runner_id_of(pid),
                 "supervisor_pid": os.getpid()}  # fmt: skip
        try:
            self.record.parent.mkdir(parents=True, exist_ok=True)
            part = self.record.with_suffix(".part")
            part.write_text(json.dumps(found))
            part.replace(self.record)
        except OSError as exc:  # a later serve cannot find this runner; the rest still holds
            log.warning("cannot record the runner in %s: %s", self.record, exc)

    def beat_age(self) -> float:
        """Seconds since the runner's loop last beat (since its start, before any beat)."""
        try:
            mtime = self.beat_path.stat().st_mtime
        except OSError:
            return time.monotonic() - self.started
        return max(0.0, min(time.time() - mtime, time.monotonic() - self.started))

    # --- the watch loop -----------------------------------------------------------------------

    def _spawn(self) -> None:
        env = {
            **os.environ,
            "ISOSWEEP_DATABASE_URL": self.database_url,
            BEAT_ENV: str(self.beat_path),
            SUPERVISOR_ENV: str(os.getpid()),
        }
        with self.lock:
            if self.stopping.is_set():
                return
            with contextlib.suppress(OSError):
                self.beat_path.unlink()  # no beat of an earlier runner counts for this one
            extra: dict[str, Any] = {}
            if (preexec := die_with(os.getpid())) is not None:
                extra["preexec_fn"] = preexec
            self.proc = subprocess.Popen(self.command, env=env, start_new_session=True, **extra)
            self.started = time.monotonic()
            pid = self.proc.pid
            self._set_locked(state="running", pid=pid, runner_id=runner_id_of(pid))
            self.current.next_start_in_s = None
        self._write_record(pid)

    def _wait(self, proc: subprocess.Popen) -> int:
        """The runner's exit code, once it exits, or once it is ended for making no progress
        for over stall_s."""
        while True:
            try:
                return proc.wait(self.check_s if self.stall_s is not None else None)
            except subprocess.TimeoutExpired:
                pass
            assert self.stall_s is not None
            age = self.beat_age()
            if age > self.stall_s and not self.stopping.is_set():
                log.error("the runner (pid %d) made no progress for %.0fs (its loop's beat; "
                          "bound ISOSWEEP_RUNNER_STALL_S=%g): ending it",
                          proc.pid, age, self.stall_s)  # fmt: skip
                return terminate(proc, self.grace_s)

    def _watch(self) -> None:
        delay = self.backoff_s
        while not self.stopping.is_set():
            proc = self.proc
            if proc is None:
                return
            code = self._wait(proc)
            if self.stopping.is_set():
                return
            lived = time.monotonic() - self.started
            delay = self.backoff_s if lived >= self.stable_s else delay
            log.error("the runner (pid %d) exited with code %s; restarting it in %gs",
                      proc.pid, code, delay)  # fmt: skip
            with self.lock:
                restarts = self.current.restarts + 1
                self._set_locked(
                    state="restarting", last_exit_code=code, next_start_in_s=delay,
                    restarts=restarts,
                )  # fmt: skip
            kill_session(proc.pid)  # its Ray processes outlive it
            self._release(runner_id_of(proc.pid))
            if self.stopping.wait(delay):
                return
            delay = min(delay * 2, self.max_backoff_s)
            self._spawn()

    def _release(self, runner_id: str) -> None:
        """Put the dead runner's sweeps back in the queue (none of it runs any more)."""
        if self.store is None:
            return
        try:
            for sweep in running_sweeps(self.store):
                if sweep.runner_id == runner_id and self.store.release_sweep(sweep.id, runner_id):
                    log.warning("sweep %d: released (its runner %s died)", sweep.id, runner_id)
        except Exception as exc:  # the lease runs out instead; the next runner resumes it then
            log.error("cannot release the dead runner's sweeps: %s", exc)

    def _set(self, **changes: Any) -> None:
        with self.lock:
            self._set_locked(**changes)

    def _set_locked(self, **changes: Any) -> None:
        if "state" in changes and changes["state"] != self.current.state:
            changes.setdefault("since", datetime.now(UTC))
        for k, v in changes.items():
            setattr(self.current, k, v)


def running_sweeps(store: Any) -> list:
    page = store.settings.max_page_size
    found, offset = [], 0
    while True:
        batch, total = store.list_sweeps(status=SweepStatus.RUNNING, offset=offset, limit=page)
        found += batch
        offset += page
        if offset >= total or not batch:
            return found


def terminate(proc: subprocess.Popen, grace_s: float) -> int:
    """SIGTERM, then SIGKILL if it is still alive after `grace_s`; returns its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`, from /proc (Linux); [] elsewhere."""
    found: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
        if int(session) == sid and state != "Z":
            found.append(int(entry.name))
    return found


def kill_session(sid: int, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process of the session `sid` leads (its process group where /proc is
    missing) until none is left or `timeout_s` has passed. Returns the processes killed."""
    killed: list[int] = []
    if not Path("/proc").is_dir():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signal.SIGKILL)
        return killed
    deadline = time.monotonic() + timeout_s
    while (pids := [p for p in session_pids(sid) if p != os.getpid()]) and (
        time.monotonic() < deadline
    ):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.1)
    return killed
