"""The shared contracts: config validation, hashing, the JSON spelling of non-finite values."""

import json
import math

import numpy as np
import pytest

from service import jsonfmt
from service.activations import ACTIVATION_NAMES, get_activation
from service.config import (
    CONFIG_FIELDS,
    TrialConfig,
    config_hash,
    parse_trial_config,
)
from service.errors import InvalidInput


def test_defaults_and_recorded_epochs():
    cfg = TrialConfig(epochs=7, record_every=3)
    assert cfg.recorded_epochs == [0, 3, 6, 7]
    assert TrialConfig(epochs=0).recorded_epochs == [0]


def test_unknown_key_names_the_field():
    with pytest.raises(InvalidInput) as exc:
        parse_trial_config({"depht": 3})
    assert exc.value.field == "depht"
    assert "unknown field" in exc.value.message


def test_bad_value_names_field_and_allowed_values():
    with pytest.raises(InvalidInput) as exc:
        parse_trial_config({"norm": "group"})
    assert exc.value.field == "norm"
    assert "'batch'" in exc.value.message and "'layer_scale'" in exc.value.message


def test_batchnorm_needs_two_samples():
    with pytest.raises(InvalidInput, match="batch_size"):
        parse_trial_config({"norm": "batch", "batch_size": 1})
    assert parse_trial_config({"norm": "layer", "batch_size": 1}).batch_size == 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0.0])
def test_gain_must_be_positive_and_finite(bad):
    with pytest.raises(InvalidInput, match="activation_gain"):
        parse_trial_config({"activation_gain": bad})


# For each field, a valid value other than its default.
OTHER_VALUE = {
    "depth": 11,
    "width": 101,
    "activation": "tanh",
    "activation_gain": 1.5,
    "gain_exponent": 0.4,
    "norm": "layer",
    "order": "act_norm",
    "init": "orthogonal",
    "init_gain": 2.0,
    "bias": True,
    "batch_size": 64,
    "epochs": 11,
    "optimizer": "adam",
    "lr": 0.1,
    "momentum": 0.9,
    "weight_decay": 1e-4,
    "dataset": "gaussian",
    "max_train_samples": 500,
    "eval_norm": "batch",
    "record_every": 2,
    "seed": 1,
    "dtype": "float64",
    "norm_eps": 0.0,
    "bias_init": "torch",
    "head_init": "xavier",
    "orthogonal_gain": False,
    "input_norm": "unit_rms",
    "spectra": True,
    "jacobian_samples": 3,
    "precision_check": True,
    "tap_metrics": True,
    "epoch0_train_samples": 200,
    "model": "resmlp",
    "residual_scale": 0.5,
    "kernel_size": 5,
    "patch_size": 4,
    "heads": 2,
    "mlp_ratio": 2,
    "skip": False,
    "norm_position": "post",
}
# what a field's other value needs besides itself
NEEDS = {
    "bias_init": {"bias": True},
    "residual_scale": {"model": "resmlp"},
    "kernel_size": {"model": "cnn"},
    **{f: {"model": "transformer"} for f in ("patch_size", "heads", "mlp_ratio", "skip")},
    "norm_position": {"model": "transformer"},
    "orthogonal_gain": {"init": "orthogonal"},  # without an orthogonal init it has no effect
}
# model_params needs a registered model: tests/workers/test_model_registered.py hashes it
UNTESTED_HERE = {"model_params"}


def test_hash_depends_on_every_field_and_not_on_key_order():
    a = TrialConfig(depth=5, width=7)
    b = parse_trial_config({"width": 7, "depth": 5})
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(TrialConfig(depth=5, width=7, seed=1))
    assert "seed" in CONFIG_FIELDS
    assert set(OTHER_VALUE) | UNTESTED_HERE == set(CONFIG_FIELDS)  # a new field needs a value
    default = TrialConfig()
    hashes = {config_hash(default)}
    for field in OTHER_VALUE:
        changed = parse_trial_config({**NEEDS.get(field, {}), field: OTHER_VALUE[field]})
        assert getattr(changed, field) != getattr(default, field), field
        assert config_hash(changed) not in hashes, field  # differs from the default and the rest
        hashes.add(config_hash(changed))


def test_nonfinite_json_roundtrip():
    values = [1.5, math.nan, math.inf, -math.inf, 0.0]
    text = jsonfmt.dumps({"v": np.array(values)})
    parsed = json.loads(text)  # a standard parser reads it
    assert parsed["v"][1:4] == ["NaN", "Infinity", "-Infinity"]
    back = [jsonfmt.decode_float(x) for x in parsed["v"]]
    assert back[0] == 1.5 and math.isnan(back[1]) and back[2] == math.inf and back[3] == -math.inf


def test_activation_registry_lookup():
    assert "relu" in ACTIVATION_NAMES and len(ACTIVATION_NAMES) == 13
    with pytest.raises(InvalidInput, match="allowed: identity"):
        get_activation("swish")
