"""THE table from domain errors (service/errors.py) to HTTP statuses, and the one error shape:

    {"error": {"type": "invalid_input", "message": "limit: must be ≥ 1", "field": "limit",
               "allowed": null}}

Every error the API sends looks like this: domain errors by the table below; request validation
(FastAPI's own 422), unknown paths (404) and methods (405) reshaped into it; a Host not allowed
(400), a missing token (401), a cross-origin mutation (403) and a body over the limit (413) from
the guards (api/guards.py). A 500 ("internal") is only ever a bug in isosweep: it is logged with
its traceback, and the message says so. Any text renders (unpaired surrogates are escaped), and
a message names at most MAX_ERRORS fields and MAX_MESSAGE characters.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.schemas import ErrorPublic, NonFiniteJSONResponse
from service.errors import (
    Conflict,
    DataUnavailable,
    InvalidInput,
    IsosweepError,
    LimitExceeded,
    NotFound,
    StorageError,
    Unauthorized,
    pydantic_hint,
)
from service.spec import MAX_ERRORS  # the same cap on the spec's own messages

log = logging.getLogger("isosweep.api")


MAX_MESSAGE = 4000  # characters of a message; a longer one is cut


class BodyTooLarge(LimitExceeded):
    """The request body is over Settings.max_body_bytes."""


class Forbidden(IsosweepError):
    """A request the server will not serve whoever asks: a mutation from another origin."""

    kind = "forbidden"


class BadHost(IsosweepError):
    """The Host header is not among Settings.allowed_hosts (a DNS-rebinding page, or a name
    the server was not told it is reached under)."""

    kind = "bad_host"


# Most specific first: an error takes the status of the first class it is an instance of.
STATUS: dict[type[IsosweepError], int] = {
    BadHost: 400,
    Forbidden: 403,
    BodyTooLarge: 413,
    LimitExceeded: 422,
    InvalidInput: 422,
    NotFound: 404,
    Conflict: 409,
    Unauthorized: 401,
    DataUnavailable: 503,  # the server's datasets, not the caller's request
    StorageError: 503,  # the database failed; retrying later may work
    IsosweepError: 400,
}

# The statuses each route may answer with, for the OpenAPI document.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorPublic, "description": text}
    for code, text in (
        (401, "a token is configured (and reads are not open) and this one is wrong"),
        (404, "no such sweep, trial, activation or plot kind"),
        (422, "a bad parameter or body field (named), or a request over a limit"),
        (503, "the database is unreachable"),
    )
}
# A route with a JSON body: a body that does not parse is a 400 (FastAPI's own answer, in the
# API's error shape).
JSON_BODY_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorPublic, "description": "the body is not JSON"},
}
WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    401: {"model": ErrorPublic, "description": "a token is configured and this one is wrong"},
    403: {"model": ErrorPublic, "description": "a browser sent this from another origin"},
    409: {"model": ErrorPublic, "description": "the request does not fit the current state"},
    413: {"model": ErrorPublic, "description": "the body is over ISOSWEEP_MAX_BODY_BYTES"},
}


def status_of(exc: IsosweepError) -> int:
    for cls, code in STATUS.items():
        if isinstance(exc, cls):
            return code
    return 400  # unreachable: IsosweepError is in the table


def error_body(
    type_: str, message: str, field: str | None = None, allowed: list[str] | None = None
) -> dict[str, Any]:
    """The one error shape; any string renders (an unpaired surrogate from a request's JSON is
    shown escaped), and a message over MAX_MESSAGE characters is cut."""
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + f"… ({len(message) - MAX_MESSAGE} more characters)"
    return {
        "error": {
            "type": type_,
            "message": printable(message),
            "field": None if field is None else printable(field),
            "allowed": None if allowed is None else [printable(a) for a in allowed],
        }
    }


def printable(text: str) -> str:
    """`text`, with what UTF-8 cannot encode (unpaired surrogates) as \\udxxx escapes."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(exc: IsosweepError) -> NonFiniteJSONResponse:
    """The response for a domain error, by the table."""
    code = status_of(exc)
    body = error_body(
        exc.kind, exc.message, getattr(exc, "field", None), getattr(exc, "allowed", None)
    )
    headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
    return NonFiniteJSONResponse(body, status_code=code, headers=headers)


async def _domain(_: Request, exc: Exception) -> NonFiniteJSONResponse:
    assert isinstance(exc, IsosweepError)
    return error_response(exc)


async def _validation(_: Request, exc: Exception) -> NonFiniteJSONResponse:
    assert isinstance(exc, RequestValidationError)
    return NonFiniteJSONResponse(validation_body(list(exc.errors())), status_code=422)


def validation_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """FastAPI's validation errors as one message naming each bad field (the first MAX_ERRORS,
    then how many more)."""
    parts, fields = [], []
    for e in errors[:MAX_ERRORS]:
        field = _field_name(e.get("loc", ()))
        msg = "required" if e.get("type") == "missing" else str(e.get("msg", "invalid"))
        msg += pydantic_hint(e)
        parts.append(f"{field}: {msg}" if field else msg)
        fields.append(field)
    if len(errors) > MAX_ERRORS:
        parts.append(f"… and {len(errors) - MAX_ERRORS} more errors")
    first = next((f for f in fields if f), None)
    return error_body("invalid_input", "; ".join(parts) or "invalid request", first)


def _field_name(loc: tuple | list) -> str | None:
    """("query", "epoch", 0) → "epoch"; ("body", "seeds", 2) → "seeds[2]"."""
    if not loc:
        return None
    where, *path = loc
    if where not in ("query", "path", "header", "cookie", "body"):
        path = list(loc)
    name = ""
    for p in path:
        if isinstance(p, int):
            name += f"[{p}]" if where == "body" else ""
        else:
            name = f"{name}.{p}" if name else str(p)
    return name or ("body" if where == "body" else None)


HTTP_TYPES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    429: "too_many_requests",
}


async def _http(request: Request, exc: Exception) -> NonFiniteJSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404 and exc.detail == "Not Found":
        message = f"no route {request.method} {request.url.path} (routes: /docs)"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    type_ = HTTP_TYPES.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    return NonFiniteJSONResponse(
        error_body(type_, message), status_code=exc.status_code, headers=headers
    )


class CatchAll:
    """Any other exception is a bug: log it with its traceback and answer 500 "internal" in
    the one shape. (Starlette's own last-resort handler re-raises after answering, and the
    server then drops the connection; this one answers and keeps serving.)"""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            path = printable(scope["path"][:300])  # a 5000-digit id need not fill the log
            log.error("internal error on %s %s", scope["method"], path, exc_info=exc)
            if started:
                raise
            body = error_body("internal", "internal error in isosweep (a bug; see the server log)")
            await NonFiniteJSONResponse(body, status_code=500)(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error the app can raise to the one shape. Call before adding other
    middleware, so that CatchAll sits right around the routes."""
    app.add_exception_handler(IsosweepError, _domain)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    app.add_middleware(CatchAll)
