"""TrialConfig (one trial's every knob, with its default) and the metric names all parts share."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service import field_effects, models
from service.activations import ACTIVATION_NAMES
from service.errors import InvalidInput
from service.metric_names import (  # noqa: F401  (re-exported: the parts read them here)
    LAYER_METRICS,
    METRICS,
    RECORD_KEYS,
    SCALAR_METRICS,
    SPECTRUM_KEYS,
)
from service.pydantic_errors import invalid_from_pydantic

# Bump when what a metric means changes: results stored under another version are not reused.
MEASUREMENT_VERSION = "2"

ActivationName = Literal[ACTIVATION_NAMES]  # type: ignore[valid-type]
Norm = Literal["batch", "layer", "none", "batch_scale", "layer_scale"]
Order = Literal["norm_act", "act_norm"]
Init = Literal["gaussian", "xavier", "kaiming", "orthogonal", "delta_orthogonal"]
NormPosition = Literal["pre", "post"]
# The built-in model families (workers/models/); a lab's own are registered (service/models.py).
BUILTIN_MODELS: tuple[str, ...] = ("mlp", "resmlp", "cnn", "transformer")
Optimizer = Literal["sgd", "adam"]
EvalNorm = Literal["running", "batch"]
Dtype = Literal["float32", "float64"]
BiasInit = Literal["zero", "torch"]
InputNorm = Literal["none", "unit_rms"]

# Epoch 0's train_loss/train_acc are measured on at most this many training samples (a seeded
# subset): the untrained network's loss and accuracy to about ±0.7% (binomial standard error at
# 5000 samples), at the cost of ~one probe measurement. digits (1437) and gaussian (4000) are
# measured whole, as before; cifar (50000) and mnist (60000) on a tenth or so.
EPOCH0_TRAIN_SAMPLES = 5000

# The datasets, each with (input dimension after flattening, number of classes)
DATASET_SHAPES: dict[str, tuple[int, int]] = {
    "cifar10": (3072, 10),
    "cifar100": (3072, 100),
    "mnist": (784, 10),
    "fashion_mnist": (784, 10),
    "digits": (64, 10),
    "gaussian": (100, 10),
}
# How a dataset's flattened inputs fold back into images: (layout, channels, height, width), the
# layout being the order the values were flattened in (torchvision keeps CIFAR as HWC).
DATASET_IMAGES: dict[str, tuple[str, int, int, int]] = {
    "cifar10": ("hwc", 3, 32, 32),
    "cifar100": ("hwc", 3, 32, 32),
    "mnist": ("chw", 1, 28, 28),
    "fashion_mnist": ("chw", 1, 28, 28),
    "digits": ("chw", 1, 8, 8),
    "gaussian": ("chw", 1, 10, 10),  # image-shaped noise
}
if TYPE_CHECKING:  # a Literal built from DATASET_SHAPES' keys, which a type checker cannot follow
    Dataset = str
else:
    Dataset = Literal[tuple(DATASET_SHAPES)]


class TrialConfig(BaseModel):
    """One trial. Same config and seed give the same numbers on CPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    depth: int = Field(10, ge=1, description="hidden blocks L (Linear then norm/activation)")
    width: int = Field(100, ge=1, description="hidden width d")
    activation: ActivationName = Field("relu", description="σ; the block computes σ(α_ℓ·x)")
    activation_gain: float = Field(1.0, gt=0, allow_inf_nan=False, description="α")
    gain_exponent: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="p: α_ℓ = α·ℓ^(−p), ℓ = 1..L"
    )
    norm: Norm = Field("batch", description="normalization; *_scale = scale only, no centering")
    order: Order = Field("norm_act", description="norm_act: Linear→norm→σ; act_norm: Linear→σ→norm")
    init: Init = Field("gaussian", description="weight init; gaussian = N(0, g²/fan_in)")
    init_gain: float = Field(1.0, gt=0, allow_inf_nan=False, description="g")
    bias: bool = Field(False, description="Linear layers carry a bias")
    batch_size: int = Field(100, ge=1, description="mini-batch size; also the probe batch size n")
    epochs: int = Field(10, ge=0, description="training epochs; 0 = measure at initialization")
    optimizer: Optimizer = "sgd"
    lr: float = Field(0.01, gt=0, allow_inf_nan=False)
    momentum: float = Field(0.0, ge=0, lt=1, allow_inf_nan=False)
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False)
    dataset: Dataset = "digits"
    max_train_samples: int | None = Field(
        None, ge=1, description="train on a seeded subset of this many samples (None = all)"
    )
    eval_norm: EvalNorm = Field(
        "running", description="test metrics use BatchNorm running stats or each batch's own"
    )
    record_every: int = Field(1, ge=1, description="record every k epochs; epoch 0 always")
    seed: int = Field(0, ge=0, lt=2**31)
    dtype: Dtype = Field("float32", description="parameters, inputs and activations")
    norm_eps: float = Field(
        1e-5, ge=0, allow_inf_nan=False, description="ε of every normalization (torch's 1e-5)"
    )
    bias_init: BiasInit = Field(
        "zero", description="zero, or torch's nn.Linear default U(±1/√fan_in); needs bias"
    )
    head_init: Init | None = Field(None, description="the classifier head's init (None = init)")
    orthogonal_gain: bool = Field(True, description="orthogonal init is multiplied by init_gain")
    input_norm: InputNorm = Field(
        "none", description="unit_rms: each input scaled to ‖x‖²/d_in = 1 before the first layer"
    )
    spectra: bool = Field(False, description="store every measured Gram's eigenvalues")
    jacobian_samples: int = Field(
        0, ge=0, description="probe samples whose input–output Jacobian spectrum is stored"
    )
    precision_check: bool = Field(
        False,
        description="re-run epoch 0's probe in float64 and store each float32 metric's relative "
        "difference from it, precision_diff/<metric> (no effect under float64)",
    )
    tap_metrics: bool = Field(
        False,
        description="record the per-tap metrics of each block's output at every recorded "
        "epoch: effective_rank, stable_rank and the server's registered ones (one SVD per "
        "block; docs/probe.md)",
    )
    epoch0_train_samples: int | None = Field(
        EPOCH0_TRAIN_SAMPLES,
        ge=1,
        description="epoch 0's train_loss/train_acc on a seeded subset of this many training "
        "samples, at least batch_size (None = all)",
    )
    model: str = Field(
        "mlp", description="mlp | resmlp | cnn | transformer | a registered model (docs/models.md)"
    )
    model_params: dict[str, Any] = Field(
        default_factory=dict, description="a registered model's own typed parameters"
    )
    residual_scale: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="resmlp/transformer: x + scale·f(x)"
    )
    kernel_size: int = Field(3, ge=1, le=31, description="cnn: odd kernel side, same padding")
    patch_size: int | None = Field(
        None, ge=1, description="transformer: k×k image patches as tokens (None = image rows)"
    )
    heads: int = Field(4, ge=1, description="transformer: attention heads (divide width)")
    mlp_ratio: int = Field(4, ge=0, description="transformer: MLP hidden = ratio·width; 0 = none")
    skip: bool = Field(True, description="transformer: residual connections around sublayers")
    norm_position: NormPosition = Field(
        "pre", description="transformer: norm before each sublayer (pre) or after the add (post)"
    )

    @model_validator(mode="after")
    def _check_combination(self) -> TrialConfig:
        # InvalidInput (not ValueError) passes through pydantic untouched, naming its field.
        if self.norm in ("batch", "batch_scale") and self.batch_size < 2:
            raise ValueError("batch_size must be ≥ 2 when norm is batch or batch_scale")
        if self.bias_init != "zero" and not self.bias:
            raise InvalidInput(
                f"{self.bias_init!r} needs bias=true (without biases there is nothing to "
                "initialize); set bias=true, or leave bias_init at 'zero'",
                field="bias_init",
            )
        if self.jacobian_samples > self.batch_size:
            raise InvalidInput(
                f"{self.jacobian_samples} exceeds the probe batch (batch_size="
                f"{self.batch_size}): at most batch_size samples can be measured",
                field="jacobian_samples",
            )
        self._check_model()
        # Fields that cannot change the trial's numbers given the others (Adam's momentum, a
        # family's unused fields, norm_eps without a norm, …: service.field_effects) take their
        # defaults, so configs that run the same network hash equal (one result, reused)
        # rather than passing for distinct trials.
        for name, value in field_effects.reset_values(self, _defaults()).items():
            object.__setattr__(self, name, value)
        return self

    def _check_model(self) -> None:
        """The model family's own rules (the fields it does not use are reset afterwards)."""
        models.check_model_name(self.model)
        if self.model in BUILTIN_MODELS:
            if self.model_params:
                raise InvalidInput(
                    f"model {self.model!r} takes no model_params (they are a registered "
                    "model's parameters); use the TrialConfig fields instead",
                    field="model_params",
                )
        else:
            object.__setattr__(self, "model_params", models.check_params(self))
        if self.init == "delta_orthogonal" and self.model != "cnn":
            raise InvalidInput(
                "init 'delta_orthogonal' is a convolution kernel's init (model: cnn); for "
                f"model {self.model!r} use 'orthogonal'",
                field="init",
            )
        if self.jacobian_samples and self.model not in ("mlp", "resmlp"):
            raise InvalidInput(
                "jacobian_samples is measured for model mlp and resmlp only (a CNN's or "
                "transformer's Jacobian is feature-map × input sized); set it to 0",
                field="jacobian_samples",
            )
        if self.model == "cnn" and self.kernel_size % 2 == 0:
            raise InvalidInput(
                f"kernel_size must be odd for same padding, not {self.kernel_size}; try "
                f"{self.kernel_size + 1}",
                field="kernel_size",
            )
        if self.model == "transformer":
            self._check_transformer()

    def _check_transformer(self) -> None:
        if self.width % self.heads:
            raise InvalidInput(
                f"heads={self.heads} must divide width={self.width} (the model dimension)",
                field="heads",
            )
        _, _, h, w = DATASET_IMAGES[self.dataset]
        k = self.patch_size
        if k is not None and (h % k or w % k):
            raise InvalidInput(
                f"patch_size={k} does not tile {self.dataset!r}'s {h}×{w} images; use a "
                "divisor of both sides, or null for rows as tokens",
                field="patch_size",
            )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def __hash__(self) -> int:  # model_params is a dict: hashed as its canonical JSON
        values = list(self.__dict__.values())
        params = self.model_params
        values[_PARAMS_AT] = json.dumps(params, sort_keys=True) if params else ""
        return hash(tuple(values))

    @property
    def recorded_epochs(self) -> list[int]:
        """The epochs that get a record: 0, k, 2k, …, and always the last one."""
        epochs = list(range(0, self.epochs + 1, self.record_every))
        if epochs[-1] != self.epochs:
            epochs.append(self.epochs)
        return epochs

    @property
    def n_recorded_epochs(self) -> int:
        """len(recorded_epochs) in O(1): ⌊E/k⌋ + 1 multiples of k in 0..E, plus E itself when
        k does not divide it."""
        return self.epochs // self.record_every + 1 + (self.epochs % self.record_every != 0)


