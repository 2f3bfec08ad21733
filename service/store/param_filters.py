"""Config filters on a registered model's parameters: `where={"model_params.expansion": 4}`
(service.param_columns). The stored `model_params` is a JSON document; a filter compares the
JSON text of one of its values, `model_params -> 'expansion'`, with the filter values' canonical
JSON (service.param_columns.canonical), which SQLite (≥ 3.38) and Postgres spell the same way
for numbers, text, booleans and null. A trial whose model lacks the parameter never matches.

An external sweep's parameters (isosweep.Monitor's free-form config, service/store/external.py)
have no registered type: for those named in `free`, a value is matched as given and, given as
text (a query parameter), also as the JSON scalar that text spells ("0.01" matches 0.01 and
"0.01")."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from sqlalchemy import Text, cast, false, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from service import models
from service.config import FILTER_FIELDS
from service.errors import InvalidInput
from service.param_columns import FIELD, canonical, column_of, param_of
from service.store.models import SqlTrial


def param_condition(
    name: str, value: Any, *, where: str, free: Collection[str] = ()
) -> ColumnElement[bool]:
    """The SQL condition of one filter `name` → value (or a list: any of them) on a model
    parameter, `name` being "model_params.<parameter>".

    Raises:
        InvalidInput: `where` names it: `name` is no config field nor model parameter (the
            allowed names listed, the closest suggested), or a value is not of the
            parameter's type (service.models.validate_param).
    """
    param = param_of(name)
    if param is None:
        known = models.param_columns()
        hint = ""
        if name == FIELD:
            hint = "; filter by one model parameter, model_params.<name>"
        elif column_of(name) in known:
            hint = f"; did you mean {column_of(name)!r}? (a model parameter)"
        raise InvalidInput(
            f"unknown config field{hint}",
            field=where,
            allowed=[*FILTER_FIELDS, *known],
            given=None if hint else name,
        )
    values = value if isinstance(value, list | tuple) else [value]
    if not values:
        return false()
    if param in free and param not in models.param_fields():
        texts = [t for v in values for t in _free_texts(v, where)]
    else:
        texts = [canonical(models.validate_param(param, v, where=where)) for v in values]
    document = getattr(SqlTrial, FIELD)  # a column derived from TrialConfig (store.models)
    stored = cast(_Member(document, literal(param)), Text)
    return stored.in_(texts)


class _Member(FunctionElement):
    """`document -> key`: one member of a JSON object, as JSON text — the key taken as one
    name on every backend (SQLite reads a bare text label as a path, "$.a.b" for "a.b", so
    there the key is quoted: an external sweep's dotted names such as "optimizer.lr")."""

    type = Text()
    name = "json_member"
    inherit_cache = True


@compiles(_Member)
def _member(element: _Member, compiler: Any, **kw: Any) -> str:
    document, key = list(element.clauses)
    return f"({compiler.process(document, **kw)} -> {compiler.process(key, **kw)})"


@compiles(_Member, "sqlite")
def _member_sqlite(element: _Member, compiler: Any, **kw: Any) -> str:
    document, key = list(element.clauses)
    path = f"('$.\"' || {compiler.process(key, **kw)} || '\"')"
    return f"({compiler.process(document, **kw)} -> {path})"


def _free_texts(value: Any, where: str) -> list[str]:
    """The canonical JSON texts a free parameter's filter value matches (module docstring)."""
    if not isinstance(value, str | int | float | bool) and value is not None:
        raise InvalidInput(
            f"a filter compares one value (a number, text, true, false or null), not "
            f"{type(value).__name__} {value!r}",
            field=where,
        )
    texts = [canonical(value)]
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return texts
        if isinstance(parsed, str | int | float | bool) or parsed is None:
            texts.append(canonical(parsed))
    return texts
