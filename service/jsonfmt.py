"""JSON with non-finite numbers. Standard JSON has no NaN or infinity, so isosweep spells them
as the strings "NaN", "Infinity" and "-Infinity" everywhere (REST, CLI, JSON lines). A finite
value is always a JSON number; JavaScript's Number("Infinity") and Python's float("Infinity")
both read the strings back.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def encode_float(x: float) -> float | str:
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def to_jsonable(obj: Any) -> Any:
    """Replace non-finite floats (also inside numpy arrays, lists, dicts) by their string names."""
    if isinstance(obj, float | np.floating):
        return encode_float(float(obj))
    if isinstance(obj, np.ndarray):
        return [to_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    return obj


def decode_float(x: float | int | str | None) -> float | None:
    """The inverse of encode_float; None stays None."""
    if x is None:
        return None
    if isinstance(x, str):
        return NONFINITE[x] if x in NONFINITE else float(x)
    return float(x)


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps that never emits the non-standard tokens NaN / Infinity."""
    return json.dumps(to_jsonable(obj), allow_nan=False, **kwargs)
