"""SweepSpec: parsing (YAML/JSON), validation naming the field, limits, expansion order."""

import itertools
import json

import pytest

from service.config import TrialConfig, config_hash, estimate_memory_bytes
from service.errors import InvalidInput, LimitExceeded
from service.settings import Settings
from service.spec import expand, load_spec, parse_spec, swept_fields, swept_fields_of

DESIGN_SPEC = """
name: bn-gradients
parameters:            # a list is a sweep axis; a scalar is fixed
  depth: [10, 50, 100, 200, 500]
  init: [gaussian, orthogonal]
  activation: identity
  norm: batch
  width: 100
  batch_size: 100
  epochs: 0            # 0 = measure at initialization only
seeds: 10              # or an explicit list
resources: {cpu: 1, gpu: 0}
max_failures: 1
priority: 0
"""


def _invalid(data, settings=None, cls=InvalidInput):
    with pytest.raises(cls) as exc:
        parse_spec(data, settings=settings)
    return exc.value


def test_design_example_expands_to_the_cartesian_product_times_seeds():
    spec = parse_spec(DESIGN_SPEC)
    trials = expand(spec)
    assert spec.n_trials == len(trials) == 5 * 2 * 10
    expected = itertools.product([10, 50, 100, 200, 500], ["gaussian", "orthogonal"], range(10))
    assert [(t.depth, t.init, t.seed) for t in trials] == list(expected)
    assert {(t.activation, t.norm, t.width, t.batch_size, t.epochs) for t in trials} == {
        ("identity", "batch", 100, 100, 0)
    }
    assert len({config_hash(t) for t in trials}) == len(trials)
    assert swept_fields(spec) == ["depth", "init", "seed"]


def test_axes_follow_the_written_order_not_the_config_order():
    spec = parse_spec({"name": "x", "parameters": {"init": ["xavier", "kaiming"], "depth": [2, 1]}})
    assert swept_fields(spec) == ["init", "depth", "seed"]
    assert [(t.init, t.depth) for t in expand(spec)] == [
        ("xavier", 2),
        ("xavier", 1),
        ("kaiming", 2),
        ("kaiming", 1),
    ]


def test_swept_fields_of_a_stored_spec_match_the_validated_one():
    specs = [
        parse_spec({"name": "x", "parameters": {"init": ["xavier", "kaiming"], "depth": [2, 1]}}),
        parse_spec({"name": "y", "parameters": {"lr": 0.1, "depth": [5], "norm": ["layer"]}}),
        parse_spec({"name": "z", "seeds": [3, 1]}),
    ]
    for spec in specs:
        stored = json.loads(json.dumps(spec.model_dump(mode="json")))  # as the store keeps it
        assert swept_fields_of(stored) == swept_fields(spec)
    assert swept_fields_of(stored) == ["seed"]


def test_json_text_yaml_text_and_dict_agree():
    data = {"name": "j", "parameters": {"depth": [3, 4], "lr": 0.001}, "seeds": [7, 2]}
    a = parse_spec(data)
    assert parse_spec(json.dumps(data)) == a
    assert parse_spec("name: j\nparameters: {depth: [3, 4], lr: 1e-3}\nseeds: [7, 2]") == a
    assert [t.seed for t in expand(a)] == [7, 2, 7, 2]


def test_defaults_and_a_length_one_list_is_still_an_axis():
    spec = parse_spec({"name": "d", "parameters": {"depth": [5]}})
    assert spec.seed_list == [0]
    assert (spec.resources.cpu, spec.resources.gpu) == (1.0, 0.0)
    assert (spec.max_failures, spec.priority, spec.rerun, spec.tags) == (1, 0, False, [])
    assert swept_fields(spec) == ["depth", "seed"]
    assert expand(spec) == [TrialConfig(depth=5, seed=0)]


def test_values_are_normalized_by_trial_config():
    spec = parse_spec("name: n\nparameters: {lr: [1e-3, 1], bias: true, depth: 4}")
    assert spec.parameters == {"lr": [0.001, 1.0], "bias": True, "depth": 4}
    assert type(spec.parameters["lr"][1]) is float  # an integer is a fine float


