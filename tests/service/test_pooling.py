"""Pooling seeds (service.plots.pooling) against closed forms, and the figures' pooling and axis
options: defaults that follow the field, forced scales, non-finite values excluded or propagated,
and the errors naming the option."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from service.errors import InvalidInput
from service.plots import PLOT_OPTIONS, build_figure, depth_scaling_series, heatmap_series
from service.plots.defaults import default_pooling, field_default, log_pooled
from service.plots.pooling import BANDS, STATS, median_ci_rank, pool, pool_seeds

T1 = stats.t.ppf(0.975, 1)  # two values: one degree of freedom


# --- closed forms ----------------------------------------------------------------------------


def test_geomean_of_1_and_100_is_10():
    assert pool([1.0, 100.0], stat="geomean")["mean"] == pytest.approx(10.0, rel=1e-14)


def test_median_of_1_2_100_is_2():
    assert pool([1.0, 2.0, 100.0], stat="median")["mean"] == 2.0
    assert pool([1.0, 2.0, 100.0, 200.0], stat="median")["mean"] == 51.0  # mid of the middle two


def test_mean_ci_is_the_t_interval():
    v = np.array([1.0, 2.0, 6.0])
    p = pool(v, stat="mean", band="ci")
    half = stats.t.ppf(0.975, 2) * v.std(ddof=1) / math.sqrt(3)
    assert p["mean"] == pytest.approx(3.0)
    assert (p["lo"], p["hi"]) == pytest.approx((3.0 - half, 3.0 + half), rel=1e-14)


@pytest.mark.parametrize(("a", "b"), [(0.0, 2.0), (-13.0, -9.0), (1.0, 1.5)])
def test_geomean_ci_is_symmetric_in_log_space_and_positive(a, b):
    p = pool([10.0**a, 10.0**b], stat="geomean", band="ci")
    centre = (a + b) / 2
    # logs a, b: mean (a+b)/2, sample sd |a−b|/√2, half-width t₀.₉₇₅,₁·sd/√2 = t·|a−b|/2
    half = T1 * abs(a - b) / 2
    assert math.log10(p["mean"]) == pytest.approx(centre, abs=1e-12)
    assert math.log10(p["lo"]) == pytest.approx(centre - half, abs=1e-12)
    assert math.log10(p["hi"]) == pytest.approx(centre + half, abs=1e-12)
    assert p["lo"] > 0  # an arithmetic t-interval of two seeds this far apart dips below 0
    assert pool([10.0**a, 10.0**b], stat="mean", band="ci")["lo"] < 0


def test_geomean_std_band_is_the_geometric_standard_deviation():
    v = np.array([1.0, 10.0, 1000.0])
    p = pool(v, stat="geomean", band="std")
    m, s = np.log(v).mean(), np.log(v).std(ddof=1)
    assert (p["mean"], p["lo"], p["hi"]) == pytest.approx(
        (math.exp(m), math.exp(m - s), math.exp(m + s)), rel=1e-13
    )


def test_iqr_band_is_the_quartiles():
    p = pool([5.0, 1.0, 4.0, 2.0, 3.0], stat="mean", band="iqr")
    assert (p["lo"], p["hi"]) == (2.0, 4.0)
    v = [1.0, 2.0, 4.0, 8.0]
    assert pool(v, stat="median", band="iqr")["lo"] == np.quantile(v, 0.25) == 1.75


def test_median_ci_is_the_order_statistic_interval():
    # coverage of [v₍ⱼ₎, v₍ₙ₊₁₋ⱼ₎] is 1 − 2·P(Bin(n, ½) ≤ j − 1): j is the largest with ≥ 95%
    def cover(k: int, n: int) -> float:
        return 1 - 2 * stats.binom.cdf(k - 1, n, 0.5)

    for n in range(1, 40):
        j = median_ci_rank(n)
        assert (j == 0 and cover(1, n) < 0.95) or (cover(j, n) >= 0.95 > cover(j + 1, n))
    assert [median_ci_rank(n) for n in (5, 6, 8, 9, 10)] == [0, 1, 1, 2, 2]
    p = pool(np.arange(10.0, 0.0, -1.0), stat="median", band="ci")
    assert (p["mean"], p["lo"], p["hi"]) == (5.5, 2.0, 9.0)  # j = 2: the 2nd and 9th values
    assert math.isnan(pool([1.0, 2.0, 3.0], stat="median", band="ci")["lo"])  # n ≤ 5: none


def test_band_none_and_one_value_have_no_band():
    p = pool([1.0, 2.0], band="none")
    assert p["mean"] == 1.5 and math.isnan(p["lo"]) and math.isnan(p["hi"])
    for stat in STATS:
        one = pool([4.0], stat=stat, band="ci" if stat != "median" else "iqr")
        assert one["mean"] == pytest.approx(4.0)
        if stat != "median":
            assert math.isnan(one["lo"])


# --- zeros, negatives and non-finite values --------------------------------------------------


def test_geomean_with_a_zero_is_zero_and_without_a_band():
    p = pool([0.0, 2.0, 8.0], stat="geomean")
    assert p["mean"] == 0.0 and p["n_excluded"] == 0  # ln 0 = −∞ takes part: not excluded
    assert math.isnan(p["lo"]) and math.isnan(p["hi"])


def test_geomean_of_a_negative_value_is_nan():
    assert math.isnan(pool([-1.0, 2.0], stat="geomean")["mean"])


@pytest.mark.parametrize("stat", STATS)
def test_exclude_drops_and_counts_nonfinite_values(stat):
    p = pool([1.0, 4.0, math.inf, math.nan, -math.inf], stat=stat, nonfinite="exclude")
    assert p["mean"] == pytest.approx({"mean": 2.5, "geomean": 2.0, "median": 2.5}[stat])
    assert (p["count"], p["n_finite"], p["n_excluded"]) == (5, 2, 3)
    none = pool([math.inf, math.nan], stat=stat, nonfinite="exclude")
    assert math.isnan(none["mean"]) and none["n_excluded"] == 2


def test_propagate_gives_inf_and_nan():
    p = pool([1.0, 2.0, math.inf], stat="mean", nonfinite="propagate")
    assert p["mean"] == math.inf and math.isnan(p["lo"]) and p["n_excluded"] == 0
    assert pool([1.0, 2.0, math.inf], stat="geomean")["mean"] == math.inf
    assert pool([1.0, 2.0, math.inf], stat="median")["mean"] == 2.0  # ordered like a number
    for stat in STATS:
        assert math.isnan(pool([1.0, 2.0, math.nan], stat=stat)["mean"])


def test_grouped_pooling_matches_numpy_point_by_point():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 9, size=40)  # 40 points of 1..8 seeds
    rows = pd.DataFrame(
        {
            "point": np.repeat(np.arange(40), n),
            "seed": np.concatenate([np.arange(k) for k in n]),
            "value": np.exp(rng.normal(0.0, 2.0, size=n.sum())),
        }
    )
    for stat in STATS:
        for band in BANDS:
            out = pool_seeds(rows, stat=stat, band=band).set_index("point")
            for point, part in rows.groupby("point"):
                v = part["value"].to_numpy()
                expect = pool(v, stat=stat, band=band)
                got = out.loc[point]
                for col in ("mean", "lo", "hi"):
                    assert got[col] == pytest.approx(expect[col], rel=1e-12, nan_ok=True)
            centre = {"mean": np.mean, "geomean": stats.gmean, "median": np.median}[stat]
            ref = rows.groupby("point")["value"].agg(centre).to_numpy()
            np.testing.assert_allclose(out["mean"].to_numpy(), ref, rtol=1e-12)


# --- the figures ------------------------------------------------------------------------------


def frame(values: dict[int, list[float]], metric: str = "grad_norm") -> pd.DataFrame:
    """depth → its seeds' values at layer 1, epoch 0, of `metric` (and train_loss = the same)."""
    rows = []
    tid = 0
    for depth, vs in values.items():
        for seed, v in enumerate(vs):
            tid += 1
            base = dict(trial_id=tid, depth=depth, seed=seed, epoch=0)
            rows.append(base | dict(metric=metric, layer=1, value=v))
            rows.append(base | dict(metric="train_loss", layer=None, value=v))
    f = pd.DataFrame(rows)
    f["layer"] = f["layer"].astype("Int64")
    return f


