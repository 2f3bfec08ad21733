"""The dashboard's pages over a live server (SQLite and Postgres), read with httpx: what each
page shows for stored sweeps (counts, progress, summaries, NaN/±inf), escaping, 404s, the trials
table's filters, sort and pages, plot defaults and links that the API serves, and no URL of
another host anywhere. The helpers in views.py are checked on their own first."""

from __future__ import annotations

import io
import math
import re
from html import unescape

import pandas as pd
import pytest
from api_support import fill, run_trial, spec, submit, value_of

from api.dashboard import views
from service.config import METRICS
from service.plots import PLOT_KINDS

# --- views.py on its own --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (math.inf, "∞"),
        ("Infinity", "∞"),
        (-math.inf, "−∞"),
        ("-Infinity", "−∞"),
        (math.nan, "NaN"),
        ("NaN", "NaN"),
    ],
)
def test_nonfinite_numbers_are_shown_as_values_in_their_own_style(value, shown):
    html = str(views.number(value))
    assert 'class="nonfinite"' in html and f">{shown}<" in html


def test_finite_numbers_have_four_significant_digits():
    assert str(views.number(2.302585093)) == "2.303"
    assert str(views.number(0.000123456)) == "0.0001235"
    assert str(views.number(1230.0)) == "1230"
    assert "—" in str(views.number(None))


def test_durations_read_at_a_glance():
    assert [views.duration(s) for s in (None, math.inf, 0, 42.4, 150, 3580, 3600, 4830)] == [
        "—", "—", "0 s", "42 s", "2 min", "1 h", "1 h", "1 h 20 min",
    ]  # fmt: skip


def test_percent_floors_so_100_means_done():
    assert views.percent(0.996) == "99%" and views.percent(1.0) == "100%"
    assert views.percent(0.5) == "50%" and views.percent(0.0) == "0%"


class _T:
    def __init__(self, index, loss):
        self.index, self.summary, self.config = index, {"train_loss": loss}, {}


def test_sort_puts_nan_then_missing_last_in_both_directions():
    trials = [_T(0, 3.0), _T(1, math.nan), _T(2, None), _T(3, math.inf), _T(4, -1.0)]
    up = views.sort_trials(trials, "train_loss", desc=False)
    down = views.sort_trials(trials, "train_loss", desc=True)
    assert [t.index for t in up] == [4, 0, 3, 1, 2]
    assert [t.index for t in down] == [3, 0, 4, 1, 2]


def test_default_plot_suits_the_sweep():
    depth_swept = {"depth": [2, 8], "init": ["gaussian", "orthogonal"], "seed": [0]}
    assert views.default_plot(None, depth_swept, {}) == {
        "kind": "depth_scaling", "metric": "grad_norm", "layer": 1, "group_by": "init",
    }  # fmt: skip
    no_depth = {"activation": ["relu", "tanh"], "seed": [0, 1]}
    assert views.default_plot(None, no_depth, {}) == {
        "kind": "layer_profile",
        "metric": "isometry_gap/act",
    }
    # depth_scaling without a depth axis: the first numeric axis goes on x
    width_init = {"init": ["gaussian"], "width": [8, 16], "seed": [0]}
    choice = views.default_plot("depth_scaling", width_init, {})
    assert choice["x"] == "width" and choice["group_by"] == "init"
    # the heatmap's axes are the plot's own defaults (service.plots.defaults.default_axes)
    assert views.default_plot("heatmap", depth_swept, {}) == {
        "kind": "heatmap", "metric": "isometry_gap/act",
    }  # fmt: skip
    no_norm = {"parameters": {"norm": "none"}}
    assert views.default_plot("theory_overlay", no_depth, no_norm)["metric"] == "isometry_gap/act"