def test_unknown_top_level_key_is_named():
    err = _invalid({"name": "x", "paramters": {}})
    assert err.field == "paramters" and "unknown field" in err.message


def test_unknown_parameter_lists_the_fields():
    err = _invalid({"name": "x", "parameters": {"dept": [1, 2]}})
    assert err.field == "parameters.dept"
    assert "depth" in err.allowed and "seed" not in err.allowed


def test_seed_is_not_a_parameter():
    err = _invalid({"name": "x", "parameters": {"seed": [1, 2]}})
    assert err.field == "parameters.seed" and "seeds" in err.message


def test_bad_literal_names_the_field_and_the_allowed_values():
    err = _invalid({"name": "x", "parameters": {"norm": ["batch", "group"]}})
    assert err.field == "parameters.norm[1]"
    assert "'layer_scale'" in err.message


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        ({"depth": 0}, "parameters.depth"),
        ({"width": [10, -1]}, "parameters.width[1]"),
        ({"lr": [0.1, ".nan"]}, "parameters.lr[1]"),
        ({"momentum": 1.0}, "parameters.momentum"),
        ({"depth": []}, "parameters.depth"),
        ({"depth": [1, 2, 1]}, "parameters.depth"),
        ({"lr": [1, 1.0]}, "parameters.lr"),  # the same value once normalized
        ({"depth": {"a": 1}}, "parameters.depth"),
    ],
)
def test_out_of_range_or_repeated_values_are_named(parameters, field):
    assert _invalid({"name": "x", "parameters": parameters}).field == field


@pytest.mark.parametrize(
    ("seeds", "field"),
    [(0, "seeds"), (True, "seeds"), ([], "seeds"), ([1, 1], "seeds"), ([0, -1], "seeds[1]")],
)
def test_bad_seeds(seeds, field):
    assert _invalid({"name": "x", "seeds": seeds}).field == field


def test_resources():
    assert parse_spec({"name": "x", "resources": {"gpu": 0.25}}).resources.gpu == 0.25
    assert parse_spec({"name": "x", "resources": {"gpu": 2}}).resources.gpu == 2.0
    assert _invalid({"name": "x", "resources": {"gpu": 1.5}}).field == "resources.gpu"
    assert _invalid({"name": "x", "resources": {"cpu": 0}}).field == "resources.cpu"
    assert _invalid({"name": "x", "resources": {"tpu": 1}}).field == "resources.tpu"


def test_name_is_required_and_not_blank():
    assert _invalid({"parameters": {}}).field == "name"
    assert _invalid({"name": "   "}).field == "name"


def test_max_failures_must_not_be_negative():
    assert _invalid({"name": "x", "max_failures": -1}).field == "max_failures"


def test_yaml_syntax_error_names_the_line():
    err = _invalid("name: x\nparameters:\n  depth: [1, 2\n  width: 3\n")
    assert err.field == "spec"
    assert "line 4" in err.message


def test_a_spec_must_be_a_mapping():
    assert _invalid("- a\n- b\n").field == "spec"


def test_invalid_combination_names_the_trial():
    err = _invalid({"name": "x", "parameters": {"batch_size": [1, 8], "norm": "batch"}})
    assert err.field == "parameters"
    assert "batch_size=1" in err.message
    ok = parse_spec({"name": "x", "parameters": {"batch_size": [1, 8], "norm": "layer"}})
    assert ok.n_trials == 2


def test_trial_count_limit_names_the_setting():
    settings = Settings(max_trials_per_sweep=20)
    spec = {"name": "x", "parameters": {"depth": [1, 2]}, "seeds": 10}
    assert parse_spec(spec, settings=settings).n_trials == 20  # at the limit is fine
    err = _invalid({**spec, "seeds": 11}, settings, LimitExceeded)
    assert err.field == "parameters"
    assert "22 trials" in err.message and "ISOSWEEP_MAX_TRIALS_PER_SWEEP" in err.message


