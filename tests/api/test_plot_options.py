"""The plot route's pooling and axis options (stat, band, nonfinite, xscale, yscale) over REST,
and "did you mean" in the errors: the one helper (service.errors.suggest) behind InvalidInput's
allowed list, checked on the typos a new user makes and over REST."""

from __future__ import annotations

import re
from html import unescape

import pytest
from api_support import fill, spec, submit
from pydantic import ValidationError

from service.config import CONFIG_FIELDS, TrialConfig
from service.errors import InvalidInput, did_you_mean, pydantic_hint, suggest
from service.plots import PLOT_OPTIONS
from service.plots.stored import make_plot
from service.spec import SweepSpec, parse_spec

pytestmark = pytest.mark.sqlite_only


# --- did you mean ----------------------------------------------------------------------------


def test_suggest_finds_the_close_name():
    assert suggest("rellu", ["relu", "tanh", "gelu"]) == "relu"
    assert suggest("activaton", CONFIG_FIELDS) == "activation"
    assert suggest("paramters", SweepSpec.model_fields) == "parameters"
    assert suggest("ReLU", ["relu"]) == "relu"  # case does not count
    assert suggest("relu", ["relu", "gelu"]) is None  # allowed: nothing to suggest
    assert suggest("zzz", ["relu", "tanh"]) is None  # nothing close
    assert did_you_mean("rellu", ["relu"]) == "; did you mean 'relu'?"
    assert did_you_mean("zzz", ["relu"]) == ""


def test_invalid_input_with_allowed_suggests_before_listing():
    err = InvalidInput("unknown value 'rellu'", field="activation", allowed=["relu", "tanh"])
    assert err.suggestion == "relu"
    assert err.message == (
        "activation: unknown value 'rellu'; did you mean 'relu'? (allowed: relu, tanh)"
    )
    err = InvalidInput("unknown field", field="parameters.activaton", allowed=CONFIG_FIELDS)
    assert err.suggestion == "activation"  # read from the field's last part
    err = InvalidInput("must be ≥ 1", field="depth", allowed=["1", "2"])
    assert err.suggestion is None and "did you mean" not in err.message
    err = InvalidInput("bad", field="x", allowed=["relu"], given="rellu")  # given explicitly
    assert err.suggestion == "relu"


def test_a_spec_parameter_typo_gets_a_suggestion():
    with pytest.raises(InvalidInput) as info:
        parse_spec({"name": "x", "parameters": {"activaton": ["relu"]}})
    assert info.value.field == "parameters.activaton"
    assert "did you mean 'activation'?" in info.value.message


def test_pydantic_errors_get_a_suggestion_from_the_helper():
    """The literal value (`rellu`) and the unknown top-level key (`paramters`) come from
    pydantic; pydantic_hint reads its error and suggests."""
    with pytest.raises(ValidationError) as info:
        TrialConfig(activation="rellu")
    (error,) = info.value.errors()
    assert pydantic_hint(error) == "; did you mean 'relu'?"
    with pytest.raises(ValidationError) as info:
        SweepSpec.model_validate({"name": "x", "paramters": {}})
    extra = [e for e in info.value.errors() if e["type"] == "extra_forbidden"]
    assert pydantic_hint(extra[0], SweepSpec.model_fields) == "; did you mean 'parameters'?"


def test_a_query_parameter_typo_gets_a_suggestion_over_rest(api):
    s = submit(api, spec(depth=[2, 4], seeds=2))
    r = api.get(f"/sweeps/{s['id']}/plots/depth_scaling", params={"stt": "median"})
    body = r.json()["error"]
    assert r.status_code == 422 and body["field"] == "stt"
    assert "did you mean 'stat'?" in body["message"] and "stat" in body["allowed"]
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"activaton": "relu"})
    body = r.json()["error"]
    assert r.status_code == 422 and body["field"] == "activaton"
    assert "did you mean 'activation'?" in body["message"]


# --- the options over REST -------------------------------------------------------------------


@pytest.fixture
def sweep(api) -> int:
    s = submit(api, spec(depth=[2, 4], init=["gaussian", "orthogonal"], seeds=2))
    fill(api, s["id"])
    return s["id"]


