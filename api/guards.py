"""What every request passes before it reaches a route, outermost first. Plain ASGI middleware,
so nothing is read or parsed before they agree; each answers in the one error shape.

- Host (HostCheck): the Host header's name must be in Settings.allowed_hosts (loopback names
  by default; "*" allows any), else 400 `bad_host`. A DNS-rebinding page reaches the API under
  its own name, so its requests (reads included) are refused here.
- Origin (SameOrigin): a mutating request (POST/PUT/PATCH/DELETE) that a browser sent from
  another origin is refused (403 `forbidden`): `Sec-Fetch-Site` other than same-origin/none,
  or, where a browser sends no Sec-Fetch-* (plain http to a non-loopback host), an `Origin`
  that is not this server's. Requests with neither (curl, the CLI's httpx) are not a browser's
  and pass. A form POST and a no-cors fetch from another page always carry one of them.
- Content-Length (ContentLength): a header that is not a bounded non-negative integer (digits
  only, at most MAX_LENGTH_DIGITS of them; one value however many times it is sent) is a 400
  at once, before the server would wait for a body of that size.
- Token (TokenAuth): when Settings.api_token is set, every request but the open paths (health,
  the docs, the login page, static files) needs `Authorization: Bearer <token>` (compared in
  constant time), or the cookie of a live dashboard login session (a random key that names a
  server-side session, service/store/logins.py: revoked at logout, by `isosweep sessions
  revoke`, at its expiry, and when the token changes). Reads are exempt when
  Settings.open_reads is set. Otherwise 401 with `WWW-Authenticate: Bearer` (API) or a
  redirect to /login (a dashboard page). A wrong bearer token counts as a failed login (the
  throttle of api/limits.py, shared with the login form): past the bound from one address, or
  from all, a 429 with Retry-After, and nothing is compared while it lasts.
- Media (MediaType): a mutating request under /api/ with a body, or a declared Content-Type,
  must be JSON or YAML (422 on field `body`): a form or text/plain body is not the API's.
- Body (BodyLimit): a declared Content-Length over Settings.max_body_bytes is refused at once
  (413); a body without one (chunked) is counted as it streams in and refused when it crosses.
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import BadHost, BodyTooLarge, Forbidden, error_body, error_response
from api.limits import Throttle, client_key, login_throttle
from api.schemas import NonFiniteJSONResponse
from api.spec_body import YAML_TYPES
from service.errors import InvalidInput, IsosweepError, StorageError, Unauthorized

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SESSION_COOKIE = "isosweep_session"
# Paths anyone may read: liveness probes, the API's description, the login page, the
# dashboard's CSS and script. None holds a result.
OPEN_PATHS = frozenset({"/api/v1/healthz", "/openapi.json", "/docs", "/login", "/logout"})
OPEN_PREFIXES = ("/static/", "/docs-assets/")
API_MEDIA = ("application/json", *YAML_TYPES)
# A Content-Length of more digits is no count this server takes: 10**18 bytes is an exabyte.
MAX_LENGTH_DIGITS = 18


def _http(scope: Scope) -> bool:
    return scope["type"] == "http"


class HostCheck:
    """400 for a Host header whose name is not allowed."""

    def __init__(self, app: ASGIApp, allowed: list[str]):
        self.app = app
        self.allowed = {h.lower().strip("[]") for h in allowed}
        self.any = "*" in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _http(scope) or self.any:
            return await self.app(scope, receive, send)
        host = host_name(Headers(scope=scope).get("host", ""))
        if host in self.allowed:
            return await self.app(scope, receive, send)
        exc = BadHost(
            f"the Host header {host!r} is not one this server is reached under: add it to "
            "ISOSWEEP_ALLOWED_HOSTS (comma-separated) if it is"
        )
        await error_response(exc)(scope, receive, send)


def host_name(header: str) -> str:
    """ "Example.org:8000" → "example.org"; "[::1]:8000" → "::1"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class SameOrigin:
    """403 for a mutation a browser sent from another origin."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _http(scope) or scope["method"] not in MUTATING:
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        why = cross_origin(headers)
        if why is None:
            return await self.app(scope, receive, send)
        exc = Forbidden(
            f"a cross-origin request cannot change anything here ({why}): use the dashboard "
            "on this server, the CLI, or a client that is not a web page"
        )
        await error_response(exc)(scope, receive, send)


def cross_origin(headers: Headers) -> str | None:
    """Why the request comes from another origin's page, or None when it does not."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return None if site in ("same-origin", "none") else f"Sec-Fetch-Site: {site}"
    origin = headers.get("origin")
    if origin is None:
        return None  # not sent by a browser page (or by one that sends neither: none today)
    parts = urlsplit(origin)
    if origin == "null" or parts.netloc.lower() != headers.get("host", "").lower():
        return f"Origin: {origin}"
    return None


