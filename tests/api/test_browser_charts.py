"""The dashboard's interactive charts in headless Chromium (as tests/api/test_browser.py, whose
fixtures it uses), over a live server whose store holds hand-made records (tests/records.py: each
value known from where it sits): what a person sees — the points and legend entries of a known
sweep, the hover text naming a stored value, a legend entry that hides its line, the log switch
(and its refusal where an axis has values ≤ 0), drag to zoom and double-click back, a non-finite
value pinned at the edge, the API's 422 message where a kind cannot be drawn, and a running
sweep's chart re-drawn in place as results arrive.

Screenshots go to artifacts/, or to docs/img/dashboard/ with ISOSWEEP_UPDATE_SCREENSHOTS=1."""

from __future__ import annotations

import math
import time

import pytest
from api_support import fill, record, spec, submit, value_of
from test_browser import browser, run_all, tab  # noqa: F401  (fixtures)
from test_trial_page_browser import shots  # noqa: F401  (fixture)

from service.config import METRICS

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.sqlite_only]

GRAD = METRICS.index("grad_norm")
CHARTS_DRAWN = """() => {
    const figs = [...document.querySelectorAll("figure[data-chart]")];
    return figs.length > 0 && figs.every((f) => f.dataset.drawn);
}"""
# Per panel of the first chart: each series' label, its drawn (non-null) points, shown or not;
# the legend's entries; the y scale's distribution (1 linear, 3 log).
PANELS = """() => [...document.querySelectorAll("figure[data-chart] .chart-panel")].map((box) => {
    const u = box._uplot;
    return {
        series: u.series.slice(1).map((s, i) => ({label: s.label, show: s.show,
            points: u.data[i + 1].filter((v) => v !== null && v !== undefined).length})),
        legend: [...box.querySelectorAll(".u-legend .u-series")].map((r) => r.textContent.trim()),
        off: [...box.querySelectorAll(".u-legend .u-off")].map((r) => r.textContent.trim()),
        ydistr: u.scales.y.distr, xmin: u.scales.x.min, xmax: u.scales.x.max,
    };
})"""
# The page position (CSS px) of a data point of the first panel (x, y in data units), a pixel
# inside the plot area where the point sits on its edge (the cursor is over the plot there).
POINT_AT = """([x, y]) => {
    const u = document.querySelector("figure[data-chart] .chart-panel")._uplot;
    const r = u.over.getBoundingClientRect();
    const inside = (v, size) => Math.min(Math.max(v, 1), size - 1);
    return [r.left + inside(u.valToPos(x, "x"), r.width),
            r.top + inside(u.valToPos(y, "y"), r.height)];
}"""
DEPTHS = (2, 4, 8)


def fmt(v: float) -> str:
    """A value as the chart's hover writes it (charts.js fmt: 6 significant digits)."""
    return f"{v:.6g}"


@pytest.fixture
def depth_sweep(api):
    """depth 2, 4, 8 × init gaussian, orthogonal, one seed, epochs 0..2, completed."""
    body = spec("charts", seeds=1, depth=list(DEPTHS), init=["gaussian", "orthogonal"])
    sid = submit(api, body)["id"]
    trials = run_all(api, sid)
    tid = {(t["config"]["init"], t["config"]["depth"]): t["id"] for t in trials}
    return sid, tid


def open_chart(page, api, path: str) -> list[dict]:
    page.goto(api.url + path)
    page.wait_for_function(CHARTS_DRAWN)
    return page.evaluate(PANELS)


def hover_text(page, x: float, y: float) -> str:
    px, py = page.evaluate(POINT_AT, [x, y])
    page.mouse.move(px - 3, py + 2)
    page.mouse.move(px, py)
    tip = page.locator("figure[data-chart] .chart-tip").first
    tip.wait_for(state="visible")
    return tip.inner_text()


GRAD_PAGE = "kind=depth_scaling&metric=grad_norm&layer=1&group_by=init&stat=mean"


def test_a_chart_shows_its_points_hover_values_and_hides_a_line(api, tab, depth_sweep, shots):  # noqa: F811
    sid, tid = depth_sweep
    (panel,) = open_chart(tab, api, f"/sweeps/{sid}?{GRAD_PAGE}")
    assert [s["label"] for s in panel["series"]] == ["gaussian", "orthogonal"]
    assert [s["points"] for s in panel["series"]] == [3, 3]  # one per depth
    assert panel["legend"] == ["gaussian", "orthogonal"]
    assert panel["ydistr"] == 3  # a gradient norm against depth: log, as the figure
    assert tab.get_attribute("figure[data-chart] + p.plot-links a", "href").endswith("format=svg")

    stored = value_of(tid[("orthogonal", 4)], 2, GRAD, 1)  # the mean of one seed: the value
    text = hover_text(tab, 4, stored)
    assert text.splitlines()[:2] == ["orthogonal", f"x = 4 · y = {fmt(stored)}"]
    shoot(tab, shots / "chart-hover.png")

    tab.locator(".u-legend .u-series", has_text="gaussian").click()
    (panel,) = tab.evaluate(PANELS)
    assert [s["show"] for s in panel["series"]] == [False, True]
    assert panel["off"] == ["gaussian"]
    low = value_of(tid[("gaussian", 2)], 2, GRAD, 1)
    px, py = tab.evaluate(POINT_AT, [2, low])
    tab.mouse.move(px, py)
    tip = tab.locator("figure[data-chart] .chart-tip").first
    assert tip.is_hidden() or "gaussian" not in tip.inner_text()  # a hidden line has no hover
    assert tab.errors == []


