"""The sweep driver: run a claimed sweep's unfinished trials on Ray Tune and store what they report.

    info = run_sweep(store, sweep_id, runner_id="host:123")

- One Tune trial per stored trial still to run, handed to Tune lazily: `TrialSource` (a Tune
  `Searcher`) reads the runnable trials from the store a keyset page at a time
  (`store.runnable_trials(after_index=, limit=)`) and suggests one {"trial_id", "config",
  "data_dir"} dict whenever Tune has room for a trial (`max_concurrent_trials`: what the cluster
  runs at once, twice over), each with the spec's resources (CPU or GPU, fractional GPUs allowed)
  and `FailureConfig(max_failures=spec.max_failures)`. Nothing is generated up front (Tune's
  `grid_search` variant generator is quadratic in the number of trials), so a sweep's first
  trial starts as soon as Ray is up, whatever its size.
- A sweep runs as a series of Tune runs ("chunks") of at most CHUNK_TRIALS trials: Tune keeps
  every Trial object of a run until the run ends, so this bounds the driver's memory (and
  Tune's per-step scans over its trials) by the chunk, not the sweep. What Tune would keep of a
  finished trial's last result beyond its scalars (the record's vectors and input Gram, 0.5 MB
  for a digits trial, which StoreCallback has stored) is dropped (`RunCallback`).
  `RunProgress` lists only the trials in flight.
- Taking turns (`yield_after_s`, the Runner's default YIELD_AFTER_S): once a sweep has held the
  runner that long and another sweep of at least its priority is waiting
  (`store.is_sweep_waiting`), no more trials are handed out, the ones in flight finish, and the
  sweep goes back to the queue (`store.release_sweep`); the claim order (priority, then the
  sweep that ran least recently) runs the waiting sweep next, then this one resumes.
- workers/callbacks.py: `StoreCallback` (the only writer), `CancelStopper` (the cancel flag,
  divergence), `Heartbeat` (the lease), `SweepProgress`.
- The lease: `Runner.run_once` starts the Heartbeat at the claim, before Ray starts, and hands its
  `SweepControl` in; called without one, run_sweep holds the lease itself from its start.

- Adaptive search and early stopping (docs/api.md): with a `search: {kind: tpe}`, `SearchFeed`
  asks Optuna for trials once the stored ones are handed out (at most `live_trials` asked and
  not finished at once), writes each to the store before it runs, and tells the study each
  outcome; a resumed run rebuilds the studies from the stored trials. With `early_stop`,
  `workers.callbacks.EarlyStopper` judges every record (its rung values rebuilt from the stored
  records on resume: `rebuild_halving`); a packed member's stop reaches its pack through a
  `StopBoard` actor. With `early_stop: {…, synchronous: true}` the trials come from a
  `workers.sync_halving.StageFeed` instead, a rung at a time.

Resumption is the store's, not Tune's: a restarted runner claims the sweep again and runs the
trials that are not finished; writes are idempotent upserts, so nothing is duplicated.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.search import Searcher

from service.config import TrialConfig
from service.errors import Conflict, InvalidInput, StorageError
from service.packs import auto_pack_size, pack_key
from service.search.halving import Halving
from service.spec import SweepSpec
from service.status import TrialStatus
from service.store import Store, SweepInfo, TrialInfo
from service.store.sweeps import LeaseLost
from workers.callbacks import (
    CancelStopper,
    DriverSide,
    EarlyStopper,
    Heartbeat,
    StoreCallback,
    SweepControl,
    SweepProgress,
    trial_name,
)
from workers.sync_halving import StageFeed
from workers.trainable import BOARD_KEY, PACK_KEY, PARAM_KEY, StopBoard, run_trial

log = logging.getLogger("isosweep.driver")

TUNE_LOGGERS = (  # Tune's own reports of what StoreCallback already records
    "ray.tune.tune",
    "ray.tune.execution.tune_controller",
    "ray.tune.analysis.experiment_analysis",
)
PAGE_TRIALS = 256  # runnable trials read from the store at a time
# Trials of one Tune run: Tune keeps each Trial object (~70 kB measured, once RunCallback has
# dropped its arrays) until the run ends, and a new run costs a round of actor start-ups (~8 s
# on a loaded 2-core host): ~70 MB at most, and a restart per 1000 trials.
CHUNK_TRIALS = 1000
LIVE_PER_SLOT = 2  # trials Tune holds at once (pending or running) per trial the cluster fits
YIELD_AFTER_S = 30.0  # the Runner's turn: a sweep gives the runner up after this, if one waits
WAIT_POLL_S = 2.0  # how often, once its turn is over, a sweep asks whether another waits


# --- Ray and the sweep run ----------------------------------------------------------------------


def init_ray(
    address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None
) -> bool:
    """Connect to the Ray cluster at `address` (or RAY_ADDRESS), else start a local instance.

    Returns:
        True when this call started Ray (the caller shuts it down), False when Ray was already
        initialized in this process.
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        log.info("connected to the Ray cluster at %s", address)
    else:
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False)
        log.info("started a local Ray instance: %s", ray.cluster_resources())
    return True


