"""service.config: names derived from one source (the datasets, the keys of an epoch record),
the trial options and their validation, Adam's momentum normalized away."""

import math

import pytest
from support import store_trial_at_revision

from service.config import (
    CONFIG_FIELDS,
    DATASET_SHAPES,
    METRICS,
    RECORD_KEYS,
    TrialConfig,
    config_hash,
    estimate_memory_bytes,
    parse_trial_config,
)
from service.errors import InvalidInput
from service.spec import expand, parse_spec


def test_datasets_are_the_keys_of_dataset_shapes():
    for name in DATASET_SHAPES:
        assert TrialConfig(dataset=name).dataset == name
    with pytest.raises(InvalidInput) as exc:
        parse_trial_config({"dataset": "imagenet"})
    assert exc.value.field == "dataset"
    assert all(f"'{name}'" in exc.value.message for name in DATASET_SHAPES)


def test_record_keys_are_not_metrics():
    assert RECORD_KEYS == ("epoch", "diverged", "input_gram", "input_moments")
    assert not set(RECORD_KEYS) & set(METRICS)


# --- the options of issue 9 ---------------------------------------------------------------------


def test_new_fields_and_their_defaults():
    c = TrialConfig()
    assert (c.dtype, c.norm_eps, c.bias_init, c.head_init) == ("float32", 1e-5, "zero", None)
    assert (c.orthogonal_gain, c.input_norm, c.spectra, c.jacobian_samples) == (
        True,
        "none",
        False,
        0,
    )
    assert CONFIG_FIELDS[-20:-12] == (
        "dtype",
        "norm_eps",
        "bias_init",
        "head_init",
        "orthogonal_gain",
        "input_norm",
        "spectra",
        "jacobian_samples",
    )


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("dtype", "float16", "'float32' or 'float64'"),
        ("norm_eps", -1e-5, "greater than or equal to 0"),
        ("norm_eps", math.inf, "finite"),
        ("bias_init", "uniform", "'zero' or 'torch'"),
        ("head_init", "he", "'orthogonal'"),
        ("input_norm", "l2", "'none' or 'unit_rms'"),
        ("jacobian_samples", -1, "greater than or equal to 0"),
    ],
)
def test_bad_values_name_the_field(field, value, says):
    with pytest.raises(InvalidInput) as exc:
        parse_trial_config({field: value})
    assert exc.value.field == field and says in exc.value.message


def test_senseless_combinations_are_refused_with_the_intent():
    with pytest.raises(InvalidInput, match="bias_init: 'torch' needs bias=true") as exc:
        parse_trial_config({"bias_init": "torch"})
    assert exc.value.field == "bias_init"
    assert TrialConfig(bias=True, bias_init="torch").bias_init == "torch"
    with pytest.raises(InvalidInput, match="101 exceeds the probe batch") as exc:
        parse_trial_config({"jacobian_samples": 101})
    assert exc.value.field == "jacobian_samples"
    assert TrialConfig(jacobian_samples=100).jacobian_samples == 100


def test_adam_momentum_is_normalized_to_zero_so_equal_trials_hash_equal():
    """The filed defect: an optimizer × momentum sweep made Adam trials with distinct hashes
    that Adam (which has no momentum) trains identically — fake replicates."""
    a, b = TrialConfig(optimizer="adam", momentum=0.9), TrialConfig(optimizer="adam")
    assert a.momentum == 0.0 and a == b and config_hash(a) == config_hash(b)
    assert a.to_dict()["momentum"] == 0.0
    sgd = TrialConfig(optimizer="sgd", momentum=0.9)
    assert sgd.momentum == 0.9 and config_hash(sgd) != config_hash(TrialConfig())
    with pytest.raises(InvalidInput, match="momentum"):  # still validated first
        parse_trial_config({"optimizer": "adam", "momentum": 1.5})


