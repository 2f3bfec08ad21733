"""`GET /sweeps/{id}/events` over a live server (uvicorn, SQLite and Postgres): a sweep's
progress and finished trials as server-sent events while the store is written by hand, the
stream's end when the sweep is final, and `isosweep submit --wait` following the stream rather
than polling (its poll interval set to an hour)."""

from __future__ import annotations

import math
import threading
import time

import httpx
import pytest
from api_support import record, spec, submit
from test_cli_client import cli, plain, spec_file

from api.routes import events as events_route
from isosweep.client import sse_events


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    monkeypatch.setattr(events_route, "POLL_S", 0.05)  # the server runs in this process


def _listen(api, sweep_id, got: list, ready: threading.Event):
    c = httpx.Client(base_url=f"{api.url}/api/v1", timeout=30)
    with c, c.stream("GET", f"/sweeps/{sweep_id}/events") as r:
        got.append(("status", r.status_code, r.headers["content-type"]))
        for item in sse_events(r.iter_lines()):
            got.append(item)
            ready.set()


def _wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_stream_follows_the_sweep_to_its_end(api):
    s = submit(api, spec("live", seeds=2, depth=2))
    got: list = []
    ready = threading.Event()
    listener = threading.Thread(target=_listen, args=(api, s["id"], got, ready))
    listener.start()
    assert ready.wait(20)
    trials = api.store.list_trials(s["id"])[0]
    api.store.claim_sweep("r1", 60.0)
    api.store.start_trial(trials[0].id)
    api.store.write_records(
        [(trials[0].id, record(trials[0].id, e, 2, train_loss=math.nan)) for e in range(3)]
    )
    api.store.finish_trial(trials[0].id, "completed")
    _wait_for(lambda: any(name == "trial" for name, *_ in got[1:]))
    api.store.start_trial(trials[1].id)
    api.store.write_records([(trials[1].id, record(trials[1].id, e, 2)) for e in range(3)])
    api.store.finish_trial(trials[1].id, "diverged")
    api.store.finish_sweep(s["id"])
    listener.join(30)
    assert not listener.is_alive()  # the server closed the stream at the end
    assert got[0] == ("status", 200, "text/event-stream; charset=utf-8")
    names = [name for name, _ in got[1:]]
    assert names[0] == "progress" and names[-1] == "end" and names.count("end") == 1
    first = got[1][1]
    assert first["id"] == s["id"] and first["status"] == "queued" and first["progress"] == 0
    finished = [data for name, data in got[1:] if name == "trial"]
    assert [(t["id"], t["status"]) for t in finished] == [
        (trials[0].id, "completed"),
        (trials[1].id, "diverged"),
    ]
    assert finished[0]["summary"]["train_loss"] == "NaN"  # the API's spelling, as in JSON
    assert names.index("trial") > names.index("progress")
    progress = [data for name, data in got[1:] if name == "progress"]
    assert any(p["status"] == "running" for p in progress)
    end = got[-1][1]
    assert end["status"] == "completed" and end["counts"]["diverged"] == 1 and end["progress"] == 1


def test_a_final_sweep_ends_at_once_and_a_missing_one_is_404(api):
    s = submit(api, spec("done", seeds=1, depth=2))
    api.store.request_cancel(s["id"])  # a queued sweep is cancelled at once
    r = api.get(f"/sweeps/{s['id']}/events")
    assert r.status_code == 200
    items = list(sse_events(r.text.splitlines()))
    assert [name for name, _ in items] == ["progress", "end"]
    assert items[-1][1]["status"] == "cancelled"
    assert "id: 1\nevent: progress\n" in r.text and "id: 2\nevent: end\n" in r.text
    r = api.get("/sweeps/999/events")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"


def test_the_client_reads_the_events(api):
    import isosweep

    s = submit(api, spec("client", seeds=1, depth=2))
    api.store.request_cancel(s["id"])
    with isosweep.Client(api.url) as c:
        assert [name for name, _ in c.events(s["id"])] == ["progress", "end"]
        with pytest.raises(isosweep.ApiError) as info:
            list(c.events(999))
        assert info.value.status == 404


def test_sse_lines_are_parsed_as_the_format_says():
    lines = [": keep-alive", "", "id: 1", "event: trial", 'data: {"a":', "data: 1}", "",
             "data: [1]", ""]  # fmt: skip
    assert list(sse_events(lines)) == [("trial", {"a": 1}), ("message", [1])]


@pytest.mark.sqlite_only
def test_submit_wait_follows_the_stream(api, tmp_path):
    """--poll-s 3600: a command that polled would wait an hour; the events end it at once."""

    def finish_when_stored():
        _wait_for(lambda: api.store.list_sweeps()[1] > 0)
        (sweep,), _ = api.store.list_sweeps()
        time.sleep(0.5)  # the command is following the stream by now
        for t in api.store.list_trials(sweep.id, limit=1000)[0]:
            api.store.start_trial(t.id)
            batch = [(t.id, record(t.id, e, t.config["depth"])) for e in range(3)]
            api.store.write_records(batch)
            api.store.finish_trial(t.id, "completed")
        api.store.finish_sweep(sweep.id)

    worker = threading.Thread(target=finish_when_stored)
    worker.start()
    started = time.monotonic()
    r = cli(api, "submit", spec_file(tmp_path), "--wait", "--poll-s", "3600", timeout=120)
    worker.join()
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.monotonic() - started < 60
    assert "completed" in plain(r.stdout) and "trials 8/8" in plain(r.stderr)
