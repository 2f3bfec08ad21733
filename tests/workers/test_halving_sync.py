"""Synchronous successive halving through the real runner (Ray Tune, the store; docs/api.md,
"Early stopping"): two runs of one spec stop the same trials and store the same rows, the
trials stopped are those a plain re-statement of the rule picks from the stored values, and a
runner that loses the sweep after a rung, or is SIGKILLed mid-sweep, is resumed to the statuses
of an uninterrupted run."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from expected_rows import row_keys
from resume_support import kill_and_resume, wait_until

from service.spec import parse_spec
from service.store import Store
from workers.callbacks import Heartbeat, SweepControl
from workers.driver import run_sweep
from workers.runner import log_progress

RUNNER = "host:1"
LRS = [0.3, 1e-3, 0.05, 3e-3, 0.1, 0.01]  # good and bad ones interleaved; × 2 seeds
SYNC = {
    "kind": "successive_halving",
    "metric": "test_loss",
    "grace_epochs": 1,
    "reduction": 2,
    "synchronous": True,
}
TINY = {"dataset": "digits", "depth": 2, "width": 8, "batch_size": 32, "norm": "batch"}


def sync_spec(name: str, **top) -> dict:
    """12 trials of 4 epochs: rungs at epochs 1, 2 (and 4, the last: moot)."""
    return {
        "name": name,
        "parameters": {**TINY, "epochs": 4, "lr": LRS},
        "seeds": 2,
        "early_stop": SYNC,
        **top,
    }


def run_once(url: str, body: dict) -> tuple[list, pd.DataFrame]:
    with Store(url) as store:
        sweep = store.create_sweep(parse_spec(body))
        store.claim_sweep(RUNNER, 60, sweep_id=sweep.id)
        info = run_sweep(store, sweep.id, runner_id=RUNNER, progress=log_progress)
        assert info.status == "completed"
        trials, _ = store.list_trials(sweep.id)
        return trials, store.read_metrics(sweep.id)


def rule_on_rows(trials, frame: pd.DataFrame, epochs: int = 4) -> dict[int, int]:
    """The synchronous rule restated on the stored rows: at rungs 1, 2, 4 the trials still in
    with a test_loss there are ranked (lower first, ties to the lower index) and all but the top
    ⌈n/2⌉ stop (at the last epoch, a stop is moot). Returns trial id → its rung."""
    loss = frame[frame["metric"] == "test_loss"].set_index(["trial_id", "epoch"])["value"]
    index = {t.id: t.index for t in trials}
    alive, stopped, rung = set(index), {}, 1
    while rung <= epochs:
        ranked = sorted(
            (loss[(tid, rung)], index[tid], tid) for tid in alive if (tid, rung) in loss.index
        )
        for _, _, tid in ranked[math.ceil(len(ranked) / 2) :]:
            alive.discard(tid)
            if rung < epochs:
                stopped[tid] = rung
        rung *= 2
    return stopped


def check_statuses(trials, frame: pd.DataFrame) -> dict[int, int]:
    """Every trial completed, or stopped at its rung as the restated rule says; its rows are
    its recorded epochs up to there, each once."""
    stopped = rule_on_rows(trials, frame)
    assert 0 < len(stopped) < len(trials)
    for t in trials:
        if t.id in stopped:
            assert (t.status, t.last_epoch) == ("stopped", stopped[t.id]), t
            assert t.error.startswith(
                f"successive halving (synchronous): at the rung of epoch {stopped[t.id]}, "
            )
        else:
            assert (t.status, t.last_epoch) == ("completed", 4), t
    keys = row_keys(frame)
    assert len(keys) == len(set(keys))
    loss = frame[frame["metric"] == "test_loss"].groupby("trial_id")["epoch"].apply(list)
    assert {t.id: list(range(t.last_epoch + 1)) for t in trials} == loss.to_dict()
    per_epoch = frame.groupby(["trial_id", "epoch"]).size()  # every record whole
    assert per_epoch.nunique() == 1
    return stopped


SPEC = sync_spec("sync", pack=4)  # packs of 4 on 2 CPUs: two packs at a time


def statuses(trials) -> dict[int, tuple]:
    return {t.index: (t.status, t.last_epoch, t.error) for t in trials}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, ray_local):
    """One uninterrupted run of SPEC: its trials and rows."""
    url = f"sqlite:///{tmp_path_factory.mktemp('sync') / 'db.sqlite'}"
    trials, frame = run_once(url, SPEC)
    stopped = check_statuses(trials, frame)
    assert set(stopped.values()) == {1, 2}  # both rungs stop some: 12 → 6 → 3
    return trials, frame


@pytest.mark.ray
@pytest.mark.slow
def test_two_runs_stop_the_same_trials_and_store_the_same_rows(tmp_path, uninterrupted):
    """The survivors of a rung are packed anew and trained again from epoch 0; only the epochs
    after the stored ones are written."""
    a_trials, a_rows = uninterrupted
    b_trials, b_rows = run_once(f"sqlite:///{tmp_path / 'b.db'}", SPEC)
    check_statuses(b_trials, b_rows)
    assert statuses(a_trials) == statuses(b_trials)
    assert [t.attempts for t in b_trials] == [1] * len(b_trials)  # held, not restarted

    # the same configs, seeds, thread counts and packs: the same numbers, bit for bit (but the
    # wall-clock epoch_time_s)
    def measured(rows):
        return rows[rows["metric"] != "epoch_time_s"].reset_index(drop=True)

    assert len(measured(a_rows)) > 1000
    pd.testing.assert_frame_equal(measured(a_rows), measured(b_rows), check_exact=True)


@pytest.mark.ray
@pytest.mark.slow
def test_a_runner_lost_after_a_rung_resumes_to_the_same_statuses(sqlite_url, uninterrupted):
    """The first runner loses the sweep (as a dead one: it writes nothing more) at its first
    record after rung 1 was decided; a second runner takes the sweep once the lease has run
    out. The stops stored stay, and the run ends as the uninterrupted one."""
    store = Store(sqlite_url)
    sweep = store.create_sweep(parse_spec(SPEC))
    assert store.claim_sweep(RUNNER, 2, sweep_id=sweep.id) is not None
    control = SweepControl()
    seen: dict[str, int] = {}

    def lose_after_the_rung(p):
        if p.event == "record" and p.counts.get("stopped", 0) and not control.lost.is_set():
            seen.update(p.counts)
            control.lost.set()

    with Heartbeat(store, sweep.id, RUNNER, 0.5, control, lease_s=2):
        run_sweep(store, sweep.id, runner_id=RUNNER, control=control, progress=lose_after_the_rung)
    assert seen["stopped"] == 6  # rung 1 decided, rung 2 not
    before = {t.index: t for t in store.list_trials(sweep.id)[0]}
    assert {t.status for t in before.values()} == {"stopped", "running"}
    wait_until(lambda: store.claim_sweep("host:2", 60, sweep_id=sweep.id), 30, "the lease's end")
    info = run_sweep(store, sweep.id, runner_id="host:2")
    assert info.status == "completed"
    after, frame = store.list_trials(sweep.id)[0], store.read_metrics(sweep.id)
    check_statuses(after, frame)
    assert statuses(after) == statuses(uninterrupted[0])
    for t in after:  # a decision stored is never taken back
        if before[t.index].status == "stopped":
            assert (t.status, t.error) == ("stopped", before[t.index].error)
    store.close()


@pytest.mark.ray
@pytest.mark.slow
def test_a_runner_killed_mid_sweep_resumes_to_the_same_statuses(tmp_path, uninterrupted):
    """`isosweep runner` SIGKILLed with its Ray processes once some trial has reached rung 1,
    then a second runner: the statuses of the uninterrupted run."""
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    sweep = store.create_sweep(parse_spec(SPEC))

    def partway():
        trials, _ = store.list_trials(sweep.id)
        running = store.get_sweep(sweep.id).status == "running"
        return running and any((t.last_epoch or 0) >= 1 for t in trials)

    resumed = kill_and_resume(store, sweep.id, tmp_path, partway, "a trial at rung 1")
    after = list(resumed.after.values())
    check_statuses(after, store.read_metrics(sweep.id))
    assert statuses(after) == statuses(uninterrupted[0])
    assert "stopped so far" in resumed.log, resumed.log[-3000:]  # its plan, from the store
    assert "a sweep run failed" not in resumed.log, resumed.log[-3000:]
    store.close()