def test_an_invalid_stat_is_a_422_naming_stat_with_allowed_values(api, sweep):
    r = api.get(f"/sweeps/{sweep}/plots/depth_scaling", params={"stat": "average"})
    body = r.json()["error"]
    assert r.status_code == 422 and body["type"] == "invalid_input"
    assert body["field"] == "stat" and body["allowed"] == ["mean", "geomean", "median"]
    assert body["message"].startswith("stat: unknown value 'average'")
    r = api.get(f"/sweeps/{sweep}/plots/depth_scaling", params={"stat": "geomaen"})
    assert "did you mean 'geomean'?" in r.json()["error"]["message"]
    r = api.get(f"/sweeps/{sweep}/plots/heatmap", params={"band": "ci"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "band"  # cells have no band


@pytest.mark.parametrize(
    "options",
    [
        {"stat": "median", "band": "iqr"},
        {"stat": "mean", "band": "std", "yscale": "linear"},
        {"stat": "geomean", "nonfinite": "exclude", "xscale": "log", "yscale": "log"},
        {"band": "none", "yscale": "auto"},
    ],
)
def test_the_route_draws_what_make_plot_draws_with_the_options(api, sweep, options):
    params = {"metric": "grad_norm", "group_by": "init", "layer": 1, "format": "png"}
    r = api.get(f"/sweeps/{sweep}/plots/depth_scaling", params={**params, **options})
    assert r.status_code == 200, r.text
    expected = make_plot(
        api.store, sweep, "depth_scaling", metric="grad_norm", group_by="init", layer=1,
        fmt="png", **options,
    )  # fmt: skip
    assert r.content == expected
    default = api.get(f"/sweeps/{sweep}/plots/depth_scaling", params=params)
    assert default.content != r.content  # the options changed the figure


def test_every_option_is_in_the_openapi_document_with_its_values(api):
    doc = api.client.get(api.url + "/openapi.json").json()
    route = doc["paths"]["/api/v1/sweeps/{sweep_id}/plots/{kind}"]["get"]
    params = {p["name"]: p for p in route["parameters"]}
    for name, values in PLOT_OPTIONS.items():
        assert params[name]["schema"]["enum"] == list(values)


def test_the_dashboard_passes_stat_and_yscale_to_the_plot(api, sweep):
    html = api.client.get(
        api.url + f"/sweeps/{sweep}?kind=depth_scaling&metric=grad_norm&stat=median&yscale=linear"
    ).text
    src = unescape(re.search(r'<img data-plot src="([^"]+)"', html).group(1))
    assert "stat=median" in src and "yscale=linear" in src
    assert 'data-opt="stat"' in html and 'data-opt="yscale"' in html
    assert api.client.get(api.url + src).status_code == 200
    html = api.client.get(api.url + f"/sweeps/{sweep}?kind=heatmap&stat=median&yscale=log").text
    src = unescape(re.search(r'<img data-plot src="([^"]+)"', html).group(1))
    assert "stat=median" in src and "yscale" not in src  # a heatmap has no y scale to set


def test_the_cli_plot_passes_the_options(api, sweep, tmp_path, monkeypatch, capsys):
    from api.cli.main import main

    monkeypatch.setenv("ISOSWEEP_API_URL", api.url)
    monkeypatch.delenv("ISOSWEEP_API_TOKEN", raising=False)
    out = tmp_path / "med.png"
    argv = ["plot", str(sweep), "depth_scaling", "--metric", "grad_norm", "--group-by", "init",
            "--layer", "1", "--stat", "median", "--nonfinite", "exclude", "--yscale", "linear",
            "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    expected = make_plot(
        api.store, sweep, "depth_scaling", metric="grad_norm", group_by="init", layer=1,
        stat="median", nonfinite="exclude", yscale="linear",
    )  # fmt: skip
    assert out.read_bytes() == expected
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main([*argv[:-2], "--stat", "medain", "-o", str(tmp_path / "x.png")])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "stat: unknown value 'medain'; did you mean 'median'?" in err
    assert not (tmp_path / "x.png").exists()
