"""A spec can never make the server import code (issue 11, docs/models.md "The security rule"):
a model the server's configuration did not register is a 422 over the real HTTP API naming the
registered ones, and nothing the request names is imported — module names, "module:attr" and
dotted paths, Python expressions, YAML's Python tags. A model the configuration registered
(ISOSWEEP_MODEL_MODULES) is accepted, its model_params validated by its own class."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from api_support import spec

from service import models
from service.settings import get_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "registered_model"
CANARY = "isosweep_canary_model"
BUILTINS = "mlp, resmlp, cnn, transformer"


@pytest.fixture
def registry(monkeypatch, tmp_path):
    """A fresh registry (nothing imported yet, the settings read anew) and, importable from
    sys.path, a canary module that leaves a file behind if anything imports it."""
    monkeypatch.setattr(models, "_REGISTRY", {})
    monkeypatch.setattr(models, "_loaded", False)
    monkeypatch.delenv("ISOSWEEP_MODEL_MODULES", raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.delitem(sys.modules, "wide_mlp", raising=False)
    marker = tmp_path / "imported"
    (tmp_path / f"{CANARY}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "def build(*args, **kwargs):\n    raise SystemExit('called')\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    get_settings.cache_clear()
    yield marker
    get_settings.cache_clear()
    sys.modules.pop("wide_mlp", None)
    sys.modules.pop(CANARY, None)


@pytest.fixture
def with_wide_mlp(registry, monkeypatch):
    monkeypatch.setenv("ISOSWEEP_MODEL_MODULES", "wide_mlp")
    get_settings.cache_clear()
    return registry


NAMES = [
    CANARY,
    f"{CANARY}:build",
    f"{CANARY}.build",
    "os",
    "subprocess:run",
    "os.path",
    "this",  # prints the Zen of Python when imported: a second canary
    "importlib.import_module",
    f"__import__('{CANARY}')",
    "../../examples/registered_model/wide_mlp",
    "wide_mlp",  # importable here, but not in the server's configuration
]


def _refused(api, model: str, registered: str) -> None:
    before = set(sys.modules)
    r = api.post("/sweeps", json=spec(model=model, epochs=0, seeds=1))
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_input"
    assert f"unknown model {model!r}" in err["message"]
    assert f"the server knows {registered}" in err["message"]
    new = set(sys.modules) - before
    head = model.split(":")[0].split(".")[0]
    assert not {n for n in new if n in (model, head) or n.startswith(CANARY)}, new
    assert api.get("/sweeps").json()["count"] == 0


@pytest.mark.parametrize("model", NAMES)
def test_an_unregistered_model_is_refused_and_nothing_is_imported(api, registry, model):
    _refused(api, model, BUILTINS)
    assert not registry.exists(), "the canary module was imported"
    assert CANARY not in sys.modules and "this" not in sys.modules
    assert "wide_mlp" not in sys.modules


def test_a_yaml_python_tag_is_refused_and_nothing_is_imported(api, registry):
    text = (
        f"name: tag\nparameters:\n  model: !!python/object/apply:{CANARY}.build []\n  epochs: 0\n"
    )
    r = api.post("/sweeps", content=text, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 422, r.text
    assert not registry.exists() and CANARY not in sys.modules


def test_the_refusal_names_the_registered_models(api, with_wide_mlp):
    _refused(api, "os", f"{BUILTINS}, wide_mlp")
    _refused(api, f"{CANARY}:build", f"{BUILTINS}, wide_mlp")
    assert not with_wide_mlp.exists()


def test_a_registered_model_is_accepted(api, with_wide_mlp):
    r = api.post("/sweeps", json=spec(model="wide_mlp", depth=[2, 3], seeds=1))
    assert r.status_code == 201, r.text
    trials = api.get(f"/sweeps/{r.json()['id']}/trials").json()["data"]
    assert {t["config"]["model"] for t in trials} == {"wide_mlp"}
    # the defaults of its own parameters are stored with it: equal networks hash equal
    assert trials[0]["config"]["model_params"] == {
        "expansion": 2,
        "activation": "relu",
        "layer_norm": True,
    }


def test_model_params_of_the_wrong_type_are_a_422_naming_the_field(api, with_wide_mlp):
    r = api.post("/sweeps", json=spec(model="wide_mlp", model_params=[{"expansion": "wide"}]))
    assert r.status_code == 422, r.text
    assert "model_params.expansion" in r.json()["error"]["message"]


def test_the_canary_shows_an_import_when_the_configuration_names_it(registry, monkeypatch):
    """The checks above are not vacuous: the server's own setting does import the module."""
    monkeypatch.setenv("ISOSWEEP_MODEL_MODULES", CANARY)
    get_settings.cache_clear()
    assert models.registered() == {}  # it registers nothing, but it ran
    assert registry.read_text() == "imported" and CANARY in sys.modules


# --- the example's model_params axis through every read (issue 19) ----------------------------