def shoot(page, path) -> None:
    """A screenshot of the page's first chart, whole (scrolled into view)."""
    page.locator("figure[data-chart]").first.screenshot(path=path)


def test_the_log_switch_and_its_refusal_for_values_at_or_below_zero(api, tab, depth_sweep, shots):  # noqa: F811
    sid, _ = depth_sweep
    (panel,) = open_chart(tab, api, f"/sweeps/{sid}?{GRAD_PAGE}&yscale=linear")
    assert panel["ydistr"] == 1
    tab.select_option("figure[data-chart] select[data-axis=y]", "log")
    tab.wait_for_function(
        "() => document.querySelector('.chart-panel')._uplot.scales.y.distr === 3"
    )
    ticks = tab.evaluate(
        "() => document.querySelector('.chart-panel')._uplot.axes[1]._values || []"
    )
    assert ticks and all(t.replace("0", "") in ("1", "2", "5") for t in ticks), ticks  # 1-2-5
    (panel,) = tab.evaluate(PANELS)
    assert [s["points"] for s in panel["series"]] == [3, 3]  # every value positive: all drawn

    # training curves: the x axis holds epoch 0, so log is refused there (greyed, disabled)
    open_chart(tab, api, f"/sweeps/{sid}?kind=training_curves&metric=train_loss")
    x_log = tab.locator("figure[data-chart] select[data-axis=x] option[value=log]").first
    assert x_log.is_disabled()
    assert "values ≤ 0" in tab.locator("label.chart-scale.off").first.get_attribute("title")
    shoot(tab, shots / "chart-training.png")
    assert tab.errors == []


def test_drag_zooms_and_a_double_click_zooms_out(api, tab, depth_sweep):  # noqa: F811
    sid, _ = depth_sweep
    (panel,) = open_chart(tab, api, f"/sweeps/{sid}?{GRAD_PAGE}")
    full = (panel["xmin"], panel["xmax"])
    assert full == (2, 8)
    box = tab.evaluate(
        "() => { const r = document.querySelector('.chart-panel')._uplot.over"
        ".getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; }"
    )
    left, top, width, height = box
    tab.mouse.move(left + 0.05 * width, top + height / 2)
    tab.mouse.down()
    tab.mouse.move(left + 0.5 * width, top + height / 2, steps=5)
    tab.mouse.up()
    (panel,) = tab.evaluate(PANELS)
    assert full[0] < panel["xmax"] < full[1] and panel["xmin"] >= full[0]
    tab.mouse.dblclick(left + width / 2, top + height / 2)
    (panel,) = tab.evaluate(PANELS)
    assert (panel["xmin"], panel["xmax"]) == full
    assert tab.errors == []


def test_a_nonfinite_value_is_pinned_at_the_edge_and_hovered(api, tab, shots):  # noqa: F811
    s = submit(api, spec("inf", seeds=1, depth=[2, 4], epochs=0))
    trials = api.store.list_trials(s["id"])[0]
    for t in trials:
        api.store.start_trial(t.id)
    grads = {2: [1.0, 2.0], 4: [1.0, math.inf, 2.0, 3.0]}  # +∞ at ℓ = 2 of depth 4
    api.store.write_records([
        (t.id, record(t.id, 0, t.config["depth"], grad_norm=grads[t.config["depth"]]))
        for t in trials
    ])  # fmt: skip
    for t in trials:
        api.store.finish_trial(t.id, "completed")
    api.store.finish_sweep(s["id"])
    path = f"/sweeps/{s['id']}?kind=layer_profile&metric=grad_norm&group_by=depth&stat=mean"
    (panel,) = open_chart(tab, api, path)
    assert [(x["label"], x["points"]) for x in panel["series"]] == [("2", 2), ("4", 3)]
    notes = tab.inner_text("figure[data-chart] .chart-notes")
    assert "mean = +∞: 1 point (at the top edge)" in notes  # the figure's legend entry
    px, _ = tab.evaluate(POINT_AT, [2, 1.0])
    top = tab.evaluate("() => document.querySelector('.chart-panel')._uplot.over"
                       ".getBoundingClientRect().top")  # fmt: skip
    tab.mouse.move(px, top + 1)
    tip = tab.locator("figure[data-chart] .chart-tip").first
    tip.wait_for(state="visible")
    assert tip.inner_text().splitlines()[:2] == ["4", "x = 2 · y = +∞"]
    shoot(tab, shots / "chart-pinned.png")
    assert tab.errors == []


