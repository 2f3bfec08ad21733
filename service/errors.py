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

from collections.abc import Iterable


class IsosweepError(Exception):
    """Base class of every error isosweep raises on purpose."""

    kind = "error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidInput(IsosweepError):
    """Bad input. `field` is the dotted path of the offending field, when there is one."""

    kind = "invalid_input"

    def __init__(self, message: str, *, field: str | None = None, allowed: Iterable | None = None):
        if allowed is not None:
            allowed = [str(a) for a in allowed]
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
