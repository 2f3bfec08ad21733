"""The compare page in headless Chromium (as test_browser.py, whose fixtures it uses): two sweeps
ticked on the sweeps list, "compare" pressed, the page's labels and its chart drawn (a line per
sweep); and the downloadable figure's legend text inside the figure. Screenshot:
artifacts/dashboard-compare.png."""

from __future__ import annotations

import re

import pytest
from api_support import spec, submit
from test_browser import CHARTS, PLOTS_DRAWN, browser, run_all, tab  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.sqlite_only]


def test_two_sweeps_ticked_on_the_list_are_compared(api, tab, artifacts_dir):  # noqa: F811
    a = submit(api, spec("bn", depth=[2, 4], norm="batch"))["id"]
    b = submit(api, spec("ln", depth=[2, 4], norm="layer"))["id"]
    run_all(api, a)
    run_all(api, b)
    tab.goto(api.url + "/")
    for sid in (a, b):
        tab.locator(f'tr[data-sweep-id="{sid}"] input[type="checkbox"]').check()
    tab.locator("form#compare button").click()
    tab.wait_for_url(re.compile(r".*/compare\?.*"))
    labels = tab.locator("table.compared td.label").all_inner_texts()
    assert labels == [f"sweep {a} (norm=batch)", f"sweep {b} (norm=layer)"]  # oldest first
    tab.wait_for_function(PLOTS_DRAWN)
    (chart,) = tab.evaluate(CHARTS)  # a line per sweep, a point per depth
    assert chart["src"].startswith(f"/api/v1/compare/plots/depth_scaling?sweep={a}&sweep={b}")
    assert chart["panels"] == [[[labels[0], 2], [labels[1], 2]]] and chart["width"] > 400
    tab.screenshot(path=artifacts_dir / "dashboard-compare.png", full_page=True)

    # The downloaded figure as a person sees it: every text of the SVG inside the figure's box.
    src = tab.get_attribute("figure[data-chart] + p.plot-links a", "href")
    assert src == chart["src"].replace("format=json", "format=svg")
    tab.goto(api.url + src)
    inside = tab.evaluate(
        """() => {
        const svg = document.querySelector("svg").getBoundingClientRect();
        const texts = [...document.querySelectorAll("g[id^='text_'], g[id^='legend_']")];
        return texts.length > 0 && texts.every((t) => {
            const r = t.getBoundingClientRect();
            return r.left >= svg.left - 1 && r.right <= svg.right + 1 &&
                   r.top >= svg.top - 1 && r.bottom <= svg.bottom + 1;
        });
    }"""
    )
    assert inside
    tab.goto(api.url + "/")
    tab.fill("form#compare input[name=sweeps]", f"{b}, {a}")
    tab.locator("form#compare button").click()
    tab.wait_for_url(re.compile(r".*/compare\?sweeps=.*"))
    labels = tab.locator("table.compared td.label").all_inner_texts()
    assert labels == [f"sweep {b} (norm=layer)", f"sweep {a} (norm=batch)"]  # as typed
    assert tab.errors == []
