"""Concurrency on SQLite and Postgres: runners racing for sweeps, a reader polling while a writer
writes, two writers at once. Each thread has its own Store (its own connections), as separate
processes would; nothing may fail with "database is locked" or any other StorageError."""

import threading
import time

import numpy as np

from service.config import LAYER_METRICS
from service.spec import parse_spec
from service.store import Store

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
