"""Sampled sweep parameters: a spec parameter given as a distribution, and the points that a
random or Sobol search draws from the distributions at submission (docs/api.md, "Sampled
parameters: random and Sobol search").

A draw is a point u of the unit cube [0, 1)^d, one coordinate per distribution parameter, the
coordinates assigned to the parameters in alphabetical order of their names (so the order in
which a spec writes its keys changes nothing). Each coordinate is mapped through its
distribution's inverse CDF:

    uniform [a, b]       a·(1 − u) + b·u
    loguniform [a, b]    exp(ln a·(1 − u) + ln b·u)           (uniform in ln x)
    int [a, b]           a + ⌊(b − a + 1)·u⌋                   (each of a..b has mass 1/(b−a+1))
    int [a, b], log      ⌊exp(ln a·(1 − u) + ln(b + 1)·u)⌋     (k: mass ln((k+1)/k) / ln((b+1)/a))
    choice [v₁..v_k]     v_{⌊k·u⌋+1}

each result clipped into [a, b] against rounding. A `random` search takes u from numpy's
Generator (PCG64) seeded with `search.seed`; a `sobol` search takes the first n = 2^m points of
scipy's scrambled Sobol sequence seeded the same way. Those points are balanced: in every
coordinate exactly one of them lies in each interval [k/n, (k+1)/n). A Sobol search therefore
needs n to be a power of 2 and refuses any other n. Values are Python floats and ints at full
precision, so a sampled config round-trips through JSON exactly; the same spec and seed give
the same values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.errors import InvalidInput

KINDS = ("uniform", "loguniform", "int", "choice")
SEARCH_KINDS = ("random", "sobol")
SEED_LIMIT = 2**31
FORMS = (
    "{uniform: [a, b]}, {loguniform: [a, b]} (a > 0), {int: [a, b]} (inclusive; `log: true` "
    "for log-spaced integers) or {choice: [v1, v2, …]}"
)

# validate(name, value, where) → the field's normalized value, or InvalidInput naming `where`.
Validate = Callable[[str, Any, str], Any]


class Search(BaseModel):
    """How many points to draw for a spec's distribution parameters, and how."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["random", "sobol"] = Field(
        description="random: numpy's Generator; sobol: scipy's scrambled Sobol points"
    )
    n: int = Field(ge=1, description="points drawn; each is crossed with the grid and seeds")
    seed: int = Field(0, ge=0, lt=SEED_LIMIT, description="seeds the generator or the scrambling")

    @model_validator(mode="after")
    def _sobol_needs_a_power_of_two(self) -> Search:
        n = self.n
        if self.kind == "sobol" and n & (n - 1):
            low = 1 << (n.bit_length() - 1)
            raise InvalidInput(
                f"a Sobol search needs n to be a power of 2 (its points are balanced only "
                f"then), not {n}: use {low} or {2 * low}, or kind: random",
                field="search.n",
            )
        return self


@dataclass(frozen=True)
class Uniform:
    a: float
    b: float

    def value(self, u: float) -> float:
        return _clip(self.a * (1.0 - u) + self.b * u, self.a, self.b)

    @property
    def top(self) -> float:
        return self.b

    def to_json(self) -> dict[str, Any]:
        return {"uniform": [self.a, self.b]}


@dataclass(frozen=True)
class LogUniform:
    a: float
    b: float

    def value(self, u: float) -> float:
        return _clip(math.exp(math.log(self.a) * (1.0 - u) + math.log(self.b) * u), self.a, self.b)

    @property
    def top(self) -> float:
        return self.b

    def to_json(self) -> dict[str, Any]:
        return {"loguniform": [self.a, self.b]}


@dataclass(frozen=True)
class IntRange:
    a: int
    b: int
    log: bool = False

    def value(self, u: float) -> int:
        if self.log:
            x = math.floor(math.exp(math.log(self.a) * (1.0 - u) + math.log(self.b + 1) * u))
        else:
            x = self.a + math.floor((self.b - self.a + 1) * u)
        return int(_clip(x, self.a, self.b))

    @property
    def top(self) -> int:
        return self.b

    def to_json(self) -> dict[str, Any]:
        return {"int": [self.a, self.b], **({"log": True} if self.log else {})}


@dataclass(frozen=True)
class Choice:
    values: tuple[Any, ...]

    def value(self, u: float) -> Any:
        return self.values[min(math.floor(len(self.values) * u), len(self.values) - 1)]

    @property
    def top(self) -> Any:
        return max(self.values)

    def to_json(self) -> dict[str, Any]:
        return {"choice": list(self.values)}


Distribution = Uniform | LogUniform | IntRange | Choice


def _clip(x: float, a: float, b: float) -> float:
    return min(max(x, a), b)


def is_distribution(value: Any) -> bool:
    """A parameter's value is a distribution: a mapping with exactly one of KINDS as a key (a
    validated spec's dump holds nothing else that is a mapping)."""
    return isinstance(value, dict) and sum(k in KINDS for k in value) == 1


def parse_distribution(name: str, raw: dict[Any, Any], *, where: str, validate: Validate) -> Any:
    """A distribution as a spec writes it, validated; returns its normalized JSON form (which
    parses to itself). Bounds and choices go through the field's own validation (`validate`),
    so every sampled value is a valid value of the field.

    Raises:
        InvalidInput: names the part at fault, e.g. `parameters.lr.loguniform[0]`.
    """
    kinds = [k for k in raw if k in KINDS]
    if len(kinds) != 1:
        raise InvalidInput(
            f"a mapping must be a distribution, one of {FORMS}; a grid axis is a list", field=where
        )
    kind = kinds[0]
    at = f"{where}.{kind}"
    extra_keys = ("log",) if kind == "int" else ()
    for key in raw:
        if key != kind and key not in extra_keys:
            raise InvalidInput("unknown key", field=f"{where}.{key}", allowed=(kind, *extra_keys))
    body = raw[kind]
    if kind == "choice":
        return _choice(name, body, at, validate).to_json()
    if kind == "int":
        return _int_range(name, body, raw.get("log", False), where, validate).to_json()
    return _float_range(name, kind, body, at, validate).to_json()


