"""Selecting one trial by its id: two trials that differ only in a document parameter (a timm
model's `model_args`) cannot be told apart by config filters, so the metrics route's `trial`, the
plot routes' `trial` and the dashboard's trial CSV select by id; a filter on a document parameter
is a 422 that says so (found by the whole-surface test: the trial page's CSV link filtered by
`model_params.model_args={}` and was refused as "Input should be a valid dictionary")."""

from __future__ import annotations

import io
import re
from html import unescape

import httpx
import pandas as pd
import pytest
from api_support import fill, submit

pytest.importorskip("timm")  # model: timm needs the extra (in the dev install)

pytestmark = pytest.mark.sqlite_only  # the selection is SQL the store tests run on both

TWINS = {
    "name": "twins",
    "parameters": {
        "model": "timm",
        "model_params": [
            {"arch": "resnet18"},
            {"arch": "resnet18", "model_args": {"zero_init_last": False}},
        ],
        "depth": 4,
        "batch_size": 8,
        "dataset": "digits",
        "epochs": 0,
    },
    "seeds": 1,
}


def test_one_trial_by_id_where_config_filters_cannot_tell_it_apart(api):
    s = submit(api, TWINS)
    trials = fill(api, s["id"])
    assert len(trials) == 2
    one, other = trials
    base = f"/sweeps/{s['id']}/metrics"
    rows = api.get(base, params={"trial": one["id"], "metric": "grad_norm"}).json()
    assert {r["trial_id"] for r in rows["data"]} == {one["id"]} and rows["count"] == 4
    # the dashboard's trial CSV is its own rows
    page = httpx.get(f"{api.url}/trials/{other['id']}").text
    link = unescape(re.search(r'<a href="([^"]+format=csv[^"]*)">', page).group(1))
    frame = pd.read_csv(io.StringIO(httpx.get(f"{api.url}{link}").text))
    assert set(frame["trial_id"]) == {other["id"]} and len(frame) > 0
    # a plot of one trial draws that trial alone
    chart = api.get(
        f"/sweeps/{s['id']}/plots/layer_profile",
        params={"trial": one["id"], "metric": "grad_norm", "format": "json"},
    ).json()
    (panel,) = chart["panels"]
    assert len(panel["series"]) == 1, [x["label"] for x in panel["series"]]


def test_a_trial_of_another_sweep_or_none_is_a_404(api):
    s = submit(api, TWINS)
    fill(api, s["id"])
    t = submit(api, {**TWINS, "name": "more", "seeds": [7]})
    (theirs, _) = fill(api, t["id"])
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"trial": theirs["id"]})
    assert r.status_code == 404 and f"belongs to sweep {t['id']}" in r.text, r.text
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"trial": 10_000})
    assert r.status_code == 404, r.text


def test_a_filter_on_a_document_parameter_says_why_it_is_refused(api):
    s = submit(api, TWINS)
    fill(api, s["id"])
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"model_params.model_args": "{}"})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "where.model_params.model_args"
    assert "is a document" in error["message"] and "trial" in error["message"]
