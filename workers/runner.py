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
from collections.abc import Callable
from typing import Any

from service.errors import StorageError
from service.store import Store, SweepInfo
from workers.callbacks import Heartbeat, SweepControl, SweepProgress
from workers.driver import YIELD_AFTER_S, init_ray, run_sweep

log = logging.getLogger("isosweep.runner")


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
        claimed_at = time.monotonic()  # before the claim: the lease never outlasts this clock
        sweep = self.store.claim_sweep(self.runner_id, self.lease_s, sweep_id=sweep_id)
        if sweep is None:
            return None
        control = SweepControl(self.stopping)
        with self.hold(sweep.id, control, since=claimed_at):  # Ray's start-up included
            log.info(
                "runner %s: running sweep %d (%s): %d trials, %d already finished",
                self.runner_id, sweep.id, sweep.name, sweep.n_trials, sweep.trials_done,
            )  # fmt: skip
            self.start_ray()
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
        return Heartbeat(
            self.store, sweep_id, self.runner_id, interval, control, lease_s=self.lease_s,
            since=since,
        )  # fmt: skip

    def run_forever(self, *, until_idle: bool = False) -> None:
        """Claim and run sweeps until stopped (SIGTERM/SIGINT, or `stop()`); with `until_idle`,
        return as soon as nothing is queued. Shuts down the Ray instance it started."""
        with SignalStop(self.stop) as self.signals:
            try:
                while not self.stopping.is_set():
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