def test_optimizer_by_momentum_sweep_gives_adam_one_trial_per_seed():
    spec = parse_spec(
        {
            "name": "m",
            "parameters": {"optimizer": ["sgd", "adam"], "momentum": [0, 0.9]},
            "seeds": 2,
        }
    )
    trials = expand(spec)
    assert spec.n_trials == 8  # the product: an upper bound
    assert [(t.optimizer, t.momentum, t.seed) for t in trials] == [
        ("sgd", 0.0, 0),
        ("sgd", 0.0, 1),
        ("sgd", 0.9, 0),
        ("sgd", 0.9, 1),
        ("adam", 0.0, 0),
        ("adam", 0.0, 1),
    ]
    assert len({config_hash(t) for t in trials}) == 6


def test_sweep_of_adam_momenta_stores_one_trial_per_seed(tmp_path):
    from service.store import Store

    spec = parse_spec(
        {"name": "m", "parameters": {"optimizer": "adam", "momentum": [0, 0.5, 0.9]}, "seeds": 2}
    )
    with Store(f"sqlite:///{tmp_path / 'db.sqlite'}") as store:
        info = store.create_sweep(spec)
        assert info.n_trials == 2
        again = store.create_sweep(spec)  # nothing finished yet: queued again, not reused
        assert again.n_trials == 2


def test_float64_doubles_the_network_part_of_the_memory_estimate():
    c32, c64 = TrialConfig(depth=50), TrialConfig(depth=50, dtype="float64")
    measure = 8 * 50 * 4 * 100 * 100  # float64 Grams either way
    assert estimate_memory_bytes(c64) - measure == 2 * (estimate_memory_bytes(c32) - measure)


def test_migration_0002_keeps_trials_written_before_it_valid(database_url):
    """A database at revision 0001 with a trial in it: after upgrading, the trial's new columns
    and its stored config hold the fields' defaults, so filters and reads see what it ran."""
    from service.store import Store

    old = {k: v for k, v in TrialConfig(depth=2).to_dict().items() if k in CONFIG_FIELDS[:-20]}
    store_trial_at_revision(database_url, "0001", old)
    with Store(database_url) as store:
        trial = store.get_trial(1)
        assert trial.config == {**TrialConfig(depth=2).to_dict(), "epoch0_train_samples": None}
        for where in ({"dtype": "float32"}, {"norm_eps": 1e-5}, {"head_init": None},
                      {"orthogonal_gain": True}, {"jacobian_samples": 0}):  # fmt: skip
            assert store.list_trials(1, where=where)[1] == 1, where
        assert store.list_trials(1, where={"dtype": "float64"})[1] == 0


# --- the model families (issue 11) --------------------------------------------------------------


def test_model_fields_come_last_and_default_to_the_mlp():
    assert CONFIG_FIELDS[-10:] == (
        "epoch0_train_samples", "model", "model_params", "residual_scale", "kernel_size",
        "patch_size", "heads", "mlp_ratio", "skip", "norm_position",
    )  # fmt: skip
    assert TrialConfig().model == "mlp" and TrialConfig().model_params == {}


def test_fields_a_family_does_not_use_are_reset_so_equal_networks_hash_equal():
    from service.config import config_hash

    plain = TrialConfig(model="cnn", depth=3)
    odd = TrialConfig(model="cnn", depth=3, residual_scale=0.1, heads=2, skip=False)
    assert odd == plain and config_hash(odd) == config_hash(plain)
    assert TrialConfig(model="cnn", kernel_size=5) != plain  # a field it uses is kept
    t = TrialConfig(model="transformer", width=64, order="act_norm", kernel_size=7)
    assert (t.order, t.kernel_size) == ("norm_act", 3)
    assert TrialConfig(model="mlp", residual_scale=0.5).residual_scale == 1.0
    assert TrialConfig(model="resmlp", residual_scale=0.5).residual_scale == 0.5
    assert len({TrialConfig(), TrialConfig(heads=8), TrialConfig(model="resmlp")}) == 2