def test_plot_url_passes_only_what_the_kind_takes():
    choice = {"kind": "layer_profile", "metric": "grad_norm", "layer": "2", "epoch": "1"}
    src = views.plot_url(3, choice, {"depth": ["4"]})
    assert src.startswith("/api/v1/sweeps/3/plots/layer_profile?")
    assert "layer=" not in src and "epoch=1" in src and "depth=4" in src
    assert src.endswith("format=svg")


# --- the pages over a live server -------------------------------------------------------------


def trials_of(api, sweep_id):
    return api.store.list_trials(sweep_id, limit=1000)[0]


def page(api, path, code=200):
    r = httpx_get(api, path)
    assert r.status_code == code, r.text[:2000]
    assert r.headers["content-type"].startswith("text/html")
    return r.text


def httpx_get(api, path):
    return api.client.get(api.url + path)


def trial_ids(html):
    return [int(i) for i in re.findall(r'<tr data-trial-id="(\d+)">', html)]


def row(html, attr, value):
    m = re.search(rf'<tr {attr}="{value}">(.*?)</tr>', html, re.S)
    assert m, f"no row {attr}={value}"
    return m.group(1)


def test_index_with_no_sweeps(api):
    r = httpx_get(api, "/")
    assert r.status_code == 200
    assert "No sweeps yet" in r.text and "<table" not in r.text
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert 'data-active="false"' in r.text


def test_index_shows_status_counts_and_progress(api):
    done = submit(api, spec("finished", seeds=2, depth=[2, 3]))
    for t, status in zip(trials_of(api, done["id"]), ["completed"] * 3 + ["failed"], strict=True):
        run_trial(api, t, status=status, error="boom" if status == "failed" else None)
    api.store.finish_sweep(done["id"])
    live = submit(api, spec("live", seeds=2))  # 2 trials × 3 records
    api.store.claim_sweep("r1", 60.0)
    first, second = trials_of(api, live["id"])
    run_trial(api, first)  # all 3 of its records, completed
    api.store.start_trial(second.id)  # running, nothing stored: progress 3/6

    html = page(api, "/")
    old = row(html, "data-sweep-id", done["id"])
    assert "status-failed" in old and "4/4" in old
    assert "3 completed" in old and "1 failed" in old and "100%" in old
    new = row(html, "data-sweep-id", live["id"])
    assert ">running<" in new and "1/2" in new and "1 running" in new
    assert 'value="0.5"' in new and "50%" in new
    assert 'data-active="true"' in html  # the page polls while a sweep runs
    assert html.index(f'data-sweep-id="{live["id"]}"') < html.index(
        f'data-sweep-id="{done["id"]}"'
    )  # newest first
    only_failed = page(api, "/?status=failed")
    assert f'data-sweep-id="{done["id"]}"' in only_failed
    assert f'data-sweep-id="{live["id"]}"' not in only_failed
    assert "status: unknown value" in page(api, "/?status=bogus", 422)


def test_sweep_page_shows_trials_summaries_nonfinite_divergence_and_errors(api):
    s = submit(api, spec("mixed", seeds=1, depth=[2, 4], init=["gaussian", "orthogonal"]))
    t1, t2, t3, t4 = trials_of(api, s["id"])
    run_trial(api, t1)
    run_trial(api, t2, train_loss=math.inf, test_loss=math.nan, test_acc=-math.inf)
    run_trial(api, t3, status="diverged", epochs=1, diverged=True, train_loss=math.nan)
    run_trial(api, t4, status="failed", epochs=0, error="CUDA <b>out</b> of memory")
    api.store.finish_sweep(s["id"])

    html = page(api, f"/sweeps/{s['id']}")
    assert trial_ids(html) == [t1.id, t2.id, t3.id, t4.id]
    r1 = row(html, "data-trial-id", t1.id)
    # the summary columns hold the last epoch's (2) values, then an empty diverged-at cell
    cells = re.findall(r'<td class="num">([^<]*)</td>', r1)
    shown = ["train_loss", "test_loss", "train_acc", "test_acc"]
    values = [value_of(t1.id, 2, METRICS.index(m)) for m in shown]
    assert cells == [*(f"{v:g}" for v in values), ""]
    assert ">2/2<" in r1 and ">gaussian<" in r1
    r2 = row(html, "data-trial-id", t2.id)
    assert r2.count('class="nonfinite"') == 3
    assert ">∞<" in r2 and ">NaN<" in r2 and ">−∞<" in r2
    r3 = row(html, "data-trial-id", t3.id)
    assert "status-diverged" in r3 and ">1/2<" in r3
    assert re.search(r'<td class="num">1</td>\s*<td class="error">', r3)  # diverged at epoch 1
    r4 = row(html, "data-trial-id", t4.id)
    assert "status-failed" in r4 and "CUDA &lt;b&gt;out&lt;/b&gt; of memory" in r4
    assert "<b>out</b>" not in html
    head = html[html.index('id="sweep-head"') : html.index("</section>")]
    assert "status-failed" in head and "1 of 4 trials failed" in head
    assert 'id="cancel"' not in html  # a finished sweep has nothing to cancel


