"""The driver's side of a sweep run on Ray Tune: what stops it and what it writes.

- `StoreCallback` (a Tune callback on the driver) is the only writer of results: trial starts,
  batched records, final statuses. Trial processes never see the database, nor its URL.
- `CancelStopper` reads the sweep's cancel flag (throttled) and stops every trial promptly; it
  also stops a trial on its diverged record.
- `Heartbeat` extends the runner's lease every lease/3 s; if another runner took the sweep over,
  the driver stops and writes nothing more.
- `SweepProgress`: trials done, epochs, ETA, for progress bars and logs.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray import tune

from service.errors import Conflict, StorageError
from service.store import Store
from service.store.models import FINISHED_TRIAL
from workers.trainable import DEVICE_KEY, PARAM_KEY, from_transport

log = logging.getLogger("isosweep.driver")

FLUSH_RECORDS = 64  # a batch goes to the store at this many records…
FLUSH_S = 0.5  # …or when its oldest record is this old
CANCEL_POLL_S = 0.5  # how often the stopper reads the cancel flag
MAX_ERROR_CHARS = 20_000  # a failed trial's stored error text (its tail is kept)


class SweepControl:
    """Why the driver should stop: a requested cancel, a lost lease, or the runner stopping."""

    def __init__(self, stop: threading.Event | None = None):
        self.stop = stop or threading.Event()  # set by the runner (SIGTERM/SIGINT)
        self.cancel = threading.Event()  # the sweep's cancel flag was seen
        self.lost = threading.Event()  # another runner holds the sweep now

    def halted(self) -> bool:
        return self.stop.is_set() or self.cancel.is_set() or self.lost.is_set()


@dataclass
class SweepProgress:
    """Where a sweep run stands; `progress(p)` gets it after every event (start, record, retry,
    finish). Epoch counts are records: epoch 0 and every recorded epoch count one each."""

    sweep_id: int
    trials_total: int  # every trial of the sweep, reused and already finished ones included
    base_counts: Counter  # statuses of the trials this run does not drive
    expected: dict[int, int]  # trial id → records a full run of it writes
    status: dict[int, str] = field(default_factory=dict)  # trial id → status (driven trials)
    done: dict[int, int] = field(default_factory=dict)  # trial id → records this attempt
    devices: dict[int, str] = field(default_factory=dict)  # trial id → where it last ran
    started_s: float = field(default_factory=time.monotonic)
    event: str = "begin"
    trial_id: int | None = None

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.base_counts + Counter(self.status.values()))

    @property
    def trials_done(self) -> int:
        return sum(n for s, n in self.counts.items() if s in FINISHED_TRIAL)

    @property
    def epochs_total(self) -> int:
        return sum(self.expected.values())

    @property
    def epochs_done(self) -> int:
        return sum(
            n if self.status.get(t) in FINISHED_TRIAL else min(self.done.get(t, 0), n)
            for t, n in self.expected.items()
        )

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the pace so far (Ray start-up and imports included), None at first."""
        total, done = self.epochs_total, self.epochs_done
        if not total or not done:
            return None
        return self.elapsed_s * (total - done) / done


class DriverSide:
    """Lives in the driver process only. Tune pickles its run config (tuner.pkl) for an
    experiment restore that isosweep never does (resumption is from the store), so the pickle
    carries no state; the live store, threads and locks stay here, and a copy is the object."""

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __copy__(self) -> DriverSide:
        return self

    def __deepcopy__(self, memo: dict) -> DriverSide:
        return self


class StoreCallback(DriverSide, tune.Callback):
    """The only writer of results: trial starts, records in batches, final statuses.

    Every state change flushes the pending records first, so that a retry's `start_trial`
    (which resets the trial's progress) never comes between an attempt and its records.
    """

    def __init__(
        self,
        store: Store,
        control: SweepControl,
        tracker: SweepProgress,
        *,
        progress: Callable[[SweepProgress], None] | None = None,
        final_epochs: dict[int, int],
        flush_records: int = FLUSH_RECORDS,
        flush_s: float = FLUSH_S,
    ):
        self.store, self.control, self.tracker = store, control, tracker
        self.progress = progress
        self.final_epochs = final_epochs  # trial id → its config's last epoch
        self.flush_records, self.flush_s = flush_records, flush_s
        self.buffer: list[tuple[int, dict[str, Any]]] = []
        self.oldest = 0.0  # monotonic time of the oldest buffered record
        self.last: dict[int, dict[str, Any]] = {}  # trial id → its last record (no arrays)
        self.skipped: set[int] = set()  # trials the store refused to start (cancelled)

    # --- Tune hooks -----------------------------------------------------------------------

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        tid = trial_key(trial)
        self.flush()
        if self.control.lost.is_set():
            return
        try:
            self.store.start_trial(tid)
        except Conflict as exc:  # cancelled while it waited; the stopper ends the run
            log.info("trial %d not started: %s", tid, exc)
            self.skipped.add(tid)
            return
        self.last.pop(tid, None)
        self._event("start", tid, status="running", done=0)

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        tid = trial_key(trial)
        if tid in self.skipped or self.control.lost.is_set():
            return
        record = from_transport(result)
        if not self.buffer:
            self.oldest = time.monotonic()
        self.buffer.append((tid, record))
        self.last[tid] = {"epoch": record["epoch"], "diverged": record["diverged"]}
        self.tracker.devices[tid] = str(result.get(DEVICE_KEY, "?"))
        if len(self.buffer) >= self.flush_records:
            self.flush()
        self._event("record", tid, done=self.tracker.done.get(tid, 0) + 1)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        if self.buffer and time.monotonic() - self.oldest >= self.flush_s:
            self.flush()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        tid = trial_key(trial)
        self.flush()
        if tid in self.skipped or self.control.lost.is_set():
            return
        status, error = self._outcome(tid)
        self.store.finish_trial(tid, status, error)
        self._event("finish", tid, status=status)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        tid = trial_key(trial)
        self.flush()
        summary = error_text(trial).split("\n", 1)[0]
        log.warning("trial %d failed (attempt %d), retrying: %s", tid, trial.num_failures, summary)
        self._event("retry", tid, status="queued", done=0)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        tid = trial_key(trial)
        self.flush()
        if tid in self.skipped or self.control.lost.is_set():
            return
        text = error_text(trial)
        log.warning("trial %d failed after %d attempts: %s", tid, trial.num_failures, text[:300])
        self.store.finish_trial(tid, "failed", text)
        self._event("finish", tid, status="failed")

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.flush()

    # --- helpers ----------------------------------------------------------------------------

    def flush(self) -> None:
        """Write the buffered records in one transaction (nothing once the lease is lost)."""
        batch, self.buffer = self.buffer, []
        if batch and not self.control.lost.is_set():
            self.store.write_records(batch)

    def _outcome(self, tid: int) -> tuple[str, str | None]:
        last = self.last.get(tid)
        if last is not None and last["diverged"]:
            return "diverged", None
        final = self.final_epochs[tid]
        if last is None or last["epoch"] != final:
            reached = "no record" if last is None else f"epoch {last['epoch']}"
            return "failed", f"the trial ended at {reached} of {final} without an error"
        return "completed", None

    def _event(self, event: str, tid: int, *, status: str | None = None, done: int | None = None):
        t = self.tracker
        if status is not None:
            t.status[tid] = status
        if done is not None:
            t.done[tid] = done
        t.event, t.trial_id = event, tid
        if self.progress is not None:
            self.progress(t)