@pytest.mark.parametrize(
    ("kwargs", "field", "says"),
    [
        ({"model": "resnet"}, "model", "mlp, resmlp, cnn, transformer"),
        ({"model": "transformer", "width": 30, "heads": 4}, "heads", "divide width=30"),
        ({"model": "transformer", "patch_size": 3}, "patch_size", "8×8"),
        ({"model": "cnn", "kernel_size": 2}, "kernel_size", "try 3"),
        ({"init": "delta_orthogonal"}, "init", "use 'orthogonal'"),
        ({"model": "cnn", "jacobian_samples": 2}, "jacobian_samples", "set it to 0"),
        ({"model_params": {"a": 1}}, "model_params", "registered"),
    ],
)
def test_model_combinations_that_cannot_run_name_their_field(kwargs, field, says):
    with pytest.raises(InvalidInput) as exc:
        parse_trial_config(kwargs)
    assert exc.value.field == field and says in exc.value.message


# --- one rule for fields without effect (service.field_effects) -------------------------------
# The engine side (bit-identical records for every rule, and a control for each) is
# tests/workers/test_field_reset.py; here the configs and the sweeps.


def test_norm_position_under_no_norm_expands_to_one_trial_per_seed():
    """The filed defect: `norm_position: [pre, post]` under `norm: none` ran every transformer
    twice with identical numbers."""
    spec = parse_spec(
        {
            "name": "t",
            "parameters": {
                "model": "transformer",
                "norm": "none",
                "norm_position": ["pre", "post"],
                "width": 8,
                "heads": 2,
                "epochs": 0,
            },
            "seeds": 3,
        }
    )
    trials = expand(spec)
    assert spec.n_trials == 6  # the product: an upper bound
    assert [(t.norm_position, t.seed) for t in trials] == [("pre", 0), ("pre", 1), ("pre", 2)]
    with_norm = parse_spec(
        {**spec.model_dump(), "parameters": {**spec.parameters, "norm": "layer"}}
    )
    assert len(expand(with_norm)) == 6  # with a norm, pre and post are two networks


@pytest.mark.parametrize(
    ("given", "reset"),
    [
        ({"norm": "none", "norm_eps": 0.1}, {"norm_eps": 1e-5}),
        ({"norm": "none", "order": "act_norm"}, {"order": "norm_act"}),
        ({"norm": "layer", "eval_norm": "batch"}, {"eval_norm": "running"}),
        ({"epochs": 0, "optimizer": "adam", "lr": 0.5, "weight_decay": 0.1}, {"lr": 0.01}),
        ({"epochs": 0, "record_every": 4}, {"record_every": 1}),
        ({"epochs": 3, "record_every": 10}, {"record_every": 3}),
        ({"init": "orthogonal", "head_init": "orthogonal"}, {"head_init": None}),
        ({"orthogonal_gain": False}, {"orthogonal_gain": True}),
        ({"init": "orthogonal", "orthogonal_gain": False, "init_gain": 2.0}, {"init_gain": 1.0}),
        ({"depth": 1, "gain_exponent": 1.5}, {"gain_exponent": 0.0}),
        (
            {"model": "transformer", "width": 8, "heads": 2, "mlp_ratio": 0, "activation": "tanh"},
            {"activation": "relu"},
        ),
    ],
)
def test_a_field_without_effect_takes_its_default_so_the_configs_hash_equal(given, reset):
    config = TrialConfig(**given)
    for field, value in reset.items():
        assert getattr(config, field) == value
    plain = {k: v for k, v in given.items() if k not in reset}
    assert config_hash(config) == config_hash(TrialConfig(**{**plain, **reset}))


@pytest.mark.parametrize(
    "given",
    [
        {"norm": "batch", "norm_eps": 0.1},
        {"norm": "layer", "order": "act_norm"},
        {"norm": "batch", "eval_norm": "batch"},
        {"epochs": 1, "lr": 0.5},
        {"epochs": 3, "record_every": 2},
        {"head_init": "orthogonal"},
        {"init": "orthogonal", "orthogonal_gain": False},
        {"init": "orthogonal", "init_gain": 2.0},
        {"depth": 2, "gain_exponent": 1.5},
        {"model": "transformer", "width": 8, "heads": 2, "activation": "tanh"},
        # a registered model builds its module from the whole config: nothing but training
        # and the built-in families' own fields is reset for it (service.field_effects)
    ],
)
def test_a_field_with_an_effect_is_kept(given):
    config = TrialConfig(**given)
    for field, value in given.items():
        assert getattr(config, field) == value, field