SEEDS = {2: [1.0, 100.0], 4: [2.0, 3.0], 8: [10.0, 1000.0]}


def _note(fig) -> str:
    return " ".join(ax.get_title(loc="left") for ax in fig.axes).replace("\n", " ")


def test_gradient_norm_against_depth_defaults_to_geomean_on_a_log_axis():
    fig = build_figure("depth_scaling", frame(SEEDS), metric="grad_norm")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"  # y spans less than two decades: auto would be linear
    (line,) = [ln for ln in ax.lines if ln.get_label() == "measured"]
    np.testing.assert_allclose(line.get_ydata(), [10.0, math.sqrt(6.0), 100.0], rtol=1e-12)
    assert "geometric mean and 95% CI (t-interval of log values) over 2 seeds" in _note(fig)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "95% CI (t-interval of log values) over seeds" in legend


def test_other_metrics_keep_the_mean_and_auto_axes():
    fig = build_figure("depth_scaling", frame(SEEDS), metric="train_loss")
    ax = fig.axes[0]
    (line,) = [ln for ln in ax.lines if ln.get_label() == "measured"]
    np.testing.assert_allclose(line.get_ydata(), [50.5, 2.5, 505.0])
    assert ax.get_yscale() == "log"  # auto: 2.5 .. 505 spans more than two decades
    assert "mean and 95% CI (t-interval) over 2 seeds" in _note(fig)


def test_yscale_log_is_forced_where_auto_draws_linear():
    f = frame({2: [1.0, 2.0], 4: [3.0, 4.0]})
    assert build_figure("depth_scaling", f, metric="train_loss").axes[0].get_yscale() == "linear"
    ax = build_figure("depth_scaling", f, metric="train_loss", yscale="log").axes[0]
    assert ax.get_yscale() == "log"
    ax = build_figure("depth_scaling", frame(SEEDS), metric="grad_norm", yscale="linear").axes[0]
    assert ax.get_yscale() == "linear"
    ax = build_figure("depth_scaling", f, metric="train_loss", xscale="log").axes[0]
    assert ax.get_xscale() == "log"


