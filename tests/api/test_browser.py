"""The dashboard in headless Chromium (Debian's /usr/bin/chromium through Playwright; no browser
is downloaded) against a live server: a finished sweep from the sweeps list to its charts (drawn
from the plot routes' JSON; tests/api/test_browser_charts.py tries them out) and a trial; a
running sweep whose progress changes in place while results are stored; cancelling with the API
token; a plot that cannot be drawn says why. Screenshots go to artifacts/.

Skipped when Chromium is missing, unless ISOSWEEP_REQUIRE_BROWSER=1 (CI), where that fails."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from api_support import fill, record, run_trial, spec, submit, value_of
from support import require

from service.config import METRICS

# The page does not depend on the backend (test_dashboard.py covers both): SQLite.
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.sqlite_only]

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 20_000  # for the page to poll, re-render or draw (the polls are 2 s apart)
# Every plot of the page drawn: a chart (static/charts.js) once it has drawn its JSON, each of its
# panels a uPlot canvas of some width; an image (a heatmap) once loaded.
PLOTS_DRAWN = """() => {
    const charts = [...document.querySelectorAll("figure[data-chart]")];
    const imgs = [...document.querySelectorAll("img[data-plot]")];
    return charts.length + imgs.length > 0
        && charts.every((f) => f.dataset.drawn && f.querySelector(".chart-panel canvas"))
        && imgs.every((i) => i.complete && i.naturalWidth > 0);
}"""
# Per chart of the page: its plot route (format=json), and per panel its series' labels and the
# points each draws (uPlot's data, a null where nothing is drawn).
CHARTS = """() => [...document.querySelectorAll("figure[data-chart]")].map((f) => ({
    src: f.dataset.chart,
    width: f.querySelector(".chart-panel canvas").getBoundingClientRect().width,
    panels: [...f.querySelectorAll(".chart-panel")].map((box) => box._uplot.series.slice(1)
        .map((s, i) => [s.label, box._uplot.data[i + 1].filter((v) => v != null).length])),
}))"""


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        reason = f"Chromium not found at {CHROMIUM} (`make browser` installs Debian's package)"
        if require("ISOSWEEP_REQUIRE_BROWSER"):
            pytest.fail(f"ISOSWEEP_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def tab(browser):
    """A fresh page that records script errors and failed requests other than the API's
    deliberate 4xx answers and the event stream the page closes itself (on `end`: closing an
    EventSource whose response the server has not ended yet aborts it, net::ERR_ABORTED)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.errors = []

    def failed(r) -> None:
        if r.url.endswith("/events") and r.failure == "net::ERR_ABORTED":
            return  # the page's own stream.close(); a lost stream shows as a poll instead
        page.errors.append(f"{r.url}: {r.failure}")

    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("requestfailed", failed)
    page.on(  # what the page's Content-Security-Policy refuses (an inline style, another host)
        "console",
        lambda m: page.errors.append(m.text) if "Content Security Policy" in m.text else None,
    )
    page.set_default_timeout(WAIT_MS)
    yield page
    context.close()


def run_all(api, sweep_id):
    """Every trial started, its records stored (api_support.fill), completed; the sweep too."""
    for t in api.store.list_trials(sweep_id)[0]:
        api.store.start_trial(t.id)  # before writing: a new attempt starts from no results
    trials = fill(api, sweep_id)
    for t in trials:
        api.store.finish_trial(t["id"], "completed")
    api.store.finish_sweep(sweep_id)
    return trials


def test_a_finished_sweep_from_the_list_to_its_plots_and_a_trial(api, tab, artifacts_dir):
    sid = submit(api, spec("bn-depth", depth=[2, 4], init=["gaussian", "orthogonal"]))["id"]
    trials = run_all(api, sid)

    tab.goto(api.url + "/")
    link = tab.locator(f'tr[data-sweep-id="{sid}"] a', has_text="bn-depth")
    assert "completed" in tab.locator(f'tr[data-sweep-id="{sid}"] .badge').inner_text()
    tab.screenshot(path=artifacts_dir / "dashboard-index.png", full_page=True)
    link.click()
    tab.wait_for_url(f"**/sweeps/{sid}")
    assert tab.locator("table.trials tbody tr[data-trial-id]").count() == len(trials) == 8
    tab.wait_for_function(PLOTS_DRAWN)
    (chart,) = tab.evaluate(CHARTS)  # the default: grad_norm against depth, a line per init
    assert "/plots/depth_scaling?" in chart["src"] and "format=json" in chart["src"]
    assert chart["panels"] == [[["gaussian", 2], ["orthogonal", 2]]] and chart["width"] > 400
    tab.screenshot(path=artifacts_dir / "dashboard-sweep.png", full_page=True)

    tab.locator("table.trials tbody a").first.click()
    tab.wait_for_url(f"**/trials/{trials[0]['id']}")
    tab.wait_for_function(PLOTS_DRAWN)
    charts = tab.evaluate(CHARTS)  # its gap and gradient norm over 2 layers, 2 training panels
    assert [len(c["panels"]) for c in charts] == [1, 1, 2]
    assert [c["panels"][0][0][1] for c in charts] == [2, 2, 3]  # layers 1, 2; epochs 0..2
    assert "completed" in tab.locator("#trial-head .badge").inner_text()
    tab.screenshot(path=artifacts_dir / "dashboard-trial.png", full_page=True)
    assert tab.errors == []


