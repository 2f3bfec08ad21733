"""The search plot kinds through the real app (`GET /sweeps/{id}/plots/{kind}`, isosweep.Client
and the dashboard's sweep page): every kind as PNG and SVG on a successive-halving random
search, and a 422 naming why where a kind does not apply, never a 5xx."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import httpx
import pytest
from api_support import record, spec, submit

import isosweep
from api.app import create_app
from service.plots.search import SEARCH_PLOT_KINDS
from service.settings import Settings


def _asha(api, *, completed: int | None = None, early_stop: bool = True, seed: int = 0):
    """examples/lr-depth-trainability.yaml's shape at small scale; odd trials stop at epoch 2.
    `completed`: only the first k trials get records and finish (the rest stay queued); `seed`:
    the search's (another draws other learning rates: no trial reuses another sweep's results)."""
    body = spec("asha", seeds=2, depth=[2, 3], lr={"loguniform": [1e-4, 1.0]}, epochs=4)
    body["search"] = {"kind": "random", "n": 3, "seed": seed}
    if early_stop:
        body["early_stop"] = {"kind": "successive_halving", "metric": "test_loss", "mode": "min"}
    s = submit(api, body)
    trials, _ = api.store.list_trials(s["id"], limit=100)
    for t in trials[:completed]:
        stop = early_stop and t.index % 2 == 1
        last = 2 if stop else 4
        v = (math.log10(t.config["lr"]) + 2) ** 2
        api.store.write_records([
            (t.id, record(t.id, e, t.config["depth"], test_loss=v + 1 / (e + 1), train_loss=v))
            for e in range(last + 1)
        ])  # fmt: skip
        api.store.finish_trial(t.id, "stopped" if stop else "completed")
    return s


@pytest.mark.parametrize("kind", SEARCH_PLOT_KINDS)
def test_every_search_kind_as_png_and_svg(api, kind):
    s = _asha(api)
    for fmt, media, magic in (("png", "image/png", b"\x89PNG"), ("svg", "image/svg+xml", b"<svg")):
        r = api.get(f"/sweeps/{s['id']}/plots/{kind}", params={"format": fmt})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == media and magic in r.content[:2000]


def test_search_kinds_answer_422_naming_why(api):
    plain = _asha(api, early_stop=False, seed=1)
    r = api.get(f"/sweeps/{plain['id']}/plots/halving_rungs")
    assert r.status_code == 422 and "no early_stop" in r.json()["error"]["message"]
    few = _asha(api, completed=1, seed=2)
    r = api.get(f"/sweeps/{few['id']}/plots/param_importances")
    assert r.status_code == 422, r.text
    assert "at least 2 completed" in r.json()["error"]["message"]
    fixed = submit(api, spec("fixed", seeds=2, depth=3))
    for kind in ("search_slice", "parallel_coordinates", "param_importances"):
        r = api.get(f"/sweeps/{fixed['id']}/plots/{kind}")
        assert r.status_code == 422 and "no sampled or varying" in r.json()["error"]["message"]
    s = _asha(api)
    for kind, params, field in [
        ("search_history", {"x": "lr"}, "x"),
        ("search_history", {"group_by": "depth"}, "group_by"),
        ("search_slice", {"stat": "mean"}, "stat"),
        ("halving_rungs", {"metric": "train_loss"}, "metric"),
        ("search_history", {"metric": "grad_norm"}, "layer"),
        ("search_history", {"metric": ["train_loss", "test_loss"]}, "metric"),
        ("layer_profile", {"mode": "max"}, "mode"),
    ]:
        r = api.get(f"/sweeps/{s['id']}/plots/{kind}", params=params)
        assert r.status_code == 422, (kind, params, r.text)
        assert r.json()["error"]["field"] == field, (kind, params, r.json())
    r = api.get(f"/sweeps/{s['id']}/plots/search_history", params={"mode": "lowest"})
    assert r.status_code == 422


def test_the_query_chooses_the_objective(api):
    s = _asha(api)
    asked = {"metric": "train_loss", "mode": "max", "epoch": 2, "format": "svg"}
    r = api.get(f"/sweeps/{s['id']}/plots/search_history", params=asked)
    assert r.status_code == 200 and b"train_loss" in r.content
    r = api.get(f"/sweeps/{s['id']}/plots/search_history", params={"format": "svg"})
    assert b"test_loss" in r.content  # the early_stop metric by default


def test_the_kinds_are_listed_in_the_openapi_document():
    doc = create_app(Settings(database_url="sqlite:///:memory:")).openapi()
    params = doc["paths"]["/api/v1/sweeps/{sweep_id}/plots/{kind}"]["get"]["parameters"]
    kind = next(p for p in params if p["name"] == "kind")
    assert set(SEARCH_PLOT_KINDS) <= set(kind["schema"]["enum"])


def test_the_client_draws_a_search_kind(api, tmp_path):
    s = _asha(api)
    with isosweep.Client(api.url) as c:
        image = c.plot(s["id"], "search_history", metric="train_loss", path=tmp_path / "h.svg")
    assert b"<svg" in image[:2000] and (tmp_path / "h.svg").read_bytes() == image


def test_the_sweep_page_links_each_search_kind_and_its_figure_draws(api):
    s = _asha(api)
    base = api.url
    html = httpx.get(f"{base}/sweeps/{s['id']}", timeout=60).text
    links = re.findall(r'<a href="([^"]+)"(?: class="current")?>(\w+)</a>', html)
    kinds = {kind: unescape(href) for href, kind in links if kind in SEARCH_PLOT_KINDS}
    assert set(kinds) == set(SEARCH_PLOT_KINDS)
    for kind, href in kinds.items():
        view = httpx.get(f"{base}{href}", timeout=60)
        assert view.status_code == 200, (kind, view.text[:500])
        img = unescape(re.search(r'<img data-plot src="([^"]+)"', view.text).group(1))
        assert f"/plots/{kind}?" in img
        r = httpx.get(f"{base}{img}", timeout=60)
        assert r.status_code == 200, (kind, r.text)
        assert b"<svg" in r.content[:2000]
    plain = submit(api, spec("grid", seeds=1, depth=[2, 3]))
    html = httpx.get(f"{base}/sweeps/{plain['id']}", timeout=60).text
    assert not any(f">{k}</a>" in html for k in SEARCH_PLOT_KINDS)  # no search: not offered


def test_the_cli_saves_a_search_kind(api, tmp_path):
    s = _asha(api)
    out = tmp_path / "rungs.svg"
    env = {**os.environ, "ISOSWEEP_API_URL": api.url}
    env.pop("ISOSWEEP_API_TOKEN", None)
    isosweep_cli = Path(sys.executable).with_name("isosweep")
    args = [str(isosweep_cli), "plot", str(s["id"])]
    r = subprocess.run([*args, "halving_rungs", "-o", str(out)], env=env, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert b"<svg" in out.read_bytes()[:2000]
    r = subprocess.run([*args, "search_history", "--mode", "max", "--metric", "train_loss", "-o",
                        str(tmp_path / "h.png")], env=env, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
