"""The driver's side of a sweep run on Ray Tune: what stops it and what it writes.

- `StoreCallback` (a Tune callback on the driver) is the only writer of results: trial starts,
  batched records, final statuses. Trial processes never see the database, nor its URL.
- `CancelStopper` reads the sweep's cancel flag (throttled) and stops every trial promptly; it
  also stops a trial on its diverged record, and (with `EarlyStopper`, the spec's early_stop
  rule) a trial the rule stops: `stopped`, its records kept, the rung and reason as its error.
  With the synchronous rule (workers/sync_halving.py, `StageFeed`) it stops a trial at the cap
  of its stage, and StoreCallback holds such a trial (not finished) instead of failing it.
- `Heartbeat` holds the runner's lease from the claim on (Ray's start-up included), extending it
  every lease/3 s; once the lease is lost (another runner took the sweep over, or no heartbeat
  went through for a whole lease) the driver stops and writes nothing more.
- `SweepProgress`: trials done, epochs, ETA, for progress bars and logs.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import tune

from service.errors import Conflict, StorageError
from service.search.halving import Halving
from service.search.models import EarlyStop, metric_value
from service.status import TrialStatus, trials_finished
from service.store import Store
from service.store.sweeps import LeaseLost
from workers.trainable import (
    DEVICE_KEY,
    ERROR_KEY,
    MEMBERS_KEY,
    PACK_SIZE_KEY,
    PARAM_KEY,
    TRIAL_KEY,
    from_transport,
    members_of,
)

if TYPE_CHECKING:
    from workers.sync_halving import StageFeed

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
        # the lease may no longer be ours: another runner holds the sweep, or no heartbeat went
        # through for a whole lease (the store unreachable), or a fenced write was refused
        self.lost = threading.Event()

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
        return trials_finished(self.counts)

    @property
    def epochs_total(self) -> int:
        return sum(self.expected.values())

    @property
    def epochs_done(self) -> int:
        def recorded(t: int, n: int) -> int:
            finished = TrialStatus(self.status.get(t, TrialStatus.QUEUED)).is_finished()
            return n if finished else min(self.done.get(t, 0), n)

        return sum(recorded(t, n) for t, n in self.expected.items())

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


class EarlyStopper(DriverSide):
    """The spec's `early_stop` rule on the driver (service/search/halving.py): every record of
    every trial passes through `__call__` once (CancelStopper calls it, before the callbacks
    see the record), and a trial the rule stops gets its reason in `reasons`. A stop is moot
    at a trial's last epoch (it completed); diverged records and records without the metric
    are not judged. A packed member's stop goes to its pack through the run's StopBoard (`board`,
    a Ray actor handle; workers/trainable.py); an unpacked trial's is Tune's (the stopper
    returns True).

    `halving` holds the rungs' values; a resumed run rebuilds them from the stored records
    (`workers.driver.rebuild_halving`): a rung's cutoff depends on the set of values recorded
    there, not on their order."""

    def __init__(self, rule: EarlyStop, halving: Halving, final_epochs: dict[int, int]):
        self.rule, self.halving, self.final_epochs = rule, halving, final_epochs
        self.reasons: dict[int, str] = {}  # trial id → why it stopped
        self.judged: dict[int, int] = {}  # trial id → the last epoch judged
        self.board: Any = None

    def __call__(self, tid: int, result: dict[str, Any]) -> bool:
        """Whether trial `tid` is stopped (by this record, or an earlier one)."""
        if tid in self.reasons:
            return True
        epoch = result.get("epoch")
        if epoch is None or ERROR_KEY in result or result.get("diverged"):
            return False
        epoch = int(epoch)
        if epoch <= self.judged.get(tid, -1):
            return False
        self.judged[tid] = epoch
        value = metric_value(result, self.rule.metric, self.rule.layer)
        if value is None:
            return False
        j = self.halving.observe(tid, epoch, value)
        if j is None or not j.stop or epoch >= self.final_epochs.get(tid, epoch + 1):
            return False
        self.reasons[tid] = j.reason(self.rule.metric, self.rule.mode, self.rule.reduction)
        log.info("trial %d stopped: %s", tid, self.reasons[tid])
        if self.board is not None and int(result.get(PACK_SIZE_KEY, 1)) > 1:
            self.board.add.remote(tid)
        return True


class StoreCallback(DriverSide, tune.Callback):
    """The only writer of results: trial starts, records in batches, final statuses.

    Every state change flushes the pending records first, so that a retry's `start_trial`
    (which resets the trial's progress) never comes between an attempt and its records. With a
    `runner_id`, every write is fenced by the store (it happens only while this runner holds
    the sweep): a write refused for that (LeaseLost) sets `control.lost`, as the heartbeat
    does, so nothing is written after another runner took the sweep over, however late this
    one's heartbeat would have noticed.

    A trial whose last result carries `ERROR_KEY` (an error no retry would cure, which the
    trainable reports rather than raises) is `failed` with that text when it ends: one attempt.
    """

    def __init__(
        self,
        store: Store,
        control: SweepControl,
        tracker: SweepProgress,
        *,
        progress: Callable[[SweepProgress], None] | None = None,
        final_epochs: dict[int, int],
        runner_id: str | None = None,
        flush_records: int = FLUSH_RECORDS,
        flush_s: float = FLUSH_S,
        early: EarlyStopper | None = None,
        on_finish: Callable[[int, str], None] | None = None,
        stages: StageFeed | None = None,
    ):
        self.early = early  # the spec's early_stop rule (its decisions: `early.reasons`)
        self.stages = stages  # the synchronous rule's stages: caps, held trials, stored epochs
        self.on_finish = on_finish  # told (trial id, status) once a trial's outcome is stored
        self.store, self.control, self.tracker = store, control, tracker
        self.progress = progress
        self.final_epochs = final_epochs  # trial id → its config's last epoch
        self.runner_id = runner_id
        self.flush_records, self.flush_s = flush_records, flush_s
        self.buffer: list[tuple[int, dict[str, Any]]] = []
        self.oldest = 0.0  # monotonic time of the oldest buffered record
        self.last: dict[int, dict[str, Any]] = {}  # trial id → its last record (no arrays)
        self.skipped: set[int] = set()  # trials the store refused to start (cancelled)
        self.errors: dict[int, str] = {}  # trial id → the deterministic error it ended with
        self.finished: set[int] = set()  # trials whose outcome this attempt has written

    # --- Tune hooks -----------------------------------------------------------------------

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.flush()
        for tid in trial_keys(trial):  # one, or a pack's members
            if self.control.lost.is_set():
                return
            try:
                if self.stages is None or not self.stages.continuing(tid):  # keeps its records
                    self._fenced(self.store.start_trial, tid)
            except LeaseLost:
                return
            except Conflict as exc:  # cancelled while it waited; the stopper ends the run
                log.info("trial %d not started: %s", tid, exc)
                self.skipped.add(tid)
                continue
            self.last.pop(tid, None)
            self.errors.pop(tid, None)
            self.finished.discard(tid)
            self._event("start", tid, status=TrialStatus.RUNNING, done=0)

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        for r in member_results(result):  # a pack's epoch comes as one result of its members'
            self._on_result(trial, r)

    def _on_result(self, trial: Any, result: dict) -> None:
        tid = int(result.get(TRIAL_KEY, trial_key(trial)))  # a pack's results name their member
        if tid in self.skipped or tid in self.finished or self.control.lost.is_set():
            return
        if ERROR_KEY in result:  # the trial's last result: an error no retry would cure
            self.errors[tid] = str(result[ERROR_KEY])
            return
        record = from_transport(result)
        if self.stages is not None and not self.stages.wanted(tid, record["epoch"]):
            return  # stored in an earlier stage, or past this stage's cap
        if not self.buffer:
            self.oldest = time.monotonic()
        self.buffer.append((tid, record))
        self.last[tid] = {"epoch": record["epoch"], "diverged": record["diverged"]}
        self.tracker.devices[tid] = str(result.get(DEVICE_KEY, "?"))
        if len(self.buffer) >= self.flush_records:
            self.flush()
        self._event("record", tid, done=self.tracker.done.get(tid, 0) + 1)
        final = record["diverged"] or record["epoch"] == self.final_epochs.get(tid)
        if self.early is not None and self.early(tid, result):
            final = True  # stopped early: its records end here
        if final and int(result.get(PACK_SIZE_KEY, 1)) > 1:
            self._finish(tid)  # a member's own end: the rest of its pack goes on

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        if self.buffer and time.monotonic() - self.oldest >= self.flush_s:
            self.flush()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        for tid in trial_keys(trial):
            self._finish(tid)
            if self.stages is not None:
                self.stages.ended(tid)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.flush()
        summary = error_text(trial).split("\n", 1)[0]
        for tid in trial_keys(trial):
            log.warning(
                "trial %d failed (attempt %d), retrying: %s", tid, trial.num_failures, summary
            )
            self.finished.discard(tid)
            self._event("retry", tid, status=TrialStatus.QUEUED, done=0)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.flush()
        text = error_text(trial)
        for tid in trial_keys(trial):
            if tid in self.skipped or tid in self.finished or self.control.lost.is_set():
                continue
            log.warning(
                "trial %d failed after %d attempts: %s", tid, trial.num_failures, text[:300]
            )
            with contextlib.suppress(LeaseLost):
                self._fenced(self.store.finish_trial, tid, TrialStatus.FAILED, text)
                self.finished.add(tid)
                self._event("finish", tid, status=TrialStatus.FAILED)
                if self.on_finish is not None:
                    self.on_finish(tid, TrialStatus.FAILED)
        if self.stages is not None:
            for tid in trial_keys(trial):
                self.stages.ended(tid)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.flush()

    def _finish(self, tid: int) -> None:
        """Write a trial's outcome once (a pack member's may come before its pack ends)."""
        self.flush()
        if tid in self.skipped or tid in self.finished or self.control.lost.is_set():
            return
        if self._held(tid):
            return  # at its stage's cap: the next stage runs it on
        status, error = self._outcome(tid)
        if status == TrialStatus.FAILED and error is not None:  # a stop's reason is logged
            log.warning("trial %d failed: %s", tid, error.split("\n", 1)[0])
        with contextlib.suppress(LeaseLost):
            self._fenced(self.store.finish_trial, tid, status, error)
            self.finished.add(tid)
            self._event("finish", tid, status=status)
            if self.on_finish is not None:
                self.on_finish(tid, status)

    # --- helpers ----------------------------------------------------------------------------

    def _held(self, tid: int) -> bool:
        """Whether the synchronous rule holds the trial at its cap (then it stays unfinished:
        a "hold" event, this stage's records as its expected ones)."""
        stages = self.stages
        if stages is None or tid in self.errors:
            return False
        if not stages.held(tid, self.last.get(tid), self.final_epochs[tid]):
            return False
        self.tracker.expected[tid] = self.tracker.done.get(tid, 0)
        self._event("hold", tid, status=TrialStatus.RUNNING)
        return True

    def flush(self) -> None:
        """Write the buffered records in one transaction (nothing once the lease is lost)."""
        batch, self.buffer = self.buffer, []
        if batch and not self.control.lost.is_set():
            with contextlib.suppress(LeaseLost):
                self._fenced(self.store.write_records, batch)

    def _fenced(self, write: Callable[..., Any], *args: Any) -> Any:
        """A store write fenced by this runner's hold on the sweep; LeaseLost sets
        control.lost (and is raised on)."""
        try:
            return write(*args, runner_id=self.runner_id)
        except LeaseLost as exc:
            if not self.control.lost.is_set():
                log.warning("%s; stopping", exc)
            self.control.lost.set()
            raise

    def _outcome(self, tid: int) -> tuple[TrialStatus, str | None]:
        if tid in self.errors:
            return TrialStatus.FAILED, self.errors[tid]
        last = self.last.get(tid)
        if last is not None and last["diverged"]:
            return TrialStatus.DIVERGED, None
        if self.early is not None and tid in self.early.reasons:
            return TrialStatus.STOPPED, self.early.reasons[tid]
        final = self.final_epochs[tid]
        if last is None or last["epoch"] != final:
            reached = "no record" if last is None else f"epoch {last['epoch']}"
            return TrialStatus.FAILED, f"the trial ended at {reached} of {final} without an error"
        return TrialStatus.COMPLETED, None

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

    def __init__(
        self,
        store: Store,
        sweep_id: int,
        control: SweepControl,
        poll_s=CANCEL_POLL_S,
        early: EarlyStopper | None = None,
        stages: StageFeed | None = None,
    ):
        self.store, self.sweep_id, self.control, self.poll_s = store, sweep_id, control, poll_s
        self.polled = -float("inf")
        self.early = early  # judges every record first (then StoreCallback reads its reasons)
        self.stages = stages  # a trial (or pack) at its stage's cap stops there

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        # a pack goes on when one member diverges or stops early (that member stops inside it)
        alone = int(result.get(PACK_SIZE_KEY, 1)) == 1
        stopped = False
        capped = False
        for r in member_results(result):
            if self.early is not None and TRIAL_KEY in r:
                stopped = self.early(int(r[TRIAL_KEY]), r) or stopped
            if self.stages is not None and TRIAL_KEY in r:  # a pack's members share their cap
                capped = self.stages.at_cap(r, int(r[TRIAL_KEY])) or capped
        return capped or (alone and (bool(result.get("diverged", False)) or stopped))

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
    """A daemon thread that holds a runner's lease on a sweep from the claim to the end of the
    run: it extends the lease every `interval_s`, and sets `control.lost` (which stops the trials
    and every further write) as soon as the lease may no longer be this runner's:

    - the store says another runner holds the sweep (it took the sweep over), or
    - a heartbeat failed, and none has gone through for `lease_s` (the store unreachable): the
      lease has run out by this clock, and another runner may have claimed it. (Checked only
      when a heartbeat fails; a heartbeat that goes through says whose the sweep is.)

    (A heartbeat that goes through late, after a stall, is still this runner's: the store says
    whether another runner took the sweep meanwhile, and StoreCallback's writes are fenced.)

    After a failed heartbeat it tries again sooner (half the time left, at most `interval_s`).

    Args:
        interval_s: time between heartbeats (the runner uses lease_s / 3).
        lease_s: the lease the sweep was claimed with (default 3 × interval_s).
        since: `time.monotonic()` when the lease was last extended: taken just before the
            claim, so that the lease's end is never overestimated (default: now).
    """

    def __init__(
        self,
        store: Store,
        sweep_id: int,
        runner_id: str,
        interval_s: float,
        control: SweepControl,
        *,
        lease_s: float | None = None,
        since: float | None = None,
    ):
        self.store, self.sweep_id, self.runner_id = store, sweep_id, runner_id
        self.interval_s, self.control = interval_s, control
        self.lease_s = 3 * interval_s if lease_s is None else lease_s
        self.good_until = (time.monotonic() if since is None else since) + self.lease_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"heartbeat-{sweep_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def _beat(self) -> None:
        wait = self.interval_s
        while not self.done.wait(wait):
            sent = time.monotonic()
            try:
                ours = self.store.heartbeat(self.sweep_id, self.runner_id)
            except StorageError as exc:
                left = self.good_until - time.monotonic()
                if left <= 0:
                    return self._lose("no heartbeat went through for the whole lease")
                log.warning("sweep %d: heartbeat failed (%.1fs of lease left): %s",
                            self.sweep_id, left, exc)  # fmt: skip
                wait = min(self.interval_s, max(left / 2, 0.05))
                continue
            if not ours:
                return self._lose("another runner holds it now")
            self.good_until, wait = sent + self.lease_s, self.interval_s

    def _lose(self, why: str) -> None:
        log.warning("sweep %d: the lease is lost (%s); stopping", self.sweep_id, why)
        self.control.lost.set()


def member_results(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-trial results inside a Tune result: a pack's epoch (MEMBERS_KEY), or itself."""
    members = result.get(MEMBERS_KEY)
    return members if isinstance(members, list) else [result]


def trial_keys(trial: Any) -> list[int]:
    """The store's trial ids a Tune trial runs: one, or a pack's members."""
    return [tid for tid, _ in members_of(trial.config[PARAM_KEY])]


def trial_key(trial: Any) -> int:
    """The store's trial id of a Tune trial (a pack's first member)."""
    return trial_keys(trial)[0]


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
