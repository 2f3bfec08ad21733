"""The example specs: every one parses and expands within the default limits; the reproduction
specs (docs/reproductions.md) are CPU-scale, set up as the papers describe, say in a comment the
one field to change for full scale, and have the trial counts the doc states. No training here."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

from service.errors import InvalidInput, LimitExceeded
from service.settings import Settings
from service.spec import expand, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
DOC = ROOT / "docs" / "reproductions.md"
REPRODUCTIONS = (
    "meterez-bn-gradients",
    "meterez-shaping",
    "joudaki-layernorm-isometry",
    "meterez-orthogonal-training",
    "de-smith-residual-depth",
    "xiao-delta-orthogonal",
    "dong-rank-collapse",
    "resnet-scaled-depth",
    "gpt2-token-isometry",  # model: hf (the dev install has the extra)
    "timm-resnet-stages",  # model: timm
)
OFFLINE = {"digits", "gaussian"}  # datasets that need no download
# "# FULL SCALE: change the one field `dataset` to `dataset: cifar10` …"
FULL_SCALE = re.compile(r"^# FULL SCALE: change the one field `(\w+)` to `(\w+): ([^`]+)`", re.M)


@pytest.fixture
def defaults(monkeypatch) -> Settings:
    """Settings at their coded defaults, whatever ISOSWEEP_* variables the shell has."""
    for name in [k for k in os.environ if k.startswith("ISOSWEEP_")]:
        monkeypatch.delenv(name)
    return Settings()


def spec_path(name: str) -> Path:
    return ROOT / "examples" / f"{name}.yaml"


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def test_the_examples_include_the_reproductions():
    assert {p.stem for p in EXAMPLES} >= set(REPRODUCTIONS)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_parses_and_expands_within_the_default_limits(path, defaults):
    spec = load_spec(path, settings=defaults)  # check_limits runs inside
    trials = expand(spec)
    assert len(trials) == spec.n_trials <= defaults.max_trials_per_sweep
    assert len({t.model_dump_json() for t in trials}) == len(trials)  # no trial twice


@pytest.mark.parametrize("name", REPRODUCTIONS)
def test_a_reproduction_runs_offline_on_cpu(name, defaults):
    spec = load_spec(spec_path(name), settings=defaults)
    assert spec.name == name  # make_reproductions.py finds its sweeps by name
    assert set(as_list(spec.parameters["dataset"])) <= OFFLINE
    assert spec.resources.gpu == 0


@pytest.mark.parametrize("name", REPRODUCTIONS)
def test_the_full_scale_comment_names_one_field_whose_change_parses(name, defaults):
    text = spec_path(name).read_text(encoding="utf-8")
    found = FULL_SCALE.findall(text)
    assert len(found) == 1, "one `# FULL SCALE: change the one field …` comment"
    field, again, value = found[0]
    assert again == field
    small = load_spec(spec_path(name), settings=defaults)
    assert field in small.parameters
    data = small.model_dump(mode="json")
    data["parameters"] = {**data["parameters"], field: value.strip()}
    big = parse_spec(data, settings=defaults)  # the full-scale spec is valid and within limits
    assert big.parameters[field] == value.strip()
    assert big.parameters[field] not in OFFLINE
    # only that field changed: the other axes and fixed values are the same
    rest = {k: v for k, v in small.parameters.items() if k != field}
    assert {k: v for k, v in big.parameters.items() if k != field} == rest
    assert big.n_trials == small.n_trials // len(as_list(small.parameters[field]))


def test_a_bad_full_scale_value_would_be_caught(defaults):
    """The check above can fail: an unknown dataset is refused naming the field."""
    data = load_spec(spec_path("meterez-shaping"), settings=defaults).model_dump(mode="json")
    data["parameters"]["dataset"] = "imagenet"
    with pytest.raises(InvalidInput) as exc:
        parse_spec(data, settings=defaults)
    assert exc.value.field == "parameters.dataset"


@pytest.mark.parametrize("name", ["meterez-bn-gradients", "meterez-shaping"])
def test_the_meterez_gradient_specs_use_the_papers_setting(name, defaults):
    p = load_spec(spec_path(name), settings=defaults).parameters
    assert p["width"] == p["batch_size"] == 100  # batch size = width (their Theorem's n = d)
    assert p["order"] == "norm_act" and "batch" in as_list(p["norm"])
    assert p["epochs"] == 0 and max(p["depth"]) == 1000
    assert {"gaussian", "orthogonal"} <= set(as_list(p["init"]))


def test_the_shaping_spec_compares_the_papers_exponent_with_none(defaults):
    p = load_spec(spec_path("meterez-shaping"), settings=defaults).parameters
    assert set(p["activation"]) == {"tanh", "sin"} and set(p["gain_exponent"]) == {0.0, 0.4}


def test_the_joudaki_spec_is_the_theorems_setting(defaults):
    p = load_spec(spec_path("joudaki-layernorm-isometry"), settings=defaults).parameters
    assert (p["norm"], p["order"], p["init"], p["epochs"]) == ("layer", "act_norm", "gaussian", 0)
    assert min(p["width"]) > p["batch_size"]  # a sample Gram can be non-singular


def test_the_training_spec_trains_an_orthogonal_bn_network(defaults):
    spec = load_spec(spec_path("meterez-orthogonal-training"), settings=defaults)
    p, (trial, *_) = spec.parameters, expand(spec)
    assert "orthogonal" in as_list(p["init"]) and (p["norm"], p["optimizer"]) == ("batch", "sgd")
    assert p["width"] == p["batch_size"] == 100 and min(as_list(p["depth"])) >= 200
    assert len(trial.recorded_epochs) > 8  # more epochs than a layer profile draws


def test_the_default_limits_are_what_the_examples_are_checked_against(defaults):
    """A spec over a default limit is refused: the parse test above is not vacuous."""
    data = load_spec(spec_path("meterez-bn-gradients"), settings=defaults).model_dump(mode="json")
    data["seeds"] = defaults.max_trials_per_sweep
    with pytest.raises(LimitExceeded):
        parse_spec(data, settings=defaults)


# --- the doc and its script --------------------------------------------------------------------


def doc_trial_counts() -> dict[str, int]:
    """`| … | [examples/NAME.yaml](…) | TRIALS | …` rows of the doc's summary table."""
    rows = re.findall(
        r"^\|[^\n]*examples/([\w-]+)\.yaml[^\n|]*\|\s*(\d+)\s*\|",
        DOC.read_text(encoding="utf-8"),
        re.M,
    )
    return {name: int(n) for name, n in rows}


