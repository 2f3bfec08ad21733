"""The runner loop: claim the next queued sweep (priority, then the one that ran least recently:
never-run sweeps oldest first), drive it, repeat.

    Runner(Store(url)).run_forever()     # what `isosweep runner` does

The lease is held from the claim on: a heartbeat (workers.callbacks.Heartbeat, every lease/3)
starts as soon as the sweep is claimed, so however long Ray takes to start no other runner takes
the sweep over, and it stops the run (and every write) once the lease is lost. Ray starts on the
first claim (the cluster in RAY_ADDRESS, else a local instance) and stays up for the runner's
life. SIGTERM or SIGINT stops the runner cleanly: trials stop, the records received are written,
and the sweep goes back to the queue at once (`store.release_sweep`), its cut trials queued again,
so that the next runner resumes it without waiting. A runner killed outright (SIGKILL) leaves the
sweep running under its lease instead: the next runner claims and resumes it once that lease has
expired, minus the records that were still in flight (`isosweep serve`, which watches its runner,
releases a dead runner's sweeps at once).

Under `isosweep serve` (api/cli/supervise.py) the runner is bound to its service: its loop beats
(`LoopBeat`: the mtime of the file ISOSWEEP_RUNNER_BEAT names) at every turn of the idle loop and
at every step of the driver's loop (Tune asks its stopper, which asks the control: `halted()`),
never from a thread of its own, so that a loop that is stuck stops beating and the supervisor
restarts it; and a watchdog stops it when its supervisor (ISOSWEEP_SUPERVISOR_PID) is gone,
beside the parent-death signal the supervisor asks of the kernel.

The heartbeat says the lease is lost only as it is: another runner holds the sweep (named), or
no runner does (it went back to the queue); a sweep that finished under this runner just ends
its heartbeat.

Sweeps take turns: a sweep that has held the runner for `yield_after_s` (default
workers.driver.YIELD_AFTER_S) while another of at least its priority waits stops handing out
trials, lets the ones in flight finish, and goes back to the queue behind it; so a small sweep
submitted behind a 100,000-trial one runs within about that long, and the big one resumes after.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from service.errors import StorageError
from service.status import SweepStatus
from service.store import Store, SweepInfo
from workers.callbacks import Heartbeat, SweepControl, SweepProgress
from workers.driver import YIELD_AFTER_S, init_ray, run_sweep

log = logging.getLogger("isosweep.runner")


BEAT_ENV = "ISOSWEEP_RUNNER_BEAT"  # the file the loop beats on (set by the supervisor)
SUPERVISOR_ENV = "ISOSWEEP_SUPERVISOR_PID"  # the supervisor's pid (set by the supervisor)
BEAT_EVERY_S = 1.0  # the beat file is touched at most this often
ORPHAN_GRACE_S = 30.0  # a runner whose supervisor is gone has this long to stop, then is killed


class LoopBeat:
    """The loop's sign of life for the supervisor: `beat()` touches `path` (its mtime is the
    beat), at most every `min_interval_s`; does nothing without a path (not under serve)."""

    def __init__(self, path: str | Path | None, *, min_interval_s: float = BEAT_EVERY_S):
        self.path = Path(path) if path else None
        self.min_interval_s = min_interval_s
        self.last = -float("inf")
        self.count = 0  # beats written

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> LoopBeat:
        return cls(env.get(BEAT_ENV) or None)

    def __call__(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if now - self.last < self.min_interval_s:
            return
        self.last = now
        try:
            self.path.touch()
            self.count += 1
        except OSError as exc:  # the supervisor sees no beat and says so; nothing to stop here
            log.warning("cannot write the loop beat %s: %s", self.path, exc)


class BeatingControl(SweepControl):
    """A SweepControl whose `halted()` — asked at every step of the driver's loop — beats."""

    def __init__(self, stop: threading.Event, beat: Callable[[], None]):
        super().__init__(stop)
        self.beat = beat

    def halted(self) -> bool:
        self.beat()
        return super().halted()


