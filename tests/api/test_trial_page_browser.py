"""The trial page and every plot kind as a person sees them (docs/dashboard.md, "Figures that
fit"), against a live server with hand-made records:

- without a browser: the trial page asks for full-width plots of the metrics its model records
  (an init-only trial gets no training-curves panel but a note), lists those metrics, and the
  default heatmap draws on a two- and a three-axis sweep, the same axes while the sweep fills;
- in headless Chromium (Debian's /usr/bin/chromium through Playwright, as tests/api/
  test_browser.py): each chart on the trial page (drawn from its plot's JSON) is at least 800 px
  wide and wholly in view; each plot kind's SVG (the download), opened in the browser, has every
  text's bounding box inside the figure's.

Screenshots go to artifacts/, or to docs/img/dashboard/ (the ones docs/dashboard.md shows) with
ISOSWEEP_UPDATE_SCREENSHOTS=1."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from api_support import fill, record, run_trial, spec, submit

from service.config import TrialConfig
from service.models import layer_metrics
from service.plots import field_label

pytestmark = [pytest.mark.sqlite_only]  # the pages do not depend on the backend

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard"
WIDE = 800  # px: the least width a trial page's plot is shown at, in a 1280 px window
SPECTRA = ("spectrum/linear", "spectrum/norm", "spectrum/act", "spectrum/weight")
K, M = 4, 16  # Jacobian: probe samples × singular values


@pytest.fixture
def shots(artifacts_dir) -> Path:
    if os.environ.get("ISOSWEEP_UPDATE_SCREENSHOTS", "") not in ("", "0"):
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        return DOCS_IMG
    return artifacts_dir


def finished(api, body) -> tuple[int, list]:
    """Submit the spec and run every trial with hand-made records; (sweep id, its trials)."""
    sid = submit(api, body)["id"]
    trials = api.store.list_trials(sid, limit=1000)[0]
    for t in trials:
        run_trial(api, t)
    api.store.finish_sweep(sid)
    return sid, trials


def plot_sources(html: str) -> list[str]:
    """The plots' images (a chart's is its figure without the script: in <noscript>)."""
    return [s.replace("&amp;", "&") for s in re.findall(r'<img data-plot src="([^"]+)"', html)]


def chart_sources(html: str) -> list[str]:
    """The plot routes (format=json) the page's charts draw."""
    return [s.replace("&amp;", "&") for s in re.findall(r'data-chart="([^"]+)"', html)]


# --- the page, without a browser ------------------------------------------------------------


def test_the_trial_page_draws_one_wide_plot_per_row(api):
    _, trials = finished(api, spec("wide", depth=[2, 4], seeds=1))
    html = api.client.get(f"{api.url}/trials/{trials[0].id}").text
    srcs = plot_sources(html)
    assert [s.split("/plots/")[1].split("?")[0] for s in srcs] == [
        "layer_profile", "layer_profile", "training_curves",
    ]  # fmt: skip
    assert "metric=isometry_gap%2Fact" in srcs[0] and "metric=grad_norm" in srcs[1]
    assert 'class="plot-column"' in html and 'class="plot-grid"' not in html
    for src in srcs:
        assert api.client.get(api.url + src).status_code == 200
    charts = chart_sources(html)  # each plot a chart of the same route and options, as JSON
    assert charts == [s.replace("format=svg", "format=json") for s in srcs]
    for src in charts:
        r = api.client.get(api.url + src)
        assert r.status_code == 200 and r.json()["panels"], src


def test_an_init_only_trial_has_no_training_curves_panel(api):
    _, (t,) = finished(api, spec("init", epochs=0, seeds=1))
    html = api.client.get(f"{api.url}/trials/{t.id}").text
    assert not [s for s in plot_sources(html) if "training_curves" in s]
    assert "init-only trial: no training epochs" in html
    assert len(plot_sources(html)) == 2  # its gap and gradient norm over layers, at init


def test_the_page_lists_the_metrics_the_trials_model_records(api):
    _, (t,) = finished(api, spec("tf", model="transformer", seeds=1))
    recorded = layer_metrics(TrialConfig.model_validate(t.config))
    html = api.client.get(f"{api.url}/trials/{t.id}").text
    section = html.split("Recorded per layer")[1]
    listed = re.findall(r"metric=([^&\"]+)", section)
    assert [m.replace("%2F", "/") for m in listed] == list(recorded)
    assert "isometry_gap/act" not in section and "token_isometry_gap" in section
    srcs = plot_sources(html)  # the residual stream's gap, grad norm, token gap, training
    assert "metric=isometry_gap%2Fresidual" in srcs[0]
    assert "metric=token_isometry_gap" in srcs[2]


