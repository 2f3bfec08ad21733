"""Time to draw the biggest chart of a 1000-trial sweep in headless Chromium, against fetching and
showing the PNG of the same figure (docs/dashboard.md, "Interactive charts").

The sweep: 100 activation gains × 10 seeds = 1000 trials of depth 1000 at initialization, each
with its `isometry_gap/act` profile stored (10⁶ values). Its layer profile grouped by gain is 100
lines × 1000 layers (seeds pooled): the biggest chart a 1000-trial sweep's page shows. A live API
(the dashboard's own server, SQLite) serves it; Chromium opens the sweep page with that chart and,
in the same page, times (median of --reps):

- chart: fetch the plot's JSON (format=json, from the server's cache), parse it and draw it with
  static/charts.js (uPlot) up to the next frame;
- draw: the same from the parsed JSON (IsosweepCharts.draw and the next frame);
- png: fetch the PNG of the same figure (from the server's cache) and decode it into an <img> up
  to the next frame: the baseline, what the page showed before.

and, once each, the server's first (uncached) answer of each format, the same URLs: reading the
rows, pooling the seeds, then encoding the JSON or drawing the PNG (with the plot time limit
raised: the PNG may take longer than the default ISOSWEEP_PLOT_TIMEOUT_S).

    .venv/bin/python bench/chart_draw.py [--gains 100] [--seeds 10] [--depth 1000] [--reps 5]

Needs Debian's Chromium at /usr/bin/chromium (`make browser`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.app import create_app  # noqa: E402
from api.server import ServerThread  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.spec import parse_spec  # noqa: E402
from service.store import Store  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
METRIC = "isometry_gap/act"
# In the page: time fetch + parse + draw (+ one frame), the draw alone, and fetch + decode of
# the PNG (+ one frame), each in a figure of its own at the page's plot width.
TIMED = """async ([json, png, reps]) => {
    const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
    const main = document.querySelector("section.plots");
    const out = {chart: [], draw: [], png: [], points: 0, series: 0};
    for (let k = 0; k < reps; k++) {
        const fig = document.createElement("figure");
        fig.className = "plot chart";
        fig.innerHTML = '<div class="chart-body"></div>';
        main.appendChild(fig);
        let t = performance.now();
        const chart = await (await fetch(json, {cache: "no-store"})).json();
        IsosweepCharts.draw(fig, chart);
        await frame();
        out.chart.push(performance.now() - t);
        t = performance.now();
        IsosweepCharts.draw(fig, chart);
        await frame();
        out.draw.push(performance.now() - t);
        const u = fig.querySelector(".chart-panel")._uplot;
        out.series = u.series.length - 1;
        out.points = u.data.slice(1).reduce((n, d) => n + d.filter((v) => v != null).length, 0);
        fig.remove();
        const img = document.createElement("img");
        main.appendChild(img);
        t = performance.now();
        const blob = await (await fetch(png, {cache: "no-store"})).blob();
        img.src = URL.createObjectURL(blob);
        await img.decode();
        await frame();
        out.png.push(performance.now() - t);
        img.remove();
    }
    return out;
}"""


def make_store(path: str, gains: int, seeds: int, depth: int) -> tuple[Store, int]:
    """The sweep, its trials completed with a gap profile each (a gain's line rises with ℓ)."""
    # the PNG of 100 lines × 1000 points can take longer than the default 30 s plot limit
    settings = Settings(database_url=f"sqlite:///{path}", plot_timeout_s=900.0)
    store = Store(settings.database_url, settings=settings)
    values = [round(0.5 + 1.5 * i / (gains - 1), 6) for i in range(gains)]
    spec = parse_spec({
        "name": "chart-bench",
        "parameters": {"activation_gain": values, "depth": depth, "width": 16, "epochs": 0,
                       "batch_size": 16, "activation": "tanh"},
        "seeds": seeds,
    })  # fmt: skip
    sweep = store.create_sweep(spec)
    rng = np.random.default_rng(0)
    ell = np.arange(1, depth + 1)
    trials: list = []
    while len(trials) < gains * seeds:
        page, _ = store.list_trials(sweep.id, offset=len(trials), limit=1000)
        trials += page
    for chunk in range(0, len(trials), 100):
        batch = []
        for t in trials[chunk : chunk + 100]:
            g = t.config["activation_gain"]
            gap = g * np.log1p(ell) * (1 + 0.05 * rng.standard_normal(depth))  # (depth,)
            batch.append((t.id, {"epoch": 0, METRIC: gap}))
        for t, _ in batch:
            store.start_trial(t)
        store.write_records(batch)
        for t, _ in batch:
            store.finish_trial(t, "completed")
    store.finish_sweep(sweep.id)
    return store, sweep.id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gains", type=int, default=100, help="lines (activation gains)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--depth", type=int, default=1000, help="points per line (layers)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if not CHROMIUM.exists():
        print(f"skipped: no Chromium at {CHROMIUM} (`make browser` installs it)")
        return
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        store, sid = make_store(os.path.join(tmp, "bench.db"), args.gains, args.seeds, args.depth)
        n = args.gains * args.seeds
        print(f"{n} trials × {args.depth} layers stored in {time.perf_counter() - t0:.1f} s")
        server = ServerThread(create_app(store.settings, store=store)).start()
        query = f"kind=layer_profile&metric={METRIC.replace('/', '%2F')}&group_by=activation_gain"
        route = f"/api/v1/sweeps/{sid}/plots/layer_profile?metric={METRIC}&group_by=activation_gain"
        try:
            with httpx.Client(base_url=server.url, timeout=600) as http:
                cold = {}
                for fmt in ("json", "png"):
                    t = time.perf_counter()
                    r = http.get(f"{route}&format={fmt}")  # the URL the page fetches below
                    r.raise_for_status()
                    cold[fmt] = (time.perf_counter() - t, len(r.content))
                    t = time.perf_counter()
                    http.get(f"{route}&format={fmt}").raise_for_status()
                    warm = time.perf_counter() - t
                    print(f"server, first {fmt}: {cold[fmt][0]:.2f} s, again {warm:.3f} s",
                          flush=True)  # fmt: skip
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                            args=["--no-sandbox", "--disable-gpu"])  # fmt: skip
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{server.url}/sweeps/{sid}?{query}")
                page.wait_for_function(
                    "() => document.querySelector('figure[data-chart]').dataset.drawn",
                    timeout=600_000,
                )
                found = page.evaluate(TIMED, [f"{route}&format=json", f"{route}&format=png",
                                              args.reps])  # fmt: skip
                browser.close()
        finally:
            server.stop()
            store.close()
    med = {k: statistics.median(found[k]) for k in ("chart", "draw", "png")}
    print(f"chart: {found['series']} lines, {found['points']} points drawn")
    print(f"server, first answer: json {cold['json'][0]:.2f} s ({cold['json'][1] / 1e6:.1f} MB),"
          f" png {cold['png'][0]:.2f} s ({cold['png'][1] / 1e6:.2f} MB)")  # fmt: skip
    for k, text in (("chart", "fetch JSON + parse + draw"), ("draw", "draw only"),
                    ("png", "fetch PNG + decode (baseline)")):  # fmt: skip
        runs = ", ".join(f"{v:.0f}" for v in found[k])
        print(f"{k:>5}: median {med[k]:7.1f} ms  ({text}; runs {runs})")
    print(f"ratio chart / png: {med['chart'] / med['png']:.2f}; draw / png: "
          f"{med['draw'] / med['png']:.2f} (both answers cached by the server)")  # fmt: skip
    print(f"ratio of the first answers, png / json: {cold['png'][0] / cold['json'][0]:.1f} "
          f"(the default plot limit is {Settings().plot_timeout_s:.0f} s)")  # fmt: skip
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs)")  # fmt: skip


if __name__ == "__main__":
    main()