def test_user_text_is_escaped_everywhere(api):
    evil = "<script>alert(1)</script>"
    s = submit(api, {**spec(evil, seeds=1), "description": f"d {evil}", "tags": [evil]})
    (t,) = trials_of(api, s["id"])
    run_trial(api, t, status="failed", error=evil)
    for path in ("/", f"/sweeps/{s['id']}", f"/trials/{t.id}"):
        html = page(api, path)
        assert "alert(1)</script>" not in html, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, path
        assert html.count("<script") == 3  # ours: uPlot.iife.min.js, charts.js, dashboard.js


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/sweeps/999", "no sweep with id 999"),
        ("/sweeps/abc", "no sweep with id &#39;abc&#39;"),
        ("/sweeps/0", "no sweep with id &#39;0&#39;"),
        ("/sweeps/99999999999", "no sweep with id &#39;99999999999&#39;"),
        ("/trials/999", "no trial with id 999"),
    ],
)
def test_missing_sweep_or_trial_is_an_html_404(api, path, says):
    html = page(api, path, 404)
    assert says in html and 'href="/"' in html


def test_bad_table_parameters_are_422_naming_them(api):
    s = submit(api, spec("p", seeds=2, depth=[2, 3]))
    sid = s["id"]
    html = page(api, f"/sweeps/{sid}?sort=nope", 422)
    assert "sort: unknown column" in html and "train_loss" in html  # the allowed columns
    assert "dir: unknown value" in page(api, f"/sweeps/{sid}?dir=up", 422)
    assert "status: unknown value" in page(api, f"/sweeps/{sid}?status=done", 422)
    assert "page" in page(api, f"/sweeps/{sid}?page=0", 422)
    assert "depth" in page(api, f"/sweeps/{sid}?depth=two", 422)
    assert "kind: unknown value" in page(api, f"/sweeps/{sid}?kind=pie", 422)
    assert "metric: unknown value" in page(api, f"/sweeps/{sid}?metric=loss", 422)


def test_trials_sort_by_a_header_nan_last(api):
    s = submit(api, spec("sorted", seeds=4))
    losses = [3.0, math.nan, math.inf, 1.0]
    trials = trials_of(api, s["id"])
    for t, loss in zip(trials, losses, strict=True):
        run_trial(api, t, train_loss=loss)
    ids = [t.id for t in trials]
    base = f"/sweeps/{s['id']}"
    html = page(api, base)
    link = re.search(r'<th><a href="([^"]*sort=train_loss[^"]*)">train_loss</a>', html)
    assert link and "dir=" not in link.group(1)  # first click: ascending
    up = page(api, unescape(link.group(1)))
    assert trial_ids(up) == [ids[3], ids[0], ids[2], ids[1]]  # 1, 3, ∞, NaN
    again = re.search(r'<th aria-sort="ascending"><a href="([^"]*)">train_loss ▲', up)
    assert again and "dir=desc" in again.group(1)  # second click: descending
    down = page(api, unescape(again.group(1)))
    assert trial_ids(down) == [ids[2], ids[0], ids[3], ids[1]]  # ∞, 3, 1, NaN
    assert trial_ids(page(api, f"{base}?sort=seed&dir=desc")) == ids[::-1]