CONFIG_FIELDS: tuple[str, ...] = tuple(TrialConfig.model_fields)
_PARAMS_AT = CONFIG_FIELDS.index("model_params")


@cache
def _defaults() -> dict[str, Any]:
    """Every field's default (what service.field_effects resets a field to)."""
    fields = TrialConfig.model_fields
    return {f: fields[f].get_default(call_default_factory=True) for f in fields}


# The fields trials can be filtered by (`where`, query parameters): all but the JSON document of a
# registered model's parameters, which filter one by one as model_params.<name>
# (service.store.param_filters).
FILTER_FIELDS: tuple[str, ...] = tuple(f for f in CONFIG_FIELDS if f != "model_params")


def parse_trial_config(data: dict[str, Any], *, where: str = "") -> TrialConfig:
    """Validate a dict into a TrialConfig.

    Raises:
        InvalidInput: names the first offending field (prefixed by `where`) and what is allowed.
    """
    try:
        return TrialConfig(**data)
    except ValidationError as exc:
        raise pydantic_to_invalid(exc, where=where) from None


def pydantic_to_invalid(
    exc: ValidationError, *, where: str = "", fields: Iterable[str] = ()
) -> InvalidInput:
    """One InvalidInput naming every bad field of a pydantic ValidationError, with a "did you
    mean" for a mistyped value of a choice or an unknown key (among `fields`, by default the
    fields of the model that raised: TrialConfig's); service.pydantic_errors."""
    fields = tuple(fields) or (CONFIG_FIELDS if exc.title == "TrialConfig" else ())
    return invalid_from_pydantic(exc, where=where, fields=fields)


