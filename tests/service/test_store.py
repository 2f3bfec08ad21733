"""The store's sweeps and trials on SQLite and Postgres: migrations, creation, reuse of stored
results, cancel, claims and leases, the finish rule, trial filters and paging."""

import math
import threading
import time
from typing import get_args

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from service.config import CONFIG_FIELDS, TrialConfig
from service.errors import Conflict, InvalidInput, LimitExceeded, NotFound, StorageError
from service.settings import Settings
from service.spec import parse_spec
from service.store import Store
from service.store.engine import migrate
from service.store.models import TRIAL_STATUSES, Base, SqlTrial


@pytest.fixture
def store(database_url):
    with Store(database_url) as s:
        yield s


def _spec(name="s", seeds=2, **extra):
    params = extra.pop("parameters", {"depth": [2, 3], "epochs": 4, "norm": "none"})
    return parse_spec({"name": name, "parameters": params, "seeds": seeds, **extra})


def _record(epoch, depth, value=1.0):
    return {
        "epoch": epoch,
        "train_loss": value,
        "grad_norm": [value] * depth,
    }


def _run(store, trial, status="completed"):
    store.start_trial(trial.id)
    store.write_records([(trial.id, _record(e, trial.config["depth"])) for e in range(5)])
    return store.finish_trial(trial.id, status)


# --- schema ----------------------------------------------------------------------------------


def test_migrations_match_the_models(database_url):
    """Every revision replayed from an empty database gives the models' schema — which is what
    a new store creates at once (service.store.engine.migrate) — types and server defaults
    included."""
    store = Store(database_url, migrate=False)
    try:
        migrate(store.engine, replay=True)
        with store.engine.connect() as conn:
            opts = {"compare_type": True, "compare_server_default": True}
            ctx = MigrationContext.configure(conn, opts=opts)
            assert compare_metadata(ctx, Base.metadata) == []
            assert {"sweeps", "trials", "metrics", "artifacts", "alembic_version"} <= set(
                inspect(conn).get_table_names()
            )
    finally:
        store.close()


def test_a_new_store_is_at_the_newest_revision(database_url):
    """The schema created at once is stamped at head: a later migration starts from there."""
    from alembic.script import ScriptDirectory

    from service.store.engine import alembic_config

    with Store(database_url) as store, store.engine.connect() as conn:
        (stamped,) = conn.execute(text("SELECT version_num FROM alembic_version")).scalars()
    assert stamped == ScriptDirectory.from_config(alembic_config()).get_current_head()


def test_every_config_field_has_a_trial_column():
    columns = SqlTrial.__table__.columns
    missing = [f for f in CONFIG_FIELDS if f not in columns]
    assert missing == []
    for f in CONFIG_FIELDS:  # nullable exactly where the field may be None
        optional = type(None) in get_args(TrialConfig.model_fields[f].annotation)
        assert columns[f].nullable == optional, f


def test_reopening_and_concurrent_starts_migrate_once(database_url):
    errors = []

    def start():
        try:
            Store(database_url).close()
        except Exception as exc:  # collected: the assertion names it
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with Store(database_url) as s:
        assert s.list_sweeps() == ([], 0)


def test_unreachable_database_is_a_storage_error(tmp_path):
    with pytest.raises(StorageError):
        Store("postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2")
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(StorageError):
        Store(f"sqlite:///{tmp_path / 'dir.db'}")


def test_sqlite_pragmas(sqlite_url):
    with Store(sqlite_url) as s, s.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 30_000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


# --- sweeps ----------------------------------------------------------------------------------


def test_create_sweep_writes_every_trial_queued(store):
    spec = _spec(parameters={"depth": [2, 3], "epochs": 7, "record_every": 3}, seeds=3)
    info = store.create_sweep(spec)
    assert info.status == "queued" and info.n_trials == 6
    assert info.counts == {s: (6 if s == "queued" else 0) for s in TRIAL_STATUSES}
    assert info.progress == 0.0 and info.eta_s is None
    assert info.spec["parameters"] == {"depth": [2, 3], "epochs": 7, "record_every": 3}
    trials, total = store.list_trials(info.id)
    assert total == 6
    assert [(t.index, t.config["depth"], t.config["seed"]) for t in trials] == [
        (0, 2, 0),
        (1, 2, 1),
        (2, 2, 2),
        (3, 3, 0),
        (4, 3, 1),
        (5, 3, 2),
    ]
    assert {t.records_total for t in trials} == {4}  # epochs 0, 3, 6, 7
    assert all(t.status == "queued" and t.results_from is None for t in trials)


