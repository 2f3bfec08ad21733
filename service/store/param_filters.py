"""Config filters on a registered model's parameters: `where={"model_params.expansion": 4}`
(service.param_columns). The stored `model_params` is a JSON document; a filter compares the
JSON text of one of its values, `model_params -> 'expansion'`, with the filter values' canonical
JSON (service.param_columns.canonical), which SQLite (≥ 3.38) and Postgres spell the same way
for numbers, text, booleans and null. A trial whose model lacks the parameter never matches."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text, cast, false, literal
from sqlalchemy.sql.elements import ColumnElement

from service import models
from service.config import FILTER_FIELDS
from service.errors import InvalidInput
from service.param_columns import FIELD, canonical, column_of, param_of
from service.store.models import SqlTrial


def param_condition(name: str, value: Any, *, where: str) -> ColumnElement[bool]:
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
    texts = [canonical(models.validate_param(param, v, where=where)) for v in values]
    document = getattr(SqlTrial, FIELD)  # a column derived from TrialConfig (store.models)
    stored = cast(document.op("->")(literal(param)), Text)
    return stored.in_(texts)
