"""Successive halving (service/search/halving.py): the asynchronous rule against Ray Tune's own
ASHA bracket (the same result sequences give the same decisions, rung by rung), and the
synchronous rule's plan (ties, NaN, infinities, diverged and stopped members, a rung nobody
reaches, records every k epochs, independence of the order), and the spec's `synchronous`."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest

from service.errors import InvalidInput
from service.search.halving import Halving, TrialState, cutoff, decide, kept, plan, rungs
from service.spec import parse_spec

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


# --- the synchronous rule (service/search/halving.py, `plan`) ----------------------------------


def state(tid, values=None, *, finished=False, epochs=4, every=1, index=None):
    return TrialState(tid, tid if index is None else index, epochs, every, values or {}, finished)


@pytest.mark.parametrize("reduction", [2, 3, 4, 5])
def test_kept_is_what_the_asynchronous_cutoff_keeps_of_a_whole_rung(reduction):
    # The (1 − 1/R)-quantile of n distinct values sits at rank position (n−1)(R−1)/R (from 0);
    # the values at or above it number n − ⌈(n−1)(R−1)/R⌉ = ⌈n/R⌉. Where that position is not
    # an integer the float quantile cannot round across a value, and `cutoff` agrees.
    rng = np.random.default_rng(reduction)
    for n in range(1, 41):
        above = n - -(-(n - 1) * (reduction - 1) // reduction)
        assert above == kept(n, reduction) == math.ceil(n / reduction)
        if (n - 1) * (reduction - 1) % reduction:
            values = rng.permutation(n).astype(float)
            assert int((values >= cutoff(values.tolist(), reduction)).sum()) == above


def test_nothing_stored_waits_for_the_first_rung():
    p = plan([state(0), state(1), state(2)], "min", 1, 2)
    assert (p.rung, p.caps, p.stops) == (1, {0: 1, 1: 1, 2: 1}, {})


def test_a_rung_ranks_its_values_and_nan_goes_on():
    trials = [state(i, {0: 9.0, 1: v}) for i, v in enumerate([5.0, 3.0, math.nan, 1.0, 4.0, 2.0])]
    p = plan(trials, "min", 1, 2)
    assert set(p.stops) == {0, 4}  # n = 5 ranked (NaN is not), ⌈5/2⌉ = 3 go on: 1, 2, 3
    assert p.rung == 2 and p.caps == {1: 2, 2: 2, 3: 2, 5: 2}
    s = p.stops[4]
    assert (s.rung, s.epoch, s.value, s.rank, s.ranked, s.cutoff) == (1, 1, 4.0, 4, 5, 3.0)
    assert s.reason("test_loss", 2) == (
        "successive halving (synchronous): at the rung of epoch 1, test_loss = 4 (epoch 1) "
        "ranks 4 of 5; the top 3 (1/2, up to 3) go on"
    )
    # mode max: the same values, the other end
    assert set(plan(trials, "max", 1, 2).stops) == {3, 5}


def test_ties_go_to_the_lower_index():
    trials = [state(i, {1: 1.0}, index=10 - i) for i in range(4)]  # indices 10, 9, 8, 7
    assert set(plan(trials, "min", 1, 2).stops) == {0, 1}  # the two highest indices


def test_infinities_rank_at_their_ends():
    trials = [state(0, {1: math.inf}), state(1, {1: -math.inf}), state(2, {1: 0.0})]
    assert set(plan(trials, "min", 1, 2).stops) == {0}  # ⌈3/2⌉ = 2 go on: −∞ and 0


def test_a_rung_waits_for_every_trial_that_can_reach_it():
    trials = [state(0, {1: 1.0}), state(1, {1: 2.0}), state(2, {0: 0.5})]  # 2 is not there yet
    p = plan(trials, "min", 1, 2)
    assert (p.rung, p.stops, p.caps) == (1, {}, {2: 1})  # 0 and 1 wait at their caps


def test_diverged_failed_and_stopped_members_are_not_waited_for():
    trials = [
        state(0, {1: 1.0, 2: 1.0}),
        state(1, {1: 2.0, 2: 3.0}),
        state(2, {1: 5.0}, finished=True),  # stopped at rung 1 (the rule says so again)
        state(3, {}, finished=True),  # diverged at epoch 1: its record is not a value
        state(4, {1: 4.0}, finished=True),  # failed after rung 1, before rung 2
    ]
    p = plan(trials, "min", 1, 2)
    assert p.stops[2].ranked == 4  # 3 has no value at rung 1: 0, 1 go on; 2, 4 stop there
    assert {t: s.rung for t, s in p.stops.items()} == {2: 1, 4: 1, 1: 2}  # rung 2: 0 beats 1
    assert p.rung == 4 and p.caps == {0: 4}


def test_a_rung_nobody_reaches_is_decided_empty():
    # rung 4: its one candidate diverged at epoch 3, and a 2-epoch trial never reaches it
    trials = [
        state(0, {1: 1.0, 2: 1.0}, finished=True),  # diverged at epoch 3
        state(1, {1: 2.0, 2: 2.0}),
        state(2, {1: 3.0}),
        state(3, {1: 4.0}),
        state(4, {1: 0.5, 2: 0.5}, epochs=2, finished=True),  # completed
    ]
    p = plan(trials, "min", 1, 2)
    assert {t: s.rung for t, s in p.stops.items()} == {2: 1, 3: 1, 1: 2}
    assert p.rung is None and p.caps == {}


def test_a_stop_at_the_last_epoch_is_moot():
    trials = [state(0, {1: 1.0}, epochs=1), state(1, {1: 2.0}, epochs=1), state(2, {1: 0.0})]
    p = plan(trials, "min", 1, 2)
    assert p.stops == {} and p.rung == 2 and p.caps == {2: 2}  # 1 ranks last but completes


def test_records_every_k_epochs_are_judged_where_they_fall():
    # recording every 2 epochs: the first record at or past rung 1 is epoch 2, judged at rung 2
    trials = [state(i, {0: 0.0}, every=2) for i in range(3)]
    p = plan(trials, "min", 1, 2)
    assert (p.rung, p.caps) == (2, {0: 2, 1: 2, 2: 2})
    done = [state(i, {0: 0.0, 2: float(i)}, every=2) for i in range(3)]
    p = plan(done, "min", 1, 2)
    assert set(p.stops) == {2} and p.stops[2].rung == 2 and p.rung == 4


@pytest.mark.parametrize("seed", range(5))
def test_the_plan_is_a_function_of_the_values_not_of_their_order(seed):
    rng = random.Random(seed)
    trials = [
        state(i, {e: rng.choice([0.5, 1.0, 2.0, math.nan]) for e in range(0, 3)}, index=i)
        for i in range(12)
    ]
    want = plan(trials, "min", 1, 2)
    assert want.stops and want.rung == 4
    for _ in range(5):
        rng.shuffle(trials)
        got = plan(trials, "min", 1, 2)
        assert (got.stops, got.rung, got.caps) == (want.stops, want.rung, want.caps)


# --- the spec's `synchronous` -------------------------------------------------------------------


def halving_body(**stop) -> dict:
    return {
        "name": "s",
        "parameters": {"depth": 2, "width": 8, "epochs": 2, "lr": [0.1, 0.01]},
        "early_stop": {"kind": "successive_halving", "metric": "test_loss", **stop},
    }


def test_synchronous_is_false_unless_asked():
    assert parse_spec(halving_body()).early_stop.synchronous is False
    assert parse_spec(halving_body(synchronous=True)).early_stop.synchronous is True


@pytest.mark.parametrize("value", ["true", 1, None])
def test_synchronous_is_a_boolean_named_when_refused(value):
    with pytest.raises(InvalidInput) as info:
        parse_spec(halving_body(synchronous=value))
    assert info.value.field == "early_stop.synchronous"


def test_synchronous_halving_is_refused_with_a_tpe_search():
    body = halving_body(synchronous=True)
    body["parameters"]["lr"] = {"loguniform": [1e-3, 1e-1]}
    body["search"] = {"kind": "tpe", "n": 4, "objective": "test_loss"}
    with pytest.raises(InvalidInput, match="tpe search asks its trials") as info:
        parse_spec(body)
    assert info.value.field == "early_stop.synchronous"
    del body["early_stop"]["synchronous"]  # the asynchronous rule goes with TPE
    assert parse_spec(body).early_stop.synchronous is False
