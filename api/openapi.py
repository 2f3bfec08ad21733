"""The OpenAPI document (/openapi.json) as a client generator reads it (docs/api.md, "The
OpenAPI document"):

- operation ids are the handlers' names (`create_sweep`, `read_metrics`, … as docs/api.md's
  table lists them), not FastAPI's path-derived defaults;
- the SweepSpec body schema has every form a spec accepts: per parameter a value, a grid axis
  (a list) or, for fields that can be sampled, a distribution ({uniform}, {loguniform}, {int},
  {choice}); `search` as random/Sobol or TPE by its `kind`; `early_stop`; metric names as enums;
  seeds as a count or distinct seeds;
- the YAML body is declared beside the JSON one, as text a generator can send as a file
  (`format: binary`); figures (image/png, image/svg+xml), CSV, Parquet and the event stream
  are declared by the routes (api/routes) with their media types.

Nothing here validates a request: service.spec does, and a spec this schema refuses is one it
refuses too (tests/api/test_openapi.py checks the examples and every sampled form against it).
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi.routing import APIRoute

from api.schemas import METRIC_ROW_SCHEMA, NONFINITE_SCHEMA
from service.config import METRICS, TrialConfig
from service.spec import DOCUMENT_FIELDS, EXPR, SEED_LIMIT, SWEPT_BY_SPEC, ZIP, SweepSpec

REF = "#/components/schemas/{model}"
YAML_BODY = {
    "type": "string",
    "format": "binary",
    "contentMediaType": "application/yaml",
    "description": "the SweepSpec as YAML 1.2 text (UTF-8)",
}
SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/SweepSpec"}},
            "application/yaml": {"schema": YAML_BODY},
        },
    }
}


def operation_id(route: APIRoute) -> str:
    """A route's operationId: its handler's name (unique: tests/api/test_openapi.py)."""
    return route.name


def _value_schema(field: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in field.items() if k not in ("default", "title")}


def _branches(one: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of a field's schema."""
    alts = one.get("anyOf", [one])
    out = []
    for alt in alts:
        if alt.get("type") == "null":
            continue
        merged = {k: v for k, v in one.items() if k not in ("anyOf", "description")}
        out.append({**merged, **alt})
    return out


def _pair(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item, "minItems": 2, "maxItems": 2}


def _form(key: str, body: dict[str, Any], text: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "description": text,
        "properties": {key: body, **extra},
        "required": [key],
        "additionalProperties": False,
    }


# The ranges of service.sampling as components of their own (one class each in a generated
# client); the field's own bounds on a and b are checked at submission (422 naming them).
DISTRIBUTIONS = {
    name: {"title": name, **form}
    for name, form in (
        ("Uniform", _form("uniform", _pair({"type": "number"}), "floats uniform in [a, b], a < b")),
        (
            "LogUniform",
            _form(
                "loguniform",
                _pair({"type": "number", "exclusiveMinimum": 0}),
                "floats in [a, b], 0 < a < b, uniform in ln x",
            ),
        ),
        (
            "IntRange",
            _form(
                "int",
                _pair({"type": "integer"}),
                "integers a..b (both included), a < b; log: true for log-spaced ones (a ≥ 1)",
                log={"type": "boolean", "default": False},
            ),
        ),
    )
}
EXPR_SCHEMA = {
    "title": "Expr",
    "type": "object",
    "description": "a derived field: an expression of the other fields, computed per trial "
    '(service.expressions), e.g. "1/sqrt(depth)"',
    "properties": {EXPR: {"type": "string", "minLength": 1}},
    "required": [EXPR],
    "additionalProperties": False,
}
RANGES = {  # the ranges a field of this JSON type can be sampled from
    "number": ("Uniform", "LogUniform", "IntRange"),
    "integer": ("IntRange",),
}


def _distributions(one: dict[str, Any]) -> list[dict[str, Any]]:
    """The distribution forms (service.sampling) a field with value schema `one` accepts: a
    range for a numeric field, a choice of its own values for any."""
    kinds = {t for b in _branches(one) for t in RANGES.get(b.get("type", ""), ())}
    forms: list[dict[str, Any]] = [
        {"$ref": REF.format(model=k)} for k in DISTRIBUTIONS if k in kinds
    ]
    item = {k: v for k, v in one.items() if k != "description"}
    choice = {"type": "array", "items": item, "minItems": 1, "uniqueItems": True}
    forms.append(_form("choice", choice, "one of these values, equally likely"))
    return forms


