"""Operations on tidy metric frames (one row per trial, epoch, metric, layer; see
docs/architecture.md), shared by the store's reads, the plots and the API."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

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
    values = frame["value"].astype("float64")
    work = frame[keys].assign(value=values, finite=np.isfinite(values.to_numpy()).astype("int64"))
    grouped = work.groupby(keys, dropna=False, sort=True)
    with np.errstate(invalid="ignore"):
        out = grouped["value"].agg(
            mean=lambda v: float(np.mean(v.to_numpy())),
            std=lambda v: float(np.std(v.to_numpy(), ddof=1)) if len(v) > 1 else np.nan,
            count="size",
        )
    out["n_finite"] = grouped["finite"].sum()
    n = out["count"].to_numpy()
    t = np.where(n > 1, stats.t.ppf(0.975, np.maximum(n - 1, 1)), np.nan)
    out["ci95"] = t * out["std"].to_numpy() / np.sqrt(n)
    return out.reset_index()[[*keys, *AGGREGATE_COLUMNS]]
