"""A registered model's parameters as configuration columns: one dotted column per parameter,
`model_params.<name>` (docs/models.md, "Model parameters as an axis").

A trial's `model_params` is a document (a dict), which no frame can group, pool or filter by.
Where a sweep varies it, the tidy frame (service.store.reads) carries it twice:

- `model_params`: the document as canonical JSON text (keys sorted, no spaces), one hashable
  value per trial: written as it is into CSV, decoded back to an object in JSON answers;
- `model_params.<name>`: one column per parameter of the trials' models, in its natural dtype
  (a list- or dict-valued parameter as its canonical JSON text), usable in `where`, `group_by`,
  a plot's `x` and every pooling, as any config field is.

No pandas, SQLAlchemy or torch: the store, the plots and the API share it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from service.jsonfmt import to_jsonable

FIELD = "model_params"
PREFIX = f"{FIELD}."


def column_of(name: str) -> str:
    """The column of model parameter `name`: "expansion" → "model_params.expansion"."""
    return PREFIX + name


def param_of(column: str) -> str | None:
    """The model parameter a column names ("model_params.expansion" → "expansion"), else None."""
    if column.startswith(PREFIX) and len(column) > len(PREFIX):
        return column[len(PREFIX) :]
    return None


def canonical(value: Any) -> str:
    """Canonical JSON text of a value: sorted keys, no spaces (equal documents, equal text),
    non-finite floats spelled as service.jsonfmt does ("NaN", "Infinity"), so it is JSON."""
    return json.dumps(
        to_jsonable(value),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def cell(value: Any) -> Any:
    """A parameter's value as a frame cell: a scalar as it is, a list or dict as its canonical
    JSON text (hashable, so it groups)."""
    return canonical(value) if isinstance(value, list | dict) else value


def param_names(documents: Iterable[Mapping[str, Any] | None]) -> list[str]:
    """Every parameter named by some document, in the order first seen."""
    seen: dict[str, None] = {}
    for doc in documents:
        for k in doc or {}:
            seen.setdefault(str(k), None)
    return list(seen)


def config_columns(fields: Sequence[str], values: Sequence[Sequence[Any]]) -> dict[str, list[Any]]:
    """The frame's configuration columns from the swept `fields` and each trial's values of them
    (`values[i][j]`: trial i's value of fields[j]): column → per-trial values. `model_params`
    becomes its canonical JSON text followed by one column per parameter (None where a trial's
    model has no such parameter); every other field is its own column."""
    out: dict[str, list[Any]] = {}
    for j, f in enumerate(fields):
        column = [row[j] for row in values]
        if f != FIELD:
            out[f] = column
            continue
        docs = [d or {} for d in column]
        out[FIELD] = [canonical(d) for d in docs]
        for name in param_names(docs):
            out[column_of(name)] = [cell(d[name]) if name in d else None for d in docs]
    return out


def spec_param_axes(spec: Mapping[str, Any]) -> dict[str, list[Any]]:
    """A stored spec's `model_params` axis as one axis per parameter its entries write:
    `model_params.<name>` → the distinct values written, in order (a parameter an entry leaves
    out takes its model's default, which the spec does not say). Empty when model_params is
    not an axis. For choosing default plot axes and listing filters from a spec alone."""
    axis = (spec.get("parameters") or {}).get(FIELD)
    if not isinstance(axis, list):
        return {}
    out: dict[str, list[Any]] = {}
    for doc in axis:
        for name, value in (doc or {}).items():
            values = out.setdefault(column_of(str(name)), [])
            if cell(value) not in [cell(v) for v in values]:
                values.append(value)
    return out
