import math

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