# --- default plots from the spec -----------------------------------------------------------


def svg_texts(svg: bytes) -> list[str]:
    """The texts of a matplotlib SVG (each drawn text's group starts with it as a comment)."""
    return re.findall(r"<!-- (.*?) -->", svg.decode())


@pytest.mark.parametrize(
    "parameters",
    [
        {"depth": [2, 4], "init": ["gaussian", "orthogonal"]},
        {"depth": [2, 4], "init": ["gaussian", "orthogonal"], "width": [8, 16]},
        {"depth": [2, 4]},
        {},
    ],
)
def test_the_default_heatmap_draws_on_every_sweep_shape(api, parameters):
    body = spec("shape", seeds=2, **parameters)
    sid, _ = finished(api, body)
    r = api.get(f"/sweeps/{sid}/plots/heatmap", params={"format": "svg"})
    assert r.status_code == 200, r.text
    texts = svg_texts(r.content)
    swept = [k for k, v in body["parameters"].items() if isinstance(v, list)]  # spec order
    axes = [*swept, "layer"][:2] if swept else ["epoch", "layer"]  # x, then y
    assert all(field_label(a) in texts for a in axes), [t for t in texts if len(t) > 3]
    for name in swept[2:]:  # a third axis is held at its first value, and the note says so
        assert any(f"{name} = {body['parameters'][name][0]}" in t for t in texts)


def test_the_default_heatmap_keeps_its_axes_while_the_sweep_fills(api):
    s = submit(api, spec("filling", depth=[2, 4], init=["gaussian", "orthogonal"], seeds=1))
    trials = api.store.list_trials(s["id"])[0]
    run_trial(api, trials[0])  # one trial done: the rows vary in nothing yet
    first = api.get(f"/sweeps/{s['id']}/plots/heatmap", params={"format": "svg"})
    for t in trials[1:]:
        run_trial(api, t)
    api.store.finish_sweep(s["id"])
    last = api.get(f"/sweeps/{s['id']}/plots/heatmap", params={"format": "svg"})
    assert first.status_code == last.status_code == 200
    for r in (first, last):
        texts = svg_texts(r.content)
        assert "depth L (hidden blocks)" in texts and "init" in texts


# --- in Chromium -------------------------------------------------------------------------------

# Each chart panel's plot (its uPlot canvas: axes and plot area) as the page lays it out.
CHART_BOXES = """() => [...document.querySelectorAll("figure[data-chart] .chart-panel canvas")]
    .map((c) => {
        const r = c.getBoundingClientRect();
        return {width: r.width, left: r.left, right: r.right,
                view: document.documentElement.clientWidth};
    })"""
# Every text group of a matplotlib SVG (id text_N: titles, labels, ticks, legend entries) against
# the figure's own box (the root <svg>), in CSS px as the browser laid them out.
SVG_TEXT_BOXES = """() => {
    const root = document.documentElement.getBoundingClientRect();
    const texts = [...document.querySelectorAll('g[id^="text_"]')].map((g) => {
        const r = g.getBoundingClientRect();
        const label = (g.firstChild && g.firstChild.nodeType === 8) ? g.firstChild.data : g.id;
        return {label: label.trim(), x0: r.left, y0: r.top, x1: r.right, y1: r.bottom,
                empty: r.width === 0 && r.height === 0};
    });
    return {root: {x0: root.left, y0: root.top, x1: root.right, y1: root.bottom}, texts};
}"""


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    p.errors = []
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    p.set_default_timeout(20_000)
    yield p
    context.close()