def run_sweep(
    store: Store,
    sweep_id: int,
    *,
    runner_id: str,
    progress: Callable[[SweepProgress], None] | None = None,
    ray_address: str | None = None,
    lease_s: float | None = None,
    control: SweepControl | None = None,
    yield_after_s: float | None = None,
) -> SweepInfo:
    """Run the trials of a sweep claimed by `runner_id` that are not finished, then finish it.

    Args:
        store: where the sweep is; the only place results go.
        sweep_id: a sweep this runner holds (store.claim_sweep).
        runner_id: the id it was claimed with; the heartbeat extends that lease.
        progress: called with a SweepProgress after every trial event (in the driver thread).
        ray_address: the cluster, when Ray is not initialized yet (default RAY_ADDRESS, else a
            local instance).
        lease_s: the lease the sweep was claimed with (default settings.runner_lease_s); the
            heartbeat runs every lease_s / 3.
        control: the run's SweepControl when the caller already holds the lease with a
            Heartbeat of its own (Runner.run_once, from the claim on; `lease_s` is then
            unused). Setting its `stop` stops the run cleanly (the runner's SIGTERM): trials
            stop, records are flushed, and the sweep goes back to the queue at once
            (store.release_sweep). Without it, run_sweep starts the Heartbeat itself, and the
            run ends when the sweep is finished, cancelled or taken over.
        yield_after_s: give the runner up once the run is this old and another sweep of at
            least this one's priority is waiting: the trials in flight finish, no new ones
            start, and the sweep goes back to the queue (the Runner passes YIELD_AFTER_S; None,
            the default and `isosweep run`'s: run to the end).

    Returns:
        The sweep as it stands: finished (completed, failed or cancelled), queued again when it
        was stopped or gave its turn up, or running when another runner took it over.

    Raises:
        NotFound: no such sweep.
        StorageError: the store failed while results were being written.
    """
    sweep = store.get_sweep(sweep_id)
    spec = SweepSpec.model_validate(sweep.spec)
    left, records = store.runnable_totals(sweep_id)
    search = SearchFeed.begin(store, sweep_id, spec, runner_id) if spec.adaptive else None
    if search is not None:
        left += search.studies.owed()
    tracker = RunProgress.begin(sweep, records)
    if progress is not None:
        progress(tracker)
    held = control is not None
    control = control or SweepControl()
    lease = lease_s or store.settings.runner_lease_s
    beat = Heartbeat(store, sweep_id, runner_id, lease / 3, control, lease_s=lease)
    yielded = False
    with contextlib.nullcontext() if held else beat:
        # not when cancelled while its runner was gone, nor stopped or lost while Ray started
        if left and not sweep.cancel_requested and not control.halted():
            init_ray(ray_address)
            local = not (ray_address or os.environ.get("RAY_ADDRESS"))
            short = unmet_resources(spec.resources.cpu, spec.resources.gpu) if local else None
            if short:  # a fixed local instance would wait forever: fail the trials instead
                feed = TrialFeed(store, sweep_id)
                while (t := feed.next()) is not None:
                    store.finish_trial(t.id, TrialStatus.FAILED, short, runner_id=runner_id)
            else:
                turn = Turn(store, sweep_id, yield_after_s)
                yielded = _tune(store, sweep, spec, control, tracker, progress, runner_id, turn,
                                search)  # fmt: skip
    return conclude(store, sweep_id, runner_id, control, yielded=yielded)


