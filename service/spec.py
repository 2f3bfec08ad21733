"""SweepSpec: what a researcher submits (YAML or JSON), its validation, limits and expansion.

A list-valued parameter is a sweep axis, a scalar is fixed for every trial; `seeds` multiplies
the cartesian product of the axes. A parameter may also be a distribution ({uniform: [a, b]},
{loguniform: [a, b]}, {int: [a, b]}, {choice: [...]}; service.sampling), from which the top-level
`search: {kind: random | sobol, n: N, seed: S}` draws N points at submission: trials = grid cells
× N × seeds, all known up front (docs/api.md, "Sampled parameters"). `search: {kind: tpe, …}`
asks them of Optuna as trials finish (service/search/tpe.py: no trial is known up front), and
`early_stop: {kind: successive_halving, …}` stops trials at rungs (service/search/halving.py).
Every value goes through TrialConfig's own field validation, so an error names
`parameters.<field>` and what is allowed. Limits that protect the machine (trial count, depth,
width, batch size, epochs, a trial's memory estimate) come from Settings.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping
from functools import cache, lru_cache
from pathlib import Path
from typing import Annotated, Any, NamedTuple, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from service import expressions, models, sampling
from service.config import (
    CONFIG_FIELDS,
    TrialConfig,
    estimate_memory_bytes,
    parse_trial_config,
    pydantic_to_invalid,
)
from service.documents import check_shape, load_yaml
from service.errors import InvalidInput, LimitExceeded, did_you_mean
from service.expressions import Expression, parse_expression
from service.sampling import Distribution, Search
from service.search.halving import rungs
from service.search.models import EarlyStop, TpeSearch
from service.settings import Settings, get_settings

SWEPT_BY_SPEC = tuple(f for f in CONFIG_FIELDS if f != "seed")  # `seeds` sets the seed
# fields whose value is a document (a dict): a dict given for one is its value, never a
# distribution to sample (a list of them is an axis)
DOCUMENT_FIELDS = frozenset(
    f for f in CONFIG_FIELDS if get_origin(TrialConfig.model_fields[f].annotation) is dict
)
SEED_LIMIT = 2**31  # TrialConfig.seed < 2**31
ZIP = "zip"  # parameters.zip: linked axes (several fields set together, point by point)
EXPR = "expr"  # {expr: "…"}: a derived field (service.expressions)
_DEFAULTS = TrialConfig().to_dict()
MAX_TAGS, MAX_TAG_LENGTH = 100, 100
MAX_ERRORS = 10  # field errors named in one message; the rest are counted


class Resources(BaseModel):
    """What one trial asks of a Ray worker."""

    model_config = ConfigDict(extra="forbid")

    cpu: float = Field(1.0, gt=0, allow_inf_nan=False, description="CPUs per trial")
    gpu: float = Field(0.0, ge=0, allow_inf_nan=False, description="GPUs per trial (fractional ok)")

    @field_validator("gpu")
    @classmethod
    def _whole_above_one(cls, v: float) -> float:
        # Ray packs fractions of one GPU; more than one must be whole GPUs.
        if v > 1 and not float(v).is_integer():
            raise ValueError("a gpu request above 1 must be a whole number")
        return v


class SweepSpec(BaseModel):
    """One sweep: parameters (lists are axes, scalars fixed) × seeds, plus how to run it."""

    model_config = ConfigDict(extra="forbid")
    # the trials of `expand` as (config, its seeds), computed once: expand_groups
    _groups: list[TrialGroup] | None = PrivateAttr(default=None)

    name: str = Field(min_length=1, max_length=200)
    description: str | None = None
    tags: list[Annotated[str, Field(max_length=MAX_TAG_LENGTH)]] = Field(
        default_factory=list, max_length=MAX_TAGS
    )
    parameters: dict[str, Any] = Field(default_factory=dict)
    seeds: int | list[int] = 1  # a count n (seeds 0..n−1) or an explicit list of distinct seeds
    resources: Resources = Field(default_factory=Resources)
    max_failures: int = Field(1, ge=0, description="retries of a crashed trial before `failed`")
    priority: int = Field(0, description="higher runs first; ties by submission time")
    rerun: bool = Field(False, description="run trials even when identical results are stored")
    pack: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="most trials trained as one batched model (docs/architecture.md, Packed "
        "trials); 1 = every trial alone; null = chosen from the trials' size and the cluster",
    )
    search: Search | TpeSearch | None = Field(
        None,
        description="draws n points for the distribution parameters (service.sampling), or "
        "asks them of Optuna's TPE as trials finish (kind: tpe; service/search/tpe.py)",
    )
    early_stop: EarlyStop | None = Field(
        None, description="successive halving: stop trials at rungs (service/search/halving.py)"
    )
    accept_cost: bool = Field(
        False,
        description="run even when the cost estimate is over the budget (ISOSWEEP_MAX_SWEEP_HOURS;"
        " service.cost)",
    )

    @field_validator("name")
    @classmethod
    def _name_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v.strip()

    @field_validator("parameters", mode="before")
    @classmethod
    def _check_parameters(cls, v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise InvalidInput("must be a mapping of TrialConfig fields", field="parameters")
        return {
            str(k): _normalize_zip(value) if k == ZIP else _normalize_parameter(str(k), value)
            for k, value in v.items()
        }

    @field_validator("search", mode="before")
    @classmethod
    def _search_by_kind(cls, v: Any) -> Any:
        # by `kind`, so that an error names `search.<field>` (not the union's branch)
        if not isinstance(v, dict):
            return v
        model = TpeSearch if v.get("kind") == "tpe" else Search
        if model is Search and v.get("kind") not in (*sampling.SEARCH_KINDS, None):
            raise InvalidInput(
                f"Input should be 'random' or 'sobol' (points drawn at submission) or 'tpe' "
                f"(asked of Optuna as trials finish), not {v.get('kind')!r}",
                field="search.kind",
            )
        try:
            return model.model_validate(v, strict=True)
        except ValidationError as exc:
            raise capped_invalid(exc, where="search") from None

    @field_validator("seeds", mode="before")
    @classmethod
    def _check_seeds(cls, v: Any) -> int | list[int]:
        return _normalize_seeds(v)

    @model_validator(mode="after")
    def _search_and_distributions_go_together(self) -> SweepSpec:
        sampled = [k for k, v in self.parameters.items() if _is_sampled(k, v)]
        if sampled and self.search is None:
            raise InvalidInput(
                "a distribution is sampled by a search: add `search: {kind: random, n: …}` "
                "(or kind: sobol) at the top level of the spec, saying how many points to draw",
                field=f"parameters.{sampled[0]}",
            )
        if self.search is not None and not sampled:
            raise InvalidInput(
                f"a search draws the values of distribution parameters ({sampling.FORMS}), and "
                "no parameter is one; write e.g. `lr: {loguniform: [1e-4, 1e-1]}`, or drop "
                "`search` (a list is a grid axis)",
                field="search",
            )
        _check_links(self)
        _check_epochs(self)
        return self

    @property
    def adaptive(self) -> bool:
        """Whether trials are asked as the search goes (kind: tpe), not expanded up front."""
        return isinstance(self.search, TpeSearch)

    @property
    def seed_list(self) -> list[int]:
        if isinstance(self.seeds, int):
            return list(range(self.seeds))
        return list(self.seeds)

    @property
    def axes(self) -> dict[str, list[Any]]:
        """The grid axes (list-valued parameters), in the order they were written; linked axes
        (`zip`) are `zips`."""
        return {k: v for k, v in self.parameters.items() if k != ZIP and isinstance(v, list)}

    @property
    def zips(self) -> list[list[dict[str, Any]]]:
        """The linked axes: each a list of points that set several fields together."""
        return self.parameters.get(ZIP, [])

    @property
    def derived(self) -> dict[str, Expression]:
        """The derived fields ({expr: …}), parsed, in the order they were written."""
        return {k: _expression(k, v) for k, v in self.parameters.items() if _is_derived(v)}

    @property
    def grid_fields(self) -> list[str]:
        """The fields a grid cell sets: the axes', then each linked axis's."""
        return [*self.axes, *(f for group in self.zips for f in group[0])]

    @property
    def sampled(self) -> dict[str, Distribution]:
        """The distribution parameters, in the order they were written."""
        return {
            k: sampling.distribution_of(v) for k, v in self.parameters.items() if _is_sampled(k, v)
        }

    @property
    def fixed(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in self.parameters.items()
            if k != ZIP and not isinstance(v, list) and not _is_sampled(k, v) and not _is_derived(v)
        }

    @property
    def n_points(self) -> int:
        """The sampled points crossed with every grid cell: search.n, or 1 without a search."""
        return self.search.n if self.search is not None else 1

    @property
    def n_trials(self) -> int:
        """Axes' product × sampled points × seeds: the trials at most (`expand` drops points
        equal to others)."""
        cells = math.prod(len(v) for v in [*self.axes.values(), *self.zips])
        return cells * self.n_points * _n_seeds(self)

    def cells(self) -> Iterable[dict[str, Any]]:
        """Every grid cell's values (axes and linked axes), in expansion order: the axes as
        written, then the linked axes, the last varying fastest."""
        axes = self.axes
        names = list(axes)
        for values in itertools.product(*axes.values(), *self.zips):
            point = dict(zip(names, values[: len(names)], strict=True))
            for linked in values[len(names) :]:
                point.update(linked)
            yield point

    def resolve(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """A trial's parameters: the fixed values, `point` (a cell, sampled values, the seed), and
        the derived fields computed from them (a name not set reads TrialConfig's default).

        Raises:
            InvalidInput: a derived value cannot be computed (field `parameters.<name>`, with the
                expression and the trial point).
        """
        out = {**self.fixed, **point}
        derived = self.derived
        if not derived:
            return out
        for name in expressions.evaluation_order(derived, where="parameters"):
            values = {n: out.get(n, _DEFAULTS.get(n)) for n in derived[name].names}
            try:
                out[name] = _derived_value(name, derived[name].evaluate(values, where=""))
            except InvalidInput as exc:
                at = ", ".join(f"{k}={v!r}" for k, v in point.items())
                raise InvalidInput(
                    f"{exc.message} (in the trial with {at})", field=f"parameters.{name}"
                ) from None
        return out


def _check_epochs(spec: SweepSpec) -> None:
    """early_stop's grace_epochs and a tpe search's epoch K within every trial's epochs; a
    per-layer metric's layer within every trial's depth."""
    low: dict[str, int] = {}
    for name in ("epochs", "depth"):
        v = _linked_values(spec, name) or spec.parameters.get(name, getattr(TrialConfig(), name))
        if _is_derived(v):  # checked per trial when the spec is expanded (check_limits)
            v = 10**9
        elif isinstance(v, list):
            v = min(v)
        elif isinstance(v, dict):
            v = sampling.distribution_of(v)
            v = min(v.values) if isinstance(v, sampling.Choice) else v.a
        low[name] = int(v)
    stop = spec.early_stop
    if stop is not None:
        if stop.grace_epochs > low["epochs"]:
            raise InvalidInput(
                f"the first rung (epoch {stop.grace_epochs}) is after the last epoch of some "
                f"trial ({low['epochs']}): lower grace_epochs or raise epochs",
                field="early_stop.grace_epochs",
            )
        if stop.layer is not None and stop.layer > low["depth"]:
            raise InvalidInput(
                f"layer {stop.layer} is deeper than some trial ({low['depth']} blocks)",
                field="early_stop.layer",
            )
        if stop.synchronous and spec.adaptive:
            raise InvalidInput(
                "synchronous halving decides a rung once every trial has reached it, and a tpe "
                "search asks its trials as others finish: drop `synchronous` (or use a random "
                "or sobol search)",
                field="early_stop.synchronous",
            )
    search = spec.search
    if isinstance(search, TpeSearch):
        if isinstance(search.epoch, int) and search.epoch > low["epochs"]:
            raise InvalidInput(
                f"epoch {search.epoch} is after the last epoch of some trial ({low['epochs']})",
                field="search.epoch",
            )
        if search.layer is not None and search.layer > low["depth"]:
            raise InvalidInput(
                f"layer {search.layer} is deeper than some trial ({low['depth']} blocks)",
                field="search.layer",
            )


def _linked_values(spec: SweepSpec, name: str) -> list[Any] | None:
    """The values a linked axis gives `name`, or None when no linked axis sets it."""
    for group in spec.zips:
        if name in group[0]:
            return [p[name] for p in group]
    return None


def halving_rungs(spec: SweepSpec, epochs: int) -> list[int]:
    """The early_stop rungs of a trial of `epochs` epochs (none without early_stop)."""
    stop = spec.early_stop
    return [] if stop is None else rungs(stop.grace_epochs, stop.reduction, epochs)


def _n_seeds(spec: SweepSpec) -> int:
    return spec.seeds if isinstance(spec.seeds, int) else len(spec.seeds)


@cache
def _field_adapter(name: str) -> TypeAdapter:
    info = TrialConfig.model_fields[name]
    return TypeAdapter(Annotated[info.annotation, info])  # type: ignore[arg-type]


def validate_field(name: str, value: Any, *, where: str, strict: bool = False) -> Any:
    """One TrialConfig field's value, validated and normalized (JSON types). `strict` (a spec's
    values): no number from text or a boolean, a boolean only from a boolean, an integer is a
    fine float; lax (filters, which arrive as query text): "4" is 4, "true" is true.

    Raises:
        InvalidInput: `where` names the field; the message says what is allowed.
    """
    if name not in CONFIG_FIELDS:
        raise InvalidInput("unknown field", field=where, allowed=CONFIG_FIELDS)
    adapter = _field_adapter(name)
    try:
        out = adapter.dump_python(adapter.validate_python(value, strict=strict), mode="json")
    except ValidationError as exc:
        raise capped_invalid(exc, where=where) from None
    if name == "model":  # only what the server's configuration registered (service/models.py)
        try:
            models.check_model_name(out)
        except InvalidInput as exc:
            exc.field = where
            raise
    return out


def capped_invalid(
    exc: ValidationError, *, where: str = "", fields: Iterable[str] = ()
) -> InvalidInput:
    """pydantic_to_invalid, naming the first MAX_ERRORS fields and counting the rest (a list
    of 100 000 bad values must not become a 5 MB message)."""
    err = pydantic_to_invalid(exc, where=where, fields=fields)
    extra = exc.error_count() - MAX_ERRORS
    if extra > 0:
        head = err.message.split("; ", MAX_ERRORS)[:MAX_ERRORS]
        err.message = "; ".join(head) + f"; … and {extra} more errors"
        err.args = (err.message,)
    return err


def _normalize_parameter(name: str, value: Any) -> Any:
    where = f"parameters.{name}"
    if name == "seed":
        raise InvalidInput("set seeds with the top-level `seeds` key", field=where)
    if name not in SWEPT_BY_SPEC:
        raise InvalidInput("unknown field", field=where, allowed=SWEPT_BY_SPEC)
    if isinstance(value, dict) and set(value) == {EXPR} and name not in DOCUMENT_FIELDS:
        parse_expression(value[EXPR], where=where)  # names are checked with the whole spec
        return {EXPR: value[EXPR].strip()}
    if isinstance(value, dict) and name not in DOCUMENT_FIELDS:
        return sampling.parse_distribution(
            name,
            value,
            where=where,
            validate=lambda n, v, w: validate_field(n, v, where=w, strict=True),
        )
    if not isinstance(value, list | tuple):  # a document (model_params) is one value
        return validate_field(name, value, where=where, strict=True)
    if not value:
        raise InvalidInput("an axis needs at least one value", field=where)
    values = [
        validate_field(name, v, where=f"{where}[{i}]", strict=True) for i, v in enumerate(value)
    ]
    distinct = {json.dumps(v, sort_keys=True) for v in values}
    if len(distinct) != len(values):  # normalized: "1e-3" and 0.001 are the same value
        raise InvalidInput(f"an axis must not repeat a value: {values}", field=where)
    return values


def _normalize_seeds(v: Any) -> int | list[int]:
    if isinstance(v, bool) or not isinstance(v, int | list | tuple):
        raise InvalidInput("a count ≥ 1 or a list of distinct integers", field="seeds")
    if isinstance(v, int):
        if not 1 <= v <= SEED_LIMIT:
            raise InvalidInput(f"a count must be between 1 and {SEED_LIMIT}", field="seeds")
        return v
    if not v:
        raise InvalidInput("the list of seeds must not be empty", field="seeds")
    for i, s in enumerate(v):
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < SEED_LIMIT:
            raise InvalidInput(f"a seed is an integer in [0, {SEED_LIMIT})", field=f"seeds[{i}]")
    if len(set(v)) != len(v):
        raise InvalidInput("seeds must be distinct", field="seeds")
    return list(v)


def parse_spec(data: dict[str, Any] | str, *, settings: Settings | None = None) -> SweepSpec:
    """Validate a sweep spec given as a dict, or as YAML or JSON text, and check its limits.

    Text is read as YAML 1.2 (a superset of JSON), strictly: see service.documents. Values are
    validated strictly: no number from text or a boolean, booleans only from booleans.

    Raises:
        InvalidInput: names the offending field (YAML syntax errors: field `spec`, with the line).
        LimitExceeded: over a Settings limit; names the field, the limit and its ISOSWEEP_ variable.
    """
    settings = settings or get_settings()
    if isinstance(data, str):
        data = _load_text(data, settings)
    if not isinstance(data, dict):
        raise InvalidInput(
            "a sweep spec must be a mapping (name, parameters, seeds, …)", field="spec"
        )
    check_shape(data, max_nodes=max_nodes(settings), field="spec")
    check_storable(data, "", ints=False)  # before pydantic, whose message for text is unclear
    try:
        spec = SweepSpec.model_validate(data, strict=True)
    except ValidationError as exc:
        raise capped_invalid(exc, fields=SweepSpec.model_fields) from None
    except RecursionError:
        raise InvalidInput("the document is nested too deeply", field="spec") from None
    check_limits(spec, settings)
    check_storable(spec.model_dump(mode="json"), "")
    return spec


def max_nodes(settings: Settings) -> int:
    """The most values a valid spec can hold: its axes' and seeds' values number at most the
    trial limit plus one per axis (a product of n factors ≥ 1 is at least their sum − n + 1),
    plus keys, tags and the rest."""
    return settings.max_trials_per_sweep + 2000


def load_spec(path: str | Path, *, settings: Settings | None = None) -> SweepSpec:
    """parse_spec of a YAML or JSON file.

    Raises:
        InvalidInput: the file cannot be read, or the spec is invalid (see parse_spec).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}", field="spec") from None
    return parse_spec(text, settings=settings)


