"""Operations on tidy metric frames (one row per trial, epoch, metric, layer; see
docs/architecture.md), shared by the store's reads, the plots and the API."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import stdtrit  # the t quantile; scipy.stats costs ~0.4 s to import

from service.errors import InvalidInput

AGGREGATE_COLUMNS = ("mean", "std", "ci95", "count", "n_finite")
STATS = ("mean", "geomean", "median")  # the pooled value: as the plots' `stat` (docs/api.md)


def check_stat(stat: str, aggregate: bool) -> None:
    """`stat` names the pooled value of an aggregate read.

    Raises:
        InvalidInput: field `stat`: not one of STATS, or asked of raw rows (no aggregate).
    """
    if stat not in STATS:
        raise InvalidInput(f"stat {stat!r} is not one of {', '.join(STATS)}", field="stat")
    if stat != "mean" and not aggregate:
        raise InvalidInput(
            f"stat={stat} pools the seeds: add aggregate=true (raw rows have no statistic)",
            field="stat",
        )


def aggregate_over_seeds(frame: pd.DataFrame, stat: str = "mean") -> pd.DataFrame:
    """Pool the seeds of each configuration: mean, std (ddof=1), ci95, count and n_finite, and
    with stat "geomean" or "median" a column of that name after `mean`.

    `ci95` is the half-width of the 95% Student-t interval, t_{0.975, n−1}·std/√n (NaN for n < 2).
    Non-finite values take part as what they are: one +inf seed makes the mean +inf, one NaN
    makes it NaN (and the median, which orders ±inf like numbers); `n_finite` says how many seeds
    were finite. The geometric mean is exp(mean ln v): 0 where a seed is 0, NaN where one is
    negative (no logarithm) — as the plots pool (service.plots.pooling).
    """
    keys = [c for c in frame.columns if c not in ("trial_id", "seed", "value")]
    extra = [stat] if stat != "mean" else []
    if frame.empty:
        return pd.DataFrame(columns=[*keys, *AGGREGATE_COLUMNS[:1], *extra, *AGGREGATE_COLUMNS[1:]])
    groups = frame.groupby(keys, dropna=False, sort=True)
    g = groups.ngroup().to_numpy()  # (rows,) group index, in the order of groups.size()
    v = frame["value"].to_numpy("float64")
    # Sums by group (bincount) rather than per-group Python: NaN and ±inf propagate as in np.mean
    n = np.bincount(g)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(g, weights=v) / n
        dev = v - mean[g]  # NaN where the mean is ±inf, so such a group's std is NaN
        var = np.bincount(g, weights=dev * dev) / np.maximum(n - 1, 1)
        std = np.where(n > 1, np.sqrt(var), np.nan)
        t = np.where(n > 1, stdtrit(np.maximum(n - 1, 1), 0.975), np.nan)
    out = groups.size().reset_index()[keys]
    for k in keys:  # a missing key (a parameter another model lacks) stays None, not NaN
        if frame[k].dtype == object:
            out[k] = out[k].astype(object).where(out[k].notna(), None)
    out["mean"], out["std"], out["ci95"], out["count"] = mean, std, t * std / np.sqrt(n), n
    out["n_finite"] = np.bincount(g, weights=np.isfinite(v)).astype("int64")
    if stat == "median":
        out.insert(len(keys) + 1, "median", groups["value"].median(skipna=False).to_numpy())
    elif stat == "geomean":
        with np.errstate(invalid="ignore", divide="ignore"):
            logs = pd.Series(np.log(v), index=frame.index).groupby(g).mean(skipna=False)
        out.insert(len(keys) + 1, "geomean", np.exp(logs.to_numpy()))
    return out
