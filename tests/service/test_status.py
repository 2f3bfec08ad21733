"""The status vocabulary: StrEnum members are the stored strings (on both backends the database
holds "queued", never a member's name), and is_finished() splits them as the store does."""

from __future__ import annotations

from sqlalchemy import text

from service.spec import parse_spec
from service.status import SweepStatus, TrialStatus, trials_finished
from service.store import Store
from service.store.models import FINISHED_TRIAL, SWEEP_STATUSES, TRIAL_STATUSES


def test_members_are_their_strings():
    assert [str(s) for s in SweepStatus] == list(SWEEP_STATUSES)
    assert [str(s) for s in TrialStatus] == list(TRIAL_STATUSES)
    assert SweepStatus("running") is SweepStatus.RUNNING and SweepStatus.RUNNING == "running"
    assert f"{TrialStatus.DIVERGED}" == "diverged" and {"failed": 1}[TrialStatus.FAILED] == 1


def test_finished_statuses():
    assert SweepStatus.finished() == ("completed", "cancelled", "failed")
    assert (
        TrialStatus.finished()
        == FINISHED_TRIAL
        == ("completed", "diverged", "failed", "cancelled", "stopped")
    )
    assert not SweepStatus.QUEUED.is_finished() and not TrialStatus.RUNNING.is_finished()
    counts = {"queued": 2, "running": 1, "completed": 3, "diverged": 1, "failed": 1}
    assert trials_finished(counts) == 5
    assert trials_finished({"queued": 1, "paused": 2}) == 2  # an unknown status is not pending


def test_the_database_holds_the_plain_strings(database_url):
    with Store(database_url) as store:
        spec = {"name": "s", "parameters": {"depth": 2, "epochs": 1}, "seeds": 2}
        sweep = store.create_sweep(parse_spec(spec))
        store.claim_sweep("r", 60.0)
        trial = store.runnable_trials(sweep.id)[0]
        store.start_trial(trial.id)
        store.finish_trial(trial.id, TrialStatus.DIVERGED)
        with store.engine.connect() as c:
            swept = c.execute(text("SELECT status FROM sweeps")).scalars().all()
            tried = c.execute(text("SELECT status FROM trials ORDER BY id")).scalars().all()
        assert swept == ["running"] and tried == ["diverged", "queued"]
        assert type(store.get_sweep(sweep.id).status) is str  # plain strings come back