def test_trials_filter_by_status_and_config(api):
    s = submit(api, spec("f", seeds=1, depth=[2, 4], init=["gaussian", "orthogonal"]))
    t1, t2, t3, t4 = trials_of(api, s["id"])
    run_trial(api, t1)
    run_trial(api, t4, status="failed", epochs=0, error="x")
    base = f"/sweeps/{s['id']}"
    assert trial_ids(page(api, f"{base}?status=failed")) == [t4.id]
    assert trial_ids(page(api, f"{base}?status=queued")) == [t2.id, t3.id]
    assert trial_ids(page(api, f"{base}?init=orthogonal")) == [t2.id, t4.id]
    html = page(api, f"{base}?depth=4&init=orthogonal&status=failed")
    assert trial_ids(html) == [t4.id] and "1 of 4 trials match" in html
    # the plot and the downloads follow the config filters
    src = unescape(re.search(r'<img data-plot src="([^"]+)"', html).group(1))
    assert "depth=4" in src and "init=orthogonal" in src
    empty = page(api, f"{base}?depth=4&init=orthogonal&status=completed")
    assert trial_ids(empty) == [] and "No trials match" in empty


def test_large_sweeps_are_paged(api):
    s = submit(api, spec("many", seeds=60, epochs=0))
    ids = [t.id for t in trials_of(api, s["id"])]
    base = f"/sweeps/{s['id']}"
    first = page(api, base)
    assert trial_ids(first) == ids[:50] and "page 1 of 2" in first
    nxt = re.search(r'<a href="([^"]+)" rel="next">', first).group(1)
    assert trial_ids(page(api, unescape(nxt))) == ids[50:]
    # sorting sorts every trial, then pages
    assert trial_ids(page(api, f"{base}?sort=seed&dir=desc&page=2")) == ids[:10][::-1]
    assert trial_ids(page(api, f"{base}?page=3")) == []


def test_default_plot_and_every_kind_link_draw(api):
    s = submit(api, spec("plots", seeds=2, depth=[2, 3], init=["gaussian", "orthogonal"]))
    fill(api, s["id"])
    html = page(api, f"/sweeps/{s['id']}")
    src = unescape(re.search(r'<img data-plot src="([^"]+)"', html).group(1))
    assert src.startswith(f"/api/v1/sweeps/{s['id']}/plots/depth_scaling?")
    for part in ("metric=grad_norm", "layer=1", "group_by=init", "format=svg"):
        assert part in src
    links = re.findall(r'<a href="([^"]+)"(?: class="current")?>(\w+)</a>', html)
    kinds = {kind: unescape(href) for href, kind in links if kind in PLOT_KINDS}
    assert set(kinds) == set(PLOT_KINDS)
    for kind, href in kinds.items():
        view = page(api, href)
        img = unescape(re.search(r'<img data-plot src="([^"]+)"', view).group(1))
        assert f"/plots/{kind}?" in img
        r = httpx_get(api, img)
        assert r.status_code == 200, (kind, r.text)
        assert r.headers["content-type"] == "image/svg+xml" and b"<svg" in r.content[:2000]


def test_plot_options_the_kind_does_not_take_are_dropped(api):
    s = submit(api, spec("opts", seeds=1, depth=[2, 3]))
    fill(api, s["id"])
    html = page(api, f"/sweeps/{s['id']}?kind=layer_profile&layer=2&epoch=1&metric=grad_norm")
    src = unescape(re.search(r'<img data-plot src="([^"]+)"', html).group(1))
    assert "layer=" not in src and "epoch=1" in src and "metric=grad_norm" in src
    assert httpx_get(api, src).status_code == 200


