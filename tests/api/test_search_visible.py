"""Issue 19's read surfaces over a live server whose store the tests fill by hand: a search's
sampled values as columns wherever trials are listed (the dashboard's trials table, `isosweep
status`), the sweep's `best` on the dashboard, `epochs_done` meaning epochs trained on REST, the
CLI and the dashboard alike, and the family-aware defaults of a transformer's sweep and trial
pages (the default plot draws; the first panel is a finite gap where one exists)."""

from __future__ import annotations

import io
import math
import os
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
from api_support import record, run_trial, spec, submit

ISOSWEEP = Path(sys.executable).with_name("isosweep")


@pytest.fixture
def database_url(sqlite_url):
    """Pages and the CLI over one backend; the store's reads are covered on both elsewhere."""
    return sqlite_url


def page(api, path):
    r = httpx.get(f"{api.url}{path}", timeout=60)
    assert r.status_code == 200, r.text[:2000]
    return r.text


def cli(api, *args):
    env = {**os.environ, "ISOSWEEP_API_URL": api.url, "COLUMNS": "250", "NO_COLOR": "1"}
    env.pop("ISOSWEEP_API_TOKEN", None)
    r = subprocess.run(
        [str(ISOSWEEP), *map(str, args)], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)


def trials(api, sweep_id):
    return api.store.list_trials(sweep_id, limit=1000)[0]


def search_sweep(api):
    body = spec("lr-search", seeds=1, depth=[2, 3], lr={"loguniform": [1e-4, 1.0]})
    body |= {
        "search": {"kind": "random", "n": 3, "seed": 7},
        "early_stop": {"kind": "successive_halving", "metric": "test_loss", "grace_epochs": 1},
    }
    s = submit(api, body)
    ts = trials(api, s["id"])
    assert len(ts) == 6 and len({t.config["lr"] for t in ts}) == 3
    for k, t in enumerate(ts):  # the last trial has the lowest test loss: the best
        run_trial(api, t, test_loss=10.0 - k)
    return s, ts


def test_sampled_values_are_columns_of_the_dashboards_trials_table(api):
    s, ts = search_sweep(api)
    html = page(api, f"/sweeps/{s['id']}")
    header = re.search(r"<thead>(.*?)</thead>", html, re.S).group(1)
    labels = [unescape(x) for x in re.findall(r"<a [^>]*>(\w+)", header)]
    assert labels[:4] == ["trial", "depth", "lr", "seed"], labels
    for t in ts:
        row = re.search(rf'<tr data-trial-id="{t.id}">(.*?)</tr>', html, re.S).group(1)
        lr = t.config["lr"]
        assert f'<td class="num sampled" title="{lr}">{lr:.4g}</td>' in row, row
    # sortable by the sampled column, smallest first
    ordered = page(api, f"/sweeps/{s['id']}?sort=lr")
    ids = [int(i) for i in re.findall(r'<tr data-trial-id="(\d+)">', ordered)]
    assert ids == [t.id for t in sorted(ts, key=lambda t: (t.config["lr"], t.index))]
    # the spec's summary names the sampled parameter and its distribution
    assert "lr sampled" in html and "loguniform" in html
    # the page's per-trial CSV (each trial's last epoch) has the sampled column too
    links = re.findall(r'<li><a href="([^"]+)">([^<]+)</a>', html)
    href = next(unescape(h) for h, label in links if label.startswith("last epoch of each trial"))
    frame = pd.read_csv(io.StringIO(page(api, href)))
    lrs = frame.groupby("trial_id")["lr"].first()
    assert {tid: lrs[tid] for tid in lrs.index} == pytest.approx({t.id: t.config["lr"] for t in ts})


def test_the_sweeps_best_is_on_the_dashboard(api):
    s, ts = search_sweep(api)
    best = ts[-1]
    html = page(api, f"/sweeps/{s['id']}")
    dd = re.search(r'<dt>best</dt><dd class="best">(.*?)</dd>', html, re.S).group(1)
    assert f'<a href="/trials/{best.id}">{best.id}</a>' in dd
    assert "test_loss = 5 " in dd and "(epoch 2, min)" in dd
    # the API says the same
    assert api.get(f"/sweeps/{s['id']}").json()["best"]["trial_id"] == best.id