def unmet_resources(cpu: float, gpu: float) -> str | None:
    """Why one trial can never be placed on this Ray instance, or None when it can."""
    have = ray.cluster_resources()
    for name, need in (("CPU", cpu), ("GPU", gpu)):
        if need > have.get(name, 0):
            return (
                f"resources.{name.lower()}: a trial needs {need:g} {name}, but the local Ray "
                f"instance has {have.get(name, 0):g}; lower it, or set RAY_ADDRESS to a cluster "
                "that has them"
            )
    return None


def new_progress(sweep: SweepInfo, trials: list[TrialInfo]) -> RunProgress:
    """The progress of a run that drives `trials` (all handed to it at once)."""
    tracker = RunProgress.begin(sweep, 0)
    for t in trials:
        tracker.feed(t)
    return tracker


@dataclass
class RunProgress(SweepProgress):
    """A SweepProgress whose cost per event does not grow with the sweep: only the trials handed
    to Tune and not finished yet are listed (status, expected, done, devices); the runnable
    trials not handed out yet (`unfed_epochs`) and the finished ones (`folded_epochs`, and their
    statuses in base_counts) are totals."""

    unfed_epochs: int = 0  # records a full run of the trials not handed to Tune yet writes
    folded_epochs: int = 0  # records of this run's finished trials, folded out of the lists

    @classmethod
    def begin(cls, sweep: SweepInfo, unfed_epochs: int) -> RunProgress:
        """Before any trial is handed out: every trial counted by its stored status."""
        return cls(
            sweep_id=sweep.id,
            trials_total=sweep.n_trials,
            base_counts=Counter({s: n for s, n in sweep.counts.items() if n}),
            expected={},
            status={},
            unfed_epochs=unfed_epochs,
        )

    def feed(self, t: TrialInfo) -> None:
        """`t` is handed to Tune: listed, queued, until it finishes."""
        self.base_counts[t.status] -= 1
        self.status[t.id] = TrialStatus.QUEUED
        self.expected[t.id] = t.records_total
        self.unfed_epochs = max(self.unfed_epochs - t.records_total, 0)

    def fold(self, trial_id: int) -> None:
        """A finished trial leaves the lists for the totals."""
        status = self.status.pop(trial_id, None)
        if status is None:
            return
        self.base_counts[status] += 1
        self.folded_epochs += self.expected.pop(trial_id, 0)
        self.done.pop(trial_id, None)
        self.devices.pop(trial_id, None)

    @property
    def epochs_total(self) -> int:
        return self.unfed_epochs + self.folded_epochs + sum(self.expected.values())

    @property
    def epochs_done(self) -> int:
        return self.folded_epochs + SweepProgress.epochs_done.fget(self)  # type: ignore[attr-defined]


