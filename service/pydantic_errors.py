"""One InvalidInput from a pydantic ValidationError: every bad field named, with a "did you
mean" for a mistyped choice or an unknown key. Shared by service.config (TrialConfig),
service.models (a registered model's parameters) and service.spec, so that none of them imports
another for it."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError

from service.errors import InvalidInput, pydantic_hint


def invalid_from_pydantic(
    exc: ValidationError, *, where: str = "", fields: Iterable[str] = ()
) -> InvalidInput:
    """One InvalidInput naming every bad field of `exc` (each path prefixed by `where`), with a
    "did you mean" for a mistyped value of a choice, or for an unknown key among `fields` (the
    model's own field names)."""
    fields = tuple(fields)
    parts = []
    first_field = None
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        path = ".".join(p for p in (where, loc) if p)
        first_field = first_field or path or where or None
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        msg += pydantic_hint(err, fields)
        parts.append(f"{path}: {msg}" if path else msg)
    invalid = InvalidInput("; ".join(parts))
    invalid.field = first_field
    return invalid
