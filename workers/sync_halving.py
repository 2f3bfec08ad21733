"""Synchronous successive halving on the driver (`early_stop: {…, synchronous: true}`;
docs/api.md, "Early stopping"; the rule: service/search/halving.py, `plan`).

The sweep runs in stages, one per rung. `StageFeed` is the driver's trial feed for it (in place
of workers.driver.TrialFeed): it hands out, in index order, every unfinished trial the rule has
not stopped, each to run up to its record at the rung waited on (its cap), then waits until all
of them are back; then it reads the stored values again, decides the rung (`plan`), stores its
stops (status `stopped`, the rank as the reason) and hands out the next stage. A trial at its
cap is held: neither finished nor failed, it keeps its records and its status, and the next
stage runs it again from epoch 0 (isosweep keeps no training checkpoints; the same config,
seed and thread count give the same numbers, docs/architecture.md), storing only the epochs
after those already stored. So a rung's values are written once, before it is decided, and a
decision is never made on other numbers, whatever the arrival order, the packs, or a runner
killed and resumed in between (the next runner's plan reads the same stored values).

Nothing is held inside a Ray worker, so the lazy driver's bounds hold: trials go to Tune as it
has room (`max_concurrent_trials`), packs form from consecutive trials with equal caps, and a
stage of any size runs through however few slots the cluster has.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from service.errors import InvalidInput
from service.search.halving import Plan, TrialState, plan
from service.search.models import EarlyStop
from service.status import TrialStatus
from service.store import Store, TrialInfo
from service.store.sweeps import LeaseLost
from workers.callbacks import SweepControl

log = logging.getLogger("isosweep.driver")


def trial_states(
    store: Store, sweep_id: int, rule: EarlyStop
) -> list[tuple[TrialInfo, TrialState]]:
    """Every trial of the sweep (index order) with what the rule reads of it: its stored
    values of the rule's metric, the record of its divergence left out."""
    trials: list[TrialInfo] = []
    while True:
        got, total = store.list_trials(sweep_id, offset=len(trials), limit=1000)
        trials.extend(got)
        if not got or len(trials) >= total:
            break
    values: dict[int, dict[int, float]] = {t.id: {} for t in trials}
    layers = None if rule.layer is None else [rule.layer]
    try:
        frame = store.read_metrics(sweep_id, metrics=[rule.metric], layers=layers, max_points=10**9)
    except InvalidInput:  # nothing recorded of it yet
        frame = None
    if frame is not None:
        if rule.layer is not None:
            frame = frame[frame["layer"] == rule.layer]
        for tid, epoch, value in frame[["trial_id", "epoch", "value"]].itertuples(index=False):
            values[int(tid)][int(epoch)] = float(value)
    out = []
    for t in trials:
        own = values[t.id]
        if t.diverged_epoch is not None:
            own.pop(t.diverged_epoch, None)
        finished = TrialStatus(t.status).is_finished() or t.results_from is not None
        every = int(t.config.get("record_every", 1))
        out.append((t, TrialState(t.id, t.index, t.epochs_total, every, own, finished)))
    return out