class TrialFeed:
    """The sweep's trials still to run, in expansion order, read from the store a keyset page
    (`PAGE_TRIALS`) at a time: memory and time per trial independent of the sweep's size."""

    def __init__(self, store: Store, sweep_id: int, page: int = PAGE_TRIALS):
        self.store, self.sweep_id, self.page = store, sweep_id, page
        self.buffer: deque[TrialInfo] = deque()
        self.after: int | None = None  # the index of the last trial read
        self.read_all = False

    def put_back(self, t: TrialInfo) -> None:
        """Return a trial taken with `next`: the next call gives it again."""
        self.buffer.appendleft(t)

    def next(self) -> TrialInfo | None:
        """The next trial, or None when there is none left.

        Raises:
            StorageError: the store failed (the feed is unchanged: ask again).
        """
        if not self.buffer and not self.read_all:
            got = self.store.runnable_trials(self.sweep_id, after_index=self.after, limit=self.page)
            self.read_all = len(got) < self.page
            self.buffer.extend(got)
            if got:
                self.after = got[-1].index
        return self.buffer.popleft() if self.buffer else None

    @property
    def drained(self) -> bool:
        return self.read_all and not self.buffer


class Turn:
    """Whether the run should give the runner up: `after_s` seconds after it began, and only
    while another sweep is waiting (asked of the store at most every `poll_s`). Never, with
    after_s None."""

    def __init__(self, store: Store, sweep_id: int, after_s: float | None, poll_s=WAIT_POLL_S):
        self.store, self.sweep_id, self.poll_s = store, sweep_id, poll_s
        self.deadline = None if after_s is None else time.monotonic() + after_s
        self.polled = -math.inf
        self.over = False

    def __call__(self) -> bool:
        if self.deadline is None or self.over:
            return self.over
        now = time.monotonic()
        if now < self.deadline or now - self.polled < self.poll_s:
            return False
        self.polled = now
        try:
            self.over = self.store.is_sweep_waiting(self.sweep_id)
        except StorageError as exc:  # a blip: keep running, ask again later
            log.warning("sweep %d: cannot tell whether another sweep waits: %s", self.sweep_id, exc)
        if self.over:
            log.info("sweep %d: another sweep is waiting; giving the runner up", self.sweep_id)
        return self.over


def stored_trials(store: Store, sweep_id: int, page: int = 1000) -> list[TrialInfo]:
    """Every trial of the sweep, in index order."""
    out: list[TrialInfo] = []
    while True:
        got, total = store.list_trials(sweep_id, offset=len(out), limit=page)
        out.extend(got)
        if not got or len(out) >= total:
            return out


def max_epochs(spec: SweepSpec) -> int:
    """The most epochs any trial of the spec trains."""
    v = spec.parameters.get("epochs", TrialConfig().epochs)
    if isinstance(v, list):
        return int(max(v))
    if isinstance(v, dict):
        return int(spec.sampled["epochs"].top)
    return int(v)


def rebuild_halving(store: Store, sweep_id: int, spec: SweepSpec) -> Halving:
    """The early_stop rule's rungs with the values of the sweep's finished trials (completed,
    diverged, stopped, reused; in index order, each trial's records by epoch), as they stood
    when the last run ended: a rung's cutoff depends on the set of values recorded there."""
    rule = spec.early_stop
    assert rule is not None
    halving = Halving(rule.metric, rule.mode, rule.grace_epochs, rule.reduction, max_epochs(spec))
    done = {t.id for t in stored_trials(store, sweep_id) if TrialStatus(t.status).is_finished()
            and t.status not in (TrialStatus.FAILED, TrialStatus.CANCELLED)}  # fmt: skip
    if not done:
        return halving
    try:
        frame = store.read_metrics(
            sweep_id,
            metrics=[rule.metric],
            layers=None if rule.layer is None else [rule.layer],
            max_points=10**9,
        )
    except InvalidInput:  # nothing recorded of it yet
        return halving
    if rule.layer is not None:
        frame = frame[frame["layer"] == rule.layer]
    frame = frame[frame["trial_id"].isin(done) & (frame["epoch"] > 0)]
    for tid, epoch, value in frame[["trial_id", "epoch", "value"]].itertuples(index=False):
        halving.observe(int(tid), int(epoch), float(value))
    return halving