def _load_text(text: str, settings: Settings) -> Any:
    if len(text) > settings.max_body_bytes:
        raise LimitExceeded(
            f"the spec ({len(text)} characters) is over the limit of {settings.max_body_bytes} "
            f"(set by {_env_name('max_body_bytes')})",
            field="spec",
        )
    return load_yaml(text, max_nodes=max_nodes(settings))


# Limits on single fields: (field, Settings attribute).
FIELD_LIMITS = (
    ("depth", "max_depth"),
    ("width", "max_width"),
    ("batch_size", "max_batch_size"),
    ("epochs", "max_epochs"),
)


def _env_name(setting: str) -> str:
    return f"ISOSWEEP_{setting.upper()}"


def check_limits(spec: SweepSpec, settings: Settings) -> list[TrialGroup]:
    """Reject a spec that would overload the machine: too many trials, too deep, too wide, too big.

    Returns:
        The expanded trials as groups that differ by their seed alone (expand_groups), which the
        check needs anyway.

    Raises:
        LimitExceeded: names the field, the limit and the setting that raises it.
        InvalidInput: a combination of values is invalid for some trial (see expand).
    """
    n = spec.n_trials
    if n > settings.max_trials_per_sweep:
        points = [f"{spec.n_points} sampled points"] if spec.search is not None else []
        shape = " × ".join(
            [*(f"{len(v)} {k}" for k, v in spec.axes.items()), *points, f"{_n_seeds(spec)} seeds"]
        )
        raise LimitExceeded(
            f"the sweep expands to {n} trials ({shape}), over the limit of "
            f"{settings.max_trials_per_sweep} (set by {_env_name('max_trials_per_sweep')})",
            field="parameters",
        )
    defaults = TrialConfig()
    sampled = spec.sampled
    derived = spec.derived
    for name, setting in FIELD_LIMITS:
        if name in derived:
            continue  # checked on the expanded trials below
        value = _linked_values(spec, name) or spec.parameters.get(name, getattr(defaults, name))
        if name in sampled:
            top = sampled[name].top
        else:
            top = max(value) if isinstance(value, list) else value
        _check_limit(name, setting, top, settings)
    groups = expand_groups(spec)
    corners = [g.config for g in groups] or _corners(spec)  # the seed changes none of these
    for name, setting in FIELD_LIMITS:
        if name in derived:
            _check_limit(name, setting, max(getattr(t, name) for t in corners), settings)
    if derived and (spec.early_stop is not None or spec.adaptive):
        _check_epochs_of(spec, corners)
    _check_memory(corners, settings)
    return groups


