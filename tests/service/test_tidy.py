import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from service.tidy import aggregate_over_seeds


def _frame(values_by_depth):
    rows = []
    tid = 0
    for depth, values in values_by_depth.items():
        for seed, v in enumerate(values):
            tid += 1
            rows.append(
                dict(
                    trial_id=tid,
                    depth=depth,
                    seed=seed,
                    epoch=0,
                    metric="grad_norm",
                    layer=1,
                    value=v,
                )
            )
    f = pd.DataFrame(rows)
    f["layer"] = f["layer"].astype("Int64")
    return f


def test_mean_std_and_t_interval():
    agg = aggregate_over_seeds(_frame({10: [1.0, 2.0, 3.0, 6.0]}))
    row = agg.iloc[0]
    assert row["mean"] == 3.0
    assert row["std"] == pytest.approx(math.sqrt(14 / 3))  # Σ(x−3)² = 4+1+0+9 over n−1 = 3
    assert row["ci95"] == pytest.approx(stats.t.ppf(0.975, 3) * math.sqrt(14 / 3) / 2)
    assert (row["count"], row["n_finite"]) == (4, 4)
    assert "seed" not in agg.columns and "trial_id" not in agg.columns


def test_nonfinite_values_propagate_and_are_counted():
    agg = aggregate_over_seeds(_frame({10: [1.0, math.inf], 20: [1.0, math.nan], 30: [5.0]}))
    by_depth = agg.set_index("depth")
    assert by_depth.loc[10, "mean"] == math.inf and by_depth.loc[10, "n_finite"] == 1
    assert np.isnan(by_depth.loc[20, "mean"]) and by_depth.loc[20, "n_finite"] == 1
    assert by_depth.loc[30, "mean"] == 5.0 and np.isnan(by_depth.loc[30, "ci95"])


def test_empty_frame():
    cols = ["trial_id", "depth", "seed", "epoch", "metric", "layer", "value"]
    empty = pd.DataFrame(columns=cols)
    assert list(aggregate_over_seeds(empty).columns)[-5:] == [
        "mean",
        "std",
        "ci95",
        "count",
        "n_finite",
    ]


def test_matches_numpy_group_by_group_on_random_data():
    rng = np.random.default_rng(0)
    values = rng.lognormal(size=600)
    values[rng.choice(600, 12, replace=False)] = rng.choice([np.inf, -np.inf, np.nan], 12)
    frame = pd.DataFrame(
        {
            "trial_id": np.arange(600),
            "depth": rng.choice([5, 50], 600),
            "seed": rng.integers(0, 5, 600),
            "epoch": 0,
            "metric": "grad_norm",
            "layer": pd.array(rng.integers(1, 30, 600), dtype="Int64"),
            "value": values,
        }
    )
    agg = aggregate_over_seeds(frame)
    for row in agg.itertuples():
        v = frame.loc[(frame.depth == row.depth) & (frame.layer == row.layer), "value"].to_numpy()
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(row.mean, np.mean(v), rtol=1e-12)
            std = np.std(v, ddof=1) if len(v) > 1 else np.nan
        np.testing.assert_allclose(row.std, std, rtol=1e-9)
        assert row.count == len(v) and row.n_finite == np.isfinite(v).sum()


def test_t_interval_matches_scipy_stats_for_every_group_size():
    sizes = [*range(2, 12), 30, 100]
    frame = _frame({n: [float(k * k) for k in range(n)] for n in sizes})
    by_depth = aggregate_over_seeds(frame).set_index("depth")
    for n in sizes:
        std = by_depth.loc[n, "std"]
        expected = stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)
        assert by_depth.loc[n, "ci95"] == pytest.approx(expected, rel=1e-13)


def test_importing_tidy_does_not_import_scipy_stats():
    code = "import sys, service.tidy; print('scipy.stats' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_geomean_and_median_columns_pool_each_configuration():
    """stat=geomean: exp(mean ln v) (the mean a log axis shows: 1, 4, 16 → 4); stat=median:
    the middle seed; 0 makes the geomean 0, a negative seed NaN (no log), NaN propagates."""
    frame = _frame(
        {2: [1.0, 4.0, 16.0], 4: [0.0, 2.0, 8.0], 8: [-1.0, 2.0, 3.0], 16: [1.0, np.nan, 2.0]}
    )
    geo = aggregate_over_seeds(frame, "geomean").set_index("depth")
    med = aggregate_over_seeds(frame, "median").set_index("depth")
    assert list(geo.columns[-6:]) == ["mean", "geomean", "std", "ci95", "count", "n_finite"]
    assert geo.loc[2, "geomean"] == pytest.approx(4.0, rel=1e-15)
    assert geo.loc[4, "geomean"] == 0.0
    assert math.isnan(geo.loc[8, "geomean"]) and math.isnan(geo.loc[16, "geomean"])
    assert (
        med.loc[2, "median"] == 4.0 and med.loc[4, "median"] == 2.0 and med.loc[8, "median"] == 2.0
    )
    assert math.isnan(med.loc[16, "median"])
    assert list(aggregate_over_seeds(frame, "mean").columns[-5:]) == [
        "mean", "std", "ci95", "count", "n_finite"
    ]  # fmt: skip
    assert list(aggregate_over_seeds(frame.iloc[:0], "median").columns)[-6:-4] == ["mean", "median"]


def test_the_pooled_statistic_is_checked_by_name():
    from service.errors import InvalidInput
    from service.tidy import check_stat

    for stat, aggregate in (("mode", True), ("median", False)):
        with pytest.raises(InvalidInput) as info:
            check_stat(stat, aggregate)
        assert info.value.field == "stat"
    check_stat("mean", False)
    check_stat("geomean", True)