class SearchFeed:
    """The driver's side of a tpe search (service/search/tpe.py): the studies rebuilt from the
    store, asked when the stored trials are handed out, told as trials finish."""

    def __init__(self, store: Store, sweep_id: int, spec: SweepSpec, runner_id: str | None,
                 studies: Any):  # fmt: skip
        self.store, self.sweep_id, self.spec, self.runner_id = store, sweep_id, spec, runner_id
        self.studies = studies
        self.max_outstanding = 1

    @classmethod
    def begin(cls, store: Store, sweep_id: int, spec: SweepSpec, runner_id: str | None
              ) -> SearchFeed:  # fmt: skip
        from service.search.tpe import Studies

        stored = stored_trials(store, sweep_id)
        self = cls(store, sweep_id, spec, runner_id, None)
        values = {t.id: self.value(t.id) for t in stored if t.status == TrialStatus.COMPLETED}
        self.studies = Studies.rebuild(spec, stored, values)
        log.info(
            "sweep %d: search rebuilt from %d stored trials (%d to ask, %d pending)",
            sweep_id, len(stored), self.studies.owed(), len(self.studies.pending),
        )  # fmt: skip
        return self

    def value(self, tid: int) -> float | None:
        """A stored trial's objective (service.search.tpe.objective_value)."""
        from service.search.tpe import objective_value

        search = self.spec.search
        try:
            epochs, values = self.store.trial_history(tid, search.objective)  # type: ignore[union-attr]
        except (InvalidInput, StorageError) as exc:
            log.warning("trial %d: no objective: %s", tid, exc)
            return None
        return objective_value(epochs, values, search)  # type: ignore[arg-type]

    def next(self) -> TrialInfo | None:
        """A newly asked trial to run, stored; None when the search owes none now (all asked,
        or `max_outstanding` in flight). A reused ask is told at once and another asked.

        Raises:
            StorageError: the write failed (the ask is kept for the next call).
        """
        while self.studies.outstanding < self.max_outstanding and self.studies.owed() > 0:
            asked = self.studies.ask()
            if asked is None:
                return None
            try:
                (t,) = self.store.append_trials(
                    self.sweep_id, [asked.config], runner_id=self.runner_id
                )
            except (StorageError, LeaseLost):
                self.studies.unwrite(asked)
                raise
            self.studies.bind(asked, t.id)
            if t.results_from is None:
                return t
            self.finished(t.id, t.status)  # reused: its outcome is stored already
        return None

    def finished(self, tid: int, status: str) -> None:
        value = self.value(tid) if status == TrialStatus.COMPLETED else None
        self.studies.tell(tid, status, value)

    @property
    def done(self) -> bool:
        return self.studies.owed() == 0