def _check_limit(name: str, setting: str, top: Any, settings: Settings) -> None:
    limit = getattr(settings, setting)
    if top > limit:
        raise LimitExceeded(
            f"{top} is over the limit of {limit} (set by {_env_name(setting)})",
            field=f"parameters.{name}",
        )


def _check_epochs_of(spec: SweepSpec, trials: list[TrialConfig]) -> None:
    """_check_epochs where epochs or depth are derived: against the trials' own values."""
    low = min(t.epochs for t in trials)
    stop = spec.early_stop
    if stop is not None and stop.grace_epochs > low:
        raise InvalidInput(
            f"the first rung (epoch {stop.grace_epochs}) is after the last epoch of some trial "
            f"({low}): lower grace_epochs or raise epochs",
            field="early_stop.grace_epochs",
        )
    search = spec.search
    if isinstance(search, TpeSearch) and isinstance(search.epoch, int) and search.epoch > low:
        raise InvalidInput(
            f"epoch {search.epoch} is after the last epoch of some trial ({low})",
            field="search.epoch",
        )


def _corners(spec: SweepSpec) -> list[TrialConfig]:
    """A tpe search's grid cells with every distribution at its top value: what its memory
    check weighs (its trials are asked later)."""
    tops = {k: d.top for k, d in spec.sampled.items()}
    out = []
    for cell in spec.cells():
        try:
            out.append(parse_trial_config(spec.resolve({**cell, **tops})))
        except InvalidInput as exc:
            raise InvalidInput(exc.message, field="parameters") from None
    return out