class CancelStopper(DriverSide, tune.Stopper):
    """Stops one trial on its diverged record, and every trial once the sweep's cancel flag is
    set (read at most every `poll_s`), its lease is lost, or the runner is stopping."""

    def __init__(self, store: Store, sweep_id: int, control: SweepControl, poll_s=CANCEL_POLL_S):
        self.store, self.sweep_id, self.control, self.poll_s = store, sweep_id, control, poll_s
        self.polled = -float("inf")

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return bool(result.get("diverged", False))

    def stop_all(self) -> bool:
        now = time.monotonic()
        if not self.control.halted() and now - self.polled >= self.poll_s:
            self.polled = now
            try:
                if self.store.is_cancel_requested(self.sweep_id):
                    log.info("sweep %d: cancel requested, stopping its trials", self.sweep_id)
                    self.control.cancel.set()
            except StorageError as exc:  # a blip: the next poll tries again
                log.warning("sweep %d: cannot read the cancel flag: %s", self.sweep_id, exc)
        return self.control.halted()


class Heartbeat:
    """A daemon thread extending the lease every `interval_s`; sets `control.lost` when the
    store says the sweep is no longer this runner's."""

    def __init__(self, store: Store, sweep_id: int, runner_id: str, interval_s: float, control):
        self.store, self.sweep_id, self.runner_id = store, sweep_id, runner_id
        self.interval_s, self.control = interval_s, control
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"heartbeat-{sweep_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def _beat(self) -> None:
        while not self.done.wait(self.interval_s):
            try:
                ours = self.store.heartbeat(self.sweep_id, self.runner_id)
            except StorageError as exc:  # keep trying until the lease runs out
                log.warning("sweep %d: heartbeat failed: %s", self.sweep_id, exc)
                continue
            if not ours:
                log.warning("sweep %d: another runner holds it now; stopping", self.sweep_id)
                self.control.lost.set()
                return


def trial_key(trial: Any) -> int:
    """The store's trial id of a Tune trial."""
    return int(trial.config[PARAM_KEY]["trial_id"])


def trial_name(trial: Any) -> str:
    return f"trial_{trial_key(trial)}"


ANSI = re.compile(r"\x1b\[[0-9;]*m")
FAILURE_HEADER = re.compile(r"^Failure # \d+ \(occurred at [^)]*\)$", re.M)
QUALIFIED = re.compile(r"^(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)(?=:|$)")


def error_text(trial: Any) -> str:
    """A failed trial's last error: a one-line summary (`DataUnavailable: …`), a blank line, then
    the remote traceback from Tune's error file (ANSI colours and caret lines removed)."""
    path = getattr(trial, "error_file", None)
    text = Path(path).read_text(errors="replace") if path and Path(path).is_file() else ""
    sections = FAILURE_HEADER.split(text)
    lines = [
        line
        for line in ANSI.sub("", sections[-1]).splitlines()
        if line.strip() and not set(line.strip()) <= {"^", "~"}
    ]
    if not lines:
        return f"the trial failed {trial.num_failures} times; Tune recorded no error text"
    trace = "\n".join(lines)
    if len(trace) > MAX_ERROR_CHARS:
        trace = "…" + trace[-MAX_ERROR_CHARS:]
    return f"{exception_line(lines)}\n\n{trace}"


def exception_line(lines: list[str]) -> str:
    """The exception a traceback ends with, class name unqualified: the lines after the last
    `File "…"` line and its source line."""
    files = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    tail = lines[files[-1] + 1 :] if files else lines[-1:]
    tail = [line for line in tail if not line.startswith("    ")] or lines[-1:]
    return QUALIFIED.sub(r"\1", " ".join(s.strip() for s in tail))