class TrialSource(DriverSide, Searcher):
    """Tune's source of trials (a Searcher; Tune asks `suggest` whenever it has room for one):
    the feed's next trial — or a pack of up to `pack` consecutive trials that share a
    service.packs.pack_key — as its Tune config, until `limit` Tune trials were handed out, the
    feed is drained, the run halts (cancel, stop, lost lease) or its turn is over, and then
    FINISHED (`ended` says why: "drained", "limit", "halted" or "turn"). Nothing to save or
    restore: resumption is from the store."""

    def __init__(
        self,
        feed: TrialFeed | StageFeed,
        *,
        param: Callable[[list[TrialInfo]], dict[str, Any]],
        on_feed: Callable[[TrialInfo], None],
        limit: int,
        control: SweepControl,
        turn: Callable[[], bool],
        pack: int = 1,
        search: SearchFeed | None = None,
    ):
        super().__init__()
        self.feed, self.param, self.on_feed = feed, param, on_feed
        self.limit, self.control, self.turn = limit, control, turn
        self.pack = pack
        self.search = search  # asked once the feed is drained (a tpe search)
        self.handed = 0
        self.ended: str | None = None

    def _members(self, first: TrialInfo) -> list[TrialInfo]:
        """`first` and the next trials of the feed with its pack key, up to `pack` in all."""
        members = [first]
        if self.pack > 1:
            key = pack_key(first.config)
            while len(members) < self.pack:
                t = self.feed.next()
                if t is None:
                    break
                if pack_key(t.config) != key:
                    self.feed.put_back(t)
                    break
                members.append(t)
        return members

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self.ended is None:
            if self.control.halted():
                self.ended = "halted"
            elif self.handed >= self.limit:
                self.ended = "limit"
            elif self.turn():
                self.ended = "turn"
        if self.ended is not None:
            return Searcher.FINISHED
        try:
            t = self.feed.next()
        except StorageError as exc:  # a blip: Tune asks again
            log.warning("sweep %d: cannot read its next trials: %s", self.feed.sweep_id, exc)
            return None
        if t is None and self.search is not None:
            try:
                t = self.search.next()
            except LeaseLost as exc:  # another runner holds the sweep: write nothing more
                log.warning("%s; stopping", exc)
                self.control.lost.set()
                self.ended = "halted"
                return Searcher.FINISHED
            except StorageError as exc:  # a blip: Tune asks again
                log.warning("sweep %d: cannot store an asked trial: %s", self.feed.sweep_id, exc)
                return None
            if t is not None:
                self.handed += 1
                self.on_feed(t)
                return {PARAM_KEY: self.param([t])}
            if not self.search.done:
                return None  # asks wait for outcomes: Tune asks again
        if t is None and isinstance(self.feed, StageFeed) and self.feed.waiting:
            return None  # a synchronous rung waits for its trials: Tune asks again
        if t is None:
            self.ended = "drained"
            return Searcher.FINISHED
        try:
            members = self._members(t)
        except StorageError as exc:  # a blip while reading on: the pack is what was read
            log.warning("sweep %d: cannot read its next trials: %s", self.feed.sweep_id, exc)
            members = [t]
        self.handed += 1
        for m in members:
            self.on_feed(m)
        return {PARAM_KEY: self.param(members)}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        pass  # StoreCallback records the outcome

    def save(self, checkpoint_path: str) -> None:
        pass

    def restore(self, checkpoint_path: str) -> None:
        pass


