"""Every rule of service.field_effects, by construction: the engine run on two configs that
differ only in the reset field — the second built with model_construct, so that no reset
happens — gives bit-identical records (same process, one thread: deterministic by
construction), and the two configs, validated, hash equal. Each rule also has a control: the
same field changed where the rule's condition does not hold changes the records, so the
comparison can fail (and a rule that reset a field with an effect would be caught)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from records import bits

from service.config import TrialConfig, config_hash
from service.field_effects import RULES
from workers.train import fit

pytestmark = pytest.mark.slow  # ~140 tiny trainings, about two minutes on one thread

SMALL = {"depth": 2, "width": 8, "batch_size": 16, "epochs": 1, "max_train_samples": 64}
TRANSFORMER = {**SMALL, "model": "transformer", "heads": 2, "mlp_ratio": 1}
CNN = {**SMALL, "model": "cnn", "width": 4}
RESMLP = {**SMALL, "model": "resmlp"}
# the library families: ResNet-18's four stages at init (one training epoch where it says
# EPOCH), a GPT-2 of 2 blocks of width 16, trained one epoch
TIMM = {**SMALL, "model": "timm", "model_params": {"arch": "resnet18"}, "depth": 4, "epochs": 0}
EPOCH = {"epochs": 1}
HF = {**SMALL, "model": "hf", "model_params": {"config": "gpt2", "heads": 2}, "width": 16}
EXTRAS = {"timm": "timm", "hf": "transformers"}
LIBRARY_FIELDS = [
    ("activation", "tanh"), ("activation_gain", 2.0), ("gain_exponent", 1.0), ("norm", "layer"),
    ("norm_eps", 0.1), ("init", "orthogonal"), ("init_gain", 2.0), ("orthogonal_gain", False),
    ("head_init", "orthogonal"), ("bias", True),
]  # fmt: skip
# bias_init torch is refused without bias true (before either is reset): the two written together
WITH_BIAS = {"bias": True}

# (rule's field, the base config (validated: the rule's condition holds), the other value)
SAME: list[tuple[str, dict[str, Any], Any]] = [
    # a family's unused fields
    ("order", {**TRANSFORMER, "norm": "layer"}, "act_norm"),
    ("residual_scale", {**SMALL, "norm": "batch"}, 0.5),
    ("kernel_size", {**RESMLP, "norm": "batch"}, 5),
    ("patch_size", {**CNN, "norm": "batch"}, 2),
    ("heads", {**SMALL, "norm": "layer"}, 2),
    ("mlp_ratio", {**SMALL, "norm": "layer"}, 2),
    ("skip", {**RESMLP, "norm": "layer"}, False),
    ("norm_position", {**SMALL, "norm": "layer"}, "post"),
    # Adam's momentum; an untrained network's optimizer, schedule and test mode
    ("momentum", {**SMALL, "optimizer": "adam"}, 0.9),
    ("optimizer", {**SMALL, "epochs": 0}, "adam"),
    ("lr", {**SMALL, "epochs": 0}, 0.5),
    ("momentum", {**SMALL, "epochs": 0}, 0.9),
    ("weight_decay", {**SMALL, "epochs": 0}, 0.1),
    ("eval_norm", {**SMALL, "epochs": 0, "norm": "batch"}, "batch"),
    ("record_every", {**SMALL, "epochs": 0}, 3),
    ("record_every", {**SMALL, "epochs": 2, "record_every": 2}, 5),
    # no running statistics
    ("eval_norm", {**SMALL, "norm": "layer"}, "batch"),
    ("eval_norm", {**SMALL, "norm": "none"}, "batch"),
    ("eval_norm", {**TRANSFORMER, "norm": "layer_scale"}, "batch"),
    # no normalization
    ("norm_eps", {**SMALL, "norm": "none"}, 0.1),
    ("norm_eps", {**RESMLP, "norm": "none"}, 0.1),
    ("norm_eps", {**CNN, "norm": "none"}, 0.1),
    ("norm_eps", {**TRANSFORMER, "norm": "none"}, 0.1),
    ("order", {**SMALL, "norm": "none", "activation": "tanh"}, "act_norm"),
    ("order", {**RESMLP, "norm": "none", "activation": "tanh"}, "act_norm"),
    ("order", {**CNN, "norm": "none"}, "act_norm"),
    ("norm_position", {**TRANSFORMER, "norm": "none"}, "post"),
    # inits
    ("head_init", {**SMALL, "init": "orthogonal", "head_init": None}, "orthogonal"),
    ("head_init", {**CNN, "init": "delta_orthogonal"}, "delta_orthogonal"),
    ("head_init", {**TRANSFORMER, "init": "xavier"}, "xavier"),
    ("orthogonal_gain", {**SMALL, "init_gain": 1.5}, False),
    ("orthogonal_gain", {**TRANSFORMER, "init": "kaiming", "init_gain": 1.5}, False),
    ("init_gain", {**SMALL, "init": "orthogonal", "orthogonal_gain": False}, 2.0),
    ("init_gain", {**RESMLP, "init": "orthogonal", "orthogonal_gain": False}, 2.0),
    ("init_gain", {**CNN, "init": "delta_orthogonal", "orthogonal_gain": False}, 2.0),
    ("init_gain", {**TRANSFORMER, "init": "orthogonal", "orthogonal_gain": False}, 2.0),
    # gains
    ("gain_exponent", {**SMALL, "depth": 1, "activation": "tanh", "activation_gain": 2.0}, 1.5),
    ("gain_exponent", {**CNN, "depth": 1, "activation": "tanh", "activation_gain": 2.0}, 1.5),
    ("activation", {**TRANSFORMER, "mlp_ratio": 0, "norm": "layer"}, "tanh"),
    ("activation_gain", {**TRANSFORMER, "mlp_ratio": 0, "norm": "layer"}, 2.0),
    ("gain_exponent", {**TRANSFORMER, "mlp_ratio": 0, "depth": 3}, 1.0),
    # the precision check of a network that already runs in float64
    ("precision_check", {**SMALL, "dtype": "float64"}, True),
    # the library families: what neither their factories nor the registered path reads
    *((f, {**TIMM, **(EPOCH if f == "init" else {})}, v) for f, v in LIBRARY_FIELDS),
    ("bias_init", {**TIMM, **WITH_BIAS}, "torch"),
    ("width", TIMM, 8),
    *((f, HF, v) for f, v in LIBRARY_FIELDS),
    ("bias_init", {**HF, **WITH_BIAS}, "torch"),
]

# The same fields where the condition fails: the records must differ.
DIFFERENT: list[tuple[str, dict[str, Any], Any]] = [
    ("order", {**SMALL, "norm": "layer"}, "act_norm"),
    ("residual_scale", {**RESMLP, "norm": "batch"}, 0.5),
    ("kernel_size", {**CNN, "norm": "batch"}, 5),
    ("patch_size", {**TRANSFORMER, "norm": "layer"}, 2),
    ("heads", {**TRANSFORMER, "norm": "layer", "width": 8}, 4),
    ("mlp_ratio", {**TRANSFORMER, "norm": "layer"}, 2),
    ("skip", {**TRANSFORMER, "norm": "layer"}, False),
    ("norm_position", {**TRANSFORMER, "norm": "layer"}, "post"),
    ("momentum", {**SMALL}, 0.9),
    ("optimizer", {**SMALL}, "adam"),
    ("lr", {**SMALL}, 0.5),
    ("weight_decay", {**SMALL, "lr": 0.5}, 0.5),
    ("eval_norm", {**SMALL, "norm": "batch"}, "batch"),
    ("eval_norm", {**TRANSFORMER, "norm": "batch"}, "batch"),
    ("record_every", {**SMALL, "epochs": 2}, 2),
    ("norm_eps", {**SMALL, "norm": "layer"}, 0.1),
    ("norm_eps", {**TRANSFORMER, "norm": "layer"}, 0.1),
    ("head_init", {**SMALL}, "orthogonal"),
    ("orthogonal_gain", {**SMALL, "init": "orthogonal", "init_gain": 1.5}, False),
    ("init_gain", {**SMALL, "init": "orthogonal"}, 2.0),
    ("init_gain", {**SMALL, "orthogonal_gain": False}, 2.0),
    ("gain_exponent", {**SMALL, "activation": "tanh", "activation_gain": 2.0}, 1.5),
    ("activation", {**TRANSFORMER, "norm": "layer"}, "tanh"),
    ("activation_gain", {**TRANSFORMER, "norm": "layer"}, 2.0),
    ("precision_check", {**SMALL}, True),
    # the per-tap metrics: no rule resets them (they add records in every config)
    ("tap_metrics", {**SMALL}, True),
    # what the library families reset, where the engine builds the layers
    ("activation", {**SMALL}, "tanh"),
    ("norm", {**SMALL}, "layer"),
    ("init", {**SMALL}, "orthogonal"),
    ("bias", {**SMALL}, True),
    ("bias_init", {**SMALL, "bias": True}, "torch"),
    ("width", {**SMALL}, 16),
    # what the library families read: hf its width, timm's BatchNorms the running statistics
    ("width", HF, 32),
    ("eval_norm", {**TIMM, **EPOCH}, "batch"),
]


def records(config: TrialConfig) -> list[dict[str, Any]]:
    return list(fit(config, threads=1))


def same_bits(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Equal records bit for bit (every value; the epoch's wall time left out)."""
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b, strict=True):
        if set(ra) != set(rb):
            return False
        for k in ra:
            if k == "epoch_time_s":
                continue
            x, y = ra[k], rb[k]
            if isinstance(x, bool | int | str) or x is None:
                if x != y:
                    return False
            elif np.shape(x) != np.shape(y) or not np.array_equal(bits(x), bits(y)):
                return False
    return True