def _check_memory(trials: list[TrialConfig], settings: Settings) -> None:
    limit = settings.max_trial_memory_gb * 1e9
    worst = max(trials, key=estimate_memory_bytes)
    need = estimate_memory_bytes(worst)
    if need > limit:
        raise LimitExceeded(
            f"a trial with depth={worst.depth}, width={worst.width}, "
            f"batch_size={worst.batch_size} needs about {need / 1e9:.1f} GB, over the limit of "
            f"{settings.max_trial_memory_gb} GB (set by {_env_name('max_trial_memory_gb')})",
            field="parameters",
        )


def expand(spec: SweepSpec) -> list[TrialConfig]:
    """The sweep's trials: the cartesian product of the axes, in the order they are written, then
    the search's sampled points (the same N points in every grid cell, in draw order: see
    service.sampling), with the seeds innermost (consecutive trials are the seeds of one
    configuration).

    A point that validates to the config of an earlier one is dropped (the first is kept): e.g.
    optimizer × momentum, where Adam's momentum is normalized to 0, gives Adam one trial per
    seed, not one per momentum value with equal numbers posing as replicates. So a sweep can
    have fewer trials than `n_trials`, the product.

    Raises:
        InvalidInput: some combination of values is not a valid TrialConfig (field `parameters`).
    """
    return [
        c if s == c.seed else c.model_copy(update={"seed": s})
        for c, seeds in expand_groups(spec)
        for s in seeds
    ]


