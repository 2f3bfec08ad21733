"""What every request passes before it reaches a route: the bearer token on mutating requests,
and the body size limit. Plain ASGI middleware, so nothing is read or parsed before they agree.

- Token: when Settings.api_token is set, POST/PUT/PATCH/DELETE need
  `Authorization: Bearer <token>`, compared in constant time (hmac.compare_digest); otherwise
  401 with `WWW-Authenticate: Bearer`. Reads stay open.
- Body: a declared Content-Length over Settings.max_body_bytes is refused at once (413); a body
  without one (chunked) is counted as it streams in and refused when it crosses the limit.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import BodyTooLarge, error_response
from service.errors import Unauthorized

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class TokenAuth:
    """Refuse mutating requests without the right bearer token (when a token is configured)."""

    def __init__(self, app: ASGIApp, token: str | None):
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] != "http" or scope["method"] not in MUTATING:
            return await self.app(scope, receive, send)
        if self._authorized(Headers(scope=scope).get("authorization")):
            return await self.app(scope, receive, send)
        exc = Unauthorized("this request changes state: send `Authorization: Bearer <token>`")
        await error_response(exc)(scope, receive, send)

    def _authorized(self, header: str | None) -> bool:
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        # Compare whatever was sent, so the time taken does not depend on where it differs.
        return hmac.compare_digest(given.strip().encode(), self.token or b"")


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
    value = Headers(scope=scope).get("content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None  # the server rejects a malformed header itself