def test_downloads_are_the_sweeps_csv(api):
    s = submit(api, spec("csv", seeds=2, depth=[2, 3]))
    fill(api, s["id"])
    html = page(api, f"/sweeps/{s['id']}")
    hrefs = [unescape(h) for h in re.findall(r'<li><a href="([^"]+format=csv[^"]*)">', html)]
    assert len(hrefs) == 4  # everything, last epoch, over seeds, the plotted metric
    frames = [pd.read_csv(io.StringIO(httpx_get(api, h).text)) for h in hrefs]
    every, last, pooled, metric = frames
    stored = api.store.read_metrics(s["id"])
    assert len(every) == len(stored) and set(every["trial_id"]) == set(stored["trial_id"])
    assert set(last["epoch"]) == {2}
    assert {"mean", "ci95", "count"} <= set(pooled.columns) and set(pooled["count"]) == {2}
    assert set(metric["metric"]) == {"grad_norm"}


def test_trial_page_shows_config_metrics_and_its_plots(api):
    s = submit(api, spec("one", seeds=2, depth=[2, 3], init="orthogonal"))
    trials = fill(api, s["id"])
    t = trials[3]  # depth 3, seed 1
    run = api.store.list_trials(s["id"])[0][3]
    html = page(api, f"/trials/{t['id']}")
    assert f'href="/sweeps/{s["id"]}"' in html
    assert "depth = 3" in html and "seed = 1" in html
    assert re.search(r'<tr class="swept"><th>depth</th><td>3</td>', html)
    assert re.search(r"<th>init</th><td>orthogonal</td>", html)
    value = run.summary["train_loss"]
    assert f'<th>train_loss</th><td class="num">{value:.6g}</td>' in html
    imgs = [unescape(i) for i in re.findall(r'<img data-plot src="([^"]+)"', html)]
    assert len(imgs) == 3 and all(f"trial={t['id']}" in i for i in imgs)
    for src in imgs:
        assert httpx_get(api, src).status_code == 200, src
    csv = unescape(re.search(r'<a href="([^"]+format=csv[^"]*)">', html).group(1))
    frame = pd.read_csv(io.StringIO(httpx_get(api, csv).text))
    assert set(frame["trial_id"]) == {t["id"]} and len(frame) > 0


def test_cancel_form_asks_for_the_token_only_when_one_is_set(start_api):
    open_api = start_api()
    s = submit(open_api, spec("q"))
    html = page(open_api, f"/sweeps/{s['id']}")
    assert 'id="cancel"' in html and 'name="token"' not in html
    guarded = start_api(api_token="s3cret", open_reads=True)  # else the page needs a login
    s = submit(guarded, spec("q"), token="s3cret")
    html = page(guarded, f"/sweeps/{s['id']}")
    assert 'id="cancel"' in html and 'name="token"' in html and "s3cret" not in html


ATTRS = re.compile(r'\b(?:src|href|action)="([^"]*)"')


def test_nothing_is_loaded_from_another_host(api):
    s = submit(api, spec("offline", seeds=1))
    (t,) = fill(api, s["id"])
    pages = ["/", f"/sweeps/{s['id']}", f"/trials/{t['id']}", "/sweeps/404"]
    for path in pages:
        html = httpx_get(api, path).text
        for target in ATTRS.findall(html):
            assert target.startswith(("/", "?", "#", "data:")) and not target.startswith("//"), (
                path,
                target,
            )
        assert "http://" not in html and "https://" not in html, path
    for asset in ("/static/dashboard.js", "/static/dashboard.css"):
        r = httpx_get(api, asset)
        assert r.status_code == 200
        assert "http://" not in r.text and "https://" not in r.text, asset
        assert "@import" not in r.text and not re.search(r"url\((?!\s*['\"]?data:)", r.text)