def test_get_and_list_sweeps(store):
    ids = [store.create_sweep(_spec(name=f"s{i}")).id for i in range(5)]
    store.request_cancel(ids[1])
    page, total = store.list_sweeps(offset=1, limit=2)
    assert total == 5 and [w.id for w in page] == [ids[3], ids[2]]  # newest first
    cancelled, n = store.list_sweeps(status="cancelled")
    assert n == 1 and cancelled[0].id == ids[1]
    assert store.get_sweep(ids[0]).name == "s0"
    with pytest.raises(NotFound):
        store.get_sweep(10_000)


def test_a_layer_filter_counts_exactly_the_values_it_returns(store):
    sweep = store.create_sweep(_spec())  # depth 2 and 3, 2 seeds, epochs 0..4
    for t in store.list_trials(sweep.id)[0]:
        _run(store, t)
    query = dict(metrics=["grad_norm", "train_loss"], layers=[2, 3, 50])
    frame = store.read_metrics(sweep.id, **query)
    assert len(frame) == 2 * 5 * (1 + 1) + 2 * 5 * (2 + 1)  # depth 2: ℓ = 2; depth 3: ℓ = 2, 3
    assert len(store.read_metrics(sweep.id, max_points=len(frame), **query)) == len(frame)
    with pytest.raises(LimitExceeded) as exc:
        store.read_metrics(sweep.id, max_points=len(frame) - 1, **query)
    assert f"would return {len(frame)} values" in exc.value.message


def test_paging_is_bounded(database_url):
    with Store(database_url, settings=Settings(max_page_size=3)) as store:
        sweep = store.create_sweep(_spec())
        with pytest.raises(LimitExceeded) as exc:
            store.list_trials(sweep.id, limit=4)
        assert exc.value.field == "limit" and "ISOSWEEP_MAX_PAGE_SIZE" in exc.value.message
        with pytest.raises(InvalidInput):
            store.list_sweeps(offset=-1, limit=3)
        with pytest.raises(InvalidInput) as exc:
            store.list_sweeps(status="done", limit=3)
        assert "running" in exc.value.allowed


def test_results_of_finished_trials_are_reused(store):
    first = store.create_sweep(_spec(name="a"))
    a = store.list_trials(first.id)[0]
    _run(store, a[0], "completed")
    _run(store, a[1], "diverged")
    _run(store, a[2], "failed")  # a failure is not a result
    again = store.create_sweep(_spec(name="b"))
    b = store.list_trials(again.id)[0]
    assert [t.results_from for t in b] == [a[0].id, a[1].id, None, None]
    assert [t.status for t in b] == ["completed", "diverged", "queued", "queued"]
    assert b[0].summary == {"train_loss": 1.0} and b[0].records_done == 5
    assert [t.id for t in store.runnable_trials(again.id)] == [b[2].id, b[3].id]
    with pytest.raises(Conflict):
        store.start_trial(b[0].id)
    frame = store.read_metrics(again.id, metrics="train_loss")
    assert set(frame["trial_id"]) == {b[0].id, b[1].id}  # the new ids, the old rows
    assert len(frame) == 10
    # a third submission points at the original, not at the reuse
    third = store.list_trials(store.create_sweep(_spec(name="c")).id)[0]
    assert third[0].results_from == a[0].id


def test_rerun_ignores_stored_results_and_all_reused_is_completed(store):
    first = store.create_sweep(_spec(seeds=1))
    for t in store.list_trials(first.id)[0]:
        _run(store, t)
    rerun = store.create_sweep(_spec(seeds=1, rerun=True))
    assert rerun.status == "queued" and rerun.counts["queued"] == 2
    reused = store.create_sweep(_spec(seeds=1))
    assert reused.status == "completed" and reused.counts["completed"] == 2
    assert reused.progress == 1.0 and reused.finished_at is not None


def test_cancel_a_queued_sweep(store):
    sweep = store.create_sweep(_spec())
    info = store.request_cancel(sweep.id)
    assert info.status == "cancelled" and info.cancel_requested
    assert info.counts["cancelled"] == 4 and store.runnable_trials(sweep.id) == []
    assert store.claim_sweep("r", 10) is None


def test_cancel_a_running_sweep_waits_for_the_runner(store):
    sweep = store.create_sweep(_spec())
    store.claim_sweep("r", 60)
    trials = store.list_trials(sweep.id)[0]
    _run(store, trials[0])
    store.start_trial(trials[1].id)
    info = store.request_cancel(sweep.id)
    assert info.status == "running" and store.is_cancel_requested(sweep.id)
    assert info.counts == {**dict.fromkeys(TRIAL_STATUSES, 0), "completed": 1, "running": 1,
                           "cancelled": 2}  # fmt: skip
    done = store.finish_sweep(sweep.id)
    assert done.status == "cancelled" and done.counts["cancelled"] == 3
    assert store.trial_history(trials[0].id, "train_loss")[0].tolist() == [0, 1, 2, 3, 4]
    assert store.request_cancel(sweep.id) == store.get_sweep(sweep.id)  # finished: no-op


