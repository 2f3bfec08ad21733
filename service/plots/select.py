"""Choosing rows of a tidy frame for a plot: the metric, the epoch, the layer, the lines.

Pure pandas/numpy (no matplotlib), so the numbers a plot draws can be tested on their own.
Every bad choice raises InvalidInput naming the field and what the frame allows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from service.config import LAYER_METRICS
from service.errors import InvalidInput
from service.metric_names import is_loop_scalar
from service.models import is_layer_metric as _is_layer_metric
from service.models import known_metrics
from service.param_columns import FIELD as PARAMS
from service.plots.pooling import (
    BANDS,
    NONFINITE,
    POOLED_COLUMNS,
    STATS,
    default_band,
    pool_seeds,
)
from service.tidy import AGGREGATE_COLUMNS

REQUIRED_COLUMNS = ("epoch", "metric", "layer", "value")
# Columns that are not configuration: identity, position, and values (raw or aggregated); and
# model_params' JSON text, whose parameters are columns of their own (service.param_columns).
NOT_CONFIG = frozenset(
    ("trial_id", "seed", PARAMS, *REQUIRED_COLUMNS, *AGGREGATE_COLUMNS, *POOLED_COLUMNS)
)
# The isometry gaps of an MLP block's sub-layers, the stages the mean-field theory predicts
# (service.theory.STAGES): what the theory overlay draws. The other models' taps (residual,
# attn, mlp, output) have no prediction.
GAP_METRICS: tuple[str, ...] = tuple(
    m
    for m in LAYER_METRICS
    if m in ("isometry_gap/linear", "isometry_gap/norm", "isometry_gap/act")
)


# What the theory overlay draws: the per-layer metrics service.theory.predict gives for some
# family (the MLP stages', a residual stream's and an attention stack's gaps and range gaps, rms,
# mean_cosine, grad_norm relative to the last block's, a transformer's token metrics); which of
# them a sweep gets, predict says (service.plots.overlay).
THEORY_METRICS: tuple[str, ...] = tuple(
    m
    for m in LAYER_METRICS
    if m.removeprefix("range_").removeprefix("isometry_gap/")
    in ("linear", "norm", "act", "residual", "attn")
    or m in ("rms", "mean_cosine", "grad_norm", "token_isometry_gap", "token_cosine")
)


def check_choice(value: object, allowed: Sequence[str], field: str) -> None:
    if value not in allowed:
        raise InvalidInput(f"unknown value {value!r}", field=field, allowed=allowed)


def check_metric(metric: str, allowed: Sequence[str] | None = None) -> None:
    """`metric` among `allowed` (default: METRICS, a lab's per-tap metrics and a user's
    `loop/` scalars)."""
    if allowed is None and is_loop_scalar(metric):
        return
    check_choice(metric, known_metrics() if allowed is None else allowed, "metric")


def check_frame(frame: pd.DataFrame) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise InvalidInput(
            f"not a tidy frame, missing columns {missing}", field="frame", allowed=REQUIRED_COLUMNS
        )


def config_columns(frame: pd.DataFrame) -> list[str]:
    """The configuration columns (the sweep's axes), in frame order."""
    return [c for c in frame.columns if c not in NOT_CONFIG]


def varying(frame: pd.DataFrame, columns: Iterable[str]) -> list[str]:
    return [c for c in columns if frame[c].nunique(dropna=False) > 1]


def check_column(frame: pd.DataFrame, name: str, field: str, extra: Sequence[str] = ()) -> None:
    """`name` must be a configuration column of the frame (or one of `extra`)."""
    allowed = [*extra, *config_columns(frame)]
    if name not in allowed:
        raise InvalidInput(f"{name!r} is not a column of the frame", field=field, allowed=allowed)


def check_numeric(frame: pd.DataFrame, name: str, field: str) -> None:
    """`name` must be a numeric configuration column (it becomes a numeric axis)."""
    numeric = [c for c in config_columns(frame) if _is_number(frame[c])]
    if name not in numeric:
        raise InvalidInput(f"{name!r} is not a numeric column", field=field, allowed=numeric)


def _is_number(col: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col)


def ranges(values: Iterable[int]) -> list[str]:
    """Integers as runs, `[0, 1, 2, 5]` → `["0..2", "5"]`: an allowed list that stays short."""
    vs = sorted({int(v) for v in values})
    out: list[str] = []
    start: int | None = None
    prev: int | None = None
    for v in [*vs, None]:
        if start is not None and prev is not None and (v is None or v != prev + 1):
            out.append(str(start) if start == prev else f"{start}..{prev}")
            start = None
        if v is not None and start is None:
            start = v
        prev = v
    return out


def metric_rows(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    return frame[frame["metric"] == metric]


def resolve_epoch(rows: pd.DataFrame, epoch: int | None, default: str = "last") -> int:
    """The epoch a plot shows: the one asked for (it must be recorded), else the last (or first)."""
    epochs = rows["epoch"].to_numpy()
    if epoch is None:
        return int(epochs.max() if default == "last" else epochs.min())
    if not np.any(epochs == epoch):
        raise InvalidInput(f"epoch {epoch} is not recorded", field="epoch", allowed=ranges(epochs))
    return int(epoch)


def select_epoch(rows: pd.DataFrame, epoch: int | None, default: str = "last") -> pd.DataFrame:
    return rows[rows["epoch"] == resolve_epoch(rows, epoch, default)]


def absent_note(rows: pd.DataFrame, epoch: int) -> str | None:
    """Trials that have records of this metric but none at `epoch` (stopped, diverged): say so."""
    if "trial_id" not in rows.columns:
        return None
    n_all = rows["trial_id"].nunique()
    n_at = rows.loc[rows["epoch"] == epoch, "trial_id"].nunique()
    if n_at == n_all:
        return None
    return f"{n_all - n_at} of {n_all} trials have no record at epoch {epoch}"


def is_layer_metric(rows: pd.DataFrame, metric: str) -> bool:
    return _is_layer_metric(metric) or bool(rows["layer"].notna().any())


def select_layer(rows: pd.DataFrame, layer: int | None) -> pd.DataFrame:
    """Rows at one layer of each trial: ℓ = `layer`; −k = the k-th from the end; None = the last.

    Scalar metrics (layer <NA>) pass through unchanged.
    """
    if rows.empty or rows["layer"].isna().all():
        return rows
    ell = rows["layer"].to_numpy("int64")  # (rows,)
    keys = [c for c in rows.columns if c not in ("layer", "value")]
    top = rows.groupby(keys, dropna=False, sort=False)["layer"].transform("max")
    top = top.to_numpy("int64")  # (rows,) each trial's depth L at that epoch
    if layer is None:
        want = top
    elif layer > 0:
        want = np.full_like(top, layer)
    elif layer < 0:
        want = top + 1 + layer
    else:
        want = np.zeros_like(top)  # layers count from 1: ℓ = 0 matches nothing
    out = rows[ell == want]
    if out.empty:
        L = int(top.max())
        allowed = [f"1..{L}", f"-1..-{L}"]
        raise InvalidInput(f"no trial has layer {layer}", field="layer", allowed=allowed)
    return out


def line_keys(rows: pd.DataFrame, group_by: str | None, exclude: Iterable[str] = ()) -> list[str]:
    """The columns that tell lines apart: `group_by` first, then every other varying config
    column (so that no two configurations are ever averaged into one line)."""
    skip = {*exclude, group_by}
    rest = varying(rows, [c for c in config_columns(rows) if c not in skip])
    return [group_by, *rest] if group_by else rest


def fmt_value(v: object) -> str:
    if isinstance(v, float | np.floating):
        return f"{float(v):g}"
    return str(v)


def line_label(values: tuple) -> str:
    return ", ".join(fmt_value(v) for v in values) if values else "measured"


class Lines(dict):
    """label → line frame, remembering which columns the labels spell (`by`), whether they
    are one numeric column (`ordered`: drawn with a sequential colour map) and how seeds were
    pooled (`pooling`)."""

    def __init__(
        self,
        lines: dict[str, pd.DataFrame],
        by: list[str],
        ordered: bool,
        pooling: Pooling | None = None,
    ):
        super().__init__(lines)
        self.by = by
        self.ordered = ordered
        self.pooling = pooling or Pooling()

    @property
    def n_excluded(self) -> int:
        """Non-finite values left out of the pooled points (nonfinite="exclude")."""
        return int(sum(int(s["n_excluded"].sum()) for s in self.values()))

    @property
    def n_nonfinite(self) -> int:
        """Non-finite values among every point's values (excluded or not)."""
        return int(sum(int((s["count"] - s["n_finite"]).sum()) for s in self.values()))


def seed_bands(
    rows: pd.DataFrame, keys: list[str], x: str, pooling: Pooling | None = None
) -> Lines:
    """Pool seeds (service.plots.pooling.pool_seeds, by `pooling`, default the arithmetic mean and
    its 95% t-interval, non-finite values propagated) and cut the result into one line per key.

    Each line is a frame with columns x, mean (the pooled value, whatever the statistic), lo, hi
    (the band; NaN where undefined), count, n_finite, n_excluded, sorted by x.
    """
    pooling = pooling or Pooling()
    agg = pool_seeds(rows, stat=pooling.stat, band=pooling.band, nonfinite=pooling.nonfinite)
    ordered = len(keys) == 1 and _is_number(rows[keys[0]])
    if agg.empty:
        return Lines({}, keys, ordered, pooling)
    parts = agg.groupby(keys, sort=True, dropna=False) if keys else [((), agg)]
    out = {}
    for key, part in parts:
        part = part.sort_values(x, kind="stable")
        if part[x].duplicated().any():
            raise InvalidInput(
                f"several rows per {x} on one line; the frame mixes layers or epochs", field="frame"
            )
        out[line_label(key if isinstance(key, tuple) else (key,))] = band_frame(part, x)
    return Lines(out, keys, ordered, pooling)


def band_frame(part: pd.DataFrame, x: str) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "x": plain_values(part[x]),
            "mean": part["mean"].to_numpy("float64"),
            "lo": part["lo"].to_numpy("float64"),
            "hi": part["hi"].to_numpy("float64"),
            "count": part["count"].to_numpy("int64"),
            "n_finite": part["n_finite"].to_numpy("int64"),
            "n_excluded": part["n_excluded"].to_numpy("int64"),
        }
    )


