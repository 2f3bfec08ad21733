"""The registry of model families: the built-in ones (workers/models/) and a lab's own
`torch.nn.Module` factories (docs/models.md).

A lab registers a model in a module of its own, named in `ISOSWEEP_MODEL_MODULES` or exposed as
an entry point of the group `isosweep.models`, both read when the server (and each worker)
starts:

    from pydantic import BaseModel
    import isosweep

    class WideParams(BaseModel):
        expansion: int = 2

    def build(params: WideParams, *, d_in: int, n_classes: int, config):   # torch imported here
        ...                                                                 # → torch.nn.Module

    isosweep.register_model("wide", build, params=WideParams, taps="blocks.{i}")

A spec then says `model: wide` and `model_params: {expansion: 4}`, validated by `WideParams`.
Names come only from the server's own configuration: a spec naming anything else is refused
(422) with the registered names, and no spec can make the server import code. This module
imports neither torch nor the registered modules' code until `load_registered` runs.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Annotated, Any, get_origin

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from service import library_models as library
from service.errors import InvalidInput
from service.metric_names import (
    LAYER_METRICS,
    METRICS,
    PRECISION_CHECKED_LAYERS,
    PRECISION_PREFIX,
    SCALAR_METRICS,
    TAP_METRICS,
    registered_lab_metrics,
)
from service.param_columns import column_of
from service.pydantic_errors import invalid_from_pydantic

if TYPE_CHECKING:  # a type only: service.config imports this module, never the reverse
    from service.config import TrialConfig

ENTRY_POINT_GROUP = "isosweep.models"
# The built-in families and the TrialConfig fields each one uses besides the common ones.
FAMILY_FIELDS: dict[str, frozenset[str]] = {
    "mlp": frozenset({"order"}),
    "resmlp": frozenset({"order", "residual_scale"}),
    "cnn": frozenset({"order", "kernel_size"}),
    "transformer": frozenset(
        {"residual_scale", "patch_size", "heads", "mlp_ratio", "skip", "norm_position"}
    ),
}
# Fields that belong to one family or another; a model that does not use one gets its default.
FAMILY_SPECIFIC: frozenset[str] = frozenset().union(*FAMILY_FIELDS.values())


class NoParams(BaseModel):
    """A registered model without parameters of its own."""

    model_config = ConfigDict(extra="forbid")


Taps = str | tuple[str, ...]


@dataclass(frozen=True)
class RegisteredModel:
    """A lab's model: `factory(params, *, d_in, n_classes, config) -> torch.nn.Module`, its typed
    parameters, and the submodules whose outputs are measured — a dotted name with `{i}` for
    i = 0..depth−1 (one measured layer per block), or an explicit tuple of names; `head`, the
    classifier's weight parameter (None: the module's last parameter with two or more axes).

    The library families (service/library_models.py) use three more forms: a factory named
    "module:function" (imported by the worker that builds the module), taps given by a function
    of the validated params, and `tokens` — the taps are (n, T, d) token streams, measured with
    the token metrics as well — and `attention` — each tap declares its attention weights
    (`isosweep_attention()`, docs/probe.md), recorded as attention_entropy."""

    name: str
    factory: Callable[..., Any] | str
    params: type[BaseModel]
    taps: Taps | Callable[[BaseModel], Taps]
    head: str | None = None
    tokens: bool = False
    attention: bool = False
    check: Callable[[BaseModel, int], None] | None = None  # (params, width): more rules

    def tap_pattern(self, params: BaseModel | None = None) -> Taps:
        """The taps, for the validated `params` where they depend on them."""
        if callable(self.taps):
            assert params is not None, f"model {self.name!r}: its taps depend on model_params"
            return self.taps(params)
        return self.taps

    def tap_names(self, depth: int, params: BaseModel | None = None) -> list[str]:
        taps = self.tap_pattern(params)
        if isinstance(taps, str):
            return [taps.format(i=i) for i in range(depth)]
        return list(taps)


_REGISTRY: dict[str, RegisteredModel] = {}
_loaded = False
_lock = threading.Lock()


def register_model(
    name: str,
    factory: Callable[..., Any],
    *,
    params: type[BaseModel] = NoParams,
    taps: str | tuple[str, ...] = "blocks.{i}",
    head: str | None = None,
) -> None:
    """Register a model factory under `name` (called from a module that the server's
    configuration names; docs/models.md). A tuple of `taps` fixes the measured layers (and the
    trial's depth must equal their number); a pattern with `{i}` gives one per block. `head`
    names the classifier's weight (a parameter name such as "head.weight"; None: the module's
    last parameter with two or more axes), whose gradient norm and weight gap are recorded."""
    if name in FAMILY_FIELDS or name in LIBRARY:
        raise ValueError(f"{name!r} is a built-in model family; choose another name")
    if not name.isidentifier():
        raise ValueError(f"a model name is an identifier, not {name!r}")
    if isinstance(taps, str) and "{i}" not in taps:
        taps = (taps,)
    _REGISTRY[name] = RegisteredModel(name, factory, params, taps, head)


def load_registered() -> None:
    """Import the modules of Settings.model_modules and the `isosweep.models` entry points (an
    entry point's object is called if it is callable), once per process."""
    global _loaded
    with _lock:
        if _loaded:
            return
        _loaded = True
        from service.settings import get_settings

        try:
            for module in get_settings().model_modules:
                importlib.import_module(module)
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                obj = ep.load()
                if callable(obj) and not isinstance(obj, type):
                    obj()
        except Exception as exc:  # a misconfigured server: loud every time, never half-loaded
            _loaded = False
            raise RuntimeError(
                "registering the configured models failed (ISOSWEEP_MODEL_MODULES, or an "
                f"'{ENTRY_POINT_GROUP}' entry point; docs/models.md): {type(exc).__name__}: {exc}"
            ) from exc


def registered() -> dict[str, RegisteredModel]:
    load_registered()
    return dict(_REGISTRY)


def lab_metrics() -> dict[str, Any]:
    """A lab's registered per-tap metrics (name → fn; isosweep.register_metric, registered in
    service.metric_names), once the configured modules are imported."""
    load_registered()
    return registered_lab_metrics()


def known_metrics() -> tuple[str, ...]:
    """Every metric a record may hold: METRICS, then the lab's per-tap metrics by name."""
    return (*METRICS, *sorted(lab_metrics()))


def is_layer_metric(name: str) -> bool:
    """A per-layer metric: one of LAYER_METRICS, or a lab's per-tap metric."""
    return name in LAYER_METRICS or (name not in SCALAR_METRICS and name in lab_metrics())


def model_names() -> tuple[str, ...]:
    return (*FAMILY_FIELDS, *sorted(registered()), *LIBRARY)


def _external(*_: Any, **__: Any) -> Any:
    raise InvalidInput(
        "model 'external' is a trial recorded by the user's own training loop "
        "(isosweep.Monitor, docs/own-loop.md); isosweep cannot build or run it",
        field="model",
    )


class FreeParams(BaseModel):
    """An external trial's parameters: the user's own config, flattened into fields of JSON
    scalars (service/store/external.py `flatten`), taken as they are."""

    model_config = ConfigDict(extra="allow")


# The trials of isosweep.Monitor (service/store/external.py): one tap kind, "output"; never run;
# model_params = the run's free-form config (filters, plot axes and compare read it).
EXTERNAL = RegisteredModel("external", _external, FreeParams, "tap.{i}")

# Families built from other libraries' constructors (service/library_models.py, docs/models.md
# "Models people already have"), by the worker modules named; optional extras.
LIBRARY: dict[str, RegisteredModel] = {
    "timm": RegisteredModel(
        "timm", "workers.models.timm_model:build", library.TimmParams, library.timm_taps
    ),
    "hf": RegisteredModel(
        "hf",
        "workers.models.hf_model:build",
        library.HFParams,
        library.hf_taps,
        head="head.weight",
        tokens=True,
        attention=True,
        check=library.check_hf,
    ),
}


def get_registered(name: str) -> RegisteredModel:
    if name == EXTERNAL.name:
        return EXTERNAL
    if name in LIBRARY:
        return LIBRARY[name]
    check_model_name(name)
    return registered()[name]


def check_model_name(name: str) -> None:
    if name in FAMILY_FIELDS or name == EXTERNAL.name or name in LIBRARY:
        return
    if name not in registered():
        raise InvalidInput(
            f"unknown model {name!r}: the server knows {', '.join(model_names())} (a lab's "
            "own models are registered in the server's configuration, docs/models.md)",
            field="model",
            allowed=model_names(),
        )


def unused_fields(model: str) -> frozenset[str]:
    """The family-specific TrialConfig fields that `model` does not use."""
    return FAMILY_SPECIFIC - FAMILY_FIELDS.get(model, frozenset())


def check_params(config: TrialConfig) -> dict[str, Any]:
    """A registered model's model_params, validated by its params class, as plain JSON values
    (defaults filled in, so equal networks hash equal)."""
    entry = get_registered(config.model)
    try:
        params = entry.params(**config.model_params)
    except ValidationError as exc:  # an unknown key gets a "did you mean" among the class's
        fields = tuple(entry.params.model_fields)
        raise invalid_from_pydantic(exc, where="model_params", fields=fields) from None
    taps = entry.tap_pattern(params)
    if not isinstance(taps, str) and len(taps) != config.depth:
        raise InvalidInput(
            f"model {config.model!r} measures {len(taps)} layers ({', '.join(taps)})"
            f"; set depth={len(taps)}",
            field="depth",
        )
    if entry.check is not None:
        entry.check(params, config.width)
    return params.model_dump(mode="json")


def tap_kinds(config: TrialConfig) -> tuple[str, ...]:
    """The tap kinds a trial's network records (isometry_gap/<kind> for each; docs/models.md)."""
    norm = () if config.norm == "none" else ("norm",)
    if config.model in ("mlp", "cnn"):
        return ("linear", *norm, "act")
    if config.model == "resmlp":
        return ("linear", *norm, "act", "residual")
    if config.model == "transformer":
        return ("attn", *(("mlp",) if config.mlp_ratio else ()), "residual")
    return ("output",)


def layer_metrics(config: TrialConfig) -> tuple[str, ...]:
    """The per-layer metrics a trial records, in service.config.LAYER_METRICS' order, then the
    lab's registered per-tap metrics (with tap_metrics) by name. update_ratio is in every
    record (NaN at the first: nothing to compare with); attention_entropy is recorded by the
    attention layers of the transformer family and of `hf` models, and by `probe` at attention
    taps (external trials)."""
    kinds = tap_kinds(config)
    have = {
        f"{m}/{k}"
        for m in ("isometry_gap", "range_isometry_gap", "isometry_gap_error")
        for k in kinds
    }
    have |= {"weight_isometry_gap", "grad_norm", "rms", "mean_cosine", "update_ratio"}
    if config.model == "transformer" or (config.model in LIBRARY and LIBRARY[config.model].tokens):
        have |= {"token_isometry_gap", "token_cosine"}
    if config.precision_check:  # at epoch 0 (docs/science.md, "Precision")
        have |= {PRECISION_PREFIX + m for m in PRECISION_CHECKED_LAYERS if m in have}
    if config.model in ("transformer", EXTERNAL.name) or (
        config.model in LIBRARY and LIBRARY[config.model].attention
    ):
        have.add("attention_entropy")
    lab: tuple[str, ...] = ()
    if config.tap_metrics:  # each block's output (docs/probe.md, "Your own metrics")
        have |= set(TAP_METRICS)
        lab = tuple(sorted(lab_metrics()))
    return (*(m for m in LAYER_METRICS if m in have), *lab)


# --- model parameters as filters (service.param_columns) --------------------------------------

SCALAR_JSON = (str, int, float, bool, type(None))


def param_fields() -> dict[str, tuple[str, FieldInfo]]:
    """Every parameter of the registered models' params classes, then the library families'
    (service/library_models.py): name → (the first model, by name, that has it; its pydantic
    field)."""
    out: dict[str, tuple[str, FieldInfo]] = {}
    for name, entry in [*sorted(registered().items()), *LIBRARY.items()]:
        for field, info in entry.params.model_fields.items():
            out.setdefault(field, (name, info))
    return out


def param_columns() -> list[str]:
    """The dotted names of every registered model parameter ("model_params.expansion", …)."""
    return [column_of(f) for f in param_fields()]


def validate_param(name: str, value: Any, *, where: str) -> Any:
    """A filter's value of model parameter `name`, validated as its registered model's field
    (lax: query text "4" is 4, "false" is False) and given as its JSON value: a scalar.

    Raises:
        InvalidInput: `where` names it: no registered model has the parameter (with a "did you
            mean" among the registered ones), the value is not of its type, or it is a list or
            object (a filter compares one value).
    """
    fields = param_fields()
    if name not in fields:
        known = param_columns()
        raise InvalidInput(
            f"unknown model parameter {column_of(name)!r}"
            + ("" if known else ": no registered model has parameters (docs/models.md)"),
            field=where,
            allowed=known if known else None,
            given=column_of(name),
        )
    model, info = fields[name]
    kind = get_origin(info.annotation) or info.annotation
    if kind in (dict, list):
        raise InvalidInput(
            f"model parameter {column_of(name)!r} of model {model!r} is a document (a "
            f"{getattr(kind, '__name__', kind)}), and a filter "
            "compares one value "
            "of a scalar parameter; filter by another parameter, or select one trial by its id "
            "(`trial` on the metrics and plot routes)",
            field=where,
        )
    adapter: TypeAdapter = TypeAdapter(Annotated[info.annotation, info])  # type: ignore[arg-type]
    try:
        out = adapter.dump_python(adapter.validate_python(value), mode="json")
    except ValidationError as exc:
        raise invalid_from_pydantic(exc, where=where) from None
    if not isinstance(out, SCALAR_JSON):
        raise InvalidInput(
            f"a filter compares one value (a number, text, true, false or null), not "
            f"{type(out).__name__} {out!r}",
            field=where,
        )
    return out