def test_a_kind_that_cannot_be_drawn_shows_the_apis_message(api, tab):  # noqa: F811
    s = submit(api, spec("why", seeds=1))
    fill(api, s["id"])
    tab.goto(f"{api.url}/sweeps/{s['id']}?kind=depth_scaling&layer=9")  # depth 2: no ℓ = 9
    caption = tab.locator("figure.plot .plot-error")
    caption.wait_for(state="visible")
    src = tab.get_attribute("figure[data-chart]", "data-chart")
    assert "format=json" in src
    message = api.client.get(api.url + src).json()["error"]["message"]  # the 422
    assert caption.inner_text() == f"This plot cannot be drawn: {message}"
    assert tab.locator("figure[data-chart] .chart-panel").count() == 0
    assert tab.errors == []


def test_a_busy_server_is_asked_again_before_the_chart_shows_an_error(api, tab):  # noqa: F811
    """The chart's first fetch answered 503 Retry-After: 1 (as a full heavy-read queue answers,
    api/limits.py); the page waits the second and asks again, and the chart is drawn with no
    error shown. The answer is made at the browser's network edge: the server's own 503 is
    tested in tests/api/test_limits.py."""
    s = submit(api, spec("busy", seeds=1))
    fill(api, s["id"])
    asked: list[float] = []

    def busy_once(route) -> None:
        asked.append(time.monotonic())
        if len(asked) == 1:
            body = '{"error":{"type":"http_error","message":"the server is busy"}}'
            headers = {"Retry-After": "1", "Content-Type": "application/json"}
            route.fulfill(status=503, headers=headers, body=body)
        else:
            route.continue_()

    tab.route("**/plots/**format=json**", busy_once)
    tab.goto(f"{api.url}/sweeps/{s['id']}")
    tab.wait_for_function(CHARTS_DRAWN)
    assert len(asked) == 2 and asked[1] - asked[0] >= 0.9  # waited out its Retry-After
    assert tab.locator("figure[data-chart] .plot-error").inner_text() == ""
    assert tab.locator("figure[data-chart] .chart-panel").count() >= 1
    assert tab.errors == []


def test_a_running_sweeps_chart_is_redrawn_in_place(api, tab, shots):  # noqa: F811
    s = submit(api, spec("live-chart", seeds=1, epochs=3))
    (trial,) = api.store.list_trials(s["id"])[0]
    api.store.claim_sweep("test-runner", 600.0)
    api.store.start_trial(trial.id)
    api.store.write_records([(trial.id, record(trial.id, 0, trial.config["depth"]))])
    path = f"/sweeps/{s['id']}?kind=training_curves&metric=train_loss"
    (panel,) = open_chart(tab, api, path)
    assert [x["points"] for x in panel["series"]] == [1]
    tab.evaluate("window.__notReloaded = true")
    batch = [(trial.id, record(trial.id, e, trial.config["depth"])) for e in (1, 2, 3)]
    api.store.write_records(batch)
    api.store.finish_trial(trial.id, "completed")
    api.store.finish_sweep(s["id"])
    tab.wait_for_function(
        "() => document.querySelector('.chart-panel')._uplot.data[1].filter((v) => v !== null)"
        ".length === 4"
    )
    tab.locator("#sweep-head .badge", has_text="completed").wait_for()
    tab.wait_for_function("() => document.getElementById('live-note').textContent === ''")
    assert tab.evaluate("window.__notReloaded") is True
    stored = value_of(trial.id, 3, METRICS.index("train_loss"))
    assert hover_text(tab, 3, stored).splitlines()[1] == f"x = 3 · y = {fmt(stored)}"
    aborted = f"{api.url}/api/v1/sweeps/{s['id']}/events: net::ERR_ABORTED"
    assert [e for e in tab.errors if e != aborted] == []


def test_screenshots_of_the_charts(api, tab, shots):  # noqa: F811
    """The sweep page's default chart (a depth × init sweep of two seeds: bands) and the theory
    overlay (its predictions leave the measurements' y range: open triangles at the edge)."""
    body = spec("bn-depth", depth=[2, 4, 8], init=["gaussian", "orthogonal"], seeds=2)
    sid = submit(api, body)["id"]
    run_all(api, sid)
    open_chart(tab, api, f"/sweeps/{sid}")
    shoot(tab, shots / "chart-sweep.png")
    open_chart(tab, api, f"/sweeps/{sid}?kind=theory_overlay")
    shoot(tab, shots / "chart-theory_overlay.png")
    assert tab.errors == []
