"""Search and early stopping as the store and the REST API show them: `stopped` trials (their
rung and reason, not reused by config hash), a tpe sweep's planned trials and appended asks, and
the sweep's best trial so far (docs/api.md, "Adaptive search", "Early stopping")."""

from __future__ import annotations

import pytest

from service.config import TrialConfig
from service.errors import Conflict
from service.spec import parse_spec
from service.status import TrialStatus

TINY = {"depth": 2, "width": 8, "dataset": "digits", "batch_size": 32}
REASON = "successive halving: at the rung of epoch 1, test_loss = 3 (epoch 1) is above …"


def run(store, sweep_id, losses: dict[int, list[float]], stop: set[int]):
    store.claim_sweep("r", 60, sweep_id=sweep_id)
    trials = store.runnable_trials(sweep_id)
    for i, t in enumerate(trials):
        store.start_trial(t.id, runner_id="r")
        recs = [{"epoch": e, "diverged": False, "test_loss": v} for e, v in enumerate(losses[i])]
        store.write_records([(t.id, r) for r in recs], runner_id="r")
        if i in stop:
            store.finish_trial(t.id, TrialStatus.STOPPED, REASON, runner_id="r")
        else:
            store.finish_trial(t.id, TrialStatus.COMPLETED, runner_id="r")
    return trials


def test_stopped_trials_and_the_best_one_over_rest(api):
    spec = parse_spec(
        {
            "name": "halving",
            "parameters": {**TINY, "epochs": 2, "lr": [0.1, 0.01, 0.001]},
            "early_stop": {"kind": "successive_halving", "metric": "test_loss"},
        }
    )
    sweep = api.store.create_sweep(spec)
    losses = {0: [3.0, 2.0, 1.5], 1: [3.0, 2.5], 2: [3.0, 2.2, 1.2]}
    trials = run(api.store, sweep.id, losses, stop={1})
    api.store.finish_sweep(sweep.id)
    got = api.get(f"/sweeps/{sweep.id}").json()
    assert got["status"] == "completed"
    assert got["counts"]["stopped"] == 1 and got["counts"]["completed"] == 2
    assert got["best"] == {
        "trial_id": trials[2].id,
        "value": 1.2,
        "epoch": 2,
        "metric": "test_loss",
        "mode": "min",
    }
    page = api.get(f"/sweeps/{sweep.id}/trials", params={"status": "stopped"}).json()
    (t,) = page["data"]
    assert t["id"] == trials[1].id and t["error"] == REASON and t["last_epoch"] == 1
    # a stopped trial is no result to reuse: the same config runs again in a new sweep
    again = api.store.create_sweep(
        parse_spec({"name": "again", "parameters": {**TINY, "epochs": 2, "lr": 0.01}})
    )
    assert again.counts["queued"] == 1 and again.status == "queued"
    assert api.get(f"/sweeps/{again.id}").json()["best"] is None  # no objective
    # and a stopped trial does not start again
    with pytest.raises(Conflict):
        api.store.start_trial(trials[1].id)


def test_a_tpe_sweep_plans_its_trials_and_appends_asks(api):
    spec = parse_spec(
        {
            "name": "tpe",
            "parameters": {**TINY, "epochs": 1, "lr": {"loguniform": [1e-3, 1.0]}, "depth": [2, 3]},
            "search": {"kind": "tpe", "n": 3, "objective": "test_loss"},
        }
    )
    sweep = api.store.create_sweep(spec)
    assert sweep.n_trials == 6 and sweep.counts["queued"] == 6 and sweep.status == "queued"
    assert api.store.list_trials(sweep.id)[1] == 0
    api.store.claim_sweep("r", 60, sweep_id=sweep.id)
    a = TrialConfig(**{**TINY, "epochs": 1, "lr": 0.01, "depth": 2})
    b = TrialConfig(**{**TINY, "epochs": 1, "lr": 0.02, "depth": 3})
    first = api.store.append_trials(sweep.id, [a], runner_id="r")
    second = api.store.append_trials(sweep.id, [b, a], runner_id="r")
    assert [t.index for t in first + second] == [0, 1, 2]
    info = api.get(f"/sweeps/{sweep.id}").json()
    assert info["n_trials"] == 6 and info["counts"]["queued"] == 6
    assert len(api.store.runnable_trials(sweep.id)) == 3


def test_appended_asks_reuse_stored_results(api):
    plain = api.store.create_sweep(
        parse_spec({"name": "p", "parameters": {**TINY, "epochs": 1, "lr": 0.01}})
    )
    run(api.store, plain.id, {0: [2.0, 1.0]}, stop=set())
    spec = parse_spec(
        {
            "name": "tpe",
            "parameters": {**TINY, "epochs": 1, "lr": {"loguniform": [1e-3, 1.0]}},
            "search": {"kind": "tpe", "n": 2, "objective": "test_loss"},
        }
    )
    sweep = api.store.create_sweep(spec)
    api.store.claim_sweep("r", 60, sweep_id=sweep.id)
    (t,) = api.store.append_trials(
        sweep.id, [TrialConfig(**{**TINY, "epochs": 1, "lr": 0.01})], runner_id="r"
    )
    assert t.status == "completed" and t.results_from is not None