class RunCallback(StoreCallback):
    """StoreCallback that, once a trial has finished and its records are stored, drops what Tune
    would keep of its last result beyond the scalars (Tune holds each Trial, with its last
    result, until the run ends; the lists are the record's vectors and input Gram)."""

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        super().on_trial_complete(iteration, trials, trial, **info)
        drop_arrays(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        super().on_trial_error(iteration, trials, trial, **info)
        drop_arrays(trial)


def drop_arrays(trial: Any) -> None:
    """A finished Tune trial's last result without its list values (Tune's Trial keeps it in
    `run_metadata.last_result`; setting it also drops the JSON Tune cached of it)."""
    meta = getattr(trial, "run_metadata", None)
    last = getattr(meta, "last_result", None)
    if isinstance(last, dict):
        meta.last_result = {k: v for k, v in last.items() if not isinstance(v, list)}


def trial_param(trials: list[TrialInfo], data_dir: str, board: str | None = None) -> dict[str, Any]:
    """What a Tune trial is given (workers.trainable.run_trial): one trial, or a pack's
    members (and the name of the run's StopBoard, with early stopping) — never a database
    URL."""
    if len(trials) == 1:
        (t,) = trials
        return {"trial_id": t.id, "config": t.config, "data_dir": data_dir}
    members = [{"trial_id": t.id, "config": t.config} for t in trials]
    extra = {} if board is None else {BOARD_KEY: board}
    return {PACK_KEY: members, "data_dir": data_dir, **extra}


def pack_size(spec: SweepSpec, first: TrialInfo | None, trials_left: int) -> int:
    """The spec's `pack`, or when unset `service.packs.auto_pack_size` for the sweep's first
    runnable trial and the trials the cluster runs at once."""
    if spec.pack is not None:
        return spec.pack
    if first is None:
        return 1
    slots = live_trials(spec.resources.cpu, spec.resources.gpu) // LIVE_PER_SLOT
    config = TrialConfig(**first.config)
    return auto_pack_size(config, trials_left=trials_left, slots=slots)


def live_trials(cpu: float, gpu: float) -> int:
    """How many trials Tune holds at once: LIVE_PER_SLOT × the trials the cluster runs at once
    (at least one)."""
    have = ray.cluster_resources()
    fits = [have.get(name, 0.0) / need for name, need in (("CPU", cpu), ("GPU", gpu)) if need > 0]
    slots = max(1, math.floor(min(fits))) if fits else 1
    return LIVE_PER_SLOT * slots


def _tune(
    store: Store,
    sweep: SweepInfo,
    spec: SweepSpec,
    control: SweepControl,
    tracker: RunProgress,
    progress: Callable[[SweepProgress], None] | None,
    runner_id: str,
    turn: Turn,
    search: SearchFeed | None = None,
) -> bool:
    """Run the sweep's runnable trials, CHUNK_TRIALS per Tune run. Returns True when the run
    gave its turn up with trials left (the caller releases the sweep)."""
    data_dir = str(Path(store.settings.data_dir).expanduser().resolve())
    if search is not None:
        search.max_outstanding = live_trials(spec.resources.cpu, spec.resources.gpu)

    def report(p: SweepProgress) -> None:
        if progress is not None:
            progress(p)
        if p.event in ("finish", "hold") and p.trial_id is not None:
            tracker.fold(p.trial_id)

    def stopped(t: TrialInfo) -> None:  # by the synchronous rule, between two stages
        tracker.base_counts[t.status] -= 1  # listed as stopped, then folded by report
        tracker.status[t.id], tracker.expected[t.id] = TrialStatus.STOPPED, 0
        tracker.event, tracker.trial_id = "finish", t.id
        report(tracker)

    stop = spec.early_stop
    feed: TrialFeed | StageFeed = TrialFeed(store, sweep.id)
    if stop is not None and stop.synchronous:
        feed = StageFeed(store, sweep.id, stop, control, runner_id=runner_id, on_stop=stopped)

    left = tracker.counts.get(TrialStatus.QUEUED, 0)
    first = feed.next()
    if first is not None:
        feed.put_back(first)
    pack = 1 if search is not None else pack_size(spec, first, left)  # asks run one by one
    early = board = None
    if stop is not None and not stop.synchronous:
        early = EarlyStopper(spec.early_stop, rebuild_halving(store, sweep.id, spec), {})
        if pack > 1:
            name = f"isosweep-stops-{sweep.id}-{os.getpid()}-{time.time_ns()}"
            board = name
            early.board = ray.remote(StopBoard).options(name=name, num_cpus=0).remote()
    log.info(
        "sweep %d (%s): running %d of %d trials, %s per %s",
        sweep.id, sweep.name, left, sweep.n_trials,
        {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu},
        "trial" if pack == 1 else f"pack of up to {pack}",
    )  # fmt: skip
    try:
        while True:
            if isinstance(feed, StageFeed):
                feed.settle()  # the last Tune run's trials are all back
            ended = _tune_chunk(store, sweep, spec, control, tracker, report, runner_id, feed,
                                turn, data_dir, pack, search=search, early=early,
                                board=board)  # fmt: skip
            more = search is not None and not search.done
            if ended != "limit" or control.halted() or (feed.drained and not more):
                return ended == "turn" and not control.halted()
            if turn():
                return True
    finally:
        if early is not None and early.board is not None:
            with contextlib.suppress(Exception):
                ray.kill(early.board)


def _tune_chunk(
    store: Store,
    sweep: SweepInfo,
    spec: SweepSpec,
    control: SweepControl,
    tracker: RunProgress,
    report: Callable[[SweepProgress], None],
    runner_id: str,
    feed: TrialFeed | StageFeed,
    turn: Turn,
    data_dir: str,
    pack: int = 1,
    *,
    search: SearchFeed | None = None,
    early: EarlyStopper | None = None,
    board: str | None = None,
) -> str | None:
    """One Tune run of up to CHUNK_TRIALS Tune trials (each one trial or a pack of up to `pack`)
    from the feed (then, for a tpe search, from its asks); returns why its source ended."""
    resources = {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu}
    stages = feed if isinstance(feed, StageFeed) else None
    callback = RunCallback(
        store, control, tracker, progress=report, final_epochs={}, runner_id=runner_id,
        early=early, on_finish=None if search is None else search.finished, stages=stages,
    )  # fmt: skip

    def on_feed(t: TrialInfo) -> None:
        tracker.feed(t)
        callback.final_epochs[t.id] = t.config["epochs"]
        if early is not None:
            early.final_epochs[t.id] = t.config["epochs"]

    source = TrialSource(
        feed,
        param=lambda ts: trial_param(ts, data_dir, board),
        on_feed=on_feed,
        limit=CHUNK_TRIALS,
        control=control,
        turn=turn,
        pack=pack,
        search=search,
    )
    storage = tempfile.mkdtemp(prefix=f"isosweep-tune-{sweep.id}-")
    try:
        tuner = tune.Tuner(
            tune.with_resources(run_trial, resources),
            tune_config=tune.TuneConfig(
                search_alg=source,
                num_samples=-1,  # until the source says FINISHED
                max_concurrent_trials=live_trials(spec.resources.cpu, spec.resources.gpu),
                reuse_actors=True,  # a worker imports torch and loads a dataset once, not per trial
                trial_name_creator=trial_name,
                trial_dirname_creator=trial_name,
            ),
            run_config=tune.RunConfig(
                name=f"sweep_{sweep.id}",
                storage_path=storage,
                callbacks=[callback],
                stop=CancelStopper(store, sweep.id, control, early=early, stages=stages),
                failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                verbose=0,
            ),
        )
        with quiet(TUNE_LOGGERS):
            tuner.fit()
        callback.flush()
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return source.ended


def conclude(
    store: Store, sweep_id: int, runner_id: str, control: SweepControl, *, yielded: bool = False
) -> SweepInfo:
    """Finish the sweep from its trials' statuses, unless this runner must leave it alone (or
    it gave its turn up: then it goes back to the queue, unless a cancel came meanwhile)."""
    if control.lost.is_set():
        return store.get_sweep(sweep_id)
    if control.stop.is_set() and not control.cancel.is_set():
        store.release_sweep(sweep_id, runner_id)
        log.info("sweep %d: stopped and released; the next runner resumes it", sweep_id)
        return store.get_sweep(sweep_id)
    if yielded and not store.is_cancel_requested(sweep_id):
        store.release_sweep(sweep_id, runner_id)
        log.info("sweep %d: back in the queue behind the sweep that waited", sweep_id)
        return store.get_sweep(sweep_id)
    try:
        info = store.finish_sweep(sweep_id)
    except Conflict as exc:  # trials Tune never finished: leave them to the next claim
        log.error("sweep %d: %s", sweep_id, exc)
        return store.get_sweep(sweep_id)
    log.info("sweep %d: %s %s", sweep_id, info.status, {k: v for k, v in info.counts.items() if v})
    return info


@contextlib.contextmanager
def quiet(names: tuple[str, ...], level: int = logging.CRITICAL) -> Iterator[None]:
    """Silence loggers for a while (Tune's failure tracebacks and "trials did not complete"
    reports, which StoreCallback records and logs in its own words)."""
    loggers = [logging.getLogger(n) for n in names]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, lvl in zip(loggers, before, strict=True):
            lg.setLevel(lvl)