def config_hash(config: TrialConfig) -> str:
    """Canonical hash of a trial: its full resolved config plus the measurement version."""
    return hash_of_text(config_text(config.to_dict()))


def config_text(values: dict[str, Any]) -> str:
    """A config's canonical JSON (keys sorted, no spaces): what config_hash hashes and the
    store keeps, serialized once."""
    return json.dumps(values, sort_keys=True, separators=(",", ":"))


def hash_of_text(text: str) -> str:
    """config_hash of the config whose config_text is `text`: the SHA-256 of the canonical JSON
    of {"config": …, "measurement_version": …}, spliced rather than serialized again."""
    return hashlib.sha256(f'{{"config":{text},{_VERSION_TEXT}}}'.encode()).hexdigest()


_VERSION_TEXT = f'"measurement_version":{json.dumps(MEASUREMENT_VERSION)}'


_SEED_MARK = -7_306_514_227_093  # no seed (0 ≤ seed < 2**31) nor plausible parameter


def seeded_texts(config: TrialConfig, seeds: Iterable[int]) -> Iterable[tuple[int, str]]:
    """config_text of `config` at each seed, serializing it once: the seed's digits are spliced
    into one text (a 100,000-seed sweep serializes one config, not 100,000)."""
    values = config.to_dict()
    values["seed"] = _SEED_MARK
    text = config_text(values)
    if text.count(str(_SEED_MARK)) != 1:  # the mark also in a model parameter: the plain way
        for seed in seeds:
            yield seed, config_text({**values, "seed": seed})
        return
    head, tail = text.split(f'"seed":{_SEED_MARK}')
    for seed in seeds:
        yield seed, f'{head}"seed":{seed}{tail}'


