"""The driver's TPE feed without Ray: TrialSource asks the search once the stored trials are
handed out, at most `max_outstanding` at a time, writes each ask to the store first, and ends
when the search owes nothing; a rebuilt SearchFeed picks up where the last one stopped."""

from __future__ import annotations

from ray.tune.search import Searcher

from service.spec import parse_spec
from service.status import TrialStatus
from service.store import Store
from workers.callbacks import SweepControl
from workers.driver import SearchFeed, TrialFeed, TrialSource

TINY = {"depth": 2, "width": 8, "dataset": "digits", "batch_size": 32, "epochs": 1}


def source(store, sweep_id, search):
    src = TrialSource(
        TrialFeed(store, sweep_id),
        param=lambda ts: [t.id for t in ts],
        on_feed=lambda t: None,
        limit=1000,
        control=SweepControl(),
        turn=lambda: False,
        search=search,
    )
    return src


def finish(store, search, tid, loss):
    store.start_trial(tid, runner_id="r")
    records = [{"epoch": 0, "test_loss": 2.0}, {"epoch": 1, "test_loss": loss}]
    store.write_records([(tid, r) for r in records], runner_id="r")
    store.finish_trial(tid, TrialStatus.COMPLETED, runner_id="r")
    search.finished(tid, TrialStatus.COMPLETED)


def test_asks_wait_for_outcomes_and_resume_from_the_store(sqlite_url):
    spec = parse_spec(
        {
            "name": "tpe",
            "parameters": {**TINY, "lr": {"loguniform": [1e-3, 1.0]}},
            "search": {"kind": "tpe", "n": 5, "objective": "test_loss"},
        }
    )
    with Store(sqlite_url) as store:
        sweep = store.create_sweep(spec)
        store.claim_sweep("r", 60, sweep_id=sweep.id)
        search = SearchFeed.begin(store, sweep.id, spec, "r")
        search.max_outstanding = 2
        src = source(store, sweep.id, search)
        a, b = src.suggest("x")["param"], src.suggest("y")["param"]
        assert src.suggest("z") is None  # two outstanding: wait for an outcome
        assert [t.index for t in store.list_trials(sweep.id)[0]] == [0, 1]
        finish(store, search, a[0], 0.5)
        c = src.suggest("z")["param"]
        assert c[0] not in a + b
        # the runner dies here: a new one rebuilds the search from the stored trials
        again = SearchFeed.begin(store, sweep.id, spec, "r")
        again.max_outstanding = 2
        assert again.studies.owed() == 2 and sorted(again.studies.pending) == sorted(b + c)
        src2 = source(store, sweep.id, again)
        assert {src2.suggest("p")["param"][0], src2.suggest("q")["param"][0]} == set(b + c)
        assert src2.suggest("r") is None  # the stored two run first, then asks wait
        for tid in b + c:
            finish(store, again, tid, 0.7)
        d, e = src2.suggest("s")["param"], src2.suggest("t")["param"]
        # all 5 asked: the source ends, the two in flight finish and are told
        assert src2.suggest("u") == Searcher.FINISHED and src2.ended == "drained"
        for tid in d + e:
            finish(store, again, tid, 0.9)
        assert again.studies.outstanding == 0
        trials, total = store.list_trials(sweep.id)
        assert total == 5 and sorted(t.index for t in trials) == list(range(5))
        assert all(1e-3 <= t.config["lr"] <= 1.0 for t in trials)
        (study,) = again.studies.studies.values()
        assert [t.state.name for t in study.study.trials] == ["COMPLETE"] * 5
        assert store.finish_sweep(sweep.id).status == "completed"
