"""One rule for fields without effect: a TrialConfig field that cannot change a trial's numbers
given the others is reset before the config is hashed (service.config.TrialConfig's validator),
so that two specs describing the same network run it once and share one stored result.

Each rule says which field, when, and why, read off the engine's own use of the field
(workers/): a field the engine never reads under the condition (a family's unused fields,
Adam's momentum, the optimizer of an untrained network), or reads only where it cannot act
(a normalization's ε without a normalization, `norm_position` around a norm that is the
identity). tests/workers/test_field_reset.py checks every rule by construction: the engine run
on two configs that differ only in the reset field (built without the reset) gives bit-identical
records, and the two configs hash equal; docs/api.md ("Fields without effect") lists them.

The field takes its default (`to` None) or the value `to` gives (record_every: the epochs).
Registered models (docs/models.md) build their module from the whole config, so only the rules
about training itself apply to them, the precision check's, and the family rule (the built-in
families' own fields). The library families `timm` and `hf` are registered models whose
factories (workers/models/timm_model.py, hf_model.py) read only the dataset (and hf depth and
width) besides model_params, and the registered path (workers/models/registered.py) applies no
isosweep initialization, norm or activation to the module they build: the fields of those are
reset for them (`LIBRARY_UNREAD`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.models import FAMILY_FIELDS, FAMILY_SPECIFIC, LIBRARY

BUILTIN = frozenset(FAMILY_FIELDS)  # the built-in families: the engine builds every layer
LIBRARY_FAMILIES = frozenset(LIBRARY)  # timm, hf: the library builds every layer
ORTHOGONAL = ("orthogonal", "delta_orthogonal")  # the inits that read orthogonal_gain
RUNNING_STATS = ("batch", "batch_scale")  # the norms with running statistics (eval_norm)


@dataclass(frozen=True)
class NoEffect:
    """`field` cannot change a trial's numbers when `when(config)` holds (`why`): it is set to
    `to(config)`, or to its default when `to` is None."""

    field: str
    when: Callable[[Any], bool]
    why: str
    to: Callable[[Any], Any] | None = None


def _builtin(c: Any) -> bool:
    return c.model in BUILTIN


def _head_init(c: Any) -> str:
    return c.head_init or c.init


def _library(c: Any) -> bool:
    return c.model in LIBRARY_FAMILIES


_ACTS = (
    "the library's modules apply their own activations (timm's act_layer, hf's activation_function)"
)
_WEIGHTS = "the library draws every weight and bias itself (registered.py applies no init)"
# The TrialConfig fields that neither library factory nor the registered path reads: (field,
# why, the value it is reset to — None: its default).
LIBRARY_UNREAD: tuple[tuple[str, str, Any], ...] = (
    *((f, _ACTS, None) for f in ("activation", "activation_gain", "gain_exponent")),
    ("norm", "the module's normalizations are the library's own; isosweep adds none", "none"),
    ("norm_eps", "the library's normalizations keep their own ε", None),
    *(
        (f, _WEIGHTS, None)
        for f in ("init", "init_gain", "orthogonal_gain", "head_init", "bias", "bias_init")
    ),
)


def _library_rule(field: str, why: str, to: Any) -> NoEffect:
    value = None if to is None else (lambda c: to)
    return NoEffect(field, _library, f"model timm or hf: {why}", value)


def _family_rule(name: str) -> NoEffect:
    return NoEffect(
        name,
        lambda c: name not in FAMILY_FIELDS.get(c.model, frozenset()),
        f"a field of the {'/'.join(m for m, f in FAMILY_FIELDS.items() if name in f)} "
        "family only; the model does not read it",
    )


RULES: tuple[NoEffect, ...] = (
    *(_family_rule(f) for f in sorted(FAMILY_SPECIFIC)),
    NoEffect("momentum", lambda c: c.optimizer == "adam", "Adam has no momentum (β₁ is 0.9)"),
    *(
        NoEffect(f, lambda c: c.epochs == 0, "epochs 0: no step is taken")
        for f in ("optimizer", "lr", "momentum", "weight_decay")
    ),
    NoEffect(
        "eval_norm",
        lambda c: c.epochs == 0,
        "epochs 0: test metrics use the batch's statistics before any step",
    ),
    NoEffect(
        "eval_norm",
        lambda c: _builtin(c) and c.norm not in RUNNING_STATS,
        "no running statistics to evaluate with (norm none, layer or layer_scale)",
    ),
    NoEffect(
        "record_every",
        lambda c: c.record_every > max(c.epochs, 1),
        "every k ≥ epochs records epoch 0 and the last one",
        to=lambda c: max(c.epochs, 1),
    ),
    NoEffect(
        "precision_check",
        lambda c: c.dtype == "float64",
        "the probe already runs in float64: there is no float32 number to check",
    ),
    NoEffect("norm_eps", lambda c: _builtin(c) and c.norm == "none", "no normalization"),
    NoEffect(
        "order", lambda c: _builtin(c) and c.norm == "none", "without a norm both are Linear → σ"
    ),
    NoEffect(
        "norm_position",
        lambda c: _builtin(c) and c.norm == "none",
        "without a norm pre and post are the same block",
    ),
    NoEffect("head_init", lambda c: _builtin(c) and c.head_init == c.init, "null means the init"),
    NoEffect(
        "orthogonal_gain",
        lambda c: _builtin(c) and c.init not in ORTHOGONAL and _head_init(c) not in ORTHOGONAL,
        "no weight is initialized orthogonally",
    ),
    NoEffect(
        "init_gain",
        lambda c: (
            _builtin(c)
            and not c.orthogonal_gain
            and c.init in ORTHOGONAL
            and _head_init(c) in ORTHOGONAL
        ),
        "every weight is orthogonal without the gain (orthogonal_gain false)",
    ),
    NoEffect(
        "gain_exponent", lambda c: _builtin(c) and c.depth == 1, "α₁ = α·1^(−p) = α at depth 1"
    ),
    *(
        NoEffect(
            f,
            lambda c: c.model == "transformer" and c.mlp_ratio == 0,
            "mlp_ratio 0: attention only, σ is never applied",
        )
        for f in ("activation", "activation_gain", "gain_exponent")
    ),
    *(_library_rule(*rule) for rule in LIBRARY_UNREAD),
    NoEffect(
        "width",
        lambda c: c.model == "timm",
        "model timm: the architecture and model_args set every width (hf's is its hidden size)",
    ),
)


def reset_values(config: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    """The fields of `config` (a TrialConfig, or anything with its attributes) that RULES
    reset, with the values they take: applied until nothing changes (a reset can make another
    rule hold), each field compared with its value so far."""
    changed: dict[str, Any] = {}
    view = _View(config, changed)
    for _ in range(len(RULES)):
        before = dict(changed)
        for rule in RULES:
            if rule.when(view):
                value = defaults[rule.field] if rule.to is None else rule.to(view)
                if getattr(view, rule.field) != value:
                    changed[rule.field] = value
        if changed == before:
            break
    return changed


class _View:
    """A config's attributes with the resets so far applied."""

    def __init__(self, config: Any, changed: dict[str, Any]):
        self._config, self._changed = config, changed

    def __getattr__(self, name: str) -> Any:
        changed = self.__dict__["_changed"]
        return changed[name] if name in changed else getattr(self.__dict__["_config"], name)