def distribution_of(normalized: Mapping[str, Any]) -> Distribution:
    """The distribution of a normalized (already validated) JSON form."""
    if "uniform" in normalized:
        return Uniform(*normalized["uniform"])
    if "loguniform" in normalized:
        return LogUniform(*normalized["loguniform"])
    if "int" in normalized:
        a, b = normalized["int"]
        return IntRange(a, b, log=bool(normalized.get("log", False)))
    return Choice(tuple(normalized["choice"]))


def _pair(body: Any, at: str, what: str, ok: Callable[[Any], bool]) -> tuple[Any, Any]:
    if not isinstance(body, list | tuple) or len(body) != 2 or not all(ok(x) for x in body):
        raise InvalidInput(f"a range is [a, b]: two {what}, not {body!r}", field=at)
    return body[0], body[1]


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _float_range(
    name: str, kind: str, body: Any, at: str, validate: Validate
) -> Uniform | LogUniform:
    a, b = _pair(body, at, "numbers", _is_number)
    ends = []
    for i, x in enumerate((a, b)):
        if not math.isfinite(x):
            raise InvalidInput(f"a bound must be finite, not {x}", field=f"{at}[{i}]")
        try:
            ends.append(validate(name, float(x), f"{at}[{i}]"))
        except InvalidInput as exc:
            if _is_integer_field(name):
                exc.message += f" ({name} is an integer: sample it with {{int: [a, b]}})"
                exc.args = (exc.message,)
            raise
    lo, hi = ends
    if not lo < hi:
        raise InvalidInput(f"needs a < b, not [{a}, {b}]", field=at)
    if kind == "loguniform":
        if lo <= 0:
            raise InvalidInput(f"needs a > 0 (it is uniform in ln x), not a = {a}", field=at)
        return LogUniform(lo, hi)
    return Uniform(lo, hi)


def _int_range(name: str, body: Any, log: Any, where: str, validate: Validate) -> IntRange:
    at = f"{where}.int"
    a, b = _pair(body, at, "integers", lambda x: isinstance(x, int) and not isinstance(x, bool))
    for i, x in enumerate((a, b)):
        validate(name, x, f"{at}[{i}]")  # the ints stay as written: an int range's bounds
    if not a < b:
        raise InvalidInput(f"needs a < b, not [{a}, {b}]", field=at)
    if not isinstance(log, bool):
        raise InvalidInput(f"true or false, not {log!r}", field=f"{where}.log")
    if log and a < 1:
        raise InvalidInput(f"log-spaced integers need a ≥ 1, not a = {a}", field=at)
    return IntRange(a, b, log)


def _choice(name: str, body: Any, at: str, validate: Validate) -> Choice:
    if not isinstance(body, list | tuple) or not body:
        raise InvalidInput("a choice is a non-empty list of values", field=at)
    values = [validate(name, v, f"{at}[{i}]") for i, v in enumerate(body)]
    keys = [json.dumps(v, sort_keys=True) for v in values]
    if len(set(keys)) != len(keys):
        raise InvalidInput(f"a choice must not repeat a value: {values}", field=at)
    return Choice(tuple(values))


def _is_integer_field(name: str) -> bool:
    from service.config import TrialConfig

    annotation = TrialConfig.model_fields[name].annotation
    return annotation is int or annotation == (int | None)


def unit_points(search: Search, d: int) -> np.ndarray:
    """The search's n points in [0, 1)^d, shape (n, d): numpy's Generator (random) or scipy's
    scrambled Sobol sequence (sobol, n a power of 2), both seeded with `search.seed`."""
    rng = np.random.default_rng(search.seed)
    if search.kind == "random":
        return rng.random((search.n, d))
    from scipy.stats import qmc  # only a Sobol search pays for scipy.stats' import

    return qmc.Sobol(d, scramble=True, rng=rng).random_base2(search.n.bit_length() - 1)


def draw(distributions: Mapping[str, Distribution], search: Search) -> list[dict[str, Any]]:
    """The search's n points: one {parameter: value} per point, in draw order. Coordinate j of
    each unit point goes to the j-th parameter in alphabetical order."""
    names = sorted(distributions)
    u = unit_points(search, len(names))
    return [
        {name: distributions[name].value(float(u[i, j])) for j, name in enumerate(names)}
        for i in range(search.n)
    ]


def distribution_schema(value_schema: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of a distribution over a field whose values have `value_schema` (for the
    OpenAPI description of a spec's parameters)."""
    pair = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
    ints = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}
    one_key = {"additionalProperties": False, "type": "object"}
    return {
        "description": "a distribution, sampled by the spec's `search`",
        "anyOf": [
            {**one_key, "properties": {"uniform": pair}, "required": ["uniform"]},
            {**one_key, "properties": {"loguniform": pair}, "required": ["loguniform"]},
            {
                **one_key,
                "properties": {"int": ints, "log": {"type": "boolean"}},
                "required": ["int"],
            },
            {
                **one_key,
                "properties": {"choice": {"type": "array", "items": value_schema, "minItems": 1}},
                "required": ["choice"],
            },
        ],
    }