def test_the_doc_states_each_reproductions_trial_count(defaults):
    counts = doc_trial_counts()
    assert set(counts) == set(REPRODUCTIONS)
    for name, n in counts.items():
        assert load_spec(spec_path(name), settings=defaults).n_trials == n, name


def load_script(monkeypatch):
    path = ROOT / "docs" / "make_reproductions.py"
    module_spec = importlib.util.spec_from_file_location("make_reproductions", path)
    module = importlib.util.module_from_spec(module_spec)
    monkeypatch.setitem(sys.modules, module_spec.name, module)  # dataclasses look it up
    module_spec.loader.exec_module(module)
    return module


def test_the_script_runs_each_reproduction_spec_and_the_doc_shows_its_figures(
    defaults, monkeypatch
):
    script = load_script(monkeypatch)
    assert [e.name for e in script.EXPERIMENTS] == list(REPRODUCTIONS)
    doc = DOC.read_text(encoding="utf-8")
    for exp in script.EXPERIMENTS:
        assert load_spec(exp.spec, settings=defaults).name == exp.name
        for fig in exp.figures:
            assert (ROOT / "docs" / "img" / "repro" / fig.file).is_file(), fig.file
            assert f"](img/repro/{fig.file})" in doc, fig.file
    assert "docs/make_reproductions.py" in doc


def test_the_scripts_figure_filters_select_values_the_specs_sweep(defaults, monkeypatch):
    """A filter on a value the sweep lacks would draw an empty "no data" figure, silently."""
    script = load_script(monkeypatch)
    for exp in script.EXPERIMENTS:
        spec = load_spec(exp.spec, settings=defaults)
        epochs = expand(spec)[0].recorded_epochs
        for fig in exp.figures:
            for field, value in fig.args.get("where", {}).items():
                assert value in spec.axes.get(field, []), (fig.file, field, value)
            assert set(fig.epochs or []) <= set(epochs), fig.file
