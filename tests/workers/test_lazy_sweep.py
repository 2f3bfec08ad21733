"""Sweeps of any size (issue 12): trials reach Ray Tune lazily, a page at a time.

Fast tests: the store's bulk insert (every column as the expansion says, ids in expansion order,
reused trials), keyset pages of runnable trials, the claim order that lets sweeps take turns, and
the driver's TrialSource / RunProgress by hand. The `ray` test runs a 100,000-trial sweep of
init-only trials through a Runner: it starts, gives its turn to a small sweep submitted behind
it (which completes), resumes without running a trial twice, and is cancelled. Outcomes and
counts only: the issue's seconds are measured by bench/lazy_sweep.py.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from records import record
from sqlalchemy import select

from service.config import CONFIG_FIELDS, config_hash
from service.settings import Settings
from service.spec import expand, parse_spec
from service.store import Store
from service.store.models import SqlTrial
from workers import driver
from workers.callbacks import SweepControl
from workers.driver import RunProgress, TrialFeed, TrialSource, new_progress
from workers.runner import Runner
from workers.trainable import PARAM_KEY

RUNNER = "lazy-runner"
BIG = 100_000


def param_of(ts):
    (t,) = ts  # one trial per Tune trial (the source's default pack of 1)
    return {"trial_id": t.id}


def spec_of(name, seeds, *, priority=0, epochs=0, depth=2, **extra):
    params = {"depth": depth, "width": 8, "epochs": epochs, "dataset": "digits", **extra}
    return parse_spec({"name": name, "parameters": params, "seeds": seeds, "priority": priority})


@pytest.fixture
def store(database_url):
    with Store(database_url) as s:
        yield s


# --- the store -----------------------------------------------------------------------------


def stored_columns(store, sweep_id):
    with store._read() as s:
        rows = s.execute(
            select(SqlTrial).where(SqlTrial.sweep_id == sweep_id).order_by(SqlTrial.index)
        ).scalars()
        return [
            {
                "id": t.id,
                "index": t.index,
                "config": t.config,
                "hash": t.config_hash,
                **{f: getattr(t, f) for f in CONFIG_FIELDS},
            }
            for t in rows
        ]


def test_bulk_insert_stores_every_column_of_the_expansion_in_order(store):
    # init_gain acts at epoch 0 (lr would not: it is reset there, docs/api.md)
    spec = spec_of("cols", 3, depth=[2, 3], init_gain=[1.0, 2.0])
    info = store.create_sweep(spec)
    rows = stored_columns(store, info.id)
    configs = expand(spec)
    assert [r["index"] for r in rows] == list(range(len(configs))) == list(range(12))
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)  # ids follow the index
    for r, c in zip(rows, configs, strict=True):
        assert r["config"] == c.to_dict() and r["hash"] == config_hash(c)
        assert {f: r[f] for f in CONFIG_FIELDS} == {f: getattr(c, f) for f in CONFIG_FIELDS}
    trials, total = store.list_trials(info.id, where={"depth": 3, "init_gain": 2.0})
    assert total == 3 and {t.config["seed"] for t in trials} == {0, 1, 2}
    t = store.get_trial(rows[0]["id"])
    assert (t.status, t.attempts, t.records_done, t.records_total, t.summary) == (
        "queued", 0, 0, 1, {}
    )  # fmt: skip
    assert (t.results_from, t.finished_at, t.last_epoch, t.diverged_epoch) == (None,) * 4


def test_bulk_insert_of_a_sweep_that_reuses_some_trials(store):
    first = store.create_sweep(spec_of("first", 2))
    done = store.list_trials(first.id)[0][0]
    store.start_trial(done.id)
    store.write_records([(done.id, record(0, 0, 2))])
    store.finish_trial(done.id, "completed")
    again = store.create_sweep(spec_of("again", 4))  # seed 0 reused, seeds 1-3 new (1 queued)
    trials, _ = store.list_trials(again.id)
    assert [t.index for t in trials] == [0, 1, 2, 3]
    assert [t.id for t in trials] == sorted(t.id for t in trials)
    reused, *new = trials
    assert (reused.status, reused.results_from, reused.last_epoch) == ("completed", done.id, 0)
    assert reused.finished_at is not None and reused.summary == store.get_trial(done.id).summary
    assert {(t.status, t.results_from, t.attempts) for t in new} == {("queued", None, 0)}
    assert again.counts["completed"] == 1 and again.counts["queued"] == 3


def test_runnable_trials_come_in_keyset_pages(store):
    info = store.create_sweep(spec_of("pages", 7))
    every = store.runnable_trials(info.id)
    store.start_trial(every[1].id)
    store.finish_trial(every[1].id, "completed")
    left = [t.id for t in every if t.id != every[1].id]
    pages, after = [], None
    while page := store.runnable_trials(info.id, after_index=after, limit=2):
        assert len(page) <= 2
        pages.append([t.id for t in page])
        after = page[-1].index
    assert [i for p in pages for i in p] == left and len(pages) == 3
    assert store.runnable_totals(info.id) == (6, 6)  # 6 trials of one record (epoch 0) each


def test_a_sweep_that_gave_its_turn_up_goes_behind_the_waiting_ones(store):
    long = store.create_sweep(spec_of("long", 2))
    assert store.claim_sweep("r", 60).id == long.id
    assert not store.is_sweep_waiting(long.id)
    low = store.create_sweep(spec_of("low", 1, priority=-1))
    assert not store.is_sweep_waiting(long.id)  # a lower priority does not take a turn
    small = store.create_sweep(spec_of("small", 1))
    assert store.is_sweep_waiting(long.id)
    assert store.release_sweep(long.id, "r")  # it ran: behind the one that never did
    order = [store.claim_sweep(f"r{i}", 60).id for i in range(3)]
    assert order == [small.id, long.id, low.id]


# --- the driver's parts, by hand ---------------------------------------------------------------


def test_trial_source_hands_out_pages_lazily_and_finishes(sqlite_url, monkeypatch):
    with Store(sqlite_url) as store:
        info = store.create_sweep(spec_of("src", 5))
        reads = []
        real = store.runnable_trials
        monkeypatch.setattr(
            store, "runnable_trials", lambda *a, **k: reads.append(k) or real(*a, **k)
        )
        fed, turn = [], {"over": False}
        control = SweepControl()
        source = TrialSource(
            TrialFeed(store, info.id, page=2),
            param=param_of,
            on_feed=fed.append,
            limit=3,
            control=control,
            turn=lambda: turn["over"],
        )
        got = [source.suggest(f"t{i}") for i in range(4)]
        assert [g[PARAM_KEY]["trial_id"] for g in got[:3]] == [t.id for t in fed]
        assert got[3] == "FINISHED" and source.ended == "limit"
        assert reads == [{"after_index": None, "limit": 2}, {"after_index": 1, "limit": 2}]
        rest = TrialSource(
            source.feed, param=param_of, on_feed=fed.append, limit=9,
            control=control, turn=lambda: turn["over"],
        )  # fmt: skip
        assert rest.suggest("a")[PARAM_KEY]["trial_id"] == fed[3].id  # where the last left off
        turn["over"] = True
        assert rest.suggest("b") == "FINISHED" and rest.ended == "turn"
        drained = TrialSource(
            source.feed, param=param_of, on_feed=fed.append, limit=9, control=SweepControl(),
            turn=lambda: False,
        )  # fmt: skip
        assert drained.suggest("c") is not None and drained.suggest("d") == "FINISHED"
        assert drained.ended == "drained" and source.feed.drained and len(fed) == 5
        control.cancel.set()
        halted = TrialSource(
            TrialFeed(store, info.id), param=param_of, on_feed=fed.append, limit=9,
            control=control, turn=lambda: False,
        )  # fmt: skip
        assert halted.suggest("e") == "FINISHED" and halted.ended == "halted"


def test_run_progress_folds_finished_trials_into_totals(sqlite_url):
    with Store(sqlite_url) as store:
        info = store.create_sweep(spec_of("prog", 4, epochs=2))  # 4 trials × 3 records
        trials = store.runnable_trials(info.id)
        p = RunProgress.begin(store.get_sweep(info.id), 12)
        assert (p.epochs_total, p.epochs_done, p.trials_done, p.counts) == (12, 0, 0, {"queued": 4})
        p.feed(trials[0])
        p.feed(trials[1])
        p.status[trials[0].id], p.done[trials[0].id] = "completed", 3
        p.fold(trials[0].id)
        assert set(p.status) == {trials[1].id} and trials[0].id not in p.expected
        assert (p.epochs_total, p.epochs_done, p.trials_done) == (12, 3, 1)
        assert p.counts == {"queued": 3, "completed": 1}
        same = new_progress(store.get_sweep(info.id), trials)  # every trial handed at once
        assert (same.epochs_total, same.counts) == (12, {"queued": 4})


# --- a 100,000-trial sweep through the runner --------------------------------------------------


def wait_for(condition, what, timeout_s=600):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.ray
@pytest.mark.slow
def test_a_100k_sweep_starts_takes_turns_and_cancels(tmp_path, ray_local, monkeypatch):
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}", max_trials_per_sweep=BIG
    )
    with Store(settings.database_url, settings=settings) as store:
        big = store.create_sweep(spec_of("big", BIG))
        assert big.n_trials == BIG and big.status == "queued"
        reads = []
        real = store.runnable_trials
        monkeypatch.setattr(
            store, "runnable_trials", lambda *a, **k: reads.append(k) or real(*a, **k)
        )
        held = Counter()  # most Tune trials one Tune run held, by sweep
        real_start = driver.RunCallback.on_trial_start

        def on_trial_start(self, iteration, trials, trial, **info):
            held[self.tracker.sweep_id] = max(held[self.tracker.sweep_id], len(trials))
            return real_start(self, iteration, trials, trial, **info)

        monkeypatch.setattr(driver.RunCallback, "on_trial_start", on_trial_start)
        runner = Runner(store, runner_id=RUNNER, poll_s=0.1, yield_after_s=1.0)
        thread = threading.Thread(target=runner.run_forever, daemon=True)
        thread.start()
        try:
            wait_for(lambda: store.get_sweep(big.id).counts["completed"] >= 2, "big's trials")
            small = store.create_sweep(spec_of("small", 2, init_gain=1.7))  # nothing to reuse
            wait_for(lambda: store.get_sweep(small.id).status == "completed", "the small sweep")
            during = store.get_sweep(big.id)
            assert 2 <= during.counts["completed"] < BIG  # it ran behind a sweep far from done
            wait_for(
                lambda: store.get_sweep(big.id).counts["completed"] > during.counts["completed"],
                "big to resume",
            )
            store.request_cancel(big.id)
            wait_for(lambda: store.get_sweep(big.id).status == "cancelled", "the cancel")
        finally:
            runner.stop()
            thread.join(120)
        assert not thread.is_alive()
        done = store.get_sweep(small.id)
        assert done.counts["completed"] == 2 and done.n_trials == 2
        after = store.get_sweep(big.id)
        counts = {k: v for k, v in after.counts.items() if v}
        assert set(counts) <= {"completed", "cancelled"} and sum(counts.values()) == BIG
        assert counts["completed"] > during.counts["completed"]
        ran, _ = store.list_trials(big.id, status="completed", limit=1000)
        assert {(t.attempts, t.last_epoch, t.records_done) for t in ran} == {(1, 0, 1)}
        frame = store.read_metrics(big.id, metrics="train_loss")  # epoch 0 of each trial that ran
        assert frame.trial_id.is_unique and {t.id for t in ran} <= set(frame.trial_id)
        assert len(frame) <= counts["completed"] + 2 * driver.LIVE_PER_SLOT  # + those cut short
        # lazily: every read was a page, and a Tune run never held the whole sweep
        assert reads and all(r.get("limit") == driver.PAGE_TRIALS for r in reads)
        assert sum(1 for r in reads if r) * driver.PAGE_TRIALS < BIG
        assert 0 < held[big.id] <= driver.CHUNK_TRIALS and 0 < held[small.id] <= 2