def _needs_extra(base: dict[str, Any]) -> None:
    """A library family's case is skipped where its extra is not installed."""
    package = EXTRAS.get(base.get("model", ""))
    if package:
        pytest.importorskip(package)


def _pair(field: str, base: dict[str, Any], other: Any) -> tuple[TrialConfig, TrialConfig]:
    config = TrialConfig(**base)
    changed = TrialConfig.model_construct(**{**config.__dict__, field: other})
    assert getattr(changed, field) != getattr(config, field), "the two configs must differ"
    return config, changed


def _id(case: tuple[str, dict[str, Any], Any]) -> str:
    field, base, other = case
    shown = ",".join(
        f"{k}={v}" for k, v in base.items() if SMALL.get(k) != v and k != "model_params"
    )
    return f"{field}={other}|{shown}"


@pytest.mark.parametrize("case", SAME, ids=[_id(c) for c in SAME])
def test_a_reset_field_changes_nothing_and_hashes_equal(case):
    field, base, other = case
    _needs_extra(base)
    config, changed = _pair(field, base, other)
    assert same_bits(records(config), records(changed))
    validated = TrialConfig(**{**base, field: other})
    assert config_hash(validated) == config_hash(config)
    assert getattr(validated, field) == getattr(config, field)


@pytest.mark.parametrize("case", DIFFERENT, ids=[_id(c) for c in DIFFERENT])
def test_the_same_field_where_it_acts_changes_the_records_and_the_hash(case):
    field, base, other = case
    _needs_extra(base)
    config, changed = _pair(field, base, other)
    assert not same_bits(records(config), records(changed))
    assert config_hash(TrialConfig(**{**base, field: other})) != config_hash(config)


def test_every_rule_is_checked_by_construction():
    """Each rule has a case whose changed config (built without the reset) meets its
    condition: the rule is what made the two hash equal."""
    for package in EXTRAS.values():
        pytest.importorskip(package)
    for rule in RULES:
        pairs = [_pair(field, base, other) for field, base, other in SAME if field == rule.field]
        assert any(rule.when(changed) for _, changed in pairs), f"{rule.field}: {rule.why}"


def test_a_run_is_repeatable_bit_for_bit():
    """What the comparison stands on: one config run twice gives the same bits."""
    config = TrialConfig(**{**SMALL, "norm": "batch"})
    assert same_bits(records(config), records(config))