class LeaseHeartbeat(Heartbeat):
    """The lease's heartbeat, which says why a lease is lost only as it is: the store is asked
    who holds the sweep. Finished (this runner's run ended it): the heartbeat just stops."""

    def _lose(self, why: str) -> None:
        if why != "another runner holds it now":
            return super()._lose(why)
        try:
            info = self.store.get_sweep(self.sweep_id)
        except Exception as exc:  # cannot tell: stop writing all the same
            return super()._lose(f"it is no longer held by this runner ({exc})")
        if SweepStatus(info.status).is_finished():
            log.debug("sweep %d: %s; its heartbeat stops", self.sweep_id, info.status)
            return None
        if info.status == SweepStatus.RUNNING and info.runner_id not in (None, self.runner_id):
            return super()._lose(f"runner {info.runner_id} holds it now")
        return super()._lose(f"it is {info.status} and no runner holds it")


def watch_supervisor(
    stop: Callable[[], None],
    env: Mapping[str, str] = os.environ,
    *,
    poll_s: float = 1.0,
    grace_s: float = ORPHAN_GRACE_S,
    kill: Callable[[], None] | None = None,
) -> threading.Thread | None:
    """Under a supervisor (ISOSWEEP_SUPERVISOR_PID): a daemon thread that calls `stop()` once
    the supervisor is gone (this process re-parented), then, if the runner is still alive
    `grace_s` later, kills its own session (it leads one: Ray's processes with it). None when
    no supervisor is named."""
    try:
        parent = int(env.get(SUPERVISOR_ENV, ""))
    except ValueError:
        return None

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        log.error("the supervisor (pid %d) is gone: this runner stops", parent)
        stop()
        time.sleep(grace_s)
        log.error("still running %gs after its supervisor died: killing itself", grace_s)
        (kill or _kill_own_session)()

    thread = threading.Thread(target=watch, name="supervisor-watch", daemon=True)
    thread.start()
    return thread


def _kill_own_session() -> None:
    """SIGKILL this process's session (it leads one under serve: Ray's processes with it)."""
    if os.getsid(0) == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)


