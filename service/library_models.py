"""The model families built from other libraries' own constructors (docs/models.md, "Models
people already have"): `model: timm` (any timm architecture by name) and `model: hf` (a Hugging
Face transformers model from its config class). Both are random initializations only: nothing
is ever downloaded (timm's `pretrained` is refused, transformers models come from `from_config`
with the hub offline).

This module holds their typed `model_params` and the rules that name each one's taps; the
modules themselves are built by workers/models/timm_model.py and workers/models/hf_model.py
(service.models registers both as library families). It imports neither library at import:
validating a `model: timm` spec imports timm (and torch) on first use — the architecture list
and the tap names come from timm itself — while `model: hf` only checks that transformers is
installed. Without the optional extra, naming the family is an InvalidInput saying which extra to
install (`pip install 'isosweep[timm]'`, `'isosweep[hf]'`).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.errors import InvalidInput

Scalar = bool | int | float | str | None
Arg = Scalar | list[Scalar]

# Keys of timm's create_model / a model's constructor that would load weights or files, or that
# the dataset sets: never taken from model_args.
TIMM_REFUSED = ("pretrained", "checkpoint", "cache", "path", "file", "url", "hub")
TIMM_FROM_DATASET = ("num_classes", "in_chans", "img_size")
TIMM_OUTPUT = ("features_only", "out_indices", "global_pool")
# The per-block containers a timm architecture keeps its stages or blocks in, tried in order;
# a "{j}" pattern counts from 1 (ResNet's layer1..layer4, RegNet's s1..s4).
TIMM_TAP_PATTERNS = ("stages.{i}", "layers.{i}", "blocks.{i}", "layer{j}", "s{j}")
MAX_LISTED = 40


def missing_extra(model: str, extra: str, package: str) -> InvalidInput:
    return InvalidInput(
        f"model {model!r} needs the optional package {package}, which this server does not "
        f"have: install it with pip install 'isosweep[{extra}]' (docs/models.md)",
        field="model",
    )


def installed(package: str) -> bool:
    """Whether `package` can be imported here, without importing it (a None in sys.modules,
    which blocks an import, counts as not installed)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _timm() -> Any:
    try:
        import timm
    except ImportError:
        raise missing_extra("timm", "timm", "timm") from None
    return timm


class TimmParams(BaseModel):
    """`model: timm` — a timm architecture at random init, its taps at its stages or blocks."""

    model_config = ConfigDict(extra="forbid")

    arch: str = Field(description="a timm architecture, as timm.list_models() names it")
    model_args: dict[str, Arg] = Field(
        default_factory=dict,
        description="further keyword arguments of the architecture (sizes: depth, embed_dim, "
        "patch_size, …); num_classes, in_chans and img_size come from the dataset",
    )
    taps: str | list[str] | None = Field(
        None,
        description="the measured submodules: a pattern with {i}, or names (default: the "
        "architecture's stages or blocks); filled in when validated",
    )
    pretrained: bool = Field(False, description="refused: isosweep measures random inits")

    @model_validator(mode="after")
    def _resolve(self) -> TimmParams:
        if self.pretrained:
            raise InvalidInput(
                "pretrained weights are refused: model 'timm' builds a random initialization "
                "and downloads nothing (docs/models.md); remove pretrained",
                field="model_params.pretrained",
            )
        for key in self.model_args:
            _check_timm_arg(key)
        _timm()  # the extra is installed (each time: a test may hide it)
        if self.arch not in _timm_archs():
            known = sorted(_timm_archs())
            close = difflib.get_close_matches(self.arch, known, n=5, cutoff=0.6)
            hint = f"; the closest: {', '.join(close)}" if close else ""
            raise InvalidInput(
                f"unknown timm architecture {self.arch!r}{hint} (timm.list_models() has "
                f"{len(known)} names)",
                field="model_params.arch",
            )
        names, features = _timm_modules(self.arch, json.dumps(self.model_args, sort_keys=True))
        object.__setattr__(self, "taps", _timm_taps(self.arch, self.taps, names, features))
        return self


def _check_timm_arg(key: str) -> None:
    lowered = key.lower()
    if any(word in lowered for word in TIMM_REFUSED):
        raise InvalidInput(
            f"model_args may not set {key!r}: model 'timm' builds a random initialization and "
            "reads no files (docs/models.md)",
            field=f"model_params.model_args.{key}",
        )
    if key in TIMM_FROM_DATASET:
        raise InvalidInput(
            f"{key} comes from the dataset (its classes, channels and image size); remove it "
            "from model_args",
            field=f"model_params.model_args.{key}",
        )
    if key in TIMM_OUTPUT:
        raise InvalidInput(
            f"model_args may not set {key!r}: the module must give (n, classes) logits",
            field=f"model_params.model_args.{key}",
        )


@lru_cache(maxsize=1)
def _timm_archs() -> frozenset[str]:
    return frozenset(_timm().list_models())