@pytest.fixture(scope="module")
def browser():
    from test_browser import ARGS, CHROMIUM  # the dashboard's browser test: same Chromium

    if not CHROMIUM.exists():
        from support import require

        reason = f"Chromium not found at {CHROMIUM} (`make browser` installs Debian's package)"
        if require("ISOSWEEP_REQUIRE_BROWSER"):
            pytest.fail(f"ISOSWEEP_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        yield b
        b.close()


def plots_in_view(page) -> list[dict]:
    """Each chart panel of the page, drawn, at least WIDE px wide and wholly in view."""
    from test_browser import PLOTS_DRAWN

    page.wait_for_function(PLOTS_DRAWN)
    boxes = page.evaluate(CHART_BOXES)
    for b in boxes:
        assert b["width"] >= WIDE, b
        assert b["left"] >= 0 and b["right"] <= b["view"] + 0.5, b  # no horizontal scroll
    return boxes


@pytest.mark.browser
@pytest.mark.slow
def test_the_trial_page_shows_wide_plots_in_chromium(api, page, shots):
    _, trials = finished(api, spec("trial-page", depth=[4, 8], init=["gaussian", "orthogonal"]))
    page.goto(f"{api.url}/trials/{trials[-1].id}")
    boxes = plots_in_view(page)
    assert len(boxes) == 4  # its gap and gradient norm, the training curves' two panels
    assert page.locator("figure[data-chart]").count() == 3
    page.screenshot(path=shots / "trial.png", full_page=True)

    _, (init,) = finished(api, spec("init-only", epochs=0, seeds=1))
    page.goto(f"{api.url}/trials/{init.id}")
    assert len(plots_in_view(page)) == 2
    note = page.locator("#init-only")
    assert note.is_visible() and "init-only trial: no training epochs" in note.inner_text()
    page.screenshot(path=shots / "trial-init-only.png", full_page=True)
    assert page.errors == []


def spectra_arrays(depth: int, epoch: int) -> dict[str, np.ndarray]:
    """Positive, descending eigenvalues per layer (depth, n = 4) and Jacobian singular values
    (K, M) spread over a decade: the shapes an MLP trial with spectra stores."""
    out = {}
    for i, key in enumerate(SPECTRA):
        c = np.arange(4)
        out[key] = np.array([2.0 ** -(c + 1) * (1 + i + r + epoch) for r in range(depth)])
    grid = np.linspace(-1, 1, M)
    out["jacobian_singular_values"] = np.array([10.0 ** (grid * (k + depth) / K) for k in range(K)])
    return out


def kind_urls(api) -> dict[str, str]:
    """Each plot kind's default SVG on a depth × init sweep with spectra stored."""
    body = spec("kinds", depth=[2, 4], init=["gaussian", "orthogonal"], seeds=2, spectra=True,
                jacobian_samples=K)  # fmt: skip
    sid = submit(api, body)["id"]
    trials = api.store.list_trials(sid, limit=1000)[0]
    for t in trials:
        api.store.start_trial(t.id)
    fill(api, sid)
    batch = []
    for t in trials:
        d = t.config["depth"]
        batch += [(t.id, {**record(t.id, e, d), **spectra_arrays(d, e)}) for e in (0, 2)]
    api.store.write_records(batch)
    for t in trials:
        api.store.finish_trial(t.id, "completed")
    api.store.finish_sweep(sid)
    base = f"{api.url}/api/v1"
    urls = {
        kind: f"{base}/sweeps/{sid}/plots/{kind}?format=svg"
        for kind in ("layer_profile", "depth_scaling", "training_curves", "heatmap",
                     "theory_overlay")
    }  # fmt: skip
    t = trials[-1]
    urls["spectrum"] = f"{base}/trials/{t.id}/plots/spectrum?format=svg"
    others = "&".join(f"compare={u.id}" for u in trials[:2])
    urls["jacobian_spectrum"] = f"{base}/trials/{t.id}/plots/jacobian_spectrum?format=svg&{others}"
    return urls


@pytest.mark.browser
@pytest.mark.slow
def test_every_plot_kinds_text_lies_inside_its_figure_in_chromium(api, page, shots):
    for kind, url in kind_urls(api).items():
        response = page.goto(url)
        assert response.status == 200, (kind, response.text())
        found = page.evaluate(SVG_TEXT_BOXES)
        root, texts = found["root"], [t for t in found["texts"] if not t["empty"]]
        assert len(texts) > 8, kind  # title, caption, labels, ticks, legend
        cut = [
            t for t in texts
            if t["x0"] < root["x0"] - 0.5 or t["y0"] < root["y0"] - 0.5
            or t["x1"] > root["x1"] + 0.5 or t["y1"] > root["y1"] + 0.5
        ]  # fmt: skip
        assert cut == [], (kind, cut)
        box = {"x": root["x0"], "y": root["y0"], "width": root["x1"] - root["x0"],
               "height": root["y1"] - root["y0"]}  # fmt: skip
        page.screenshot(path=shots / f"plot-{kind}.png", clip=box)
    assert page.errors == []