@pytest.mark.parametrize(
    ("field", "setting"),
    [
        ("depth", "max_depth"),
        ("width", "max_width"),
        ("batch_size", "max_batch_size"),
        ("epochs", "max_epochs"),
    ],
)
def test_field_limits(field, setting):
    settings = Settings(**{setting: 50})
    assert parse_spec({"name": "x", "parameters": {field: [2, 50]}}, settings=settings)
    err = _invalid({"name": "x", "parameters": {field: [2, 51]}}, settings, LimitExceeded)
    assert err.field == f"parameters.{field}"
    assert "50" in err.message and f"ISOSWEEP_{setting.upper()}" in err.message


def test_memory_limit_uses_the_estimate_of_the_biggest_trial():
    big = TrialConfig(depth=200, width=1000, batch_size=500)
    need_gb = estimate_memory_bytes(big) / 1e9
    spec = {"name": "x", "parameters": {"depth": [10, 200], "width": 1000, "batch_size": 500}}
    assert parse_spec(spec, settings=Settings(max_trial_memory_gb=need_gb * 1.001))
    err = _invalid(spec, Settings(max_trial_memory_gb=need_gb * 0.999), LimitExceeded)
    assert "depth=200" in err.message and "ISOSWEEP_MAX_TRIAL_MEMORY_GB" in err.message


def test_huge_seed_count_is_refused_before_expanding():
    err = _invalid({"name": "x", "seeds": 2**31}, cls=LimitExceeded)
    assert "2147483648 trials" in err.message


def test_load_spec_of_a_missing_file_names_the_spec(tmp_path):
    with pytest.raises(InvalidInput) as exc:
        load_spec(tmp_path / "missing.yaml")
    assert exc.value.field == "spec"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "a\x00b", "parameters": {}}, "name"),
        ({"name": "ok", "tags": ["x\ud800"], "parameters": {}}, "tags[0]"),
        ({"name": "ok", "priority": 2**40, "parameters": {}}, "priority"),
        ({"name": "ok", "parameters": {"record_every": 2**63}}, "parameters.record_every"),
    ],
)
def test_values_no_database_can_store_are_refused(data, field):
    with pytest.raises(InvalidInput) as exc:
        parse_spec(data)
    assert exc.value.field == field


# --- strict input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "x", "parameters": {"depth": True}}, "parameters.depth"),  # was read as 1
        ({"name": "x", "parameters": {"depth": "2"}}, "parameters.depth"),  # was read as 2
        ({"name": "x", "parameters": {"lr": "1e-3"}}, "parameters.lr"),
        ({"name": "x", "parameters": {"lr": [0.1, False]}}, "parameters.lr[1]"),
        ({"name": "x", "parameters": {"bias": 1}}, "parameters.bias"),
        ({"name": "x", "parameters": {"bias": "true"}}, "parameters.bias"),
        ({"name": "x", "parameters": {"depth": 4.0}}, "parameters.depth"),
        ({"name": "x", "rerun": "yes"}, "rerun"),
        ({"name": "x", "rerun": 1}, "rerun"),
        ({"name": "x", "priority": True}, "priority"),
        ({"name": "x", "max_failures": "2"}, "max_failures"),
        ({"name": "x", "resources": {"cpu": "1"}}, "resources.cpu"),
        ({"name": "x", "resources": {"gpu": False}}, "resources.gpu"),
    ],
)
def test_no_coercion_into_numbers_or_booleans(data, field):
    err = _invalid(data)
    assert err.field == field, err.message