@lru_cache(maxsize=64)
def _timm_modules(arch: str, args: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The submodule names of `arch` built with `args` (JSON) on the meta device (no memory, no
    initialization, nothing downloaded), and its feature_info stage modules."""
    import torch

    timm = _timm()
    try:
        with torch.device("meta"):
            module = timm.create_model(arch, pretrained=False, **json.loads(args))
    except Exception as exc:
        raise InvalidInput(
            f"timm could not build {arch!r} with model_args {args}: {type(exc).__name__}: {exc}",
            field="model_params.model_args",
        ) from None
    names = tuple(name for name, _ in module.named_modules() if name)
    info = getattr(module, "feature_info", None) or []
    features = tuple(f["module"] for f in info if isinstance(f, dict) and "module" in f)
    return names, features


def _expand(pattern: str, have: set[str]) -> list[str]:
    """A tap pattern's names while they exist: "{i}" counts from 0, "{j}" from 1."""
    out: list[str] = []
    while True:
        name = pattern.format(i=len(out), j=len(out) + 1)
        if name not in have:
            return out
        out.append(name)


def _timm_taps(
    arch: str, taps: str | list[str] | None, names: tuple[str, ...], features: tuple[str, ...]
) -> list[str]:
    """The tap names: the user's (a pattern expanded, or names checked), else the first of
    TIMM_TAP_PATTERNS the architecture has, else its feature_info stages."""
    have = set(names)
    if taps is None:
        for pattern in TIMM_TAP_PATTERNS:
            found = _expand(pattern, have)
            if found:
                return found
        if features and set(features) <= have:
            return list(features)
        _no_taps(arch, "it has no stages or blocks isosweep recognizes; name them in taps", names)
    if isinstance(taps, str):
        found = _expand(taps, have) if "{" in taps else ([taps] if taps in have else [])
        if not found:
            _no_taps(arch, f"{taps!r} names no submodule", names, taps)
        return found
    if not taps or len(set(taps)) != len(taps):
        raise InvalidInput("taps must name distinct submodules", field="model_params.taps")
    for t in taps:
        if t not in have:
            _no_taps(arch, f"{t!r} is not a submodule", names, t)
    return list(taps)


def _no_taps(arch: str, why: str, names: tuple[str, ...], given: str | None = None) -> None:
    close = difflib.get_close_matches(given, names, n=3) if given else []
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    listed = ", ".join(names[:MAX_LISTED]) + (" …" if len(names) > MAX_LISTED else "")
    raise InvalidInput(
        f"timm {arch!r}: {why}{hint} Its submodules: {listed}", field="model_params.taps"
    )


def timm_taps(params: BaseModel) -> tuple[str, ...]:
    """A validated TimmParams' taps, as submodules of the module the worker builds (the timm
    model sits at `net`)."""
    assert isinstance(params, TimmParams) and isinstance(params.taps, list)
    return tuple(f"net.{t}" for t in params.taps)


# --- Hugging Face transformers --------------------------------------------------------------

# config → (the transformers config and model classes, the blocks' ModuleList in the model)
HF_ARCHS: dict[str, tuple[str, str, str]] = {
    "gpt2": ("GPT2Config", "GPT2Model", "h"),
    "bert": ("BertConfig", "BertModel", "encoder.layer"),
    "llama": ("LlamaConfig", "LlamaModel", "layers"),
}
# config_args that the family sets itself (sizes from the trial, no dropout, no vocabulary)
HF_SET = (
    "n_layer", "num_hidden_layers", "n_embd", "hidden_size", "n_head", "num_attention_heads",
    "num_key_value_heads", "n_inner", "intermediate_size", "n_positions",
    "max_position_embeddings", "vocab_size", "type_vocab_size", "initializer_range",
)  # fmt: skip


class HFParams(BaseModel):
    """`model: hf` — a transformers model from its own config class: depth → layers, width →
    hidden size; tokens are the dataset's image rows (or patch_size × patch_size patches)."""

    model_config = ConfigDict(extra="forbid")

    config: Literal["gpt2", "bert", "llama"] = Field(
        "gpt2", description="the transformers architecture (GPT2Model, BertModel, LlamaModel)"
    )
    heads: int = Field(4, ge=1, description="attention heads (divide width)")
    mlp_ratio: int = Field(4, ge=1, description="MLP hidden size = mlp_ratio · width")
    patch_size: int | None = Field(
        None, ge=1, description="k×k image patches as tokens (None: the image rows)"
    )
    initializer_range: float = Field(
        0.02, gt=0, allow_inf_nan=False, description="the weights' init s.d. (transformers' 0.02)"
    )
    config_args: dict[str, Scalar] = Field(
        default_factory=dict,
        description="further fields of the config class (initializer_range, "
        "activation_function, layer_norm_epsilon, …)",
    )

    @model_validator(mode="after")
    def _check(self) -> HFParams:
        if not installed("transformers"):
            raise missing_extra("hf", "hf", "transformers")
        for key in self.config_args:
            if key in HF_SET or "dropout" in key or "pdrop" in key or "path" in key.lower():
                raise InvalidInput(
                    f"config_args may not set {key!r}: sizes come from depth, width, heads and "
                    "mlp_ratio (the init's s.d. from initializer_range), dropout is off, nothing "
                    "is read from files",
                    field=f"model_params.config_args.{key}",
                )
        return self


def hf_taps(params: BaseModel) -> str:
    """The blocks of a validated HFParams' architecture (the transformers model sits at
    `model`), one per layer: "model.h.{i}" for GPT-2."""
    assert isinstance(params, HFParams)
    return f"model.{HF_ARCHS[params.config][2]}.{{i}}"


def check_hf(params: BaseModel, width: int) -> None:
    """heads divides the model dimension (the trial's width)."""
    assert isinstance(params, HFParams)
    if width % params.heads:
        raise InvalidInput(
            f"heads={params.heads} must divide width={width} (the model dimension)",
            field="model_params.heads",
        )