class TokenAuth:
    """With a token configured, 401 (or the login page) for a request without it; 429 for a
    client throttled for its failed logins."""

    def __init__(self, app: ASGIApp, token: str | None, *, open_reads: bool = False):
        self.app = app
        self.token_text = token
        self.token = token.encode() if token else None
        self.open_reads = open_reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or not _http(scope):
            return await self.app(scope, receive, send)
        reading = scope["method"] not in MUTATING
        exempt = open_path(scope["path"]) or (reading and self.open_reads)
        try:
            authorized = await self._authorized(scope, Headers(scope=scope), exempt)
        except _Throttled as throttled:
            return await throttled.response(scope, receive, send)
        except StorageError as failed:  # the sessions cannot be read: a 503, not a false 401
            return await error_response(failed)(scope, receive, send)
        if authorized:
            scope.setdefault("state", {})["authorized"] = True  # request.state.authorized
            return await self.app(scope, receive, send)
        if exempt:
            return await self.app(scope, receive, send)
        if reading and not scope["path"].startswith("/api/"):  # a dashboard page
            query = scope["query_string"].decode("latin-1")
            target = scope["path"] + (f"?{query}" if query else "")
            url = "/login?next=" + quote(target, safe="/")
            return await RedirectResponse(url, status_code=303)(scope, receive, send)
        what = "this request changes state" if not reading else "reads need the token too"
        refused = Unauthorized(f"{what}: send `Authorization: Bearer <token>`")
        await error_response(refused)(scope, receive, send)

    async def _authorized(self, scope: Scope, headers: Headers, exempt: bool) -> bool:
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            throttle = throttle_of(scope)
            key = client_key(scope)
            wait = throttle.retry_after(key)
            if wait is not None:
                if exempt:  # an open path needs no token: nothing to refuse
                    return False
                raise _Throttled(wait)
            # Compare whatever was sent, so the time taken does not depend on where it differs.
            ok = hmac.compare_digest(given.strip().encode("utf-8", "replace"), self.token or b"")
            throttle.succeeded(key) if ok else throttle.failed(key)
            return ok
        cookie = _cookie(headers.get("cookie", ""), SESSION_COOKIE)
        store = getattr(scope.get("app"), "state", None)
        store = getattr(store, "store", None)
        if not cookie or store is None or self.token_text is None:
            return False
        from service.store.logins import LoginSessions  # SQLAlchemy: imported with the store

        return await run_in_threadpool(LoginSessions(store).check, cookie, self.token_text)


class _Throttled(Exception):
    def __init__(self, wait: int):
        self.wait = wait

    @property
    def response(self) -> NonFiniteJSONResponse:
        body = error_body(
            "too_many_requests",
            f"too many failed logins from this address (or from all): retry after {self.wait} s",
        )
        return NonFiniteJSONResponse(body, status_code=429, headers={"Retry-After": str(self.wait)})


def throttle_of(scope_or_state: Any) -> Throttle:
    """The app's throttle of failed logins (app.state.login_throttle), made on first use (on
    the event loop: no race)."""
    state = scope_or_state["app"].state if isinstance(scope_or_state, dict) else scope_or_state
    throttle = getattr(state, "login_throttle", None)
    if throttle is None:
        throttle = state.login_throttle = login_throttle(state.settings)
    return throttle


def open_path(path: str) -> bool:
    """Whether anyone may request `path`, token or not."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


class ContentLength:
    """400 for a Content-Length that is not a bounded non-negative integer."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _http(scope):
            return await self.app(scope, receive, send)
        values = [v for k, v in scope["headers"] if k.lower() == b"content-length"]
        if not values or bounded_length(values) is not None:
            return await self.app(scope, receive, send)
        shown = b", ".join(values)[:40].decode("latin-1")
        exc = _BadHeader(
            f"Content-Length {shown!r} is not a bounded non-negative integer (digits only, at "
            f"most {MAX_LENGTH_DIGITS} of them, one value)",
            field="Content-Length",
        )
        await error_response(exc)(scope, receive, send)


class _BadHeader(IsosweepError):
    kind = "bad_request"  # a 400 (api.errors.STATUS: IsosweepError)

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def bounded_length(values: list[bytes]) -> int | None:
    """The body size the Content-Length header(s) declare, or None when they are not one
    bounded non-negative integer: ASCII digits only (no sign, space, `_` or other numerals),
    1 to MAX_LENGTH_DIGITS of them, the same value each time the header is sent."""
    if len(set(values)) != 1:
        return None
    value = values[0]
    if not 0 < len(value) <= MAX_LENGTH_DIGITS or not all(48 <= c <= 57 for c in value):
        return None
    return int(value)


class MediaType:
    """422 for a mutation under /api/ whose body is not JSON or YAML."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            not _http(scope)
            or scope["method"] not in MUTATING
            or not scope["path"].startswith("/api/")
        ):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        media = headers.get("content-type")
        body = _content_length(scope) or "transfer-encoding" in headers
        if media is None and not body:
            return await self.app(scope, receive, send)
        kind = (media or "").partition(";")[0].strip().lower()
        if kind in API_MEDIA or kind.endswith("+json"):
            return await self.app(scope, receive, send)
        said = f"unsupported content type {kind!r}" if media else "a body without a Content-Type"
        exc = InvalidInput(
            f"{said}: the API reads JSON or YAML (send Content-Type: application/json or "
            "application/yaml)",
            field="body",
            allowed=API_MEDIA,
        )
        await error_response(exc)(scope, receive, send)


class BodyLimit:
    """413 for a request body over `max_bytes`, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: int | str) -> BodyTooLarge:
        return BodyTooLarge(
            f"the request body ({size} bytes) is over the limit of {self.max_bytes} bytes "
            "(set by ISOSWEEP_MAX_BODY_BYTES)",
            field="body",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            return await error_response(self._too_large(declared))(scope, receive, send)
        seen = 0

        async def counted() -> Message:
            # Raised inside the route that reads the body; the app's IsosweepError handler
            # answers it (413, api/errors.py), before anything else was sent.
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self._too_large(f"more than {self.max_bytes}")
            return message

        await self.app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    """The declared body size (ContentLength, outside, has refused any other header value)."""
    values = [v for k, v in scope["headers"] if k.lower() == b"content-length"]
    return bounded_length(values) if values else None
