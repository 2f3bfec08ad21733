"""Tidy frames on the wire: JSON rows, streamed CSV, Parquet. NaN and ±inf keep one spelling:
"NaN", "Infinity", "-Infinity" (JSON strings; CSV fields, which pandas.read_csv reads back as
the same floats). A missing layer (a scalar metric) is JSON null and an empty CSV field."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from service.jsonfmt import NONFINITE

CSV_CHUNK_ROWS = 5000  # rows per streamed CSV chunk


def spelled_floats(values: np.ndarray) -> np.ndarray:
    """Float64 values as an object array: finite values stay floats, the others become
    "NaN" / "Infinity" / "-Infinity"."""
    out = values.astype(object)  # (n,)
    if not np.isfinite(values).all():
        for word, x in NONFINITE.items():
            out[np.isnan(values) if np.isnan(x) else values == x] = word
    return out


def column_values(col: pd.Series) -> list[Any]:
    """A column as plain Python values for JSON: floats spelled, missing values None."""
    if pd.api.types.is_float_dtype(col):
        return spelled_floats(col.to_numpy("float64")).tolist()
    if isinstance(col.dtype, pd.api.extensions.ExtensionDtype) or col.dtype == object:
        return col.to_numpy(dtype=object, na_value=None).tolist()
    return col.to_numpy().tolist()


def json_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    cols = list(frame.columns)
    values = [column_values(frame[c]) for c in cols]
    return [dict(zip(cols, row, strict=True)) for row in zip(*values, strict=True)]


def csv_chunks(frame: pd.DataFrame, chunk: int | None = None) -> Iterator[bytes]:
    """The frame as CSV, header first, `chunk` rows at a time (default CSV_CHUNK_ROWS), for a
    StreamingResponse. Floats are written in their shortest round-trip digits (integral ones
    with ".0", so that a reader keeps them floats), NaN and ±inf spelled as in JSON, <NA> as an
    empty field, booleans as True/False; fields are quoted only if a text column holds a comma,
    quote or line break. Arrow writes it, a chunk at a time and outside the GIL: three times
    pandas' speed, and an export no longer holds up the plots drawn beside it."""
    chunk = chunk or CSV_CHUNK_ROWS
    quoting = "needed" if _needs_quotes(frame) else "none"
    header = "needed" if any(_SPECIAL.search(str(c)) for c in frame.columns) else "none"
    for start in range(0, max(len(frame), 1), chunk):
        out = io.BytesIO()
        options = pcsv.WriteOptions(
            include_header=start == 0, quoting_style=quoting, quoting_header=header
        )
        pcsv.write_csv(_csv_table(frame.iloc[start : start + chunk]), out, options)
        yield out.getvalue()


_SPECIAL = re.compile('[,"\r\n]')  # what makes a CSV field need quotes


def _needs_quotes(frame: pd.DataFrame) -> bool:
    """Whether a text field of the frame holds a comma, quote or line break."""
    for name in frame.columns:
        col = frame[name]
        if col.dtype == object:
            if any(_SPECIAL.search(str(v)) for v in col if not _missing(v)):
                return True
        elif pd.api.types.is_string_dtype(col) or isinstance(col.dtype, pd.CategoricalDtype):
            values = pa.array(col.astype("str"), from_pandas=True)
            if pc.any(pc.match_substring_regex(values, _SPECIAL.pattern)).as_py():
                return True
    return False


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _csv_column(col: pd.Series) -> pa.Array:
    """One column as Arrow, floats and booleans already spelled as CSV text; other Python
    objects (a config field's lists, dicts or mixed types) by str(), as pandas writes them."""
    if pd.api.types.is_float_dtype(col):
        text = pc.cast(pa.array(col.to_numpy("float64", na_value=np.nan)), pa.string())
        integral = pc.match_substring_regex(text, "^-?[0-9]+$")  # shortest digits: "1", "-0"
        text = pc.if_else(integral, pc.binary_join_element_wise(text, ".0", ""), text)
        for arrow, word in (("nan", "NaN"), ("inf", "Infinity"), ("-inf", "-Infinity")):
            text = pc.if_else(pc.equal(text, arrow), word, text)
        return text
    if pd.api.types.is_bool_dtype(col):
        return pc.if_else(pa.array(col, from_pandas=True), "True", "False")
    if col.dtype == object:
        return pa.array([None if _missing(v) else str(v) for v in col], pa.string())
    values = pa.array(col, from_pandas=True)
    if pa.types.is_dictionary(values.type):  # a categorical: its values
        return pc.cast(values, values.type.value_type)
    return values


def _csv_table(frame: pd.DataFrame) -> pa.Table:
    names = [str(c) for c in frame.columns]
    return pa.table([_csv_column(frame.iloc[:, i]) for i in range(frame.shape[1])], names=names)


def parquet_bytes(frame: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)  # pyarrow: NaN/±inf and nullable layers are native
    return buf.getvalue()
