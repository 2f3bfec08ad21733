"""The OpenAPI document as a client generator reads it (api/openapi.py; docs/api.md, "The OpenAPI
document"): operation ids are docs/api.md's handler names; the SweepSpec schema accepts every
spec in examples/ (as written and as the server stores it) and every sampled form, and refuses
what the server refuses; metric rows, NaN spellings and epoch parameters are typed as the API
writes and reads them; every media type the API speaks is declared. Validation with jsonschema
(Draft 2020-12, OpenAPI 3.1's dialect); no server needed."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pandas as pd
import pytest

from api.app import create_app
from api.routes.deps import INT32_MAX, parse_epoch
from api.tables import json_rows
from service.config import TrialConfig
from service.documents import load_yaml
from service.errors import InvalidInput
from service.settings import Settings
from service.spec import SWEPT_BY_SPEC, parse_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(ROOT.glob("examples/*.yaml")) + sorted(ROOT.glob("examples/*/spec.yaml"))
DOC = create_app(Settings(database_url="sqlite:///:memory:")).openapi()


def validator(component: str) -> jsonschema.Draft202012Validator:
    """A validator of one component; its $refs resolve inside the document."""
    schema = {**copy.deepcopy(DOC), "$ref": f"#/components/schemas/{component}"}
    return jsonschema.Draft202012Validator(schema)


SPEC = validator("SweepSpec")


def accepted(v: jsonschema.Draft202012Validator, value: Any) -> bool:
    return v.is_valid(value)


def operations() -> dict[tuple[str, str], str]:
    """(METHOD, path with `{}` for each path parameter, no /api/v1) → operationId."""
    out = {}
    for path, ops in DOC["paths"].items():
        for method, op in ops.items():
            out[(method.upper(), re.sub(r"\{[^}]*\}", "{}", path.removeprefix("/api/v1")))] = op[
                "operationId"
            ]
    return out


def documented() -> dict[tuple[str, str], str]:
    """docs/api.md's Routes table: (METHOD, path) → handler."""
    text = (ROOT / "docs/api.md").read_text()
    table = text.split("## Routes", 1)[1].split("\n\n", 2)[1]
    out = {}
    for line in table.splitlines()[2:]:
        m = re.match(r"\| `(GET|POST|PUT|DELETE|PATCH) ([^`?]+)[^`]*` \| `(\w+)` \|", line)
        assert m, line
        out[(m[1], re.sub(r"\{[^}]*\}", "{}", m[2]))] = m[3]
    return out


