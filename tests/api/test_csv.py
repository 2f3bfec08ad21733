"""api.tables.csv_chunks, the CSV every export writes (metrics, compare, the dashboard's trials):
each float back bit for bit from its text, the JSON spellings of NaN and ±inf, integral floats
kept floats, quotes only where a text field needs them (and then in every chunk alike), and a
config field's Python objects written as pandas writes them."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd

from api.tables import csv_chunks


def _csv(frame: pd.DataFrame, chunk: int | None = None) -> str:
    return b"".join(csv_chunks(frame, chunk)).decode()


def test_every_float_comes_back_bit_for_bit_from_its_text():
    rng = np.random.default_rng(0)
    exponents = rng.integers(-320, 308, 20_000).astype(float)
    values = rng.standard_normal(20_000) * 10.0**exponents  # subnormals to 1e308
    values[:6] = [5e-324, -0.0, 0.1, 1 / 3, 2.0**60, np.finfo(float).max]
    text = _csv(pd.DataFrame({"v": values}), chunk=999)
    fields = text.split("\n")
    assert fields[0] == "v" and fields[-1] == "" and len(fields) == 20_002
    back = np.array([float(f) for f in fields[1:-1]])
    assert back.tobytes() == values.tobytes()  # bit for bit, the sign of -0.0 included
    assert fields[1:3] == ["5e-324", "-0.0"]


def test_nonfinite_values_integral_floats_and_missing_fields():
    frame = pd.DataFrame(
        {
            "value": [1.0, np.nan, np.inf, -np.inf, 1e16, 3.0],
            "layer": pd.array([1, None, 2, 3, None, 4], dtype="Int64"),
            "kept": [True, False, True, True, False, True],
        }
    )
    lines = _csv(frame).splitlines()
    assert lines == [
        "value,layer,kept",
        "1.0,1,True",
        "NaN,,False",
        "Infinity,2,True",
        "-Infinity,3,True",
        "1e+16,,False",
        "3.0,4,True",
    ]
    back = pd.read_csv(io.StringIO("\n".join(lines)))
    assert back["value"].dtype == np.float64  # "1.0" and "3.0": a float column stays float
    assert np.array_equal(back["value"].to_numpy(), frame["value"].to_numpy(), equal_nan=True)


def test_fields_are_quoted_in_every_chunk_when_one_text_field_needs_it():
    plain = pd.DataFrame({"activation": ["relu", "tanh", "gelu"], "value": [0.5, 1.5, 2.5]})
    assert '"' not in _csv(plain, chunk=1)
    # a comma in the last row's text: the first chunk, already written, must be quoted too
    params = plain.assign(model_params=['{"a":1}', '{"a":2}', '{"a":1,"b":"x"}'])
    text = _csv(params, chunk=1)
    assert text.splitlines()[1] == '"relu","0.5","{""a"":1}"'
    back = pd.read_csv(io.StringIO(text))
    assert back["model_params"].tolist() == params["model_params"].tolist()
    assert back["value"].tolist() == [0.5, 1.5, 2.5]


def test_python_objects_of_a_config_column_are_written_as_pandas_writes_them():
    frame = pd.DataFrame({"width": [64, "auto", None, 2.5], "tag": pd.Categorical(list("abab"))})
    assert _csv(frame) == frame.to_csv(index=False, lineterminator="\n")
    empty = frame.iloc[:0]
    assert _csv(empty) == "width,tag\n"