def plain_values(col: pd.Series) -> np.ndarray:
    """A column as a numpy array; nullable integers (layer) become int64 when complete."""
    if isinstance(col.dtype, pd.api.extensions.ExtensionDtype) and not col.isna().any():
        if pd.api.types.is_integer_dtype(col):
            return col.to_numpy("int64")
        if pd.api.types.is_float_dtype(col):
            return col.to_numpy("float64")
    return col.to_numpy()


@dataclass(frozen=True)
class Pooling:
    """How seeds are pooled: `stat`, `band`, `nonfinite` (service.plots.pooling); checked."""

    stat: str = "mean"
    band: str = "ci"
    nonfinite: str = "propagate"

    @classmethod
    def of(cls, stat: str = "mean", band: str | None = None, nonfinite: str = "propagate"):
        """The pooling asked for; `band` None is the statistic's default (default_band).

        Raises:
            InvalidInput: an unknown value, naming `stat`, `band` or `nonfinite`.
        """
        check_choice(stat, STATS, "stat")
        band = default_band(stat) if band is None else band
        check_choice(band, BANDS, "band")
        check_choice(nonfinite, NONFINITE, "nonfinite")
        return cls(stat, band, nonfinite)


def resolve_scale(asked: str | None, values: Iterable[float], span: float, field_log: bool) -> str:
    """The scale of an axis, "log" or "linear": `asked` when log or linear; "auto" = log when
    every finite value is positive and they span more than `span` (wants_log); None = the
    field's default: log when `field_log` and some finite value is positive, else as auto."""
    if asked in ("log", "linear"):
        return asked
    v = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    if asked is None and field_log and bool(np.any(np.isfinite(v) & (v > 0))):
        return "log"
    return "log" if wants_log(v, span) else "linear"


def wants_log(values: Iterable[float], span: float) -> bool:
    """Log scale when every finite value is positive and max/min exceeds `span` (10: a decade)."""
    v = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    v = v[np.isfinite(v)]
    return bool(v.size) and bool(np.all(v > 0)) and float(v.max() / v.min()) > span