def default_runner_id() -> str:
    """host:pid — unique among live runners, and says where to look for one."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Runner:
    """Claims queued sweeps one at a time and runs them with `run_sweep`.

    Args:
        store: the database the sweeps are in.
        runner_id: this runner's name in the store (default host:pid).
        lease_s: how long a claim lasts without a heartbeat (default settings.runner_lease_s);
            a runner that dies is replaced that long after its last heartbeat.
        poll_s: how often an idle runner looks for queued sweeps (default
            settings.runner_poll_s).
        ray_address: the Ray cluster (default RAY_ADDRESS, else a local instance).
        num_cpus, num_gpus: the size of a local instance (default: the machine's).
        progress: called with a SweepProgress after every trial event of a run (default
            `log_progress`: a log line per finished trial; `isosweep run` draws a bar).
        yield_after_s: a sweep's turn: after this long, it gives the runner up to another
            waiting sweep of at least its priority (run_sweep; not with run_once(sweep_id)).
            None: never.
        beat: called at every turn of the loop and every step of the driver's (default
            `LoopBeat.from_env()`: the file `isosweep serve` watches, if any).
    """

    def __init__(
        self,
        store: Store,
        *,
        runner_id: str | None = None,
        lease_s: float | None = None,
        poll_s: float | None = None,
        ray_address: str | None = None,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        progress: Callable[[SweepProgress], None] | None = None,
        yield_after_s: float | None = YIELD_AFTER_S,
        beat: Callable[[], None] | None = None,
    ):
        self.store = store
        self.runner_id = runner_id or default_runner_id()
        self.lease_s = lease_s or store.settings.runner_lease_s
        self.poll_s = poll_s or store.settings.runner_poll_s
        self.ray_address = ray_address
        self.ray_size = {"num_cpus": num_cpus, "num_gpus": num_gpus}
        self.progress = progress or log_progress
        self.yield_after_s = yield_after_s
        self.stopping = threading.Event()
        self.started_ray = False
        self.signals: SignalStop | None = None  # set while run_forever (or `isosweep run`) runs
        self.beat = beat or LoopBeat.from_env()

    def run_once(self, sweep_id: int | None = None) -> SweepInfo | None:
        """Claim one sweep and run it to its end (or until stopped).

        Args:
            sweep_id: claim this sweep only (as `isosweep run` does), never another queued one.

        Returns:
            The sweep as the run left it (queued again when it gave its turn up to another
            sweep), or None when nothing was claimable (nothing queued; or sweep_id is
            finished, or another runner holds it).
        """
        if self.stopping.is_set():
            return None
        self.beat()
        claimed_at = time.monotonic()  # before the claim: the lease never outlasts this clock
        sweep = self.store.claim_sweep(self.runner_id, self.lease_s, sweep_id=sweep_id)
        if sweep is None:
            return None
        control = BeatingControl(self.stopping, self.beat)
        with self.hold(sweep.id, control, since=claimed_at):  # Ray's start-up included
            log.info(
                "runner %s: running sweep %d (%s): %d trials, %d already finished",
                self.runner_id, sweep.id, sweep.name, sweep.n_trials, sweep.trials_done,
            )  # fmt: skip
            self.start_ray()
            self.beat()
            return run_sweep(
                self.store,
                sweep.id,
                runner_id=self.runner_id,
                progress=self.progress,
                ray_address=self.ray_address,
                control=control,
                # `isosweep run` drives its own sweep to the end; this runner runs no other
                yield_after_s=self.yield_after_s if sweep_id is None else None,
            )

    def hold(self, sweep_id: int, control: SweepControl, *, since: float) -> Heartbeat:
        """The heartbeat that holds a claimed sweep's lease (every lease_s / 3); `since`: the
        monotonic time taken before the claim."""
        interval = self.lease_s / 3
        return LeaseHeartbeat(
            self.store, sweep_id, self.runner_id, interval, control, lease_s=self.lease_s,
            since=since,
        )  # fmt: skip

    def run_forever(self, *, until_idle: bool = False) -> None:
        """Claim and run sweeps until stopped (SIGTERM/SIGINT, or `stop()`); with `until_idle`,
        return as soon as nothing is queued. Shuts down the Ray instance it started."""
        with SignalStop(self.stop) as self.signals:
            watch_supervisor(self.stop)
            try:
                while not self.stopping.is_set():
                    self.beat()
                    if self._turn() is None:
                        if until_idle:
                            return
                        self.stopping.wait(self.poll_s)
            finally:
                self.shutdown()

    def _turn(self) -> SweepInfo | None:
        """One claim-and-run; errors are logged, never fatal (the lease of a sweep that failed
        to run expires, and it is claimed again)."""
        try:
            return self.run_once()
        except StorageError as exc:
            log.error("runner %s: the store failed: %s", self.runner_id, exc)
        except Exception:
            log.exception("runner %s: a sweep run failed", self.runner_id)
        return None

    def stop(self) -> None:
        """Ask the runner to stop: the current sweep's trials stop, its records are flushed, and
        run_forever returns."""
        if not self.stopping.is_set():
            log.info("runner %s: stopping", self.runner_id)
        self.stopping.set()

    def start_ray(self) -> None:
        if init_ray(self.ray_address, **self.ray_size):
            self.started_ray = True
            if self.signals is not None:
                self.signals.arm()  # ray.init() replaced the SIGTERM handler

    def shutdown(self) -> None:
        if self.started_ray:
            import ray

            ray.shutdown()
            self.started_ray = False


def log_progress(p: SweepProgress) -> None:
    """The runner's progress report: one log line per finished trial."""
    if p.event == "finish" and p.trial_id is not None:
        log.info(
            "sweep %d: trial %d %s on %s (%d/%d trials done)",
            p.sweep_id, p.trial_id, p.status[p.trial_id], p.devices.get(p.trial_id, "?"),
            p.trials_done, p.trials_total,
        )  # fmt: skip


class SignalStop:
    """SIGTERM and SIGINT call `stop()`; a second one interrupts at once (KeyboardInterrupt).

    Tune's own SIGINT handler is switched off so that it does not take these over, and since
    `ray.init()` installs a SIGTERM handler of its own in the driver (one that exits), `arm()` is
    called again once Ray is up. Outside the main thread (where Python allows no handlers) this
    does nothing.
    """

    def __init__(self, stop: Any):
        self.stop = stop
        self.seen: list[int] = []
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> SignalStop:
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        self.arm()
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous.clear()

    def arm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for s in (signal.SIGTERM, signal.SIGINT):
            before = signal.signal(s, self._on_signal)
            self.previous.setdefault(s, before)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.seen:
            raise KeyboardInterrupt
        self.seen.append(signum)
        log.info("received %s", signal.Signals(signum).name)
        self.stop()
