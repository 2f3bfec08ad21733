"""How a plot pools the seeds of one point: the statistic, its band, and non-finite values.

    pool_seeds(rows, stat="geomean", band="ci", nonfinite="exclude") -> frame

Options (docs/api.md, "Pooling and axes"):

- `stat`: "mean" (arithmetic), "geomean" (exp of the mean of ln v: the mean a log axis shows,
  the docs' mean log₁₀ tables exponentiated) or "median".
- `band`: "ci" (95%; for mean the Student-t interval m ± t₀.₉₇₅,ₙ₋₁·s/√n; for geomean the same
  interval of ln v, exponentiated, so it is positive and symmetric on a log axis; for median the
  distribution-free interval of order statistics [v₍ⱼ₎, v₍ₙ₊₁₋ⱼ₎] with the largest j whose
  binomial coverage 1 − 2·P(Bin(n, ½) ≤ j − 1) is at least 95%, none for n ≤ 5), "std" (m ± s;
  for geomean exp(mean ln v ± sd ln v), the geometric standard deviation), "iqr" (the 25% and
  75% quantiles, linear interpolation; of ln v for geomean) or "none". NaN where it is
  undefined (one value, or a non-finite pooled value).
- `nonfinite`: "propagate" (the values take part as what they are: one +∞ seed makes a mean +∞,
  one NaN makes any statistic NaN; a median orders ±∞ like numbers) or "exclude" (a point's
  NaN and ±∞ values are dropped and counted in `n_excluded`; a point with none finite is NaN).

The geometric mean of values that include 0 is 0: ln 0 = −∞ takes part like any value (it is a
finite value, not excluded), its band is then undefined (NaN). A negative value has no logarithm:
the point's geometric mean is NaN (not excluded: it is finite; choose mean or median).
Pure numpy/pandas, vectorized over points (no Python loop per point).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pandas as pd
from scipy import stats

STATS: tuple[str, ...] = ("mean", "geomean", "median")
BANDS: tuple[str, ...] = ("ci", "std", "iqr", "none")
NONFINITE: tuple[str, ...] = ("propagate", "exclude")
SCALES: tuple[str, ...] = ("auto", "log", "linear")
POOLED_COLUMNS = ("mean", "lo", "hi", "count", "n_finite", "n_excluded")

STAT_TEXT = {"mean": "mean", "geomean": "geometric mean", "median": "median"}
BAND_TEXT = {
    ("mean", "ci"): "95% CI (t-interval)",
    ("geomean", "ci"): "95% CI (t-interval of log values)",
    ("median", "ci"): "95% CI of the median (order statistics)",
    ("mean", "std"): "± 1 std",
    ("geomean", "std"): "×/÷ geometric std",
    ("median", "std"): "± 1 std",
    ("mean", "iqr"): "inter-quartile range",
    ("geomean", "iqr"): "inter-quartile range",
    ("median", "iqr"): "inter-quartile range",
}


def default_band(stat: str) -> str:
    """The band a statistic gets unless one is asked for: its CI; the median's spread."""
    return "iqr" if stat == "median" else "ci"


def pool_seeds(
    rows: pd.DataFrame, *, stat: str = "mean", band: str = "ci", nonfinite: str = "propagate"
) -> pd.DataFrame:
    """Pool the seeds of each configuration point (every column but trial_id, seed, value).

    Returns one row per point: its keys, then `mean` (the pooled value, whatever `stat` is),
    `lo`, `hi` (the band; NaN where undefined or band="none"), `count` (values), `n_finite`
    and `n_excluded` (non-finite values dropped: 0 unless nonfinite="exclude").
    """
    keys = [c for c in rows.columns if c not in ("trial_id", "seed", "value")]
    if rows.empty:
        return pd.DataFrame(columns=[*keys, *POOLED_COLUMNS])
    groups = rows.groupby(keys, dropna=False, sort=True)
    g = groups.ngroup().to_numpy()  # (rows,) point index
    v = rows["value"].to_numpy("float64")  # (rows,)
    out = groups.size().reset_index()[keys]
    pooled = pool_groups(g, v, len(out), stat=stat, band=band, nonfinite=nonfinite)
    for name in POOLED_COLUMNS:
        out[name] = pooled[name]
    return out


def pool(values, *, stat: str = "mean", band: str = "ci", nonfinite: str = "propagate") -> dict:
    """One point's pooled value: {mean, lo, hi, count, n_finite, n_excluded} of `values`."""
    v = np.asarray(values, dtype=np.float64).ravel()
    pooled = pool_groups(np.zeros(v.size, dtype=np.int64), v, 1, stat=stat, band=band,
                         nonfinite=nonfinite)  # fmt: skip
    return {k: (int(a[0]) if a.dtype.kind == "i" else float(a[0])) for k, a in pooled.items()}


