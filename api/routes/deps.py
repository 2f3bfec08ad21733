"""What the routes share: the store and settings of the app, id and paging parameters, metric
names, config filters as query parameters, the `epoch` parameter, and the refusal of unknown
parameters."""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Literal, get_args

from fastapi import Depends, Path, Query, Request
from fastapi.dependencies.utils import get_flat_params
from pydantic import AfterValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from api.cache import SingleFlightCache
from service.config import FILTER_FIELDS, METRICS, TrialConfig
from service.errors import InvalidInput, StorageError
from service.metric_names import is_loop_scalar
from service.models import known_metrics
from service.param_columns import param_of
from service.settings import Settings
from service.store import Store

INT32_MAX = 2**31 - 1  # ids and counts are 32-bit integers in Postgres

SweepId = Annotated[int, Path(ge=1, le=INT32_MAX, description="the sweep's id")]
TrialId = Annotated[int, Path(ge=1, le=INT32_MAX, description="the trial's id")]
Offset = Annotated[int, Query(ge=0, le=INT32_MAX, description="rows to skip")]


def _known_metric(name: str) -> str:
    """A metric name: one of METRICS, a lab's per-tap metric the server registered or a user's
    scalar `loop/<name>` (service.metric_names), refused as a literal field is (its "did you
    mean" included)."""
    known = known_metrics()
    if name not in known and not is_loop_scalar(name):
        expected = ", ".join(repr(m) for m in known[:-1]) + f" or {known[-1]!r}"
        raise PydanticCustomError(
            "literal_error", "Input should be {expected}", {"expected": expected}
        )
    return name


# The document lists the built-in names; a lab's registered ones (docs/probe.md) and a user's
# `loop/<name>` scalars (docs/own-loop.md) are accepted too.
MetricName = Annotated[
    str,
    AfterValidator(_known_metric),
    WithJsonSchema({"type": "string", "enum": list(METRICS)}),
]


def get_store(request: Request) -> Store:
    store = getattr(request.app.state, "store", None)
    if store is None:
        raise StorageError("the store is not open (the app has not started)")
    return store


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_cache(request: Request) -> SingleFlightCache:
    return request.app.state.cache


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
CacheDep = Annotated[SingleFlightCache, Depends(get_cache)]


def frozen(filters: dict[str, list[Any]]) -> tuple:
    """Config filters as a hashable cache-key part."""
    return tuple((k, tuple(v)) for k, v in sorted(filters.items()))


# --- unknown query parameters -----------------------------------------------------------------


def reject_unknown_query(request: Request) -> None:
    """A typo such as `?metrc=` must not silently return everything: 422 naming it."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = getattr(route, "isosweep_query_names", None)
    if known is None:  # computed once per route, kept on the route itself
        params = get_flat_params(dependant)
        known = frozenset(p.alias for p in params if _is_query(p))
        route.isosweep_query_names = known  # type: ignore[union-attr]
    unknown = sorted(set(request.query_params) - known)
    if "depth" in known:  # a route with config filters also takes model_params.<name> ones
        unknown = [k for k in unknown if param_of(k) is None]
    if unknown:
        raise InvalidInput(
            "unknown query parameter" + (f"s {', '.join(unknown)}" if len(unknown) > 1 else ""),
            field=unknown[0],
            allowed=sorted(known),
        )


def _is_query(field: Any) -> bool:
    info = getattr(field, "field_info", None)
    return type(info).__name__ == "Query"


# --- config filters ---------------------------------------------------------------------------


def _filter_type(name: str) -> Any:
    """list[T] of a TrialConfig field's type and constraints, ints bounded to 32 bits. The
    field's own constraints come last, so they win over the 32-bit bound (depth ≥ 1, not
    ≥ −2³¹): a value the type layer accepts is one TrialConfig accepts."""
    info = TrialConfig.model_fields[name]
    base = info.annotation
    args = [a for a in get_args(base) if a is not type(None)]
    if type(None) in get_args(base) and len(args) == 1:
        base = args[0]  # Optional[int] → int: a filter value is never null
    extra = [Field(ge=-INT32_MAX - 1, le=INT32_MAX)] if base is int else []
    meta = [*extra, *info.metadata]
    item = Annotated[base, *meta] if meta else base
    return list[item]  # type: ignore[valid-type]


def _filter_parameter(name: str) -> inspect.Parameter:
    desc = TrialConfig.model_fields[name].description or name
    query = Query(description=f"only trials with `{name}` among these values ({desc})")
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[_filter_type(name) | None, query],
    )


def _collect_filters(request: Request, **given: Any) -> dict[str, list[Any]]:
    """Config field → accepted values, each already validated by FastAPI against the field's
    type and constraints (the store validates `where` again); and each `model_params.<name>`
    query parameter → its values as text, validated by the store against the registered
    model's parameter (service.models.validate_param)."""
    filters = {k: v for k, v in given.items() if v is not None}
    for key in request.query_params:
        if param_of(key) is not None:
            filters[key] = request.query_params.getlist(key)
    return filters


_collect_filters.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
        *(_filter_parameter(name) for name in FILTER_FIELDS),
    ]
)

ConfigFilters = Annotated[dict[str, list[Any]], Depends(_collect_filters)]


# --- epochs -----------------------------------------------------------------------------------

# An epoch parameter is read as text (parse_epoch: its own 422 naming `epoch`) and typed in the
# document as what it accepts: an epoch number, or `last`.
EPOCH_SCHEMA = {
    "anyOf": [
        {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
        {"type": "string", "const": "last"},
    ]
}
EpochText = Annotated[str, WithJsonSchema(EPOCH_SCHEMA)]
EpochQuery = Annotated[
    list[EpochText] | None,
    Query(description="recorded epochs (repeatable), or `last`: each trial's highest epoch"),
]

PooledStat = Annotated[
    Literal["mean", "geomean", "median"],
    Query(
        description="with aggregate: the pooled value besides the mean — geomean (exp of the "
        "mean log) or median, as a column of that name (service.tidy.aggregate_over_seeds)"
    ),
]


def parse_epochs(values: list[str] | None) -> list[int] | str | None:
    """`["last"]` → "last"; `["0", "10"]` → [0, 10]; None → None (every epoch)."""
    if not values:
        return None
    if "last" in values:
        if len(values) > 1:
            raise InvalidInput("`last` cannot be combined with epoch numbers", field="epoch")
        return "last"
    return [parse_epoch(v) for v in values]


def parse_epoch(value: str) -> int:
    text = value.strip()
    # The length first: int() of over 4300 digits raises ValueError, not a bounds check.
    if not text.isascii() or not text.isdigit() or len(text) > 10 or int(text) > INT32_MAX:
        raise InvalidInput(
            f"an epoch number (0, 1, …) or `last`, got {value[:20]!r}", field="epoch"
        )
    return int(text)
