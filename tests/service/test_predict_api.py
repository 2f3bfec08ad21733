"""`POST /api/v1/theory/predict` and `isosweep theory predict --set …`: the prediction of
service.theory.predict, bad configs and inputs as 422s naming the field."""

import json
import math
import subprocess

import numpy as np
import pytest
from fastapi.testclient import TestClient
from support import isosweep_command

from api.app import create_app
from service import jsonfmt
from service.settings import Settings
from service.theory import predict


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'p.db'}"
    with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as c:
        yield c


LINEAR_BN = {"norm": "batch", "activation": "identity", "depth": 4, "batch_size": 8,
             "norm_eps": 0.0}  # fmt: skip


def _decoded(values):
    return np.array([jsonfmt.decode_float(v) for v in values])


def test_route_returns_the_prediction(client):
    r = client.post("/api/v1/theory/predict", json={"config": LINEAR_BN})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["layers"] == [1, 2, 3, 4] and body["config"]["norm"] == "batch"
    direct = predict(LINEAR_BN)
    for k, v in body["metrics"].items():
        np.testing.assert_array_equal(_decoded(v), direct[k])
    assert body["metrics"]["isometry_gap/norm"][0] == "Infinity"  # batch-centred: 1 in the null
    g = _decoded(body["metrics"]["grad_norm"])
    assert g[1] / g[2] == pytest.approx(math.sqrt(6 / 5), rel=1e-9)  # (n − 2)/(n − 3), n = 8
    assert "weight_isometry_gap" in body["unpredicted"]


def test_route_with_inputs_and_labels(client):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((6, 64))
    body = {"config": {"norm": "layer", "order": "act_norm", "depth": 2, "batch_size": 6},
            "inputs": X.tolist(), "labels": [0, 1, 2, 3, 4, 5]}  # fmt: skip
    r = client.post("/api/v1/theory/predict", json=body)
    assert r.status_code == 200, r.text
    assert "labels" in r.json()["notes"]["grad_norm"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"config": {"depth": 0}}, "config.depth"),
        ({"config": {"norm": "group"}}, "config.norm"),
        ({"config": {"no_such": 1}}, "config.no_such"),
        ({"config": {"depth": 5000}}, "config.depth"),
        ({"config": {}, "inputs": [[1.0, 2.0], [3.0]]}, "inputs"),
        ({"config": {}, "inputs": [[1.0, 2.0]]}, "inputs"),
        ({"config": {"batch_size": 2}, "inputs": [[1.0], [2.0]], "labels": [0, 10]}, "labels"),
        ({"config": {}, "samples": 10}, "samples"),
        # found by schemathesis: a label past 64 bits, inputs whose Gram overflows (were 500s)
        (
            {"config": {"batch_size": 2}, "inputs": [[1.0], [2.0]], "labels": [0, 10**22]},
            "labels[1]",
        ),
        ({"config": {"batch_size": 2}, "inputs": [[1e300, 1.0], [1.0, 1e300]]}, "inputs"),
        ({}, "config"),
    ],
)
def test_route_refuses_bad_bodies_naming_the_field(client, body, field):
    r = client.post("/api/v1/theory/predict", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field, r.json()


def test_route_answers_families_it_does_not_cover_with_reasons(client):
    r = client.post("/api/v1/theory/predict", json={"config": {"model": "cnn"}})
    assert r.status_code == 200
    assert r.json()["metrics"] == {} and "'cnn'" in r.json()["unpredicted"]["rms"]
    r = client.post("/api/v1/theory/predict", json={"config": {"model": "transformer"}})
    assert r.json()["metrics"] == {} and "mlp_ratio 0" in r.json()["unpredicted"]["rms"]


def test_route_predicts_an_attention_stack_in_the_uniform_limit(client):
    cfg = {"model": "transformer", "mlp_ratio": 0, "skip": False, "depth": 2, "batch_size": 4}
    r = client.post("/api/v1/theory/predict", json={"config": cfg})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["metrics"]["token_cosine"] == [1.0, 1.0]
    assert body["metrics"]["token_isometry_gap"] == ["Infinity", "Infinity"]
    assert "softmax" in body["unpredicted"]["grad_norm"] and "uniform" in body["notes"]["attention"]


def _theory(*args):
    return subprocess.run(
        [*isosweep_command(), "theory", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_predict_prints_the_prediction():
    sets = [a for k, v in LINEAR_BN.items() for a in ("--set", f"{k}={v}")]
    done = _theory("predict", *sets, "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    np.testing.assert_array_equal(
        _decoded(body["metrics"]["grad_norm"]), predict(LINEAR_BN)["grad_norm"]
    )
    table = _theory(*sets)  # `isosweep theory --set …` is the same command
    assert table.returncode == 0 and "grad_norm" in table.stdout and "relative" in table.stdout


def test_cli_predict_names_a_bad_field():
    done = _theory("predict", "--set", "depth=0")
    assert done.returncode != 0 and "depth" in done.stderr