@pytest.mark.sqlite_only
def test_isosweep_status_lists_the_sampled_values(api):
    s, ts = search_sweep(api)
    out = cli(api, "status", s["id"])
    head = next(line for line in out.splitlines() if line.split()[:1] == ["trial"])
    assert head.split()[:4] == ["trial", "depth", "lr", "seed"], head
    for t in ts:
        line = next(x for x in out.splitlines() if x.split()[:1] == [str(t.id)])
        assert line.split()[1:3] == [str(t.config["depth"]), f"{t.config['lr']:.6g}"], line


# --- epochs_done: epochs trained, everywhere --------------------------------------------------


@pytest.mark.sqlite_only
def test_epochs_done_counts_epochs_trained_on_rest_cli_and_dashboard(api):
    s = submit(api, spec("eight", seeds=1, epochs=8, depth=[2, 3]))
    done, running = trials(api, s["id"])
    run_trial(api, done)  # epochs 0..8: nine records
    run_trial(api, running, status="running", epochs=3)  # epochs 0..3 so far
    one = api.get(f"/trials/{done.id}").json()
    assert (one["epochs_done"], one["epochs_total"], one["last_epoch"]) == (8, 8, 8)
    assert (one["records_done"], one["records_total"]) == (9, 9)  # epoch 0's record too
    two = api.get(f"/trials/{running.id}").json()
    assert (two["epochs_done"], two["epochs_total"], two["records_done"]) == (3, 8, 4)
    queued = submit(api, spec("later", seeds=1, epochs=8))
    (q,) = api.get(f"/sweeps/{queued['id']}/trials").json()["data"]
    assert (q["epochs_done"], q["epochs_total"], q["records_done"], q["records_total"]) == (
        0, 8, 0, 9,
    )  # fmt: skip
    # the CLI's epoch column and the dashboard's say the same
    out = cli(api, "status", s["id"])
    rows = {x.split()[0]: x.split() for x in out.splitlines() if x.split()[:1] in
            ([str(done.id)], [str(running.id)])}  # fmt: skip
    assert "8/8" in rows[str(done.id)] and "3/8" in rows[str(running.id)]
    html = page(api, f"/sweeps/{s['id']}")
    row = re.search(rf'<tr data-trial-id="{done.id}">(.*?)</tr>', html, re.S).group(1)
    assert 'title="9 of 9 records, epoch 0 included">8/8</td>' in row
    trial = page(api, f"/trials/{done.id}")
    assert "8 of 8 (9/9 records, epoch 0 included)" in trial


# --- a transformer's defaults -----------------------------------------------------------------

TRANSFORMER = dict(model="transformer", width=8, heads=2, batch_size=4, depth=2)


def plot_srcs(html):
    return [unescape(i) for i in re.findall(r'<img data-plot src="([^"]+)"', html)]


def test_a_transformer_sweeps_default_plots_draw(api):
    s = submit(api, spec("tf", seeds=2, **TRANSFORMER, norm=["layer", "none"]))
    for t in trials(api, s["id"]):
        run_trial(api, t)
    html = page(api, f"/sweeps/{s['id']}")
    (src,) = plot_srcs(html)
    assert "/plots/layer_profile?" in src and "metric=isometry_gap%2Fresidual" in src, src
    r = httpx.get(f"{api.url}{src}", timeout=120)
    assert r.status_code == 200, r.text  # before: 422 "does not record 'isometry_gap/act'"
    heat = page(api, f"/sweeps/{s['id']}?kind=heatmap")
    (src,) = plot_srcs(heat)
    assert "metric=isometry_gap%2Fresidual" in src
    assert httpx.get(f"{api.url}{src}", timeout=120).status_code == 200