def _parameter(name: str, field: dict[str, Any]) -> dict[str, Any]:
    one = _value_schema(field)
    alts = [one, {"type": "array", "items": one, "minItems": 1, "uniqueItems": True}]
    forms = "a value or a grid axis (a list)"
    if name not in DOCUMENT_FIELDS:  # a document field's mapping is its value, never sampled
        alts += [{"$ref": REF.format(model="Expr")}, *_distributions(one)]
        forms = "a value, a grid axis (a list), an {expr} or a distribution sampled by `search`"
    return {"anyOf": alts, "description": f"{one.get('description', name)}: {forms}"}


def spec_schema() -> dict[str, Any]:
    """SweepSpec's JSON schema with `parameters`, `seeds`, `search` and `early_stop` spelled
    out as service.spec reads them."""
    spec = SweepSpec.model_json_schema(ref_template=REF)
    spec.pop("$defs", None)
    fields = TrialConfig.model_json_schema()["properties"]
    props = spec["properties"]
    point = {"$ref": REF.format(model="LinkedPoint")}
    axis = {"type": "array", "items": point, "minItems": 1, "uniqueItems": True}
    linked = {
        "anyOf": [axis, {"type": "array", "items": axis, "minItems": 1}],
        "description": "linked axes: one (a list of points) or several (a list of such lists); "
        "every point of one sets the same fields",
    }
    props["parameters"] = {
        "type": "object",
        "properties": {
            **{name: _parameter(name, fields[name]) for name in SWEPT_BY_SPEC},
            ZIP: linked,
        },
        "additionalProperties": False,
        "description": "TrialConfig fields (but seed): a list is a grid axis, a scalar is fixed, "
        "{expr: …} is derived from the others, a distribution ({uniform: [a, b]}, {loguniform: "
        "[a, b]}, {int: [a, b], log}, {choice: [...]}) is sampled by `search`; `zip` holds "
        "linked axes",
    }
    seed = {"type": "integer", "minimum": 0, "exclusiveMaximum": SEED_LIMIT}
    props["seeds"] = {
        "anyOf": [
            {"type": "integer", "minimum": 1, "maximum": SEED_LIMIT},
            {"type": "array", "items": seed, "minItems": 1, "uniqueItems": True},
        ],
        "default": 1,
        "description": "a count n (seeds 0..n−1) or distinct seeds",
    }
    search = {
        "oneOf": [{"$ref": REF.format(model="Search")}, {"$ref": REF.format(model="TpeSearch")}],
        "discriminator": {
            "propertyName": "kind",
            "mapping": {
                "random": REF.format(model="Search"),
                "sobol": REF.format(model="Search"),
                "tpe": REF.format(model="TpeSearch"),
            },
        },
    }
    for key, form in (("search", search), ("early_stop", {"$ref": REF.format(model="EarlyStop")})):
        props[key] = {
            "anyOf": [form, {"type": "null"}],
            "default": None,
            "description": props[key].get("description", ""),
        }
    return spec


def linked_point() -> dict[str, Any]:
    """One point of a linked axis (parameters.zip)."""
    fields = TrialConfig.model_json_schema()["properties"]
    return {
        "type": "object",
        "title": "LinkedPoint",
        "description": "one point of a linked axis: one value for each field it sets",
        "properties": {name: _value_schema(fields[name]) for name in SWEPT_BY_SPEC},
        "minProperties": 1,
        "additionalProperties": False,
    }


def spec_components() -> dict[str, Any]:
    """SweepSpec and what it refers to (the distributions, Expr, LinkedPoint, Resources, Search,
    TpeSearch, EarlyStop), with metric names as enums and the epoch a TPE search reads bounded
    as the spec checks it."""
    defs = SweepSpec.model_json_schema(ref_template=REF)["$defs"]
    tpe, stop = copy.deepcopy(defs["TpeSearch"]), copy.deepcopy(defs["EarlyStop"])
    tpe["properties"]["objective"]["enum"] = list(METRICS)
    tpe["properties"]["epoch"]["anyOf"] = [
        {"const": "last", "type": "string"},
        {"type": "integer", "minimum": 0},
    ]
    stop["properties"]["metric"]["enum"] = list(METRICS)
    return {
        "SweepSpec": spec_schema(),
        "LinkedPoint": linked_point(),
        "Expr": EXPR_SCHEMA,
        **DISTRIBUTIONS,
        **defs,
        "TpeSearch": tpe,
        "EarlyStop": stop,
    }


def finish(doc: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's document with the components its routes refer to by name: the SweepSpec body
    (SPEC_BODY) and the rows of MetricsPublic (api.schemas.METRIC_ROW_SCHEMA)."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(spec_components())
    schemas["MetricRow"] = METRIC_ROW_SCHEMA
    schemas["NonFinite"] = NONFINITE_SCHEMA
    return doc