class TrialGroup(NamedTuple):
    """Trials that differ by their seed alone: `config` (validated, with the first seed) and the
    seeds, in expansion order."""

    config: TrialConfig
    seeds: tuple[int, ...]


def expand_groups(spec: SweepSpec) -> list[TrialGroup]:
    """`expand` as groups of trials that differ by their seed alone, computed once per spec.

    The seed changes no other field's validity or reset (service.field_effects has no rule on
    it), so one validation per grid point stands for all of its seeds — unless a derived field
    reads the seed, when every trial is validated (a group of one each). Equal configs are
    dropped as in `expand`: two points whose first-seed configs are equal are equal at every
    seed, since every point takes the same seeds.
    """
    if spec._groups is not None:  # parse_spec expanded it already (check_limits)
        return spec._groups
    if spec.adaptive:  # asked as the search goes (service/search/tpe.py)
        spec._groups = []
        return []
    search = spec.search
    draws = sampling.draw(spec.sampled, search) if isinstance(search, Search) else [{}]
    seeds = tuple(spec.seed_list)
    per_trial = any("seed" in e.names for e in spec.derived.values())
    inner: list[tuple[int, ...]] = [(s,) for s in seeds] if per_trial else [seeds]
    found: dict[TrialConfig, tuple[int, ...]] = {}  # insertion-ordered: the first of equals
    for cell, draw, group in itertools.product(spec.cells(), draws, inner):
        point = {**cell, **draw}
        values = spec.resolve({**point, "seed": group[0]})  # its errors name the trial
        try:
            found.setdefault(parse_trial_config(values), group)
        except InvalidInput as exc:
            at = ", ".join(f"{k}={v!r}" for k, v in point.items())
            raise InvalidInput(
                f"{exc.message}" + (f" (in the trial with {at})" if at else ""),
                field="parameters",
            ) from None
    spec._groups = [TrialGroup(c, group) for c, group in found.items()]
    return spec._groups


