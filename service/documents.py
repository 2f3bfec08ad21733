"""Reading a spec document strictly: JSON (RFC 8259) or YAML read as YAML 1.2 would.

Both refuse what would otherwise be read silently wrong or cost the server: duplicate keys
(JSON and YAML would keep the last), integers of more than MAX_DIGITS digits (Python refuses
to convert over 4300 and the store over 32 bits), nesting deeper than MAX_DEPTH, more than
`max_nodes` values, and (YAML) aliases, whose expansion is exponential in the text's size.

YAML scalars follow the YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#103-core-schema):
`1e-3` is a number, `on` is text. PyYAML implements YAML 1.1, where `yes`/`no`/`on`/`off` are
booleans, `1:30` is 90, `010` is 8, `1_000` is 1000 and `2024-01-02` a date; a plain scalar
that YAML 1.1 reads as something else than YAML 1.2 does is refused, naming its line and the
two readings, so that no file means one thing here and another in a YAML 1.1 tool.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

from service.errors import InvalidInput

MAX_DEPTH = 32  # a sweep spec nests 3 deep (parameters → axis → value)
MAX_DIGITS = 100  # far beyond any integer a spec can hold (32 bits: 10 digits)

STR, INT, FLOAT = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
LEADING_ZERO = re.compile(r"^[-+]?0[0-9]+$")


# --- JSON -------------------------------------------------------------------------------------


def load_json(text: str, *, max_nodes: int = 100_000, field: str = "body") -> Any:
    """A JSON document: duplicate keys, NaN/Infinity literals and integers over MAX_DIGITS
    digits refused; at most MAX_DEPTH deep and `max_nodes` values.

    Raises:
        InvalidInput: (field `field`) naming the problem and, for syntax errors, where.
    """
    try:
        data = json.loads(
            text,
            object_pairs_hook=lambda pairs: _unique(pairs, field),
            parse_int=lambda s: _bounded_int(s, field),
            parse_constant=lambda s: _refuse_constant(s, field),
        )
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}", field=field
        ) from None
    except RecursionError:
        raise InvalidInput(_too_deep(), field=field) from None
    check_shape(data, max_nodes=max_nodes, field=field)
    return data


def _unique(pairs: list[tuple[str, Any]], field: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidInput(f"duplicate key {key!r} (each key once)", field=field)
        out[key] = value
    return out


def _bounded_int(text: str, field: str) -> int:
    if len(text.lstrip("+-")) > MAX_DIGITS:
        raise InvalidInput(f"an integer of {len(text)} digits (at most {MAX_DIGITS})", field=field)
    return int(text)


def _refuse_constant(text: str, field: str) -> float:
    raise InvalidInput(f"{text} is not JSON (write a number)", field=field)


def _too_deep() -> str:
    return f"the document is nested too deeply (at most {MAX_DEPTH} levels)"


def check_shape(data: Any, *, max_nodes: int, field: str) -> None:
    """Refuse a document nested deeper than MAX_DEPTH or holding more than `max_nodes`
    values (iterative: any depth is safe to look at)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise InvalidInput(_too_many(max_nodes), field=field)
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise InvalidInput(_too_deep(), field=field)
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items)


def _too_many(max_nodes: int) -> str:
    return f"the document holds more than {max_nodes} values (no valid spec needs as many)"


# --- YAML -------------------------------------------------------------------------------------

_YAML11 = Resolver()  # PyYAML's own (YAML 1.1) reading, to compare with


