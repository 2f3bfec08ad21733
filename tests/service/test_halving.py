"""Successive halving (service/search/halving.py) against Ray Tune's own ASHA bracket: the same
result sequences give the same decisions, rung by rung."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest

from service.search.halving import Halving, cutoff, decide, rungs

asha = pytest.importorskip("ray.tune.schedulers.async_hyperband")


def reference(grace: int, reduction: int, epochs: int):
    return asha._Bracket(min_t=grace, max_t=epochs, reduction_factor=reduction, s=0)


@pytest.mark.parametrize(
    ("grace", "reduction", "epochs"),
    [(1, 2, 10), (1, 2, 8), (2, 3, 20), (1, 3, 9), (3, 2, 3), (1, 4, 64), (5, 2, 39)],
)
def test_rungs_are_asha_milestones(grace, reduction, epochs):
    milestones = sorted(m for m, _ in reference(grace, reduction, epochs)._rungs)
    assert rungs(grace, reduction, epochs) == milestones


def test_the_docstring_example_of_asha():
    # ASHA's docstring: rf 2, values 2 then 4 at rung 1 → cutoff 3; 1 stops (mode max)
    assert cutoff([2.0, 4.0], 2) == 3.0
    assert not decide([], 2.0, "max", 2)
    assert not decide([2.0], 4.0, "max", 2)
    assert decide([2.0, 4.0], 1.0, "max", 2)
    # min: the same numbers negated
    assert decide([-2.0, -4.0], -1.0, "min", 2)
    assert not decide([1.0, 2.0, 3.0], 1.5, "min", 2)  # median 2: 1.5 is in the top half


def _sequence(rng: random.Random, n_trials: int, epochs: int, every: int, nan: bool):
    """Interleaved (trial, epoch, value) results as concurrent trials would report them."""
    pending = {t: list(range(every, epochs + 1, every)) for t in range(n_trials)}
    out = []
    while pending:
        t = rng.choice(sorted(pending))
        e = pending[t].pop(0)
        v = rng.gauss(0, 1) + 0.1 * e
        if nan and rng.random() < 0.05:
            v = math.nan
        out.append((t, e, v))
        if not pending[t]:
            del pending[t]
    return out


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize(
    ("grace", "reduction", "epochs", "every"),
    [(1, 2, 8, 1), (1, 3, 12, 1), (2, 2, 16, 2), (1, 2, 10, 3), (2, 4, 32, 1)],
)
@pytest.mark.parametrize("seed", range(4))
def test_decisions_equal_asha(mode, grace, reduction, epochs, every, seed):
    rng = random.Random(seed * 1000 + epochs)
    ours = Halving("m", mode, grace, reduction, epochs)
    ref = reference(grace, reduction, epochs)
    op = 1.0 if mode == "max" else -1.0
    stopped: set[int] = set()
    n_stops = 0
    for t, e, v in _sequence(rng, 12, epochs, every, nan=seed == 3):
        if t in stopped:  # a stopped trial reports nothing more
            continue
        want = ref.on_result(SimpleNamespace(trial_id=t), e, op * v) == "STOP"
        got = ours.observe(t, e, v)
        assert (got is not None and got.stop) == want, (t, e, v)
        if want:
            stopped.add(t)
            n_stops += 1
    for milestone, recorded in ref._rungs:
        mine = ours.recorded[int(milestone)]
        assert mine.keys() == recorded.keys()
        np.testing.assert_array_equal([op * mine[k] for k in recorded], list(recorded.values()))
    assert n_stops > 0


def test_judgement_reason_names_rung_and_cutoff():
    h = Halving("test_loss", "min", 1, 2, 4)
    assert h.observe(0, 0, 5.0) is None  # epoch 0: before the first rung
    assert not h.observe(0, 1, 1.0).stop
    j = h.observe(1, 1, 3.0)
    assert j.stop and j.rung == 1 and j.cutoff == 1.0 and j.n_before == 1
    assert "epoch 1" in j.reason("test_loss", "min", 2) and "1/2" in j.reason("test_loss", "min", 2)
    assert h.observe(1, 1, 3.0) is None  # judged there already