def test_a_plot_that_cannot_be_drawn_says_why(api, tab):
    s = submit(api, spec("why", seeds=1))
    fill(api, s["id"])
    tab.goto(f"{api.url}/sweeps/{s['id']}?kind=theory_overlay&metric=weight_isometry_gap")
    caption = tab.locator("figure.plot .plot-error")
    caption.wait_for(state="visible")
    text = caption.inner_text()
    assert "metric" in text and "isometry_gap/norm" in text  # the API's message, allowed values
    assert tab.locator("figure.plot .chart-panel").count() == 0  # no chart drawn
    # the form greys out what the kind ignores: layer_profile takes no layer
    tab.select_option("select[data-kind]", "layer_profile")
    assert tab.locator("input[name=layer]").is_disabled()
    assert not tab.locator("input[name=epoch]").is_disabled()


def test_a_running_sweep_updates_in_place(api, tab, browser, artifacts_dir):
    s = submit(api, spec("live", seeds=2, epochs=3))  # 2 trials × 4 records
    sid = s["id"]
    api.store.claim_sweep("test-runner", 600.0)
    first, second = api.store.list_trials(sid)[0]
    api.store.start_trial(first.id)
    api.store.write_records([(first.id, record(first.id, 0, first.config["depth"]))])

    index = browser.new_page()
    index.goto(api.url + "/")
    tab.goto(f"{api.url}/sweeps/{sid}")
    pct = tab.locator("#sweep-head .pct")
    assert pct.inner_text() == "12%"  # 1 of 8 records
    assert "running" in tab.locator(f'tr[data-trial-id="{first.id}"] .badge').inner_text()
    tab.evaluate("window.__notReloaded = true")
    index.evaluate("window.__notReloaded = true")

    batch = [(first.id, record(first.id, e, first.config["depth"])) for e in (1, 2, 3)]
    api.store.write_records(batch)
    api.store.finish_trial(first.id, "completed")
    tab.wait_for_function("() => document.querySelector('#sweep-head .pct').textContent === '50%'")
    row = tab.locator(f'tr[data-trial-id="{first.id}"]')
    row.locator(".badge", has_text="completed").wait_for()
    final_loss = value_of(first.id, 3, METRICS.index("train_loss"))
    assert f"{final_loss:g}" in row.inner_text()
    index.wait_for_function(
        f"() => document.querySelector('tr[data-sweep-id=\"{sid}\"] .pct').textContent === '50%'"
    )
    tab.screenshot(path=artifacts_dir / "dashboard-running.png", full_page=True)

    run_trial(api, second, train_loss=math.inf)  # epochs 0..3, completed
    api.store.finish_sweep(sid)
    tab.locator("#sweep-head .badge", has_text="completed").wait_for()
    assert tab.locator(f'tr[data-trial-id="{second.id}"] .nonfinite').first.inner_text() == "∞"
    assert tab.locator("#cancel").is_hidden()  # nothing left to cancel
    assert tab.evaluate("window.__notReloaded") is True  # updated in place, never reloaded
    assert index.evaluate("window.__notReloaded") is True

    # finished: the page stops polling the API
    polls: list[str] = []
    tab.on("request", lambda r: polls.append(r.url) if "/api/v1/sweeps/" in r.url else None)
    tab.wait_for_timeout(5000)  # 2.5 poll intervals
    assert [u for u in polls if u.endswith(f"/api/v1/sweeps/{sid}")] == []
    index.close()
    assert tab.errors == []


def test_cancel_from_the_page_with_the_token(start_api, tab):
    api = start_api(api_token="s3cret", open_reads=True)  # the page asks for it on cancel
    s = submit(api, spec("stop-me", seeds=1), token="s3cret")
    tab.on("dialog", lambda d: d.accept())
    tab.goto(f"{api.url}/sweeps/{s['id']}")

    tab.fill("#cancel input[name=token]", "wrong")
    tab.click("#cancel button")
    message = tab.locator("#cancel .cancel-msg.error")
    message.wait_for()
    assert "Authorization: Bearer" in message.inner_text()  # the server's 401 message
    assert api.store.get_sweep(s["id"]).cancel_requested is False

    tab.fill("#cancel input[name=token]", "s3cret")
    tab.click("#cancel button")
    tab.locator("#sweep-head .badge", has_text="cancelled").wait_for()
    assert api.store.get_sweep(s["id"]).status == "cancelled"
    assert tab.locator("#cancel").is_hidden()