def test_defaults_follow_the_field():
    assert log_pooled("grad_norm") and log_pooled("isometry_gap/act")
    assert log_pooled("weight_isometry_gap") and log_pooled("head_grad_norm")
    assert not log_pooled("train_loss") and not log_pooled("test_acc")
    assert default_pooling("depth_scaling", "grad_norm") == {"stat": "geomean", "yscale": "log"}
    assert default_pooling("depth_scaling", "grad_norm", x="width")["stat"] == "mean"
    assert default_pooling("layer_profile", "isometry_gap/norm")["stat"] == "geomean"
    assert default_pooling("training_curves", "grad_norm") == {"stat": "mean", "yscale": "auto"}
    assert field_default("heatmap", "grad_norm") and not field_default("heatmap", "test_acc")
    assert set(PLOT_OPTIONS) == {"stat", "band", "nonfinite", "xscale", "yscale"}


def test_excluded_nonfinite_values_are_counted_in_the_figure():
    f = frame({2: [1.0, math.inf, 4.0], 4: [math.nan, 2.0, 8.0]})
    fig = build_figure("depth_scaling", f, metric="grad_norm", nonfinite="exclude")
    assert "2 non-finite values excluded" in _note(fig)
    (line,) = [ln for ln in fig.axes[0].lines if ln.get_label() == "measured"]
    np.testing.assert_allclose(line.get_ydata(), [2.0, 4.0], rtol=1e-12)
    lines = depth_scaling_series(f, "grad_norm", stat="geomean", nonfinite="exclude")
    assert lines.n_excluded == 2 and lines["measured"]["n_excluded"].tolist() == [1, 1]


def test_propagated_nonfinite_values_are_pinned_and_said():
    f = frame({2: [1.0, math.inf], 4: [2.0, 8.0]})
    fig = build_figure("depth_scaling", f, metric="grad_norm", nonfinite="propagate")
    ax = fig.axes[0]
    (pin,) = [ln for ln in ax.lines if ln.get_gid() == "nonfinite-posinf"]
    assert pin.get_xdata().tolist() == [2]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "geomean = +∞: 1 point (at the top edge)" in legend
    assert "1 non-finite value propagated" in _note(fig)


def test_a_zero_geomean_on_a_log_axis_is_pinned_at_the_bottom():
    f = frame({2: [0.0, 3.0], 4: [2.0, 8.0]})
    ax = build_figure("depth_scaling", f, metric="grad_norm").axes[0]
    (pin,) = [ln for ln in ax.lines if ln.get_gid() == "nonfinite-nonpos"]
    assert pin.get_xdata().tolist() == [2] and pin.get_ydata().tolist() == [0.0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "geomean ≤ 0 (log axis): 1 point (at the bottom edge)" in legend


def test_median_band_defaults_to_the_iqr():
    fig = build_figure("depth_scaling", frame(SEEDS), metric="grad_norm", stat="median")
    assert "median and inter-quartile range over 2 seeds" in _note(fig)


def test_heatmap_cells_pool_by_the_stat():
    f = frame(SEEDS)
    grid = heatmap_series(f, "grad_norm", x="depth", y="epoch", stat="geomean")
    np.testing.assert_allclose(grid.values[0], [10.0, math.sqrt(6.0), 100.0], rtol=1e-12)
    fig = build_figure("heatmap", f, metric="grad_norm", x="depth", group_by="epoch")
    assert "cell = geometric mean over seeds" in _note(fig)
    fig = build_figure("heatmap", f, metric="grad_norm", x="depth", group_by="epoch", stat="mean")
    assert "cell = mean over seeds" in _note(fig)


@pytest.mark.parametrize(
    ("kwargs", "field", "suggestion"),
    [
        (dict(stat="geomaen"), "stat", "geomean"),
        (dict(band="iqrr"), "band", "iqr"),
        (dict(nonfinite="exclud"), "nonfinite", "exclude"),
        (dict(yscale="logg"), "yscale", "log"),
        (dict(xscale="sqrt"), "xscale", None),
    ],
)
def test_an_unknown_option_value_names_the_option(kwargs, field, suggestion):
    with pytest.raises(InvalidInput) as info:
        build_figure("depth_scaling", frame(SEEDS), metric="grad_norm", **kwargs)
    err = info.value
    assert err.field == field and err.allowed == list(PLOT_OPTIONS[field])
    assert err.suggestion == suggestion
    if suggestion:
        assert f"did you mean {suggestion!r}?" in err.message


def test_a_heatmap_takes_no_band_or_scale():
    for name, value in (("band", "none"), ("yscale", "log")):
        with pytest.raises(InvalidInput) as info:
            build_figure(
                "heatmap", frame(SEEDS), metric="grad_norm", x="depth", group_by="epoch",
                **{name: value},
            )  # fmt: skip
        assert info.value.field == name and "stat" in info.value.allowed