def test_json_numbers_are_fine_floats():
    spec = parse_spec(
        {"name": "x", "parameters": {"lr": 1, "momentum": 0}, "resources": {"cpu": 2}}
    )
    assert spec.parameters["lr"] == 1.0 and spec.resources.cpu == 2.0


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("name: x\nparameters: {epochs: 1:30}\n", "1:30"),  # YAML 1.1: 90 (sexagesimal)
        ("name: x\nparameters: {depth: 010}\n", "010"),  # YAML 1.1: 8 (octal)
        ("name: x\nrerun: yes\n", "yes"),  # YAML 1.1: true
        ("name: x\nparameters: {bias: on}\n", "on"),
        ("name: x\ntags: [off]\n", "off"),
        ("name: x\nparameters: {width: 1_000}\n", "1_000"),  # YAML 1.1: 1000
        ("name: x\ndescription: 2024-01-02\n", "2024-01-02"),  # YAML 1.1: a date
    ],
)
def test_yaml_scalars_where_1_1_and_1_2_disagree_are_refused(text, says):
    err = _invalid(text)
    assert err.field == "spec" and says in err.message and "line" in err.message
    assert "quote" in err.message


def test_yaml_scalars_are_read_as_yaml_1_2():
    spec = parse_spec(
        "name: x\ntags: ['on', '1:30', yes please]\n"
        "parameters: {lr: 1e-3, depth: 0o17, width: 0x10, bias: True}\nrerun: false\n"
    )
    assert spec.tags == ["on", "1:30", "yes please"]
    assert spec.parameters == {"lr": 0.001, "depth": 15, "width": 16, "bias": True}
    assert spec.rerun is False


@pytest.mark.parametrize(
    "text",
    [
        "name: x\nname: y\n",
        "name: x\nparameters:\n  depth: 2\n  depth: 3\n",
        "name: x\nparameters: {depth: 2, width: 4, depth: 3}\n",
        '{"name": "x", "name": "y"}',  # JSON text through parse_spec
    ],
)
def test_duplicate_keys_are_refused(text):
    err = _invalid(text)
    assert "duplicate key" in err.message and "line" in err.message


def test_duplicate_keys_in_json_are_refused():
    from service.documents import load_json

    with pytest.raises(InvalidInput) as exc:
        load_json('{"name": "x", "parameters": {"depth": 2, "depth": 3}}')
    assert "duplicate key 'depth'" in exc.value.message and exc.value.field == "body"


@pytest.mark.parametrize("n", [400, 2000])
def test_deeply_nested_yaml_is_refused_not_a_recursion_error(n):
    texts = [
        "name: x\ndescription: " + "{a: " * n + "1" + "}" * n + "\n",  # 8 KB at n = 2000
        "name: x\nparameters: {depth: " + "[" * n + "]" * n + "}\n",
        "name: x\nparameters:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(min(n, 400))),
    ]
    for text in texts:
        err = _invalid(text)
        assert err.field == "spec" and "nested" in err.message


def test_huge_integers_in_yaml_are_refused():
    err = _invalid("name: x\npriority: " + "9" * 5000 + "\n")
    assert err.field == "spec" and "digits" in err.message
    err = _invalid({"name": "x", "priority": 10**5000})  # a dict built in Python
    assert err.field == "priority" and len(err.message) < 200


def test_a_huge_yaml_list_is_refused_early_with_a_short_message():
    text = "name: x\ntags: [" + ", ".join(["1"] * 110_000) + "]\n"  # 330 KB
    err = _invalid(text)
    assert err.field == "spec" and len(err.message) < 500  # was 4.8 MB and 4.5 s of CPU


def test_many_tags_or_long_tags_are_refused():
    assert _invalid({"name": "x", "tags": ["t"] * 101}).field == "tags"
    assert _invalid({"name": "x", "tags": ["t" * 101]}).field == "tags.0"
    assert parse_spec({"name": "x", "tags": ["t" * 100] * 100}).tags[0] == "t" * 100


def test_yaml_aliases_are_refused():
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    err = _invalid("name: x\n" + laughs.replace("a: &a", "tags: &a"))
    assert err.field == "spec" and "alias" in err.message


def test_a_spec_file_is_read_strictly_too(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: x\nparameters: {depth: 010}\n")
    with pytest.raises(InvalidInput) as exc:
        load_spec(path)
    assert "010" in exc.value.message
