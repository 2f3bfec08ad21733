"""The cost estimate at submission (service.cost): POST /sweeps answers with it, GET /sweeps/{id}
keeps it, a sweep over ISOSWEEP_MAX_SWEEP_HOURS is a 422 naming `budget` unless the spec says
`accept_cost: true`, `isosweep submit` prints it and the dashboard's sweep page shows it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service import cost

ISOSWEEP = Path(sys.executable).with_name("isosweep")
SPEC = """\
name: costly
parameters:
  depth: 3
  width: 4
  epochs: 2
seeds: 6
"""
ONE_TRIAL = 7_932_624  # flops of depth 3, width 4, 2 epochs on digits (tests/service/test_cost)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(cost.os, "cpu_count", lambda: 2)  # the server thread's host: 2 CPUs
    cost.forget_throughput()
    yield
    cost.forget_throughput()


def _post(api, text):
    return api.post("/sweeps", content=text, headers={"Content-Type": "application/yaml"})


def test_submit_answers_with_the_estimate_and_the_sweep_keeps_it(api):
    r = _post(api, SPEC)
    assert r.status_code == 201, r.text
    e = r.json()["estimate"]
    assert (e["trials"], e["trial_epochs"], e["records"]) == (6, 12, 18)
    assert e["flops"] == 6 * ONE_TRIAL and e["parallel"] == 2 and e["kind"] == "cpu"
    assert e["seconds"] == pytest.approx(6 * ONE_TRIAL / (2 * 2e9))
    assert e["throughput_source"].startswith("an assumed 2 GFLOP/s per CPU")
    again = api.get(f"/sweeps/{r.json()['id']}").json()["estimate"]
    assert again == e
    assert api.get("/sweeps").json()["data"][0]["estimate"] == e


def test_over_the_budget_is_a_422_naming_budget_until_accepted(start_api):
    api = start_api(max_sweep_hours=1e-6)  # 3.6 ms: any sweep of real trials is over
    r = _post(api, SPEC)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["type"] == "limit_exceeded" and err["field"] == "budget"
    assert "accept_cost: true" in err["message"] and "≈" in err["message"]
    assert api.get("/sweeps").json()["count"] == 0
    ok = _post(api, SPEC + "accept_cost: true\n")
    assert ok.status_code == 201 and ok.json()["spec"]["accept_cost"] is True


@pytest.mark.sqlite_only
def test_the_cli_prints_the_estimate_and_the_dashboard_shows_it(api, tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    env = {**os.environ, "ISOSWEEP_API_URL": api.url, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("ISOSWEEP_API_TOKEN", None)
    r = subprocess.run(
        [str(ISOSWEEP), "submit", str(path)], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    # 6 trials × 7.9 MFLOP over 2 CPUs at 2 GFLOP/s each: 0.012 s
    line = next(x for x in r.stdout.splitlines() if x.startswith("cost:"))
    assert "cost: ≈ 0.012 s (12 trial-epochs, 47.6 MFLOP, 2 trials at once)" in line, line
    assert "an assumed 2 GFLOP/s per CPU" in line
    (sweep,), _ = api.store.list_sweeps()
    page = httpx.get(f"{api.url}/sweeps/{sweep.id}", timeout=30)
    assert page.status_code == 200
    assert "<dt>estimate</dt>" in page.text and "12 trial-epochs" in page.text


# --- sampled and adaptive searches: n × the per-trial estimate --------------------------------

SEARCH = """\
name: searched
parameters:
  depth: 3
  width: 4
  epochs: 2
  lr: {loguniform: [1.0e-3, 1.0]}
seeds: 2
"""


@pytest.mark.parametrize(
    "search",
    [
        "search: {kind: tpe, n: 5, objective: test_loss}\n",
        "search: {kind: random, n: 5}\n",
        "search: {kind: sobol, n: 4}\n",
    ],
)
def test_a_search_is_estimated_as_n_times_the_trial(api, search):
    r = _post(api, SEARCH + search)
    assert r.status_code == 201, r.text
    n = 4 if "sobol" in search else 5
    e = r.json()["estimate"]
    # lr does not change the operation count: every trial is ONE_TRIAL's shape
    assert (e["trials"], e["trial_epochs"], e["records"]) == (2 * n, 2 * 2 * n, 3 * 2 * n)
    assert e["flops"] == 2 * n * ONE_TRIAL
    assert e["seconds"] == pytest.approx(2 * n * ONE_TRIAL / (2 * 2e9))
    assert api.get(f"/sweeps/{r.json()['id']}").json()["estimate"] == e


def test_a_tpe_search_over_a_costly_field_averages_its_distribution(api):
    text = SEARCH.replace("width: 4", "width: {choice: [4, 64]}")
    r = _post(api, text + "search: {kind: tpe, n: 8, objective: test_loss}\n")
    assert r.status_code == 201, r.text
    e = r.json()["estimate"]
    wide = cost.trial_flops(cost.shape_of({"depth": 3, "width": 64, "epochs": 2}))
    assert e["trials"] == 16 and 16 * ONE_TRIAL < e["flops"] < 16 * wide
    assert e["per_trial_flops_max"] == wide


def test_a_tpe_search_over_the_budget_is_refused(start_api):
    api = start_api(max_sweep_hours=1e-6)
    r = _post(api, SEARCH + "search: {kind: tpe, n: 5, objective: test_loss}\n")
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "budget"
