"""Successive halving, the rule of a spec's `early_stop: {kind: successive_halving, metric,
mode, grace_epochs: G, reduction: R, synchronous}` (docs/api.md, "Early stopping"): the
asynchronous rule (ASHA, the default: `Halving`) and the synchronous one (`plan`).

Rungs sit at epochs G, G·R, G·R², … up to the trial's last epoch. The first record of a trial
at or past a rung's epoch that the trial has not been judged at yet is judged there (the
highest such rung; a record past several rungs is judged at the highest only): with the values
recorded at that rung so far (every earlier trial that reached it, in the order they arrived),
the cutoff is their (1 − 1/R)-quantile (linear interpolation, NaN ignored) of the values
oriented so that larger is better (−value for mode min), and the trial stops when its oriented
value is below the cutoff, i.e. outside the top 1/R. The first trial at a rung always goes on.
Its value is then recorded at the rung whatever the decision. This is the rule of Ray Tune's
AsyncHyperBandScheduler (one bracket, stop_last_trials): tests/service/test_halving.py checks
it decision by decision against Tune's own implementation on the same sequences.

The synchronous rule (`synchronous: true`) decides a rung once: when every trial that can
reach it has its record there (or ended before it: diverged, failed, cancelled, stopped at an
earlier rung). Of the n members with a non-NaN value, the top ⌈n/R⌉ go on (best first by the
oriented value, ties to the lower trial index) and the rest stop — what the asynchronous cutoff
keeps when every value of the rung is before it (`kept` is that count, tested as an identity).
A NaN value is not ranked and goes on, as above; a stop at a trial's last epoch is moot. The
set of stopped trials is a function of the stored values alone: `plan` computes it from them,
with the rung still waited on and the epoch each unfinished trial runs to meanwhile.

Pure: no torch, no store. `Halving` holds the rungs' recorded values; `decide` is the
asynchronous rule at one rung, `rank_rung` the synchronous one, `plan` the synchronous run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Mode = Literal["min", "max"]


def rungs(grace_epochs: int, reduction: int, epochs: int) -> list[int]:
    """The rung epochs G·R^k ≤ epochs, ascending (integers, computed exactly)."""
    out, r = [], grace_epochs
    while r <= epochs:
        out.append(r)
        r *= reduction
    return out


def oriented(value: float, mode: Mode) -> float:
    """The value with larger = better."""
    return -value if mode == "min" else value


def cutoff(recorded: Sequence[float], reduction: float) -> float | None:
    """The (1 − 1/R)-quantile of the oriented values recorded at a rung (NaN ignored; None when
    nothing is recorded, NaN when only NaN is)."""
    if not recorded:
        return None
    values = np.asarray(recorded, dtype=np.float64)
    if np.isnan(values).all():
        return math.nan
    return float(np.nanpercentile(values, (1 - 1 / reduction) * 100))


def decide(rung_values: Sequence[float], value: float, mode: Mode, reduction: float) -> bool:
    """Whether a trial whose metric is `value` at a rung stops there, given the raw metric values
    `rung_values` recorded at that rung before it: True when its oriented value is below the
    cutoff of theirs (outside the top 1/R). A NaN value, or a NaN cutoff, never stops."""
    c = cutoff([oriented(v, mode) for v in rung_values], reduction)
    return c is not None and oriented(value, mode) < c


@dataclass
class Judgement:
    """One trial judged at one rung."""

    trial: int
    rung: int  # the rung's epoch
    epoch: int  # the epoch of the record judged
    value: float
    cutoff: float | None  # in the metric's own orientation (not negated)
    n_before: int  # values recorded at the rung before this one
    stop: bool

    def reason(self, metric: str, mode: Mode, reduction: int) -> str:
        """The text stored with a stopped trial."""
        side = "above" if mode == "min" else "below"
        return (
            f"successive halving: at the rung of epoch {self.rung}, {metric} = {self.value:.6g} "
            f"(epoch {self.epoch}) is {side} the cutoff {self.cutoff:.6g} of the "
            f"{self.n_before} trials before it (outside the top 1/{reduction})"
        )


@dataclass
class Halving:
    """The rungs' recorded values of one sweep, and the decisions (`observe`)."""

    metric: str
    mode: Mode
    grace_epochs: int
    reduction: int
    epochs: int
    recorded: dict[int, dict[int, float]] = field(default_factory=dict)  # rung → trial → value

    def __post_init__(self) -> None:
        for r in rungs(self.grace_epochs, self.reduction, self.epochs):
            self.recorded.setdefault(r, {})

    def observe(self, trial: int, epoch: int, value: float) -> Judgement | None:
        """Judge trial `trial`'s record of `epoch` (None when it is judged at no rung: before
        the first, or at a rung it was judged at already) and record its value there."""
        for r in sorted(self.recorded, reverse=True):
            seen = self.recorded[r]
            if epoch < r or trial in seen:
                continue
            before = list(seen.values())
            stop = decide(before, value, self.mode, self.reduction)
            c = cutoff([oriented(v, self.mode) for v in before], self.reduction)
            self.recorded[r][trial] = value
            shown = None if c is None else oriented(c, self.mode)
            return Judgement(trial, r, epoch, value, shown, len(before), stop)
        return None