def test_operation_ids_are_unique_and_the_handlers_named_in_docs_api_md():
    ids = [op["operationId"] for ops in DOC["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    assert operations() == documented()  # a new route needs its row in docs/api.md
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)+", i) for i in ids), ids  # no path in them


# --- the SweepSpec schema -------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_spec_is_valid_against_the_schema(path):
    data = load_yaml(path.read_text())
    errors = [e.message for e in SPEC.iter_errors(data)]
    assert not errors, errors[:3]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_spec_as_the_server_stores_it_is_valid_against_the_schema(path):
    """What GET /sweeps/{id} answers as `spec` (normalized distributions, search and early_stop
    spelled out or null) goes back into POST /sweeps as it is."""
    if "registered_model" in str(path):
        pytest.skip("needs its module registered (tests/api/test_registered_models.py)")
    stored = parse_spec(path.read_text()).model_dump(mode="json")
    errors = [e.message for e in SPEC.iter_errors(stored)]
    assert not errors, errors[:3]


def spec_with(parameters: dict[str, Any], **top: Any) -> dict[str, Any]:
    base = {"depth": 2, "width": 8, "batch_size": 4, "epochs": 1}
    return {"name": "s", "parameters": {**base, **parameters}, **top}


RANDOM = {"search": {"kind": "random", "n": 4}}
SAMPLED = [  # each form of docs/api.md's table, and the fields of each JSON type
    {"lr": {"loguniform": [1.0e-4, 1.0]}},
    {"lr": {"uniform": [0.01, 0.1]}},
    {"momentum": {"uniform": [0, 0.9]}},
    {"activation_gain": {"int": [1, 3]}},
    {"depth": {"int": [2, 5]}},
    {"width": {"int": [4, 64], "log": True}},
    {"activation": {"choice": ["relu", "tanh"]}},
    {"norm": {"choice": ["batch", "none"]}, "bias": {"choice": [True, False]}},
    {"max_train_samples": {"choice": [100, None]}},
    {"lr": {"loguniform": [1e-3, 1e-1]}, "depth": [2, 3], "init": "orthogonal"},
]


@pytest.mark.parametrize("params", SAMPLED, ids=lambda p: ",".join(p))
def test_every_sampled_form_is_valid_and_accepted_by_the_server(params):
    spec = spec_with(params, **RANDOM)
    assert accepted(SPEC, spec), [e.message for e in SPEC.iter_errors(spec)][:3]
    parse_spec(spec)  # and the server takes it (raises otherwise)


LINKED = [  # derived fields and linked axes (docs/api.md, "Derived and linked parameters")
    {"depth": [4, 8], "residual_scale": {"expr": "1/sqrt(depth)"}, "model": "resmlp"},
    {"width": {"expr": "2*batch_size"}},
    {"zip": [{"width": 8, "batch_size": 8}, {"width": 16, "batch_size": 16}]},
    {"zip": [[{"width": 8}, {"width": 16}], [{"init": "gaussian"}, {"init": "orthogonal"}]]},
]


@pytest.mark.parametrize("params", LINKED, ids=lambda p: ",".join(p))
def test_derived_fields_and_linked_axes_are_valid_and_accepted(params):
    spec = spec_with(params)
    zips = params.get("zip", [])
    groups = zips if zips and isinstance(zips[0], list) else [zips]
    linked = {k for group in groups for point in group for k in point}  # not set twice
    spec["parameters"] = {k: v for k, v in spec["parameters"].items() if k not in linked}
    assert accepted(SPEC, spec), [e.message for e in SPEC.iter_errors(spec)][:3]
    stored = parse_spec(spec).model_dump(mode="json")
    assert accepted(SPEC, stored), [e.message for e in SPEC.iter_errors(stored)][:3]


TPE = {"kind": "tpe", "n": 4, "objective": "test_loss", "mode": "min", "epoch": "last"}
SEARCHES = [
    {"kind": "random", "n": 3, "seed": 7},
    {"kind": "sobol", "n": 4},
    TPE,
    {**TPE, "epoch": 1, "objective": "grad_norm", "layer": 1},
]


@pytest.mark.parametrize("search", SEARCHES, ids=lambda s: f"{s['kind']}-{s.get('epoch', '')}")
def test_search_and_early_stop_forms_are_valid_and_accepted(search):
    stop = {"kind": "successive_halving", "metric": "test_loss", "grace_epochs": 1}
    spec = spec_with({"lr": {"loguniform": [1e-3, 1e-1]}, "epochs": 2}, search=search)
    for body in (spec, {**spec, "early_stop": stop}, {**spec, "early_stop": None}):
        assert accepted(SPEC, body), [e.message for e in SPEC.iter_errors(body)][:3]
        parse_spec(body)


REFUSED = [  # what the schema refuses, the server refuses too (422 naming the field)
    ({"lr": {"loguniform": [0, 1]}}, RANDOM),  # a > 0
    ({"lr": {"uniform": [0.1]}}, RANDOM),  # [a, b]
    ({"lr": {"gauss": [0, 1]}}, RANDOM),  # not a distribution
    ({"lr": {"uniform": [0.1, 1], "step": 1}}, RANDOM),  # an unknown key
    ({"depth": {"uniform": [1, 5]}}, RANDOM),  # an integer field: {int: …}
    ({"depth": {"int": [1.5, 5]}}, RANDOM),
    ({"activation": {"choice": []}}, RANDOM),
    ({"activation": {"choice": ["relu", "relu"]}}, RANDOM),
    ({"activation": {"choice": ["relu", "swish"]}}, RANDOM),
    ({"bias": {"uniform": [0, 1]}}, RANDOM),
    ({"depth": [2, 2]}, {}),  # an axis repeating a value
    ({"depth": []}, {}),
    ({"seed": [1, 2]}, {}),  # seeds are top-level
    ({"lr": {"loguniform": [1e-3, 1e-1]}}, {"search": {"kind": "grid", "n": 4}}),
    ({"lr": {"loguniform": [1e-3, 1e-1]}}, {"search": {**TPE, "objective": "tset_loss"}}),
    ({"lr": {"loguniform": [1e-3, 1e-1]}}, {"search": {**TPE, "epoch": -1}}),
    ({}, {"early_stop": {"kind": "successive_halving", "metric": "accuracy"}}),
    ({"width": {"expr": 16}}, {}),  # an expression is text
    ({"width": {"expr": "2*batch_size", "int": [1, 2]}}, {}),
    ({"zip": [{"width": [8, 16]}]}, {}),  # one value per point
    ({"zip": [{"widht": 8}]}, {}),
    ({"zip": [{}]}, {}),
    ({"zip": []}, {}),
    ({}, {"seeds": 0}),
    ({}, {"seeds": [0, 0]}),
    ({}, {"seeds": [-1]}),
]


@pytest.mark.parametrize(("params", "top"), REFUSED, ids=[str(r)[:60] for r in REFUSED])
def test_what_the_schema_refuses_the_server_refuses(params, top):
    spec = spec_with(params, **top)
    assert not accepted(SPEC, spec)
    with pytest.raises(InvalidInput):
        parse_spec(spec)


def test_every_swept_field_is_in_the_schema_with_its_forms():
    params = DOC["components"]["schemas"]["SweepSpec"]["properties"]["parameters"]["properties"]
    assert set(params) == {*SWEPT_BY_SPEC, "zip"}
    del params["zip"]
    fields = TrialConfig.model_json_schema()["properties"]
    for name, schema in params.items():
        forms = {a.get("$ref", "").rsplit("/", 1)[-1] for a in schema["anyOf"]}
        types = {b.get("type") for b in fields[name].get("anyOf", [fields[name]])}
        if name == "model_params":  # a mapping is its value, never derived or sampled
            assert len(schema["anyOf"]) == 2, name
            continue
        assert "Expr" in forms, name
        if "number" in types:
            assert forms >= {"Uniform", "LogUniform", "IntRange"}, name
        elif "integer" in types:
            assert "IntRange" in forms and "Uniform" not in forms, name
        else:
            assert not forms - {"", "Expr"}, name
        if name != "model_params":
            assert any("choice" in a.get("properties", {}) for a in schema["anyOf"]), name


# --- answers: metric rows, NaN spellings ------------------------------------------------------


def test_metric_rows_of_every_kind_are_valid_against_the_schema():
    """Rows as the API writes them (api.tables.json_rows): NaN/±inf spelled, a null layer, a
    model_params object and a list cell, and pooled rows."""
    frame = pd.DataFrame(
        {
            "trial_id": [1, 2, 3],
            "seed": [0, 1, 0],
            "model_params": [{"expansion": 1}, {"expansion": 4, "layer_norm": True}, {}],
            "tags": [["a"], [], ["b", 1]],
            "activation": ["relu", "tanh", "relu"],
            "lr": [0.1, 0.01, 1e-300],
            "epoch": [0, 1, 2],
            "metric": ["train_loss", "grad_norm", "test_acc"],
            "layer": pd.array([None, 3, None], dtype="Int64"),
            "value": [math.nan, math.inf, -math.inf],
        }
    )
    rows = json_rows(frame)
    assert rows[0]["value"] == "NaN" and rows[0]["layer"] is None  # as written on the wire
    pooled = json_rows(
        pd.DataFrame(
            {"epoch": [0], "metric": ["grad_norm"], "layer": [1], "mean": [np.inf],
             "std": [math.nan], "ci95": [0.5], "count": [3], "n_finite": [2]}
        )
    )  # fmt: skip
    page = validator("MetricsPublic")
    body = {"data": rows + pooled, "count": 4, "columns": list(frame.columns)}
    assert not [e.message for e in page.iter_errors(body)]
    row = validator("MetricRow")
    for bad in ({"value": "nan"}, {"value": "1.5"}, {"mean": None}, {"layer": 1.5},
                {"epoch": "last"}, {"metric": "loss"}):  # fmt: skip
        assert not row.is_valid({**rows[0], **bad}), bad


def test_nonfinite_numbers_are_one_component_used_by_every_real_field():
    nonfinite = DOC["components"]["schemas"]["NonFinite"]
    assert nonfinite["enum"] == ["NaN", "Infinity", "-Infinity"]
    text = str(DOC)
    assert text.count("'enum': ['NaN', 'Infinity', '-Infinity']") == 1  # one definition
    real = validator("ActivationPublic")
    good = {"name": "tanh", "gain": 1.0, "formula": "tanh(x)", "params": {}, "breakpoints": [],
            "homogeneous": False, "coefficients": [0.0, "Infinity"], "beta": "NaN",
            "kappa_prime0": 0.5, "moments": {"m": "-Infinity"}}  # fmt: skip
    assert real.is_valid(good)
    assert not real.is_valid({**good, "beta": "inf"})


# --- parameters: epoch ------------------------------------------------------------------------


def epoch_parameters() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path, ops in DOC["paths"].items():
        for op in ops.values():
            for p in op.get("parameters", []):
                if p["name"] == "epoch":
                    out.append((f"{path} {op['operationId']}", p["schema"]))
    return out


def test_every_epoch_parameter_is_typed_as_a_number_or_last_as_parse_epoch_reads_it():
    found = epoch_parameters()
    assert len(found) == 6, [f for f, _ in found]
    for where, schema in found:
        one = schema["anyOf"][0]
        item = one["items"] if one.get("type") == "array" else schema
        v = jsonschema.Draft202012Validator(item)
        for value in (0, 3, INT32_MAX, "last"):
            assert v.is_valid(value), (where, value)
            assert value == "last" or parse_epoch(str(value)) == value
        for value in (-1, INT32_MAX + 1, 1.5, "first", "3"):
            assert not v.is_valid(value), (where, value)
        for text in ("-1", str(INT32_MAX + 1), "1.5", "first"):
            with pytest.raises(InvalidInput):
                parse_epoch(text)


# --- media types --------------------------------------------------------------------------------


def content(path: str, method: str = "get", status: str = "200") -> list[str]:
    return list(DOC["paths"][f"/api/v1{path}"][method]["responses"][status]["content"])


def test_every_media_type_the_api_speaks_is_declared():
    body = DOC["paths"]["/api/v1/sweeps"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/SweepSpec"}
    assert body["application/yaml"]["schema"]["type"] == "string"
    assert body["application/yaml"]["schema"]["format"] == "binary"  # a generator sends a file
    for path in ("/sweeps/{sweep_id}/plots/{kind}", "/compare/plots/{kind}",
                 "/trials/{trial_id}/plots/{kind}"):  # fmt: skip
        assert content(path) == ["image/png", "image/svg+xml", "application/json"], path
    for path in ("/sweeps/{sweep_id}/metrics", "/compare/metrics"):
        assert content(path) == ["application/json", "text/csv", "application/vnd.apache.parquet"]
    assert content("/sweeps/{sweep_id}/events") == ["text/event-stream"]
