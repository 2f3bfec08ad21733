"""THE table from domain errors (service/errors.py) to HTTP statuses, and the one error shape:

    {"error": {"type": "invalid_input", "message": "limit: must be ≥ 1", "field": "limit",
               "allowed": null}}

Every error the API sends looks like this: domain errors by the table below; request validation
(FastAPI's own 422), unknown paths (404) and methods (405) reshaped into it; a missing token
(401) and a body over the limit (413) from the guards. A 500 ("internal") is only ever a bug in
isosweep: it is logged with its traceback, and the message says so.
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
)

log = logging.getLogger("isosweep.api")


class BodyTooLarge(LimitExceeded):
    """The request body is over Settings.max_body_bytes."""


# Most specific first: an error takes the status of the first class it is an instance of.
STATUS: dict[type[IsosweepError], int] = {
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
        (404, "no such sweep, trial, activation or plot kind"),
        (422, "a bad parameter or body field (named), or a request over a limit"),
        (503, "the database is unreachable"),
    )
}
WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    401: {"model": ErrorPublic, "description": "a token is configured and this one is wrong"},
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
    return {"error": {"type": type_, "message": message, "field": field, "allowed": allowed}}


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
    return NonFiniteJSONResponse(validation_body(exc.errors()), status_code=422)


def validation_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """FastAPI's validation errors as one message naming every bad field."""
    parts, fields = [], []
    for e in errors:
        field = _field_name(e.get("loc", ()))
        msg = "required" if e.get("type") == "missing" else str(e.get("msg", "invalid"))
        parts.append(f"{field}: {msg}" if field else msg)
        fields.append(field)
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


HTTP_TYPES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}


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
            log.error("internal error on %s %s", scope["method"], scope["path"], exc_info=exc)
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
