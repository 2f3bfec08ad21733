"""Asynchronous successive halving (ASHA), the rule of a spec's `early_stop:
{kind: successive_halving, metric, mode, grace_epochs: G, reduction: R}` (docs/api.md, "Early
stopping").

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

Pure: no torch, no store. `Halving` holds the rungs' recorded values; `decide` is the rule at
one rung.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