def test_a_transformers_first_panel_is_finite_where_a_gap_is(api):
    s = submit(api, spec("tf-trial", seeds=2, **TRANSFORMER))
    singular, regular = trials(api, s["id"])
    inf = np.full(2, math.inf)
    # every pooled gap +∞ (n > d would do it), its range gap finite
    run_trial(api, singular, **{f"isometry_gap/{k}": inf for k in ("attn", "mlp", "residual")})
    api.store.write_records(
        [(singular.id, {"epoch": e, **{f"isometry_gap/{k}": inf for k in ("attn", "mlp",
          "residual")}}) for e in range(2)]
    )  # fmt: skip
    run_trial(api, regular)
    first = plot_srcs(page(api, f"/trials/{singular.id}"))[0]
    assert "metric=range_isometry_gap%2Fresidual" in first, first
    _, values = api.store.trial_history(singular.id, "range_isometry_gap/residual")
    assert np.isfinite(values).all()
    first = plot_srcs(page(api, f"/trials/{regular.id}"))[0]
    assert "metric=isometry_gap%2Fresidual" in first, first
    for src in (first,):
        assert httpx.get(f"{api.url}{src}", timeout=120).status_code == 200


def test_first_gap_before_records_and_where_none_is_finite():
    from api.dashboard.pages import first_gap, recorded_layer_metrics

    wide = {**TRANSFORMER, "width": 32, "heads": 4, "batch_size": 16}  # n ≤ d
    narrow = {**TRANSFORMER, "width": 8, "batch_size": 100}  # n > d: every gap +∞
    finite = {"isometry_gap/mlp", "range_isometry_gap/residual"}
    for config, before in (
        (wide, "isometry_gap/residual"),
        (narrow, "range_isometry_gap/residual"),
    ):
        recorded = recorded_layer_metrics(config)
        assert first_gap(recorded, config, lambda m: None) == before  # nothing stored yet
        # stored, none finite: the family's first gap, its +∞ pinned and counted
        assert first_gap(recorded, config, lambda m: False) == "isometry_gap/residual"
        # the first finite one in the family's order, gaps before range gaps
        assert first_gap(recorded, config, lambda m: m in finite) == "isometry_gap/mlp"
    mlp = {"width": 16, "batch_size": 8}
    recorded = recorded_layer_metrics(mlp)
    assert first_gap(recorded, mlp, lambda m: m.startswith("range_")) == "range_isometry_gap/act"


def test_the_dashboards_trials_csv_has_the_sampled_column(api):
    s, ts = search_sweep(api)
    # a non-finite summary, spelled as the API's CSV spells it
    last = record(ts[0].id, 2, ts[0].config["depth"], train_loss=math.inf, test_loss=10.0)
    api.store.write_records([(ts[0].id, last)])
    html = page(api, f"/sweeps/{s['id']}?depth=3")
    links = re.findall(r'<li><a href="([^"]+)">([^<]+)</a>', html)
    href = next(unescape(h) for h, label in links if label.startswith("trials (CSV)"))
    assert href == f"/sweeps/{s['id']}/trials.csv?depth=3"  # the page's filters
    r = httpx.get(f"{api.url}{href}", timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    frame = pd.read_csv(io.StringIO(r.text))
    assert list(frame.columns[:5]) == ["trial_id", "index", "depth", "lr", "seed"]
    deep = [t for t in ts if t.config["depth"] == 3]
    assert list(frame["trial_id"]) == [t.id for t in deep]
    assert list(frame["lr"]) == [t.config["lr"] for t in deep]  # written by repr: exact
    assert set(frame["epochs_done"]) == {2} and set(frame["records_done"]) == {3}
    every = pd.read_csv(io.StringIO(page(api, f"/sweeps/{s['id']}/trials.csv?sort=lr")))
    assert list(every["lr"]) == sorted(t.config["lr"] for t in ts)
    first = pd.read_csv(io.StringIO(page(api, f"/sweeps/{s['id']}/trials.csv")))
    assert first.loc[0, "train_loss"] == math.inf and len(first) == 6
    assert httpx.get(f"{api.url}/sweeps/999/trials.csv", timeout=60).status_code == 404