class StageFeed:
    """The trials of a synchronous halving sweep, a stage at a time (a TrialFeed for
    workers.driver.TrialSource, which asks again while `waiting`).

    Args:
        control: the run's; a stop refused because another runner holds the sweep sets `lost`.
        runner_id: fences the stops' writes (store.finish_trial).
        on_stop: told each trial the rule stops (as it stood before), once stored.
    """

    def __init__(
        self,
        store: Store,
        sweep_id: int,
        rule: EarlyStop,
        control: SweepControl,
        *,
        runner_id: str | None = None,
        on_stop: Callable[[TrialInfo], None] | None = None,
    ):
        self.store, self.sweep_id, self.rule, self.control = store, sweep_id, rule, control
        self.runner_id, self.on_stop = runner_id, on_stop
        self.queue: deque[TrialInfo] = deque()
        self.in_flight: set[int] = set()  # handed out this stage and not back
        self.caps: dict[int, int] = {}  # trial id → the epoch it runs to in this stage
        self.resume_from: dict[int, int] = {}  # trial id → its last stored epoch (continuing)
        self.rung: int | None = None  # the rung waited on
        self.last_plan: tuple | None = None  # (rung, caps, resume_from) of the stage before
        self.over = False  # every rung decided and every trial handed out

    # --- TrialFeed ------------------------------------------------------------------------

    def next(self) -> TrialInfo | None:
        """The stage's next trial; None while its trials are out (`waiting`) or at the end.

        Raises:
            StorageError: the store failed (nothing changed: ask again).
        """
        if not self.queue and not self.in_flight and not self.over:
            try:
                self._advance()
            except LeaseLost as exc:  # another runner holds the sweep: write nothing more
                log.warning("%s; stopping", exc)
                self.control.lost.set()
        if not self.queue:
            return None
        t = self.queue.popleft()
        self.in_flight.add(t.id)
        return t

    def put_back(self, t: TrialInfo) -> None:
        self.in_flight.discard(t.id)
        self.queue.appendleft(t)

    @property
    def waiting(self) -> bool:
        """Whether trials of the stage are out: the next stage waits for them."""
        return bool(self.in_flight)

    @property
    def drained(self) -> bool:
        return self.over and not self.queue and not self.in_flight

    def ended(self, tid: int) -> None:
        """Trial `tid`'s Tune trial ended (held at its cap, finished, or failed)."""
        self.in_flight.discard(tid)

    def settle(self) -> None:
        """A Tune run ended: none of its trials is out any more."""
        self.in_flight.clear()

    # --- what the driver's callbacks ask --------------------------------------------------

    def continuing(self, tid: int) -> bool:
        """Whether the trial has stored records (start_trial would delete them)."""
        return tid in self.resume_from

    def wanted(self, tid: int, epoch: int) -> bool:
        """Whether a record is stored: after the stored ones, up to the cap."""
        return self.resume_from.get(tid, -1) < epoch <= self.caps.get(tid, math.inf)

    def at_cap(self, result: dict[str, Any], tid: int) -> bool:
        """Whether this result of trial `tid` is at (or past) its cap: its Tune trial stops."""
        epoch = result.get("epoch")
        return epoch is not None and int(epoch) >= self.caps.get(tid, math.inf)

    def held(self, tid: int, last: dict[str, Any] | None, final_epoch: int) -> bool:
        """Whether a trial whose Tune trial ended with record `last` waits for the rung."""
        cap = self.caps.get(tid)
        if cap is None or last is None or last["diverged"]:
            return False
        return last["epoch"] == cap < final_epoch

    # --- stages ---------------------------------------------------------------------------

    def _advance(self) -> None:
        """Read the stored values, store the stops of the rungs decided, queue the next stage."""
        rule = self.rule
        states = trial_states(self.store, self.sweep_id, rule)
        p: Plan = plan([s for _, s in states], rule.mode, rule.grace_epochs, rule.reduction)
        for t, _ in states:
            stop = p.stops.get(t.id)
            if stop is None or TrialStatus(t.status).is_finished() or t.results_from is not None:
                continue
            reason = stop.reason(rule.metric, rule.reduction)
            self.store.finish_trial(t.id, TrialStatus.STOPPED, reason, runner_id=self.runner_id)
            log.info("trial %d stopped: %s", t.id, reason)
            if self.on_stop is not None:
                self.on_stop(t)
        resume_from = {
            t.id: t.last_epoch for t, _ in states if t.id in p.caps and t.last_epoch is not None
        }
        if (p.rung, p.caps, resume_from) == self.last_plan:  # a stage that changed nothing
            log.error("sweep %d: the stage of rung %s made no progress; stopping", self.sweep_id,
                      p.rung)  # fmt: skip
            self.over = True
            return
        self.last_plan = (p.rung, p.caps, resume_from)
        self.rung, self.caps, self.resume_from = p.rung, p.caps, resume_from
        self.queue.extend(t for t, _ in states if t.id in p.caps)
        self.over = p.rung is None
        log.info(
            "sweep %d: %s; %d trials run to it, %d stopped so far",
            self.sweep_id,
            "the last stage" if p.rung is None else f"the rung of epoch {p.rung} waits",
            len(p.caps),
            len(p.stops),
        )
