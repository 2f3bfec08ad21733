"""Concurrency on SQLite and Postgres: runners racing for sweeps, a reader polling while a writer
writes, two writers at once. Each thread has its own Store (its own connections), as separate
processes would; nothing may fail with "database is locked" or any other StorageError."""

import threading
import time

import numpy as np

from service.config import LAYER_METRICS, TrialConfig
from service.spec import parse_spec
from service.store import Store, engine

DEPTH = 100
SECONDS = 1.5


def _spec(name, seeds=4, priority=0):
    params = {"depth": DEPTH, "epochs": 100_000, "norm": "none", "width": [8, 16]}
    return parse_spec({"name": name, "parameters": params, "seeds": seeds, "priority": priority})


def _record(epoch, rng):
    rec = {"epoch": epoch, "train_loss": float(rng.normal()), "test_acc": 0.5}
    rec.update({m: rng.normal(size=DEPTH) for m in LAYER_METRICS})
    return rec


def _threads(targets):
    errors = []

    def guard(fn):
        def run():
            try:
                fn()
            except Exception as exc:  # reported by the assertion below
                errors.append(repr(exc))

        return run

    threads = [threading.Thread(target=guard(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return errors


def test_concurrent_claims_never_share_a_sweep(database_url):
    with Store(database_url) as store:
        ids = {store.create_sweep(_spec(f"s{i}", seeds=1, priority=i % 3)).id for i in range(6)}
    claimed: list[tuple[str, int]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def runner(name):
        def run():
            with Store(database_url, migrate=False) as s:
                barrier.wait()
                while (sweep := s.claim_sweep(name, 60)) is not None:
                    with lock:
                        claimed.append((name, sweep.id))

        return run

    assert _threads([runner(f"r{i}") for i in range(6)]) == []
    assert sorted(sid for _, sid in claimed) == sorted(ids)  # each exactly once
    with Store(database_url, migrate=False) as store:
        for name, sid in claimed:
            assert store.get_sweep(sid).runner_id == name


def test_reader_polls_while_writer_writes(database_url):
    with Store(database_url) as store:
        sweep = store.create_sweep(_spec("rw"))
        trial_ids = [t.id for t in store.list_trials(sweep.id)[0]]
    done = threading.Event()
    counts = {"writes": 0, "reads": 0}

    def writer():
        rng = np.random.default_rng(0)
        with Store(database_url, migrate=False) as s:
            epoch = 0
            while not done.is_set():
                s.write_records([(t, _record(epoch, rng)) for t in trial_ids])
                s.write_records([(trial_ids[0], _record(0, rng))])  # rewrites, too
                epoch, counts["writes"] = epoch + 1, counts["writes"] + 2

    def reader():
        with Store(database_url, migrate=False) as s:
            while not done.is_set():
                s.get_sweep(sweep.id)
                s.list_trials(sweep.id, where={"width": 8})
                s.read_metrics(sweep.id, metrics="isometry_gap/act", epoch="last")
                s.trial_history(trial_ids[0], "grad_norm")
                counts["reads"] += 1

    def clock():  # at least SECONDS, and until both sides have done real work (or a failure)
        start = time.monotonic()
        while time.monotonic() - start < SECONDS or min(counts.values()) < 10:
            if time.monotonic() - start > 30:
                break
            time.sleep(0.05)
        done.set()

    assert _threads([writer, reader, reader, clock]) == []
    assert min(counts.values()) >= 10
    with Store(database_url, migrate=False) as s:
        assert s.get_trial(trial_ids[-1]).last_epoch == counts["writes"] // 2 - 1


def test_two_writers_queue_instead_of_failing(database_url):
    with Store(database_url) as store:
        sweep = store.create_sweep(_spec("ww"))
        trials = [t.id for t in store.list_trials(sweep.id)[0]]
    n_epochs = 15

    def writer(mine, seed):
        def run():
            rng = np.random.default_rng(seed)
            with Store(database_url, migrate=False) as s:
                s.start_trial(mine[0])  # a write of another kind among the other's writes
                for e in range(n_epochs):
                    s.write_records([(t, _record(e, rng)) for t in mine])

        return run

    halves = [trials[: len(trials) // 2], trials[len(trials) // 2 :]]
    assert _threads([writer(halves[0], 1), writer(halves[1], 2)]) == []
    with Store(database_url, migrate=False) as s:
        frame = s.read_metrics(sweep.id, metrics="grad_norm")
        assert len(frame) == len(trials) * n_epochs * DEPTH


def test_concurrent_cancel_and_claim_agree(database_url):
    with Store(database_url) as store:
        ids = [store.create_sweep(_spec(f"c{i}", seeds=1)).id for i in range(3)]

    def cancel():
        with Store(database_url, migrate=False) as s:
            for sid in ids:
                s.request_cancel(sid)

    def claim():
        with Store(database_url, migrate=False) as s:
            while s.claim_sweep("r", 60) is not None:
                pass

    assert _threads([cancel, claim]) == []
    with Store(database_url, migrate=False) as s:
        for sid in ids:
            info = s.get_sweep(sid)
            # cancelled before the claim, or claimed then flagged: never a lost flag
            assert info.cancel_requested
            assert info.status in ("cancelled", "running")
            if info.status == "cancelled":
                assert info.counts["cancelled"] == info.n_trials


# --- submissions: work outside the write transaction, writers queue -------------------------


def test_recorded_epoch_count_is_the_length_of_the_list():
    for epochs in [*range(31), 97, 100]:
        for every in [1, 2, 3, 7, 10, 30, 31, 99, 100, 101, 1000]:
            c = TrialConfig(epochs=epochs, record_every=every)
            assert c.n_recorded_epochs == len(c.recorded_epochs), (epochs, every)
    # 0, k, …, ⌊E/k⌋·k and E itself when k does not divide E
    assert TrialConfig(epochs=100_000).n_recorded_epochs == 100_001
    assert TrialConfig(epochs=100_000, record_every=7).n_recorded_epochs == 14_285 + 1 + 1
    assert TrialConfig(epochs=100_000, record_every=100_000).n_recorded_epochs == 2
    assert TrialConfig(epochs=0, record_every=5).n_recorded_epochs == 1


def test_a_submission_never_lists_the_recorded_epochs(sqlite_url, monkeypatch):
    def listed(self):
        raise AssertionError("create_sweep built the list of recorded epochs")

    monkeypatch.setattr(TrialConfig, "recorded_epochs", property(listed))
    params = {"depth": [1, 2], "epochs": 100_000, "record_every": [1, 7], "norm": "none"}
    with Store(sqlite_url) as store:
        sweep = store.create_sweep(parse_spec({"name": "big", "parameters": params}))
        trials, _ = store.list_trials(sweep.id)
    totals = {(t.config["depth"], t.config["record_every"]): t.records_total for t in trials}
    assert totals == {(1, 1): 100_001, (2, 1): 100_001, (1, 7): 14_287, (2, 7): 14_287}


def test_six_big_submissions_at_once_all_succeed(database_url, monkeypatch):
    """Six 1,000-trial, 100,000-epoch specs posted at once through one Store (as the API has),
    with SQLite's busy timeout cut to 0.2 s: writers of one process queue in the process, so
    none waits on the busy timeout, and none fails with "database is locked"."""
    monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_MS", 200)
    params = {"depth": list(range(1, 101)), "width": [8, 16], "epochs": 100_000, "norm": "none"}
    specs = [
        parse_spec({"name": f"big{i}", "parameters": params, "seeds": 5, "accept_cost": True})
        for i in range(6)
    ]  # days of work each: past the cost budget, accepted
    created = []
    with Store(database_url) as store:
        barrier = threading.Barrier(len(specs))

        def submit(spec):
            def run():
                barrier.wait()
                created.append(store.create_sweep(spec))

            return run

        assert _threads([submit(spec) for spec in specs]) == []
        assert sorted(info.name for info in created) == [f"big{i}" for i in range(6)]
        for info in created:
            assert info.n_trials == 1000 and info.counts["queued"] == 1000
            assert store.list_trials(info.id, limit=1)[0][0].records_total == 100_001