def test_finish_rule(store):
    ok = store.create_sweep(_spec(name="ok", seeds=1))
    bad = store.create_sweep(_spec(name="bad", seeds=1, parameters={"depth": [5, 6]}))
    for t in store.list_trials(ok.id)[0]:
        _run(store, t, "diverged")
    with pytest.raises(Conflict):
        store.finish_sweep(bad.id)
    tb = store.list_trials(bad.id)[0]
    _run(store, tb[0])
    store.start_trial(tb[1].id)
    store.finish_trial(tb[1].id, "failed", error="boom")
    assert store.finish_sweep(ok.id).status == "completed"
    failed = store.finish_sweep(bad.id)
    assert failed.status == "failed"
    assert failed.error == f"1 of 2 trials failed; the first, trial {tb[1].id}: boom"
    assert store.get_trial(tb[1].id).error == "boom"
    assert store.finish_sweep(bad.id).status == "failed"  # idempotent


def test_claim_order_lease_and_takeover(store):
    low = store.create_sweep(_spec(name="low"))
    high = store.create_sweep(_spec(name="high", priority=5))
    old = store.create_sweep(_spec(name="old-mid", priority=1))
    new = store.create_sweep(_spec(name="new-mid", priority=1))
    order = [store.claim_sweep(f"r{i}", 60).id for i in range(4)]
    assert order == [high.id, old.id, new.id, low.id]
    assert store.claim_sweep("r9", 60) is None
    assert store.get_sweep(high.id).runner_id == "r0"
    assert store.heartbeat(high.id, "r0") and not store.heartbeat(high.id, "r1")


def test_expired_lease_is_taken_over_and_running_trials_requeued(store):
    sweep = store.create_sweep(_spec())
    assert store.claim_sweep("dead", 0.05).status == "running"
    t = store.list_trials(sweep.id)[0][0]
    store.start_trial(t.id)
    time.sleep(0.1)
    taken = store.claim_sweep("alive", 60)
    assert taken.id == sweep.id and taken.runner_id == "alive"
    assert store.get_trial(t.id).status == "queued" and store.get_trial(t.id).attempts == 1
    assert not store.heartbeat(sweep.id, "dead")
    assert store.claim_sweep("third", 60) is None  # the new lease holds
    with pytest.raises(InvalidInput):
        store.claim_sweep("x", 0)


def test_claim_one_sweep_by_id_and_release(store):
    first = store.create_sweep(_spec(name="first", priority=9))
    mine = store.create_sweep(_spec(name="mine"))
    got = store.claim_sweep("run-cli", 60, sweep_id=mine.id)
    assert got.id == mine.id  # not the higher-priority one queued ahead of it
    assert store.claim_sweep("other", 60, sweep_id=mine.id) is None  # held
    t = store.list_trials(mine.id)[0][0]
    store.start_trial(t.id)
    assert not store.release_sweep(mine.id, "other")  # only its holder can give it back
    assert store.release_sweep(mine.id, "run-cli")
    assert store.get_sweep(mine.id).status == "queued"
    assert store.get_trial(t.id).status == "queued"
    # claimable again at once, without waiting for the 60 s lease
    assert store.claim_sweep("next", 60, sweep_id=mine.id).runner_id == "next"
    assert store.get_sweep(first.id).status == "queued"


def test_a_new_attempt_starts_from_no_stored_results(store):
    sweep = store.create_sweep(_spec(seeds=1))
    t = store.list_trials(sweep.id)[0][0]
    depth = t.config["depth"]
    store.start_trial(t.id)
    store.write_records([(t.id, _record(e, depth)) for e in range(4)])  # epochs 0..3
    store.start_trial(t.id)  # a retry, which then diverges at epoch 1
    store.write_records([(t.id, _record(e, depth, value=math.inf)) for e in range(2)])
    epochs, values = store.trial_history(t.id, "train_loss")
    assert epochs.tolist() == [0, 1] and values.tolist() == [math.inf, math.inf]