# --- the synchronous rule ------------------------------------------------------------------------


def kept(n: int, reduction: int) -> int:
    """How many of n ranked values go on at a rung: ⌈n/R⌉."""
    return -(-n // reduction)


def first_record(epoch: int, epochs: int, record_every: int) -> int:
    """The first epoch ≥ `epoch` that a trial of `epochs` epochs recording every `record_every`
    records (its last epoch is always recorded)."""
    return min(epochs, -(-epoch // record_every) * record_every)


@dataclass(frozen=True)
class TrialState:
    """What the synchronous rule reads of one trial (from the store)."""

    trial: int  # id
    index: int  # its place in the sweep: ties go to the lower
    epochs: int
    record_every: int
    values: Mapping[int, float]  # epoch → the metric of each stored record (not a diverged one)
    finished: bool  # it records nothing more (completed, diverged, failed, stopped, reused …)


@dataclass(frozen=True)
class RungStop:
    """A trial the synchronous rule stops at a rung."""

    trial: int
    rung: int
    epoch: int  # of the record judged
    value: float
    rank: int  # 1 = the best of the rung
    ranked: int  # n: the rung's members with a value (NaN not ranked)
    cutoff: float  # the value of the last trial that goes on

    def reason(self, metric: str, reduction: int) -> str:
        """The text stored with the stopped trial."""
        return (
            f"successive halving (synchronous): at the rung of epoch {self.rung}, {metric} = "
            f"{self.value:.6g} (epoch {self.epoch}) ranks {self.rank} of {self.ranked}; the top "
            f"{kept(self.ranked, reduction)} (1/{reduction}, up to {self.cutoff:.6g}) go on"
        )


def rank_rung(
    members: Sequence[tuple[TrialState, int, float]], rung: int, mode: Mode, reduction: int
) -> list[RungStop]:
    """The stops of one rung: `members` are (trial, epoch judged, value); of those with a
    non-NaN value, all but the top ⌈n/R⌉ (ties to the lower index)."""
    ranked = sorted(
        (m for m in members if not math.isnan(m[2])),
        key=lambda m: (-oriented(m[2], mode), m[0].index),
    )
    keep = kept(len(ranked), reduction)
    if keep == len(ranked):
        return []
    last = ranked[keep - 1][2]
    return [
        RungStop(s.trial, rung, e, v, i + 1, len(ranked), last)
        for i, (s, e, v) in enumerate(ranked)
        if i >= keep
    ]


@dataclass
class Plan:
    """Where a synchronous run stands: every stop of the rungs decided so far (moot stops at a
    trial's last epoch left out), the rung waited on (None once all are decided), and the
    epoch each unfinished trial still short of it runs to now."""

    stops: dict[int, RungStop]
    rung: int | None
    caps: dict[int, int]


def plan(trials: Sequence[TrialState], mode: Mode, grace_epochs: int, reduction: int) -> Plan:
    """The synchronous rule on the trials' stored values: the rungs decided in order, until one
    still waits for a trial that can reach it."""
    top = max((t.epochs for t in trials), default=0)
    ladder = rungs(grace_epochs, reduction, top)
    alive = {t.trial: t for t in trials}  # not stopped by the rule
    stops: dict[int, RungStop] = {}
    for k, r in enumerate(ladder):
        after = ladder[k + 1] if k + 1 < len(ladder) else math.inf
        members, waiting = [], False
        for t in alive.values():
            e = first_record(r, t.epochs, t.record_every)
            if t.epochs < r or e >= after:  # never reaches it, or judged at a later rung
                continue
            if e in t.values:
                members.append((t, e, t.values[e]))
            elif not t.finished:
                waiting = True
        if waiting:
            caps = {t.trial: first_record(r, t.epochs, t.record_every) for t in alive.values()}
            return Plan(stops, r, _short(alive, caps))
        for stop in rank_rung(members, r, mode, reduction):
            if stop.epoch < alive.pop(stop.trial).epochs:  # at its last epoch: it completed
                stops[stop.trial] = stop
    return Plan(stops, None, _short(alive, {t.trial: t.epochs for t in alive.values()}))


def _short(alive: dict[int, TrialState], caps: dict[int, int]) -> dict[int, int]:
    """The caps of the unfinished trials whose records do not reach them yet."""
    return {
        i: c
        for i, c in caps.items()
        if not alive[i].finished and max(alive[i].values, default=-1) < c
    }
