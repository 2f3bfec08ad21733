"""The read cache: one computation per key however many ask at once, errors shared and never
kept, expiry unless final, a byte bound; and through the API, answers that follow every write."""

from __future__ import annotations

import threading
import time

import pytest
from api_support import fill, record, spec

from api.cache import SingleFlightCache, sweep_version


def _wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


def test_concurrent_misses_compute_once():
    cache = SingleFlightCache()
    release = threading.Event()
    calls = []

    def compute():
        calls.append(1)
        release.wait(10)
        return object()

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get("k", compute))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    _wait_for(lambda: cache.hits == 7)  # seven wait on the one computing
    release.set()
    for t in threads:
        t.join(10)
    assert len(calls) == 1 and len(results) == 8
    assert all(r is results[0] for r in results)


def test_an_error_reaches_every_waiter_and_is_not_kept():
    cache = SingleFlightCache()
    release = threading.Event()

    def fail():
        release.wait(10)
        raise ValueError("boom")

    errors = []

    def ask():
        try:
            cache.get("k", fail)
        except ValueError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    _wait_for(lambda: cache.hits == 2)
    release.set()
    for t in threads:
        t.join(10)
    assert len(errors) == 3
    assert cache.get("k", lambda: 42) == 42  # computed afresh


def test_entries_expire_unless_final():
    cache = SingleFlightCache(ttl_s=0.0)  # everything not final is stale at once
    n = iter(range(100))
    assert cache.get("a", lambda: next(n)) == 0
    assert cache.get("a", lambda: next(n)) == 1
    assert cache.get("b", lambda: next(n), final=True) == 2
    assert cache.get("b", lambda: next(n), final=True) == 2


def test_peek_tells_a_hit_a_flight_and_a_miss_without_computing():
    cache = SingleFlightCache(ttl_s=60)
    assert cache.peek("k") == ("miss", None)
    release = threading.Event()
    value = object()
    owner = threading.Thread(target=cache.get, args=("k", lambda: release.wait(10) and value))
    owner.start()
    _wait_for(lambda: cache.peek("k")[0] == "flight")
    state, flight = cache.peek("k")
    assert state == "flight" and not flight.done()
    release.set()
    assert flight.result(10) is value  # a waiter gets the owner's value from the flight
    owner.join(10)
    assert cache.peek("k") == ("hit", value)
    cache.get("f", lambda: value, final=True)
    cache.ttl_s = 0.0  # everything not final is stale now
    assert cache.peek("k") == ("miss", None)  # and peek computed nothing
    assert cache.peek("f") == ("hit", value)  # final entries never expire


def test_the_byte_bound_evicts_least_recently_used():
    cache = SingleFlightCache(max_bytes=250)  # room for two 100-byte values, not three
    for key in "ab":
        cache.get(key, lambda: b"x" * 100, final=True)
    assert cache.get("a", lambda: b"new", final=True) == b"x" * 100  # a hit: a is now the newest
    cache.get("c", lambda: b"x" * 100, final=True)  # pushes out b, the least recently used
    assert cache.peek("a") == ("hit", b"x" * 100)  # oldest by insertion, but read since (no FIFO)
    assert cache.peek("c") == ("hit", b"x" * 100)
    assert cache.peek("b") == ("miss", None)


def test_the_version_follows_states_and_progress():
    class Info:
        status, counts, progress, n_trials = "running", {"running": 2}, 0.5, 2

    a = sweep_version(Info)
    Info.progress = 0.75
    b = sweep_version(Info)
    Info.status = "completed"
    c = sweep_version(Info)
    assert len({a, b, c}) == 3 and not a[0] and c[0]  # only a finished sweep is final


@pytest.mark.sqlite_only
def test_answers_follow_every_write(api):
    s = api.post("/sweeps", json=spec(depth=[2], seeds=2, epochs=3)).json()
    trials = fill(api, s["id"], epochs=1)
    query = {"metric": "train_loss", "epoch": "last"}
    first = api.get(f"/sweeps/{s['id']}/metrics", params=query).json()
    assert {r["epoch"] for r in first["data"]} == {0}
    api.store.write_records([(t["id"], record(t["id"], 1, 2)) for t in trials])
    second = api.get(f"/sweeps/{s['id']}/metrics", params=query).json()
    assert {r["epoch"] for r in second["data"]} == {1}  # not the cached epoch-0 answer
    svg = {"format": "svg", "metric": "train_loss"}
    before = api.get(f"/sweeps/{s['id']}/plots/training_curves", params=svg).content
    api.store.write_records([(t["id"], record(t["id"], 2, 2)) for t in trials])
    after = api.get(f"/sweeps/{s['id']}/plots/training_curves", params=svg).content
    assert before != after
