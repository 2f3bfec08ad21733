"""Derived parameter values: `{expr: "1/sqrt(depth)"}` in a spec computes a field per trial from
the others (docs/api.md, "Derived and linked parameters").

An expression is parsed by Python's own parser (`ast.parse(mode="eval")`) and evaluated by a walk
over the tree that knows only: numbers, the names of other fields, the operators + − * / ** and
unary ±, and the functions sqrt, log, exp, min, max, round, abs. Anything else (attributes,
subscripts, comparisons, lambdas, calls of other names, strings) is refused when the spec is
submitted, naming the expression — the text is never given to `eval`.

Arithmetic is Python's on ints and floats: + − * of integers stay integers (so `2*batch_size` is
an int), / gives a float, ** has an exponent bounded by MAX_EXPONENT (no 9**9**9), and any
non-finite or complex result is an error naming the expression.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from service.errors import InvalidInput

MAX_LENGTH = 200  # characters of one expression
MAX_EXPONENT = 64  # |exponent| of **
MAX_MAGNITUDE = 1e300  # |any intermediate value|; integers past it are refused too

Number = int | float

FUNCTIONS: dict[str, tuple[Callable[..., Number], int | None]] = {
    # name: (function, its argument count; None = one or more)
    "sqrt": (math.sqrt, 1),
    "log": (math.log, 1),
    "exp": (math.exp, 1),
    "abs": (abs, 1),
    "round": (round, 1),
    "min": (min, None),
    "max": (max, None),
}
_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
}
_SYMBOL = {ast.Add: "+", ast.Sub: "−", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
ALLOWED = "numbers, field names, + − * / **, and sqrt, log, exp, abs, round, min, max"


@dataclass(frozen=True)
class Expression:
    """A parsed, checked expression: its text and the field names it reads."""

    text: str
    tree: ast.Expression
    names: frozenset[str]

    def evaluate(self, values: Mapping[str, Any], *, where: str) -> Number:
        """The expression's value with `values` for its names.

        Raises:
            InvalidInput: a name's value is not a number, or the arithmetic fails (division by
                zero, log of 0, overflow, a complex or non-finite result); `where` names the field.
        """
        try:
            out = _eval(self.tree.body, values)
        except _Failure as exc:
            raise InvalidInput(f"{{expr: {self.text!r}}}: {exc}", field=where) from None
        return out


class _Failure(Exception):
    pass


def parse_expression(text: Any, *, where: str) -> Expression:
    """Parse and check an expression (its syntax and node kinds; names are checked by the spec,
    which knows the fields).

    Raises:
        InvalidInput: not a string, too long, a syntax error, or something outside ALLOWED.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("an expression is a non-empty string, e.g. '1/sqrt(depth)'", field=where)
    if len(text) > MAX_LENGTH:
        raise InvalidInput(f"an expression has at most {MAX_LENGTH} characters", field=where)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        msg = f"{{expr: {text!r}}} is not an expression: {exc.msg}"
        raise InvalidInput(msg, field=where) from None
    names: set[str] = set()
    for node in ast.walk(tree.body):
        problem = _refused(node, names)
        if problem:
            raise InvalidInput(f"{{expr: {text!r}}}: {problem}; allowed: {ALLOWED}", field=where)
    return Expression(text.strip(), tree, frozenset(names))


def _refused(node: ast.AST, names: set[str]) -> str | None:
    """Why `node` may not appear in an expression (None: it may), collecting field names."""
    if isinstance(node, ast.Constant):
        ok = isinstance(node.value, int | float) and not isinstance(node.value, bool)
        return None if ok else f"{node.value!r} is not a number"
    if isinstance(node, ast.BinOp):
        return None if type(node.op) in _BINARY else "that operator is not allowed"
    if isinstance(node, ast.UnaryOp):
        return None if isinstance(node.op, ast.UAdd | ast.USub) else "that operator is not allowed"
    if isinstance(node, ast.Call):
        fn = node.func
        if not isinstance(fn, ast.Name) or fn.id not in FUNCTIONS or node.keywords:
            return "only sqrt, log, exp, abs, round, min and max may be called"
        want = FUNCTIONS[fn.id][1]
        if (want is None and not node.args) or (want is not None and len(node.args) != want):
            return f"{fn.id} takes {want or 'one or more'} argument(s)"
        return None
    if isinstance(node, ast.Name):
        if node.id not in FUNCTIONS:
            names.add(node.id)
        return None
    if isinstance(node, ast.Load | ast.operator | ast.unaryop):
        return None
    return f"{type(node).__name__.lower()} is not allowed"


def _eval(node: ast.AST, values: Mapping[str, Any]) -> Number:
    if isinstance(node, ast.Constant):
        return _checked(node.value)
    if isinstance(node, ast.Name):
        v = values[node.id]
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise _Failure(f"{node.id} is {v!r}, not a number")
        return _checked(v)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, values)
        return _checked(-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, values), _eval(node.right, values)
        if isinstance(node.op, ast.Pow) and abs(b) > MAX_EXPONENT:
            raise _Failure(f"the exponent {b} is over {MAX_EXPONENT} in magnitude")
        try:
            return _checked(_BINARY[type(node.op)](a, b))
        except ZeroDivisionError:
            raise _Failure(f"division by zero in {a} {_SYMBOL[type(node.op)]} {b}") from None
        except OverflowError:
            raise _Failure("the value overflows") from None
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    fn = FUNCTIONS[node.func.id][0]
    args = [_eval(a, values) for a in node.args]
    try:
        return _checked(fn(*args))
    except (ValueError, OverflowError):
        shown = ", ".join(map(repr, args))
        raise _Failure(f"{node.func.id}({shown}) is not defined") from None


def _checked(v: Any) -> Number:
    if isinstance(v, complex):
        raise _Failure("the value is complex (a fractional power of a negative number)")
    if isinstance(v, float) and not math.isfinite(v):
        raise _Failure(f"the value is {v}")
    if abs(v) > MAX_MAGNITUDE:
        raise _Failure("the value overflows")
    return v


def evaluation_order(derived: Mapping[str, Expression], *, where: str) -> list[str]:
    """The derived fields in an order where each comes after the derived fields it reads.

    Raises:
        InvalidInput: the expressions read each other in a cycle (named, with its path).
    """
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = being visited, 2 = done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = " → ".join([*path[path.index(name) :], name])
            raise InvalidInput(
                f"derived fields read each other in a cycle: {cycle}",
                field=f"{where}.{name}",
            )
        state[name] = 1
        for dep in sorted(derived[name].names & derived.keys()):
            visit(dep, [*path, name])
        state[name] = 2
        order.append(name)

    for name in derived:
        visit(name, [])
    return order