def swept_fields(spec: SweepSpec) -> list[str]:
    """The config fields that vary across the sweep's trials: its axes, linked axes' fields,
    distribution parameters and the derived fields that read any of them, in the order they were
    written, then `seed`."""
    return swept_fields_of(spec.parameters, parameters_only=True)


def swept_values(spec: SweepSpec) -> dict[str, list[Any] | None]:
    """Each swept field (swept_fields, `seed` included) and the values its trials take, in order
    of first appearance: an axis's values, a linked axis's, a derived field's as computed over
    the grid's cells (and seeds, when it reads the seed); None for a sampled field (its values
    are drawn, or asked as the search goes) and a derived field that reads one. Needs no
    expansion: a stored spec of 10⁵ trials answers from its cells."""
    derived = spec.derived
    sampled = set(spec.sampled)
    linked = {f: [p[f] for p in group] for group in spec.zips for f in group[0]}
    out: dict[str, list[Any] | None] = {}
    for name in swept_fields(spec):
        if name == "seed":
            out[name] = spec.seed_list
        elif name in spec.axes:
            out[name] = list(spec.axes[name])
        elif name in linked:
            out[name] = _distinct(linked[name])
        elif name in derived and not _reads(derived, name) & sampled:
            seeds = spec.seed_list if "seed" in _reads(derived, name) else spec.seed_list[:1]
            values = (
                spec.resolve({**cell, "seed": seed})[name]
                for cell in spec.cells()
                for seed in seeds
            )
            out[name] = _distinct(values)
        else:
            out[name] = None
    return out