def pool_groups(
    g: np.ndarray, v: np.ndarray, n_groups: int, *, stat: str, band: str, nonfinite: str
) -> dict[str, np.ndarray]:
    """The pooled columns of values v (rows,) in groups g (rows,) ∈ 0..n_groups−1."""
    finite = np.isfinite(v)
    count = np.bincount(g, minlength=n_groups)
    n_finite = np.bincount(g, weights=finite, minlength=n_groups).astype(np.int64)
    keep = finite if nonfinite == "exclude" else np.ones(v.size, dtype=bool)
    g, v = g[keep], v[keep]
    n = np.bincount(g, minlength=n_groups)  # (groups,) values pooled
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.log(v) if stat == "geomean" else v  # ln 0 = −∞; ln of a negative = NaN
        if stat == "median":
            center = _quantiles(g, w, n, 0.5)
            lo, hi = _median_band(g, w, n, band)
        else:
            center, lo, hi = _moment_band(g, w, n, band)
        if stat == "geomean":
            center, lo, hi = np.exp(center), np.exp(lo), np.exp(hi)
    nan_in = np.bincount(g, weights=np.isnan(w), minlength=n_groups) > 0
    center = np.where(nan_in | (n == 0), np.nan, center)  # NaN is NaN under every statistic
    ok = np.isfinite(center)
    if band == "none":
        ok[:] = False
    return {
        "mean": center,
        "lo": np.where(ok, lo, np.nan),
        "hi": np.where(ok, hi, np.nan),
        "count": count.astype(np.int64),
        "n_finite": n_finite,
        "n_excluded": (count - n).astype(np.int64),
    }


def _moment_band(g, w, n, band) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean of w per group and its band in w's units (ci, std, iqr)."""
    center = np.bincount(g, weights=w, minlength=n.size) / n  # ±∞ and NaN propagate
    dev = w - center[g]  # NaN where the mean is ±∞: that group's spread is undefined
    var = np.bincount(g, weights=dev * dev, minlength=n.size) / np.maximum(n - 1, 1)
    sd = np.where(n > 1, np.sqrt(var), np.nan)
    if band == "ci":
        half = t_quantile(n) * sd / np.sqrt(n)
        return center, center - half, center + half
    if band == "std":
        return center, center - sd, center + sd
    if band == "iqr":
        return center, _quantiles(g, w, n, 0.25), _quantiles(g, w, n, 0.75)
    return center, np.full(n.size, np.nan), np.full(n.size, np.nan)


def t_quantile(n: np.ndarray) -> np.ndarray:
    """t₀.₉₇₅ with n − 1 degrees of freedom (NaN for n < 2)."""
    return np.where(n > 1, stats.t.ppf(0.975, np.maximum(n - 1, 1)), np.nan)


def _median_band(g, w, n, band) -> tuple[np.ndarray, np.ndarray]:
    if band == "ci":
        a, start = _sorted(g, w, n)
        sizes, inverse = np.unique(n, return_inverse=True)
        j = np.array([median_ci_rank(int(k)) for k in sizes], dtype=np.int64)[inverse]  # 0: none
        has = j > 0
        lo_i = np.where(has, start + j - 1, 0)
        hi_i = np.where(has, start + n - j, 0)
        if a.size == 0:
            return np.full(n.size, np.nan), np.full(n.size, np.nan)
        return np.where(has, a[lo_i], np.nan), np.where(has, a[hi_i], np.nan)
    if band == "iqr":
        return _quantiles(g, w, n, 0.25), _quantiles(g, w, n, 0.75)
    if band == "std":
        center, lo, hi = _moment_band(g, w, n, "std")
        med = _quantiles(g, w, n, 0.5)
        return med - (center - lo), med + (hi - center)
    return np.full(n.size, np.nan), np.full(n.size, np.nan)


@cache
def median_ci_rank(n: int) -> int:
    """The largest j ≥ 1 with P(v₍ⱼ₎ ≤ median ≤ v₍ₙ₊₁₋ⱼ₎) = 1 − 2·P(Bin(n, ½) ≤ j − 1) ≥ 0.95;
    0 when no such j (n ≤ 5)."""
    best = 0
    for j in range(1, n // 2 + 1):
        if 1.0 - 2.0 * stats.binom.cdf(j - 1, n, 0.5) >= 0.95:
            best = j
        else:
            break
    return best


def _sorted(g, w, n) -> tuple[np.ndarray, np.ndarray]:
    """w sorted by (group, value), NaN last in its group, and each group's start offset."""
    order = np.lexsort((w, g))
    start = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
    return w[order], start


def _quantiles(g, w, n, q: float) -> np.ndarray:
    """The q-quantile of each group (linear interpolation, as numpy's default); NaN for an empty
    group. ±∞ take part as ordered values; a NaN group is made NaN by the caller."""
    a, start = _sorted(g, w, n)
    out = np.full(n.size, np.nan)
    has = n > 0
    if not has.any():
        return out
    pos = q * (n[has] - 1)  # (groups with values,)
    k = np.floor(pos).astype(np.int64)
    frac = pos - k
    base = start[has] + k
    below = a[base]
    above = a[np.minimum(base + 1, start[has] + n[has] - 1)]
    with np.errstate(invalid="ignore"):
        mixed = below + frac * (above - below)
    out[has] = np.where(frac == 0, below, np.where(above == below, below, mixed))
    return out
