"""Operations on tidy metric frames (one row per trial, epoch, metric, layer; see
docs/architecture.md), shared by the store's reads, the plots and the API."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import stdtrit  # the t quantile; scipy.stats costs ~0.4 s to import

AGGREGATE_COLUMNS = ("mean", "std", "ci95", "count", "n_finite")


def aggregate_over_seeds(frame: pd.DataFrame) -> pd.DataFrame:
    """Pool the seeds of each configuration: mean, std (ddof=1), ci95, count and n_finite.

    `ci95` is the half-width of the 95% Student-t interval, t_{0.975, n−1}·std/√n (NaN for n < 2).
    Non-finite values take part as what they are: one +inf seed makes the mean +inf, one NaN
    makes it NaN; `n_finite` says how many seeds were finite.
    """
    keys = [c for c in frame.columns if c not in ("trial_id", "seed", "value")]
    if frame.empty:
        return pd.DataFrame(columns=[*keys, *AGGREGATE_COLUMNS])
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
    out["mean"], out["std"], out["ci95"], out["count"] = mean, std, t * std / np.sqrt(n), n
    out["n_finite"] = np.bincount(g, weights=np.isfinite(v)).astype("int64")
    return out
