"""The body of `POST /sweeps`: a SweepSpec as JSON, or as YAML text. Read by hand (not by a
FastAPI body model) so that both media types work and every error names the spec's own field;
the document declares both (api.openapi.SPEC_BODY).
"""

from __future__ import annotations

from email.message import Message
from typing import Any

from fastapi import Request

from service.documents import load_json
from service.errors import InvalidInput
from service.spec import max_nodes

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")


async def read_spec(request: Request) -> dict[str, Any] | str:
    """The request's spec, not yet validated: a parsed JSON document, or YAML text, for
    service.spec.parse_spec (which validates it and refuses what no database can store).

    JSON is read strictly (service.documents.load_json): duplicate keys, NaN literals, integers
    of more than 100 digits and documents nested too deeply or too large are refused.

    Raises:
        InvalidInput: (field `body`) an empty body, malformed JSON, text that is not UTF-8, an
            unsupported media type.
    """
    raw = await request.body()
    if not raw.strip():
        raise InvalidInput("the body is empty: send a sweep spec as JSON or YAML", field="body")
    media = _media_type(request.headers.get("content-type"))
    if media in YAML_TYPES:
        return _utf8(raw)
    if media is not None and media != "application/json" and not media.endswith("+json"):
        raise InvalidInput(
            f"unsupported content type {media!r}",
            field="body",
            allowed=["application/json", *YAML_TYPES],
        )
    return load_json(_utf8(raw), max_nodes=max_nodes(request.app.state.settings))


def _media_type(header: str | None) -> str | None:
    if not header:
        return None
    msg = Message()
    msg["content-type"] = header
    return msg.get_content_type().lower()


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the body is not UTF-8 text ({exc.reason})", field="body") from None