def tokens_of(config: TrialConfig) -> tuple[int, int]:
    """A transformer's (tokens T, values per token) from its dataset's images: (H/k)·(W/k)
    patches of C·k·k values, or the H rows of C·W values (patch_size None)."""
    _, c, h, w = DATASET_IMAGES[config.dataset]
    k = config.patch_size
    return (h * w // (k * k), c * k * k) if k else (h, c * w)


def estimate_memory_bytes(config: TrialConfig) -> float:
    """Rough peak memory of one trial: parameters, gradients, optimizer state and activations.

    A guard against specs that would take a machine down, not an accounting. Registered models
    are estimated as an MLP of their depth and width (their modules are not known here).
    """
    d_in, n_classes = DATASET_SHAPES[config.dataset]
    L, d, n = config.depth, config.width, config.batch_size
    measured = n  # values per sample of one float64 measurement beyond the n × n Gram's
    if config.model == "cnn":
        _, c, h, w = DATASET_IMAGES[config.dataset]
        k2 = config.kernel_size**2
        params = c * k2 * d + (L - 1) * d * d * k2 + d * n_classes
        acts = n * d * h * w * L * 6
        measured = d * h * w
    elif config.model == "transformer":
        t, token = tokens_of(config)
        hidden = config.mlp_ratio * d
        params = token * d + t * d + L * (4 * d * d + 2 * d * hidden) + d * n_classes
        acts = n * t * L * (8 * d + 2 * hidden) + n * config.heads * t * t * L * 2
        measured = max(n, d)
    else:
        params = d_in * d + (L - 1) * d * d + d * n_classes
        acts = n * d * L * (8 if config.model == "resmlp" else 6)
    states = 2 if config.optimizer == "adam" else (1 if config.momentum else 0)
    size = 8 if config.dtype == "float64" else 4  # bytes per value of the network's dtype
    param_bytes = size * params * (2 + states)  # weights, grads, optimizer state
    act_bytes = size * acts  # each block keeps ~3 outputs plus their gradients
    # float64 copies of one measurement: ~4 taps per block, n × measured values each
    measure_bytes = 8 * L * 4 * n * measured
    return float(param_bytes + act_bytes + measure_bytes)
