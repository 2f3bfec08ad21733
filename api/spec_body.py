"""The body of `POST /sweeps`: a SweepSpec as JSON, or as YAML text. Read by hand (not by a
FastAPI body model) so that both media types work and every error names the spec's own field.
"""

from __future__ import annotations

from email.message import Message
from typing import Any

from fastapi import Request

from service.config import TrialConfig
from service.documents import load_json
from service.errors import InvalidInput
from service.spec import SWEPT_BY_SPEC, SweepSpec, max_nodes

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")


def _spec_schema() -> dict[str, Any]:
    """SweepSpec's JSON schema with `parameters` spelled out: each TrialConfig field (but seed)
    takes a value or a non-empty list of values (a sweep axis)."""
    spec = SweepSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    spec.pop("$defs", None)
    fields = TrialConfig.model_json_schema()["properties"]
    params = {}
    for name in SWEPT_BY_SPEC:
        one = {k: v for k, v in fields[name].items() if k not in ("default", "title")}
        params[name] = {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]}
    spec["properties"]["parameters"] = {
        "type": "object",
        "properties": params,
        "additionalProperties": False,
        "description": "TrialConfig fields: a list is a sweep axis, a scalar is fixed",
    }
    spec["properties"]["seeds"]["description"] = "a count n (seeds 0..n−1) or distinct seeds"
    return spec


def spec_components() -> dict[str, Any]:
    """Schemas to add to the OpenAPI components: SweepSpec and what it refers to."""
    defs = SweepSpec.model_json_schema(ref_template="#/components/schemas/{model}")["$defs"]
    return {"SweepSpec": _spec_schema(), **defs}


SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/SweepSpec"}},
            "application/yaml": {
                "schema": {"type": "string", "description": "the SweepSpec as YAML text"}
            },
        },
    }
}


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
