"""A running sweep's page in headless Chromium (as test_browser.py, whose fixtures it uses) follows
the sweep's event stream, `GET /api/v1/sweeps/{id}/events` (docs/dashboard.md, "Live"): records
written into the store while the page is open change its progress and trials table in place, with
no reload and no poll of the JSON API; the stream closes at the sweep's end. With a token set and
reads not open, the stream is authorized by the dashboard's session cookie alone. A stream the
server refuses (503: too many open) leaves the page polling instead.

The screenshot goes to artifacts/, or to docs/img/dashboard/live.png with
ISOSWEEP_UPDATE_SCREENSHOTS=1."""

from __future__ import annotations

import math

import pytest
from api_support import record, run_trial, spec, submit, value_of
from test_browser import browser, tab  # noqa: F401  (fixtures)
from test_trial_page_browser import shots  # noqa: F401  (fixture)

from api.routes import events as events_route
from service.config import METRICS

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.sqlite_only]

TOKEN = "s3cret"


@pytest.fixture(autouse=True)
def fast_stream(monkeypatch):
    monkeypatch.setattr(events_route, "POLL_S", 0.1)  # the server runs in this process


def pct_is(text: str) -> str:
    return f"() => document.querySelector('#sweep-head .pct').textContent === '{text}'"


def watch_requests(page, sweep_id: int) -> tuple[list[str], list[str]]:
    """(event-stream requests, JSON polls of the sweep) the page makes from now on."""
    streams: list[str] = []
    polls: list[str] = []
    poll_url = f"/api/v1/sweeps/{sweep_id}"

    def seen(r):
        if r.url.endswith(poll_url + "/events"):
            streams.append(r.resource_type)
        elif r.url.endswith(poll_url):
            polls.append(r.url)

    page.on("request", seen)
    return streams, polls


def log_in(page, api, path: str) -> None:
    page.goto(f"{api.url}{path}")  # no session yet: the login page, which comes back here
    page.fill("input[name=token]", TOKEN)
    page.click("form.login button[type=submit]")
    page.wait_for_url(f"**{path}")


def test_a_running_sweep_follows_its_event_stream(start_api, tab, shots):  # noqa: F811
    api = start_api(api_token=TOKEN)  # reads need the token: the page has only its cookie
    sid = submit(api, spec("live", seeds=2, epochs=3), token=TOKEN)["id"]  # 2 trials × 4 records
    api.store.claim_sweep("test-runner", 600.0)
    first, second = api.store.list_trials(sid)[0]
    api.store.start_trial(first.id)
    api.store.write_records([(first.id, record(first.id, 0, first.config["depth"]))])

    streams, polls = watch_requests(tab, sid)
    log_in(tab, api, f"/sweeps/{sid}")
    assert tab.locator("#sweep-head .pct").inner_text() == "12%"  # 1 of 8 records
    assert tab.get_attribute("body", "data-events") == f"/api/v1/sweeps/{sid}/events"
    tab.wait_for_function("() => document.getElementById('live-note').textContent === 'live'")
    tab.evaluate("window.__notReloaded = true")

    batch = [(first.id, record(first.id, e, first.config["depth"])) for e in (1, 2, 3)]
    api.store.write_records(batch)
    api.store.finish_trial(first.id, "completed")
    tab.wait_for_function(pct_is("50%"))
    row = tab.locator(f'tr[data-trial-id="{first.id}"]')
    row.locator(".badge", has_text="completed").wait_for()
    final_loss = value_of(first.id, 3, METRICS.index("train_loss"))
    assert f"{final_loss:g}" in row.inner_text()
    api.store.start_trial(second.id)
    api.store.write_records([(second.id, record(second.id, 0, second.config["depth"]))])
    tab.wait_for_function(pct_is("62%"))
    tab.locator(f'tr[data-trial-id="{second.id}"] .badge', has_text="running").wait_for()
    tab.screenshot(path=shots / "live.png", full_page=True)

    run_trial(api, second, train_loss=math.inf)  # epochs 0..3, completed
    api.store.finish_sweep(sid)
    tab.locator("#sweep-head .badge", has_text="completed").wait_for()
    tab.wait_for_function(pct_is("100%"))
    assert tab.locator(f'tr[data-trial-id="{second.id}"] .nonfinite').first.inner_text() == "∞"
    assert tab.locator("#cancel").is_hidden()
    assert tab.evaluate("window.__notReloaded") is True  # updated in place, never reloaded
    tab.wait_for_timeout(3000)  # 1.5 poll intervals: nothing reopens the stream or polls
    assert streams == ["eventsource"]  # one stream, opened by the page, never reopened
    assert polls == []  # the JSON API was never polled
    assert tab.inner_text("#live-note") == ""
    # closed by the page at `end`, perhaps before the server's last chunk: an aborted request
    aborted = f"{api.url}/api/v1/sweeps/{sid}/events: net::ERR_ABORTED"
    assert [e for e in tab.errors if e != aborted] == []


def test_a_refused_stream_falls_back_to_polling(api, tab, monkeypatch):  # noqa: F811
    monkeypatch.setattr(events_route, "MAX_STREAMS", 0)  # every stream: 503
    s = submit(api, spec("refused", seeds=1, epochs=1))  # 1 trial × 2 records
    (trial,) = api.store.list_trials(s["id"])[0]
    api.store.claim_sweep("test-runner", 600.0)
    streams, polls = watch_requests(tab, s["id"])
    tab.goto(f"{api.url}/sweeps/{s['id']}")
    tab.wait_for_function(
        "() => document.getElementById('live-note').textContent === 'live stream lost; polling'"
    )
    run_trial(api, trial, status="running")
    tab.wait_for_function(pct_is("100%"))
    assert streams and polls  # it tried the stream, then polled
    api.store.finish_trial(trial.id, "completed")
    api.store.finish_sweep(s["id"])
    tab.locator("#sweep-head .badge", has_text="completed").wait_for()
    # the refused stream, closed by the page on its error (Chromium may log it as aborted)
    aborted = f"{api.url}/api/v1/sweeps/{s['id']}/events: net::ERR_ABORTED"
    assert [e for e in tab.errors if e != aborted] == []