def _example_sweep(api) -> tuple[int, list[dict]]:
    """examples/registered_model/spec.yaml submitted as YAML, its 6 trials given hand-made
    records: trial t's train_loss at epoch e is 1000·t + 100·e, its rms at layer ℓ that + ℓ."""
    import numpy as np

    text = (EXAMPLE / "spec.yaml").read_text(encoding="utf-8")
    r = api.post("/sweeps", content=text, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    trials = api.get(f"/sweeps/{sweep_id}/trials").json()["data"]
    assert len(trials) == 6
    for t in trials:
        api.store.start_trial(t["id"])
        depth = t["config"]["depth"]
        api.store.write_records(
            [
                (t["id"], {"epoch": e, "train_loss": 1000.0 * t["id"] + 100 * e,
                           "rms": 1000.0 * t["id"] + 100 * e + np.arange(1, depth + 1.0)})
                for e in range(3)
            ]
        )  # fmt: skip
        api.store.finish_trial(t["id"], "completed")
    return sweep_id, trials


def test_the_examples_model_params_axis_reads_pooled_filtered_and_drawn(api, with_wide_mlp):
    """The filed defect: metrics aggregate=true, the plots and the pooled CSV of this very
    example answered 500 (unhashable dict); CSV wrote model_params as a Python repr."""
    import csv
    import io
    import json
    import re

    import isosweep

    sweep_id, trials = _example_sweep(api)
    base = f"/sweeps/{sweep_id}"
    r = api.get(f"{base}/metrics", params={"metric": "rms", "layer": 1, "aggregate": "true"})
    assert r.status_code == 200, r.text
    rows = r.json()["data"]
    assert len(rows) == 3 * 3  # parameter points × epochs
    point = {json.dumps(t["config"]["model_params"], sort_keys=True): t["id"] for t in trials[::2]}
    for row in rows:
        assert isinstance(row["model_params"], dict)  # an object in JSON
        assert row["model_params.expansion"] == row["model_params"]["expansion"]
        t = point[json.dumps(row["model_params"], sort_keys=True)]
        assert row["mean"] == 1000 * (t + 0.5) + 100 * row["epoch"] + 1 and row["count"] == 2
    r = api.get(f"{base}/metrics", params={"metric": "rms", "aggregate": "true", "format": "csv"})
    assert r.status_code == 200, r.text
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert {json.loads(row["model_params"])["expansion"] for row in table} == {1, 4}
    # filters, and a typo's did-you-mean
    r = api.get(f"{base}/trials", params={"model_params.layer_norm": "false"})
    assert [t["id"] for t in r.json()["data"]] == [t["id"] for t in trials[:4]]
    r = api.get(f"{base}/metrics", params={"metric": "train_loss", "model_params.expansion": 4})
    assert {row["trial_id"] for row in r.json()["data"]} == {t["id"] for t in trials[2:]}
    r = api.get(f"{base}/metrics", params={"metric": "train_loss", "model_params.expanson": 4})
    assert r.status_code == 422, r.text
    assert "did you mean 'model_params.expansion'?" in r.json()["error"]["message"]
    # every plot kind, grouped by each parameter
    for kind, params in [
        ("depth_scaling", {"metric": "rms", "x": "model_params.expansion"}),
        ("training_curves", {"metric": "train_loss"}),
        ("training_curves", {"metric": "train_loss", "group_by": "model_params.layer_norm"}),
        ("layer_profile", {"metric": "rms", "group_by": "model_params.expansion"}),
        ("heatmap", {"metric": "rms", "x": "model_params.expansion",
                     "group_by": "model_params.layer_norm"}),
    ]:  # fmt: skip
        r = api.get(f"{base}/plots/{kind}", params=params)
        assert r.status_code == 200, (kind, params, r.text)
    r = api.get(
        f"{base}/plots/training_curves",
        params={"metric": "train_loss", "group_by": "model_params.layer_nrom"},
    )
    assert r.status_code == 422 and "model_params.layer_norm" in r.json()["error"]["message"]
    # the dashboard's page filtered by a parameter, and the Python client
    page = api.client.get(f"{api.url}/sweeps/{sweep_id}", params={"model_params.expansion": 4})
    assert page.status_code == 200
    assert '<select name="model_params.layer_norm">' in page.text  # a filter per parameter
    shown = {int(i) for i in re.findall(r'href="/trials/(\d+)"', page.text)}
    assert shown == {t["id"] for t in trials[2:]}
    for sort in ("model_params", "model_params.expansion"):
        page = api.client.get(f"{api.url}/sweeps/{sweep_id}", params={"sort": sort})
        assert page.status_code in (200, 422), page.text  # never a 500
    with isosweep.Client(api.url) as client:
        frame = client.metrics(sweep_id, metric="train_loss", epoch=2, aggregate=True)
        assert sorted(frame["model_params.expansion"]) == [1, 4, 4]
        four = client.metrics(sweep_id, metric="train_loss", where={"model_params.expansion": 4})
        assert set(four["trial_id"]) == {t["id"] for t in trials[2:]}
