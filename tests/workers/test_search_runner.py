"""Adaptive search and early stopping through the real runner (Ray Tune, the store): successive
halving stops exactly the trials its rule stops on the stored records (packed members and
trials alone), and a TPE search killed mid-run resumes from the stored trials (docs/api.md,
"Adaptive search", "Early stopping")."""

from __future__ import annotations

import pytest
from expected_rows import row_keys
from resume_support import assert_resumed_exactly, kill_and_resume
from support import TINY

from service.search.halving import Halving
from service.spec import parse_spec
from service.store import Store
from workers.driver import run_sweep

RUNNER = "host:1"
LRS = [0.1, 1e-4, 0.03, 3e-4, 0.3, 1e-3, 0.01, 3e-3]  # good and bad ones interleaved
EARLY = {"kind": "successive_halving", "metric": "test_loss", "grace_epochs": 1, "reduction": 2}


def halving_spec(name: str, **top) -> dict:
    return {
        "name": name,
        "parameters": {**TINY, "depth": 2, "epochs": 4, "lr": LRS},
        "early_stop": EARLY,
        **top,
    }


def rule_on_records(store: Store, sweep_id: int, order: str) -> tuple[set[int], dict[int, int]]:
    """The trials the rule stops, replayed on the stored test_loss records in the order the
    driver saw them: `epoch` (a pack: every member's record of an epoch, in trial order, then
    the next epoch) or `trial` (one trial at a time, in index order). Returns the stopped set
    and each stopped trial's rung."""
    frame = store.read_metrics(sweep_id, metrics=["test_loss"])
    frame = frame[frame["epoch"] > 0]
    keys = ["epoch", "trial_id"] if order == "epoch" else ["trial_id", "epoch"]
    frame = frame.sort_values(keys)
    h = Halving("test_loss", "min", 1, 2, 4)
    stopped: dict[int, int] = {}
    for tid, epoch, value in frame[["trial_id", "epoch", "value"]].itertuples(index=False):
        if tid in stopped:
            continue
        j = h.observe(int(tid), int(epoch), float(value))
        if j is not None and j.stop and epoch < 4:
            stopped[int(tid)] = j.rung
    return set(stopped), stopped


def check_stopped(store: Store, sweep_id: int, order: str) -> set[int]:
    trials, _ = store.list_trials(sweep_id)
    got = {t.id for t in trials if t.status == "stopped"}
    want, rung = rule_on_records(store, sweep_id, order)
    assert got == want
    assert 0 < len(got) < len(trials)
    for t in trials:
        if t.id in got:  # its records end at its rung; why is stored
            assert t.last_epoch == rung[t.id]
            assert t.error.startswith(f"successive halving: at the rung of epoch {rung[t.id]}")
        else:
            assert t.status == "completed" and t.last_epoch == 4
    keys = row_keys(store.read_metrics(sweep_id))
    assert len(keys) == len(set(keys))
    return got


@pytest.mark.ray
@pytest.mark.slow
def test_halving_stops_packed_members_as_the_rule_says(sqlite_url, ray_local):
    """8 trials in one pack: a member stops at its rung, the pack goes on."""
    with Store(sqlite_url) as store:
        sweep = store.create_sweep(parse_spec(halving_spec("halving-packed", pack=8)))
        store.claim_sweep(RUNNER, 60, sweep_id=sweep.id)
        info = run_sweep(store, sweep.id, runner_id=RUNNER)
        assert info.status == "completed"
        assert info.counts["stopped"] > 0
        check_stopped(store, sweep.id, "epoch")


@pytest.mark.ray
@pytest.mark.slow
def test_halving_stops_trials_alone_as_the_rule_says(sqlite_url, ray_local):
    """8 trials alone, one at a time (2 CPUs each): Tune stops them (CancelStopper)."""
    body = halving_spec("halving-alone", pack=1, resources={"cpu": 2})
    with Store(sqlite_url) as store:
        sweep = store.create_sweep(parse_spec(body))
        store.claim_sweep(RUNNER, 60, sweep_id=sweep.id)
        info = run_sweep(store, sweep.id, runner_id=RUNNER)
        assert info.status == "completed"
        check_stopped(store, sweep.id, "trial")


@pytest.mark.ray
@pytest.mark.slow
def test_tpe_search_killed_mid_run_resumes_from_the_stored_trials(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    n = 8
    spec = {
        "name": "tpe-resume",
        "parameters": {**TINY, "depth": 2, "epochs": 3, "lr": {"loguniform": [1e-3, 0.5]}},
        "search": {"kind": "tpe", "n": n, "objective": "test_loss", "seed": 3},
    }
    sweep = store.create_sweep(parse_spec(spec))
    assert sweep.n_trials == n and sweep.counts["queued"] == n

    def some_but_not_all():
        trials, _ = store.list_trials(sweep.id)
        done = sum(t.status == "completed" for t in trials)
        return 2 <= done < n - 1

    resumed = kill_and_resume(
        store, sweep.id, tmp_path, some_but_not_all, "some trials to complete"
    )
    before, after = resumed.before, resumed.after
    assert len(before) < n or len(resumed.completed) < n
    log = resumed.log
    assert f"search rebuilt from {len(before)} stored trials" in log, log[-3000:]
    assert len(after) == n  # no trial lost, none asked twice
    assert sorted(t.index for t in after.values()) == list(range(n))
    # the told trials were not run again
    assert_resumed_exactly(store, sweep.id, resumed, same=("attempts", "finished_at"))
    assert all(1e-3 <= t.config["lr"] <= 0.5 for t in after.values())
    store.close()