def determined_fields(spec: Mapping[str, Any], keep: Iterable[str | None] = ()) -> list[str]:
    """The swept fields of a stored spec that its other swept fields determine, so that no plot
    line need tell them apart: every derived field that reads a swept field (residual_scale =
    1/√depth follows depth), and in each linked axis every field but one that identifies its
    points (batch_size tied to width) — the first of `keep` that does, else the first written.
    Fields in `keep` (a plot's x and group_by) are never in the answer."""
    keep = {k for k in keep if k}
    swept = set(swept_fields_of(spec))
    parameters = spec.get("parameters") or {}
    out = [k for k, v in parameters.items() if _is_derived(v) and k in swept]
    for group in parameters.get(ZIP) or []:
        names = list(group[0])
        ids = [f for f in names if len(_distinct(p[f] for p in group)) == len(group)]
        if not ids:
            continue  # no one field names the points: all of them tell lines apart
        anchor = next((f for f in ids if f in keep), ids[0])
        out += [f for f in names if f != anchor]
    return [f for f in out if f not in keep]


def _reads(derived: Mapping[str, Expression], name: str) -> set[str]:
    """The fields a derived field reads, through the derived fields it reads."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for n in derived[todo.pop()].names:
            if n not in seen:
                seen.add(n)
                if n in derived:
                    todo.append(n)
    return seen


def _distinct(values: Iterable[Any]) -> list[Any]:
    """Values in order of first appearance, equal ones once (keyed by JSON: a model_params
    value is a dict)."""
    seen: dict[str, Any] = {}
    for v in values:
        seen.setdefault(json.dumps(v, sort_keys=True), v)
    return list(seen.values())


@lru_cache(maxsize=256)
def _stored_values(text: str) -> dict[str, list[Any] | None]:
    return swept_values(SweepSpec.model_construct(**json.loads(text)))


def swept_values_of(spec: Mapping[str, Any]) -> dict[str, list[Any] | None]:
    """`swept_values` of a stored spec (its JSON dump, validated when it was stored), without
    validating it again; cached per spec."""
    return dict(_stored_values(json.dumps(spec)))  # (key order kept: it is the axes order)


def swept_fields_of(spec: Mapping[str, Any], *, parameters_only: bool = False) -> list[str]:
    """`swept_fields` of a stored spec (a validated SweepSpec's JSON dump, as the store keeps it)
    without validating it again: the keys of its parameters that are lists or distributions,
    then `seed`."""
    parameters = spec if parameters_only else spec.get("parameters") or {}
    moving = {"seed"}
    for k, v in parameters.items():
        if k == ZIP:
            moving |= {f for group in v for f in group[0]}
        elif isinstance(v, list) or _is_sampled(k, v):
            moving.add(k)
    derived = {k: v for k, v in parameters.items() if _is_derived(v)}
    changed = True
    while changed:  # a derived field varies when it reads one that does
        changed = False
        for k, v in derived.items():
            if k not in moving and _expression(k, v).names & moving:
                moving.add(k)
                changed = True
    out: list[str] = []  # as written; linked fields where `zip` was written
    for k in parameters:
        if k == ZIP:
            out += [f for group in parameters[k] for f in group[0]]
        elif k in moving:
            out.append(k)
    return [*out, "seed"]


def _is_derived(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {EXPR} and isinstance(value[EXPR], str)


@cache
def _parsed(text: str) -> Expression:
    return parse_expression(text, where="")


def _expression(name: str, value: Mapping[str, str]) -> Expression:
    return _parsed(value[EXPR])


def _derived_value(name: str, v: int | float) -> Any:
    """A derived number as the field takes it: an integral float for an int field is that int
    (sqrt(64) sets width = 8); any other value must pass the field's own validation."""
    annotation = TrialConfig.model_fields[name].annotation
    if annotation is int and isinstance(v, float):
        if not v.is_integer():
            raise InvalidInput(
                f"{v} is not an integer; wrap the expression in round(…)", field=name
            )
        v = int(v)
    return validate_field(name, v, where=name, strict=True)


def _normalize_zip(value: Any) -> list[list[dict[str, Any]]]:
    """parameters.zip: one linked axis (a list of mappings) or several (a list of such lists),
    normalized to a list of groups; in a group every point sets the same fields."""
    where = f"parameters.{ZIP}"
    if not isinstance(value, list) or not value:
        raise InvalidInput(
            "linked axes are a list of points, e.g. [{width: 64, batch_size: 64}, {width: 128, "
            "batch_size: 128}], or a list of such lists (one linked axis each)",
            field=where,
        )
    groups = value if all(isinstance(g, list) for g in value) else [value]
    out = []
    for g, group in enumerate(groups):
        at = f"{where}[{g}]" if len(groups) > 1 else where
        if not group:
            raise InvalidInput("a linked axis needs at least one point", field=at)
        points = []
        for i, point in enumerate(group):
            if not isinstance(point, dict) or not point:
                raise InvalidInput(
                    "a point of a linked axis maps fields to values", field=f"{at}[{i}]"
                )
            if i and set(point) != set(group[0]):
                raise InvalidInput(
                    f"every point of a linked axis sets the same fields ({sorted(group[0])}); "
                    f"this one sets {sorted(point)}",
                    field=f"{at}[{i}]",
                )
            norm = {}
            for k, v in point.items():
                fat = f"{at}[{i}].{k}"
                if k == "seed" or k == ZIP or str(k) not in SWEPT_BY_SPEC:
                    raise InvalidInput("unknown field", field=fat, allowed=SWEPT_BY_SPEC)
                if isinstance(v, list) or (isinstance(v, dict) and k not in DOCUMENT_FIELDS):
                    raise InvalidInput("a linked axis sets one value per point", field=fat)
                norm[str(k)] = validate_field(str(k), v, where=fat, strict=True)
            points.append(norm)
        if len({json.dumps(p, sort_keys=True) for p in points}) != len(points):
            raise InvalidInput("a linked axis must not repeat a point", field=at)
        out.append(points)
    return out


def _check_links(spec: SweepSpec) -> None:
    """A field is set in one place only (a parameter, or one linked axis), and every derived
    field reads known fields, none of them sampled by a tpe search, without a cycle."""
    seen: dict[str, str] = {k: f"parameters.{k}" for k in spec.parameters if k != ZIP}
    for g, group in enumerate(spec.zips):
        for f in group[0]:
            if f in seen:
                raise InvalidInput(
                    f"{f} is set twice: by {seen[f]} and by linked axis {g}",
                    field=f"parameters.{ZIP}",
                )
            seen[f] = f"linked axis {g}"
    derived = spec.derived
    for name, expr in derived.items():
        where = f"parameters.{name}"
        for n in sorted(expr.names):
            if n not in CONFIG_FIELDS:
                hint = did_you_mean(n, CONFIG_FIELDS)
                raise InvalidInput(
                    f"{{expr: {expr.text!r}}} reads {n!r}, which is not a field{hint}",
                    field=where,
                )
            if n == name:
                raise InvalidInput(f"{{expr: {expr.text!r}}} reads itself", field=where)
    expressions.evaluation_order(derived, where="parameters")


def _is_sampled(name: str, value: Any) -> bool:
    """A distribution parameter; a document-valued field's dict (model_params) is one value."""
    return name not in DOCUMENT_FIELDS and sampling.is_distribution(value)


# What no database stores, whatever the spec allows: NUL characters and unpaired surrogates
# in strings (Postgres and SQLite refuse them), integers outside 32 bits (Postgres `integer`).
# Refused here so that a user's input never surfaces as a storage error.
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def check_storable(data: Any, root: str, *, ints: bool = True) -> None:
    """Refuse strings with NUL or unpaired surrogates and (with `ints`) integers outside 32
    bits, anywhere in the document. Iterative, and each container is visited once.

    Raises:
        InvalidInput: naming the path of the first offending value.
    """
    stack: list[tuple[Any, str]] = [(data, root)]
    seen: set[int] = set()
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict | list):
            if id(value) in seen:
                continue
            seen.add(id(value))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                if isinstance(k, str):
                    _check_text(k, path or "body")
                sub = (
                    f"{path}[{k}]" if isinstance(value, list) else f"{path}.{k}" if path else str(k)
                )
                stack.append((v, sub))
        elif isinstance(value, str):
            _check_text(value, path or "body")
        elif ints and isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            shown = value if abs(value) < 10**30 else f"an integer of {value.bit_length()} bits"
            raise InvalidInput(
                f"{shown} is outside the 32-bit integers [{INT_MIN}, {INT_MAX}]",
                field=path or "body",
            )


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise InvalidInput("text must not contain NUL characters", field=path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            "text must be valid Unicode (an unpaired surrogate)", field=path
        ) from None
