"""A layer, epoch or metric a sweep does not have is an error everywhere: the store's read, the
REST metrics route (SQLite and Postgres), and the CLI, which exits non-zero with the message the
plot gives; `--where` typos are answered in the CLI's own words, not the REST route's."""

from __future__ import annotations

import pytest
from api_support import fill, spec, submit
from test_cli_client import cli, failed_red, plain

from service.config import SCALAR_METRICS
from service.errors import InvalidInput
from service.models import layer_metrics
from service.spec import expand, parse_spec

DEPTH = 20


@pytest.fixture
def deep(api):
    """A filled MLP sweep of depths 10 and 20 (norm batch), epochs 0..2."""
    s = submit(api, spec("deep", seeds=1, depth=[10, DEPTH]))
    fill(api, s["id"])
    return s


def _error(r, field):
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == field, error
    return error


def test_a_layer_beyond_every_trials_depth_is_named(api, deep):
    error = _error(api.get(f"/sweeps/{deep['id']}/metrics", params={"layer": 500}), "layer")
    assert error["message"] == "layer: no trial has layer 500 (allowed: 1..20)"
    assert error["allowed"] == ["1..20"]
    r = api.get(f"/sweeps/{deep['id']}/metrics", params={"layer": [20], "metric": "grad_norm"})
    assert r.status_code == 200 and r.json()["count"] == 3  # the last layer, epochs 0..2


def test_layers_some_trials_have_keep_those(api):
    """Depths 3 and 5: layer 5 is a depth-5 trial's, layers 4 and 9 together keep layer 4."""
    s = submit(api, spec("mixed", seeds=1, depth=[3, 5]))
    fill(api, s["id"])
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"layer": 5, "metric": "grad_norm"})
    assert r.status_code == 200 and {row["layer"] for row in r.json()["data"]} == {5}
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"layer": [4, 9], "metric": "rms"})
    assert r.status_code == 200 and {row["layer"] for row in r.json()["data"]} == {4}
    error = _error(api.get(f"/sweeps/{s['id']}/metrics", params={"layer": [6, 9]}), "layer")
    assert error["message"] == "layer: no trial has layer 6 or 9 (allowed: 1..5)"


def test_a_metric_the_sweeps_model_does_not_record_names_its_metrics(api, deep):
    r = api.get(f"/sweeps/{deep['id']}/metrics", params={"metric": "isometry_gap/attn"})
    error = _error(r, "metric")
    config = expand(parse_spec(spec("deep", seeds=1, depth=[10, DEPTH])))[0]
    have = [*SCALAR_METRICS, *layer_metrics(config)]
    assert error["allowed"] == have and "isometry_gap/attn" not in have
    assert error["message"].startswith(
        f"metric: sweep {deep['id']} does not record 'isometry_gap/attn'; did you mean "
        "'isometry_gap/act'?"
    )
    none = submit(api, spec("plain", seeds=1, depth=2, norm="none"))
    r = api.get(f"/sweeps/{none['id']}/metrics", params={"metric": "isometry_gap/norm"})
    assert "isometry_gap/norm" not in _error(r, "metric")["allowed"]  # norm none: no such tap


def test_an_epoch_no_trial_records_is_named(api, deep):
    error = _error(api.get(f"/sweeps/{deep['id']}/metrics", params={"epoch": 9}), "epoch")
    assert error["message"] == "epoch: epoch 9 is not recorded (allowed: 0..2)"
    sparse = submit(api, spec("sparse", seeds=1, depth=2, epochs=10, record_every=4))
    error = _error(api.get(f"/sweeps/{sparse['id']}/metrics", params={"epoch": 5}), "epoch")
    assert error["allowed"] == ["0", "4", "8", "10"]
    r = api.get(f"/sweeps/{sparse['id']}/metrics", params={"epoch": 8})
    assert r.status_code == 200  # recorded by the schedule (no rows stored yet)


def test_the_store_read_says_the_same(api, deep):
    with pytest.raises(InvalidInput) as info:
        api.store.read_metrics(deep["id"], layers=[500])
    assert info.value.message == "layer: no trial has layer 500 (allowed: 1..20)"


@pytest.mark.sqlite_only
def test_the_cli_fails_as_the_plot_does(api, deep):
    sid = str(deep["id"])
    results = cli(api, "results", sid, "--layer", "500")
    failed_red(results, "layer: no trial has layer 500 (allowed: 1..20)", "HTTP 422")
    plot = cli(api, "plot", sid, "depth_scaling", "--layer", "200", "-o", "-")
    failed_red(plot, "layer: no trial has layer 200 (allowed: 1..20", "HTTP 422")
    failed_red(cli(api, "results", sid, "--metric", "isometry_gap/attn"), "does not record")
    failed_red(cli(api, "results", sid, "--epoch", "7"), "epoch 7 is not recorded")


@pytest.mark.sqlite_only
def test_where_typos_are_answered_in_the_clis_words(api, deep):
    sid = str(deep["id"])
    r = cli(api, "results", sid, "--where", "activaton=relu")
    failed_red(r, "--where activaton: unknown config field; did you mean 'activation'?")
    assert "query parameter" not in plain(r.stderr) and "aggregate" not in plain(r.stderr)
    r = cli(api, "results", sid, "--where", "activation=rellu")
    failed_red(r, "--where activation", "did you mean 'relu'?")
    r = cli(api, "plot", sid, "depth_scaling", "--where", "dpeth=3", "-o", "-")
    failed_red(r, "--where dpeth: unknown config field; did you mean 'depth'?")
    r = cli(api, "results", sid, "--where", "depth=20", "--metric", "train_loss")
    assert r.returncode == 0 and "train_loss" in r.stdout