def test_a_retry_that_stops_earlier_resets_last_epoch_and_summary(store):
    sweep = store.create_sweep(_spec(seeds=1))
    t = store.list_trials(sweep.id)[0][0]
    depth = t.config["depth"]
    store.start_trial(t.id)
    store.write_records([(t.id, _record(e, depth, value=float(e))) for e in range(4)])  # 0..3
    assert store.get_trial(t.id).last_epoch == 3
    fresh = store.start_trial(t.id)  # a retry: nothing of the last attempt is left
    assert fresh.last_epoch is None and fresh.summary == {}
    store.write_records([(t.id, _record(e, depth, value=10.0 + e)) for e in range(2)])  # 0..1
    info = store.get_trial(t.id)
    assert info.last_epoch == 1 and info.summary == {"train_loss": 11.0}
    last = store.read_metrics(sweep.id, epoch="last")
    assert set(last["epoch"]) == {1} and set(last["metric"]) == {"train_loss", "grad_norm"}
    assert last.loc[last["metric"] == "train_loss", "value"].tolist() == [11.0]


# --- trials ----------------------------------------------------------------------------------


def test_trial_lifecycle(store):
    sweep = store.create_sweep(_spec(seeds=1))
    t = store.list_trials(sweep.id)[0][0]
    assert store.start_trial(t.id).attempts == 1
    again = store.start_trial(t.id)  # a retry
    assert again.status == "running" and again.attempts == 2 and again.started_at
    done = store.finish_trial(t.id, "completed")
    assert done.status == "completed" and done.finished_at >= again.started_at
    with pytest.raises(Conflict):
        store.start_trial(t.id)
    with pytest.raises(InvalidInput) as exc:
        store.finish_trial(t.id, "running")
    assert exc.value.field == "status"
    with pytest.raises(NotFound):
        store.get_trial(99_999)


def test_list_trials_filters_in_sql(store):
    params = {"depth": [2, 3, 4], "lr": [0.001, 0.1], "bias": [True, False], "epochs": 1}
    sweep = store.create_sweep(_spec(parameters=params, seeds=1))

    def depths_lrs(**kw):
        trials, total = store.list_trials(sweep.id, limit=100, **kw)
        assert total == len(trials)
        return sorted({(t.config["depth"], t.config["lr"]) for t in trials})

    assert depths_lrs(where={"depth": 3, "lr": 0.1}) == [(3, 0.1)]
    assert depths_lrs(where={"depth": [2, 4], "lr": "1e-3"}) == [(2, 0.001), (4, 0.001)]
    # A page smaller than the sweep, of trials that come last in expansion order: a filter
    # applied after LIMIT/OFFSET (in Python, on the first page) would find none of them.
    everything = store.list_trials(sweep.id, limit=100)[0]
    last_depth = everything[-1].config["depth"]
    matching = [t.id for t in everything if t.config["depth"] == last_depth]
    assert len(matching) == 4 and everything[0].id not in matching

    def page(offset):
        trials, total = store.list_trials(
            sweep.id, where={"depth": last_depth}, offset=offset, limit=2
        )
        return [t.id for t in trials], total

    assert page(0) == (matching[:2], 4)
    assert page(2) == (matching[2:], 4)
    assert page(4) == ([], 4)
    assert store.list_trials(sweep.id, where={"bias": "true"})[1] == 6
    assert store.list_trials(sweep.id, where={"max_train_samples": None})[1] == 12
    assert store.list_trials(sweep.id, where={"depth": []})[1] == 0
    store.start_trial(store.list_trials(sweep.id, limit=1)[0][0].id)
    assert store.list_trials(sweep.id, status="running")[1] == 1
    with pytest.raises(InvalidInput) as exc:
        store.list_trials(sweep.id, where={"depht": 3})
    assert exc.value.field == "where.depht" and "depth" in exc.value.allowed
    with pytest.raises(InvalidInput) as exc:
        store.list_trials(sweep.id, where={"norm": "group"})
    assert exc.value.field == "where.norm" and "'batch'" in exc.value.message


def test_progress_and_eta(store):
    sweep = store.create_sweep(_spec(seeds=1, parameters={"depth": [2, 3], "epochs": 3}))
    store.claim_sweep("r", 60)
    t = store.list_trials(sweep.id)[0]
    store.start_trial(t[0].id)
    store.write_records([(t[0].id, _record(0, 2)), (t[0].id, _record(1, 2))])
    info = store.get_sweep(sweep.id)
    assert info.progress == pytest.approx(2 / 8)  # 2 of 4 + 4 records
    assert info.eta_s is not None and info.eta_s > 0
    assert info.trials_done == 0 and "trials_done" not in info.model_dump()
    store.finish_trial(t[0].id, "diverged")  # stopped early: counts in full
    assert store.get_sweep(sweep.id).progress == pytest.approx(4 / 8)
    assert store.get_sweep(sweep.id).trials_done == 1