class _Loader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 core schema's implicit types, bounded depth and size, no
    aliases, unique keys and bounded integers. (The pure-Python parser: its composer is where
    depth and size are counted; libyaml's would recurse in C before anything could stop it.)"""

    yaml_implicit_resolvers: ClassVar[dict] = {}  # type: ignore[misc]  # filled below: YAML 1.2 core

    def __init__(self, text: str, max_nodes: int):
        super().__init__(text)
        self.max_nodes = max_nodes
        self.depth = 0
        self.nodes = 0
        self.mark: Any = None

    def where(self) -> str:
        m = self.mark
        return f" at line {m.line + 1}, column {m.column + 1}" if m is not None else ""

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            raise InvalidInput(
                f"YAML aliases (*name) are not supported{self.where()}: write the value out",
                field="spec",
            )
        self.depth += 1
        self.nodes += 1
        if self.depth > MAX_DEPTH:
            raise InvalidInput(_too_deep() + self.where(), field="spec")
        if self.nodes > self.max_nodes:
            raise InvalidInput(_too_many(self.max_nodes), field="spec")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        tag = super().resolve(kind, value, implicit)
        if kind is ScalarNode and implicit[0]:  # a plain (unquoted) scalar
            _refuse_disagreement(value, tag, self.where())
        return tag

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # unhashable: the base class says so
            if duplicate:
                m = key_node.start_mark
                raise InvalidInput(
                    f"duplicate key {key!r} at line {m.line + 1}, column {m.column + 1} "
                    "(each key once)",
                    field="spec",
                )
        return super().construct_mapping(node, deep=deep)


def _construct_int(loader: _Loader, node: Any) -> int:
    text = str(loader.construct_scalar(node)).replace("_", "")
    digits = text.lstrip("+-")
    if len(digits) > MAX_DIGITS:
        m = node.start_mark
        raise InvalidInput(
            f"an integer of {len(digits)} digits at line {m.line + 1} (at most {MAX_DIGITS})",
            field="spec",
        )
    try:
        if text[:2] in ("0o", "0x"):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text)
    except ValueError:
        raise InvalidInput(f"not an integer: {text!r}", field="spec") from None


def _construct_float(loader: _Loader, node: Any) -> float:
    text = str(loader.construct_scalar(node)).lower()
    if text.lstrip("+-") == ".inf":
        return float(text.replace(".inf", "inf"))
    if text == ".nan":
        return float("nan")
    try:
        return float(text)
    except ValueError:
        raise InvalidInput(f"not a number: {text!r}", field="spec") from None


def _core_schema() -> None:
    """The YAML 1.2 core schema's tags for plain scalars."""
    schema = [
        ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
        ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
        ("int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
        (
            "float",
            r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
            r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
            "-+.0123456789",
        ),
    ]
    for name, pattern, first in schema:
        regexp = re.compile(rf"^(?:{pattern})$")
        _Loader.add_implicit_resolver(f"tag:yaml.org,2002:{name}", regexp, list(first))
    _Loader.add_constructor(INT, _construct_int)
    _Loader.add_constructor(FLOAT, _construct_float)


_core_schema()


def _refuse_disagreement(text: str, tag: str, where: str) -> None:
    """Refuse a plain scalar that YAML 1.1 reads as a non-string differing from YAML 1.2."""
    old = _YAML11.resolve(ScalarNode, text, (True, False))
    if old == STR or (old == tag and not (tag == INT and LEADING_ZERO.match(text))):
        return
    kind = old.rsplit(":", 1)[1]
    now = "text" if tag == STR else f"the number {int(text)}" if tag == INT else tag
    reading = READINGS.get(kind, kind)
    hint = HINTS.get(kind, "")
    raise InvalidInput(
        f"`{text}`{where} is read differently by YAML 1.1 ({reading}{_yaml11_value(old, text)}) "
        f"and YAML 1.2 ({now}): {hint}quote it ('{text}') if you mean text",
        field="spec",
    )


READINGS = {"bool": "the boolean ", "int": "the number ", "float": "the number ", "timestamp":
            "the date ", "merge": "a merge key", "value": "a value key"}  # fmt: skip
HINTS = {
    "bool": "write true or false, or ",
    "int": "write the number in decimal, without leading zeros, `_` or `:` (0o10 for octal), or ",
    "float": "write the number without `_` or `:`, or ",
    "merge": "write the keys out, or ",
}


def _yaml11_value(tag: str, text: str) -> str:
    if tag.endswith((":merge", ":value")):
        return ""
    try:
        value = SafeConstructor().construct_object(ScalarNode(tag, text), deep=True)
    except Exception:  # a 1.1 value this module never uses: only a message needs it
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def load_yaml(text: str, *, max_nodes: int = 100_000) -> Any:
    """A YAML (or JSON) document read as YAML 1.2, with the bounds above.

    Raises:
        InvalidInput: field `spec`, naming the line of a syntax error or a refused value.
    """
    loader = None
    try:  # the reader refuses a control character while it is built: inside the try
        loader = _Loader(text, max_nodes)
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidInput(f"YAML syntax error{where}: {problem}", field="spec") from None
    except RecursionError:  # unreachable with MAX_DEPTH; kept so that it can never be a 500
        raise InvalidInput(_too_deep(), field="spec") from None
    finally:
        if loader is not None:
            loader.dispose()
