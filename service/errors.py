"""Domain errors. No HTTP here: api/errors.py maps each class to a status code.

IsosweepError
 ├── InvalidInput          the caller sent something wrong (names the field)
 │    └── LimitExceeded    valid, but over a machine-protecting limit (a setting)
 ├── NotFound              no such sweep / trial / plot kind
 ├── Conflict              the request does not fit the current state
 ├── Unauthorized          a mutating request without the right token
 ├── DataUnavailable       a dataset's files are missing and cannot be downloaded
 └── StorageError          the database failed; the transaction was rolled back
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

QUOTED = re.compile(r"'([^'\n]{1,200})'")  # a value as repr() quotes it: 'rellu'


class IsosweepError(Exception):
    """Base class of every error isosweep raises on purpose."""

    kind = "error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def suggest(given: object, allowed: Iterable) -> str | None:
    """The allowed value closest to `given` ("rellu" → "relu", "activaton" → "activation"), by
    difflib's similarity ratio (at least 0.6, case ignored); None when `given` is allowed or
    nothing is close."""
    text = str(given)
    choices = [str(a) for a in allowed]
    if not text or text in choices:
        return None
    lowered: dict[str, str] = {}
    for c in choices:
        lowered.setdefault(c.lower(), c)
    close = difflib.get_close_matches(text.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def did_you_mean(given: object, allowed: Iterable) -> str:
    """ "; did you mean 'relu'?" for a close allowed value (suggest), else ""."""
    hint = suggest(given, allowed)
    return f"; did you mean {hint!r}?" if hint is not None else ""


def pydantic_hint(error: Mapping[str, Any], fields: Iterable[str] = ()) -> str:
    """did_you_mean for one pydantic error (an item of ValidationError.errors()): a literal
    field's value against the expected values its ctx lists ("'relu', 'tanh' or 'gelu'"), or
    an unknown key (extra_forbidden) against the model's `fields`; else ""."""
    kind, loc = error.get("type"), error.get("loc") or ()
    if kind == "extra_forbidden" and loc:
        return did_you_mean(loc[-1], fields)
    if kind != "literal_error" or not isinstance(error.get("input"), str):
        return ""
    expected = QUOTED.findall(str((error.get("ctx") or {}).get("expected", "")))
    return did_you_mean(error["input"], expected)


def _given(message: str, field: str | None) -> str | None:
    """What the caller typed, as far as the message says: the first quoted value ("unknown
    value 'rellu'"), or for an unknown name the field's last part ("parameters.activaton")."""
    quoted = QUOTED.search(message)
    if quoted:
        return quoted.group(1)
    if field and message.startswith("unknown"):
        return re.sub(r"\[\d+\]$", "", field).rsplit(".", 1)[-1]
    return None


class InvalidInput(IsosweepError):
    """Bad input. `field` is the dotted path of the offending field, when there is one.

    With `allowed`, the message lists the allowed values and, when one is close to what was
    given (`given`, else read from the message: service.errors._given), suggests it first:
    "parameters.activaton: unknown field; did you mean 'activation'? (allowed: …)". The
    suggestion is kept in `suggestion`.
    """

    kind = "invalid_input"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        allowed: Iterable | None = None,
        given: object = None,
    ):
        self.suggestion: str | None = None
        if allowed is not None:
            allowed = [str(a) for a in allowed]
            guess = given if given is not None else _given(message, field)
            self.suggestion = None if guess is None else suggest(guess, allowed)
            if self.suggestion is not None:
                message = f"{message}; did you mean {self.suggestion!r}?"
            message = f"{message} (allowed: {', '.join(allowed)})"
        if field:
            message = f"{field}: {message}"
        super().__init__(message)
        self.field = field
        self.allowed = allowed


class LimitExceeded(InvalidInput):
    kind = "limit_exceeded"


class NotFound(IsosweepError):
    kind = "not_found"


class Conflict(IsosweepError):
    kind = "conflict"


class Unauthorized(IsosweepError):
    kind = "unauthorized"


class DataUnavailable(IsosweepError):
    kind = "data_unavailable"


class StorageError(IsosweepError):
    kind = "storage_error"
