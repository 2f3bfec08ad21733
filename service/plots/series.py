"""What each plot kind draws, as plain data: lines (x, pooled value, band, counts) or a grid.

These functions are the plots' numbers, testable without drawing. Seeds are pooled by
service.plots.pooling (`stat`, `band`, `nonfinite`); here the defaults are the arithmetic
mean, its 95% t-interval and non-finite values propagated (they stay in `mean` as what they
are). The figures' defaults follow the field instead (service.plots.defaults.default_pooling).

The lines of layer_profile, depth_scaling and training_curves (and the theory overlay's measured
ones) carry `n_unresolved` per point: how many of its seeds' values of an `isometry_gap/<kind>`
have an error bar (`isometry_gap_error/<kind>`, in the same frame) of at least UNRESOLVED or
+∞ — a gap that the Gram's conditioning and the working precision leave unresolved
(docs/science.md, "Error bars"); 0 for other metrics and where the frame has no error rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from service.config import LAYER_METRICS
from service.errors import InvalidInput
from service.plots.pooling import pool_seeds
from service.plots.select import (
    Lines,
    Pooling,
    check_column,
    check_numeric,
    config_columns,
    line_keys,
    metric_rows,
    plain_values,
    resolve_epoch,
    seed_bands,
    select_epoch,
    select_layer,
    varying,
)

MAX_EPOCH_LINES = 8  # a layer profile with more recorded epochs shows this many, evenly spaced
# A gap whose error bar (a bound on its relative error) is at least this, or +∞, is unresolved.
UNRESOLVED = 0.1
ERROR_PREFIX, GAP_PREFIX = "isometry_gap_error/", "isometry_gap/"


def error_metric(metric: str) -> str | None:
    """The error bar's metric of an isometry gap (isometry_gap/<kind> → isometry_gap_error/<kind>);
    None for every other metric."""
    return ERROR_PREFIX + metric.removeprefix(GAP_PREFIX) if metric.startswith(GAP_PREFIX) else None


def mark_unresolved(
    lines: Lines, rows: pd.DataFrame, frame: pd.DataFrame, metric: str, keys: list[str], x: str
) -> Lines:
    """`lines` (pooled from `rows` by `keys` against `x`) with the column n_unresolved: per
    point, how many of the rows pooled into it have an error bar ≥ UNRESOLVED or +∞ in `frame`
    (matched by trial, epoch and layer; without a trial_id column, by every other column)."""
    for s in lines.values():
        s["n_unresolved"] = np.zeros(len(s), dtype=np.int64)
    err = error_metric(metric)
    errors = metric_rows(frame, err) if err is not None else frame.iloc[:0]
    if errors.empty or not lines:
        return lines
    on = (["trial_id", "epoch", "layer"] if "trial_id" in rows.columns
          else [c for c in rows.columns if c not in ("metric", "value")])  # fmt: skip
    bars = errors[[*on, "value"]].rename(columns={"value": "error"})
    joined = rows.merge(bars.drop_duplicates(subset=on, keep="last"), on=on, how="left")
    flags = joined.drop(columns="error").assign(
        value=(joined["error"].to_numpy("float64") >= UNRESOLVED).astype(np.float64)
    )  # NaN (no bar) ≥ … is False; +∞ is True
    pooled = seed_bands(flags, keys, x, Pooling("mean", "none", "propagate"))
    for label, s in lines.items():
        f = pooled.get(label)
        if f is None:
            continue
        n = dict(zip(f["x"], np.rint(f["mean"] * f["count"]).astype(np.int64), strict=True))
        s["n_unresolved"] = np.array([n.get(v, 0) for v in s["x"]], dtype=np.int64)
    return lines


def epoch_subset(epochs: np.ndarray, limit: int = MAX_EPOCH_LINES) -> np.ndarray:
    """At most `limit` of the recorded epochs, evenly spaced, always the first and the last."""
    es = np.unique(epochs)
    if es.size <= limit:
        return es
    return es[np.unique(np.linspace(0, es.size - 1, limit).round().astype(int))]


def _one_config(rows: pd.DataFrame) -> bool:
    return not varying(rows, config_columns(rows))


def layer_profile_series(
    frame: pd.DataFrame,
    metric: str,
    *,
    group_by: str | None = None,
    epoch: int | None = None,
    stat: str = "mean",
    band: str | None = None,
    nonfinite: str = "propagate",
) -> Lines:
    """A per-layer metric against ℓ = 1..L, pooled over seeds (default: mean and 95% CI).

    Lines are epochs (group_by="epoch", or by default when the frame holds one configuration;
    at most MAX_EPOCH_LINES of them unless `epoch` picks one) or configurations (group_by a
    config column, at `epoch`, default the last recorded one).
    """
    pooling = Pooling.of(stat, band, nonfinite)
    rows = metric_rows(frame, metric)
    if rows.empty:
        return Lines({}, [], False, pooling)
    _need_layers(rows, metric)
    if group_by is not None:
        check_column(rows, group_by, "group_by", extra=("epoch",))
    if group_by == "epoch" or (group_by is None and _one_config(rows)):
        if epoch is None:
            rows = rows[rows["epoch"].isin(epoch_subset(rows["epoch"].to_numpy()))]
        else:
            rows = select_epoch(rows, epoch)
        keys = ["epoch", *line_keys(rows, None)]
    else:
        rows = select_epoch(rows, epoch)
        keys = line_keys(rows, group_by)
    lines = seed_bands(rows, keys, "layer", pooling)
    return mark_unresolved(lines, rows, frame, metric, keys, "layer")


def _need_layers(rows: pd.DataFrame, metric: str) -> None:
    if rows["layer"].isna().all():
        raise InvalidInput(f"{metric!r} has no layers", field="metric", allowed=LAYER_METRICS)


def depth_scaling_series(
    frame: pd.DataFrame,
    metric: str,
    *,
    x: str = "depth",
    group_by: str | None = None,
    epoch: int | None = None,
    layer: int | None = None,
    stat: str = "mean",
    band: str | None = None,
    nonfinite: str = "propagate",
) -> Lines:
    """A metric at one layer (default each trial's last, ℓ = L) and one epoch (default the last)
    against a numeric config field `x` (default depth), one line per `group_by` value (and per
    value of every other varying config field), pooled over seeds (default: mean and 95% CI)."""
    pooling = Pooling.of(stat, band, nonfinite)
    rows = metric_rows(frame, metric)
    if rows.empty:
        return Lines({}, [], False, pooling)
    check_numeric(rows, x, "x")
    _check_group(rows, group_by, x)
    rows = select_layer(select_epoch(rows, epoch), layer)
    keys = line_keys(rows, group_by, exclude=(x,))
    return mark_unresolved(seed_bands(rows, keys, x, pooling), rows, frame, metric, keys, x)


def _check_group(rows: pd.DataFrame, group_by: str | None, x: str) -> None:
    if group_by is None:
        return
    check_column(rows, group_by, "group_by")
    if group_by == x:
        allowed = [c for c in config_columns(rows) if c != x]
        raise InvalidInput(
            f"group_by must differ from x ({x!r})", field="group_by", allowed=allowed
        )


def training_curves_series(
    frame: pd.DataFrame,
    metric: str,
    *,
    group_by: str | None = None,
    layer: int | None = None,
    stat: str = "mean",
    band: str | None = None,
    nonfinite: str = "propagate",
) -> Lines:
    """A metric against epoch, one line per configuration (`group_by` first), pooled over
    seeds (default: mean and 95% CI). A per-layer metric is taken at `layer` (default each
    trial's last)."""
    pooling = Pooling.of(stat, band, nonfinite)
    rows = metric_rows(frame, metric)
    if rows.empty:
        return Lines({}, [], False, pooling)
    _check_group(rows, group_by, "epoch")
    rows = select_layer(rows, layer)
    keys = line_keys(rows, group_by)
    lines = seed_bands(rows, keys, "epoch", pooling)
    return mark_unresolved(lines, rows, frame, metric, keys, "epoch")


@dataclass(frozen=True)
class Grid:
    """A heatmap's cells: values[i, j] is the pooled value over seeds (`stat`) at y = ys[i],
    x = xs[j]; `n_excluded` non-finite values were left out (nonfinite="exclude")."""

    x: str
    y: str
    xs: np.ndarray  # (nx,) sorted
    ys: np.ndarray  # (ny,) sorted
    values: np.ndarray  # (ny, nx) float64; NaN also where there is no record
    present: np.ndarray  # (ny, nx) bool: a record exists (tells a NaN value from a hole)
    stat: str = "mean"
    n_excluded: int = 0


def heatmap_series(
    frame: pd.DataFrame,
    metric: str,
    *,
    x: str = "epoch",
    y: str = "layer",
    epoch: int | None = None,
    layer: int | None = None,
    stat: str = "mean",
    nonfinite: str = "propagate",
) -> Grid | None:
    """A metric over two dimensions (epoch, layer or config fields), pooled over seeds per cell
    (`stat`, `nonfinite`: service.plots.pooling; default the mean, non-finite propagated).

    `epoch` / `layer` fix those dimensions when they are not axes (defaults: the last epoch,
    each trial's last layer). Any other varying config field is an error naming it: a cell
    holds one configuration. None when the frame has no rows of the metric.
    """
    pooling = Pooling.of(stat, "none", nonfinite)
    rows = metric_rows(frame, metric)
    if rows.empty:
        return None
    for name, field in ((x, "x"), (y, "group_by")):
        check_column(rows, name, field, extra=("epoch", "layer"))
    if x == y:
        raise InvalidInput("the two heatmap axes must differ", field="group_by")
    if "layer" in (x, y):
        _need_layers(rows, metric)
    if "epoch" not in (x, y):
        rows = select_epoch(rows, epoch)
    if "layer" not in (x, y):
        rows = select_layer(rows, layer)
    agg = pool_seeds(rows, stat=pooling.stat, band="none", nonfinite=pooling.nonfinite)
    _one_config_per_cell(agg, (x, y))
    return _grid(agg, x, y, pooling.stat)


def _one_config_per_cell(agg: pd.DataFrame, axes: tuple[str, str]) -> None:
    extra = varying(agg, [c for c in config_columns(agg) if c not in axes])
    if extra:
        c = extra[0]
        values = sorted(agg[c].dropna().unique().tolist())
        raise InvalidInput(
            f"a heatmap cell holds one configuration but the frame varies {c!r}: filter it to "
            "one value or make it an axis (x / group_by)",
            field=c,
            allowed=values,
        )


def _grid(agg: pd.DataFrame, x: str, y: str, stat: str = "mean") -> Grid:
    xv, yv = plain_values(agg[x]), plain_values(agg[y])
    xs, ys = np.unique(xv), np.unique(yv)
    j, i = np.searchsorted(xs, xv), np.searchsorted(ys, yv)
    values = np.full((ys.size, xs.size), np.nan)  # (ny, nx)
    present = np.zeros((ys.size, xs.size), dtype=bool)
    values[i, j] = agg["mean"].to_numpy("float64")
    present[i, j] = True
    if present.sum() < len(agg):
        raise InvalidInput(f"several rows per ({y}, {x}) cell", field="frame")
    n_excluded = int(agg["n_excluded"].sum())
    return Grid(x, y, xs, ys, values, present, stat, n_excluded)


def theory_lines(theory: dict | None) -> dict[str, pd.DataFrame]:
    """The mean-field predictions, label → frame (x = the layer ℓ or the depth, value = the
    predicted value)."""
    out = {}
    for label, pair in (theory or {}).items():
        try:
            ell, gap = (np.asarray(a, dtype=float) for a in pair)
        except (TypeError, ValueError):
            raise InvalidInput(
                f"{label!r}: expected (x values, predicted values) arrays", field="theory"
            ) from None
        if ell.ndim != 1 or ell.shape != gap.shape:
            raise InvalidInput(
                f"{label!r}: x {ell.shape} and values {gap.shape} must be 1-D of one length",
                field="theory",
            )
        order = np.argsort(ell, kind="stable")
        out[str(label)] = pd.DataFrame({"x": ell[order], "value": gap[order]})
    return out


def theory_overlay_series(
    frame: pd.DataFrame,
    metric: str,
    *,
    x: str | None = None,
    group_by: str | None = None,
    epoch: int | None = None,
    layer: int | None = None,
    theory: dict | None = None,
    stat: str = "mean",
    band: str | None = None,
    nonfinite: str = "propagate",
) -> tuple[Lines, dict[str, pd.DataFrame]]:
    """A measured per-layer metric and its mean-field predictions, on one axis.

    x = "depth" (default when depth varies): the metric at `layer` (default ℓ = L) against depth;
    x = "layer": its profile against ℓ. `theory` gives each line's prediction at the same x
    values (service.plots.overlay computes them from service.theory.predict for a stored
    sweep). `epoch` defaults to the first recorded (initialization).
    """
    rows = metric_rows(frame, metric)
    predicted = theory_lines(theory)
    if rows.empty:
        return Lines({}, [], False, Pooling.of(stat, band, nonfinite)), predicted
    x = x or default_theory_x(rows)
    if x not in ("depth", "layer"):
        raise InvalidInput(f"unknown value {x!r}", field="x", allowed=("depth", "layer"))
    ep = resolve_epoch(rows, epoch, default="first")
    if x == "depth":
        measured = depth_scaling_series(
            rows, metric, x="depth", group_by=group_by, epoch=ep, layer=layer, stat=stat,
            band=band, nonfinite=nonfinite,
        )  # fmt: skip
    else:
        measured = layer_profile_series(
            rows, metric, group_by=group_by, epoch=ep, stat=stat, band=band, nonfinite=nonfinite
        )
    return measured, predicted


def heatmap_axes(x: str | None, group_by: str | None) -> tuple[str, str]:
    """A heatmap's (x, y) axes: x defaults to epoch, y (`group_by`) to layer, or to epoch when
    x is the layer."""
    x = x or "epoch"
    return x, group_by or ("epoch" if x == "layer" else "layer")


def default_theory_x(rows: pd.DataFrame) -> str:
    return "depth" if "depth" in rows.columns and rows["depth"].nunique() > 1 else "layer"
