"""Tidy frames on the wire: JSON rows, streamed CSV, Parquet. NaN and ±inf keep one spelling:
"NaN", "Infinity", "-Infinity" (JSON strings; bare CSV fields, which pandas.read_csv reads back
as the same floats). A missing layer (a scalar metric) is JSON null and an empty CSV field."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

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
    StreamingResponse."""
    chunk = chunk or CSV_CHUNK_ROWS
    floats = [c for c in frame.columns if pd.api.types.is_float_dtype(frame[c])]
    for start in range(0, max(len(frame), 1), chunk):
        part = frame.iloc[start : start + chunk]
        part = part.assign(**{c: spelled_floats(part[c].to_numpy("float64")) for c in floats})
        # Floats are written by repr (shortest round-trip); <NA> as an empty field.
        yield part.to_csv(index=False, header=start == 0, lineterminator="\n").encode()


def parquet_bytes(frame: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)  # pyarrow: NaN/±inf and nullable layers are native
    return buf.getvalue()
