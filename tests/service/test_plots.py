"""Plots: the numbers each kind draws (checked against the aggregation's mathematics on a
hand-built frame), the drawing (valid PNG/SVG, non-finite markers), and the errors."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest
from matplotlib import colors as mcolors
from scipy import stats

from service.config import METRICS
from service.errors import InvalidInput
from service.plots import (
    GAP_METRICS,
    METRIC_LABELS,
    PLOT_KINDS,
    build_figure,
    depth_scaling_series,
    field_label,
    heatmap_axes,
    heatmap_series,
    layer_profile_series,
    memo,
    render,
    theory_overlay_series,
    training_curves_series,
    wants_log,
)
from service.plots.series import epoch_subset

DEPTHS = (2, 20)
SLOPE = {"gaussian": 3.0, "orthogonal": 1.0}  # per-depth slope of the seed mean
SPREAD = {"gaussian": 1.0, "orthogonal": 2.0}  # the seeds sit at mean − s, mean, mean + s
T = stats.t.ppf(0.975, 2)  # 3 seeds: t quantile with n − 1 = 2 degrees of freedom


def grad_mean(depth: int, init: str, epoch: int, layer: int) -> float:
    return SLOPE[init] * depth + layer + 100 * epoch


def loss_mean(init: str, epoch: int) -> float:
    return 2.0 - 0.1 * epoch - (0.5 if init == "orthogonal" else 0.0)


def hand_frame() -> pd.DataFrame:
    """2 depths × 2 inits × 3 seeds, epochs 0 and 5; grad_norm per layer and a scalar loss.

    Seed k ∈ {0, 1, 2} adds (k − 1)·s, so over seeds mean = the formula and sample std = s
    exactly, and the 95% half-width is t_{0.975,2}·s/√3.
    """
    rows, tid = [], 0
    for depth in DEPTHS:
        for init in SLOPE:
            for seed in range(3):
                tid += 1
                dev = (seed - 1) * SPREAD[init]
                base = dict(trial_id=tid, depth=depth, init=init, seed=seed)
                for epoch in (0, 5):
                    for ell in range(1, depth + 1):
                        v = grad_mean(depth, init, epoch, ell) + dev
                        rows.append(
                            base | dict(epoch=epoch, metric="grad_norm", layer=ell, value=v)
                        )
                    v = loss_mean(init, epoch) + 0.1 * dev
                    rows.append(base | dict(epoch=epoch, metric="train_loss", layer=None, value=v))
    frame = pd.DataFrame(rows)
    frame["layer"] = frame["layer"].astype("Int64")
    return frame


def gaps(frame: pd.DataFrame, name: str = "isometry_gap/act") -> pd.DataFrame:
    """The grad_norm rows renamed as an isometry gap metric (for theory_overlay)."""
    return frame[frame["metric"] == "grad_norm"].assign(metric=name)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return hand_frame()


def half_width(init: str, scale: float = 1.0) -> float:
    return T * scale * SPREAD[init] / math.sqrt(3)


def assert_line(line: pd.DataFrame, xs, means, hw: float) -> None:
    np.testing.assert_array_equal(line["x"].to_numpy(), xs)
    np.testing.assert_allclose(line["mean"], means, rtol=0, atol=1e-12)
    np.testing.assert_allclose(line["lo"], np.asarray(means) - hw, rtol=1e-12)
    np.testing.assert_allclose(line["hi"], np.asarray(means) + hw, rtol=1e-12)
    assert (line["count"] == 3).all() and (line["n_finite"] == 3).all()


# --- series: the plotted numbers ------------------------------------------------------------


def test_depth_scaling_defaults_to_last_layer_and_last_epoch(frame):
    lines = depth_scaling_series(frame, "grad_norm", group_by="init")
    assert list(lines) == ["gaussian", "orthogonal"] and lines.by == ["init"]
    for init in SLOPE:
        means = [grad_mean(L, init, epoch=5, layer=L) for L in DEPTHS]  # ℓ = L of each depth
        assert_line(lines[init], DEPTHS, means, half_width(init))


@pytest.mark.parametrize(("layer", "ell"), [(1, lambda L: 1), (-2, lambda L: L - 1)])
def test_depth_scaling_at_a_chosen_layer_and_epoch(frame, layer, ell):
    lines = depth_scaling_series(frame, "grad_norm", group_by="init", epoch=0, layer=layer)
    for init in SLOPE:
        means = [grad_mean(L, init, epoch=0, layer=ell(L)) for L in DEPTHS]
        assert_line(lines[init], DEPTHS, means, half_width(init))


def test_depth_scaling_of_a_scalar_metric_ignores_layers(frame):
    lines = depth_scaling_series(frame, "train_loss", epoch=5)
    assert lines.by == ["init"]  # the only other varying field becomes the line key
    for init in SLOPE:
        assert_line(lines[init], DEPTHS, [loss_mean(init, 5)] * 2, half_width(init, 0.1))


def test_layer_profile_lines_per_configuration(frame):
    lines = layer_profile_series(frame, "grad_norm", group_by="init", epoch=0)
    # depth also varies, so it joins the key: no two configurations share a line
    assert lines.by == ["init", "depth"]
    assert list(lines) == ["gaussian, 2", "gaussian, 20", "orthogonal, 2", "orthogonal, 20"]
    ells = np.arange(1, 21)
    assert_line(
        lines["orthogonal, 20"],
        ells,
        grad_mean(20, "orthogonal", 0, ells),
        half_width("orthogonal"),
    )


def test_layer_profile_of_one_configuration_has_a_line_per_epoch(frame):
    one = frame[(frame["depth"] == 2) & (frame["init"] == "gaussian")]
    lines = layer_profile_series(one, "grad_norm")
    assert lines.by == ["epoch"] and lines.ordered and list(lines) == ["0", "5"]
    for epoch in (0, 5):
        means = [grad_mean(2, "gaussian", epoch, ell) for ell in (1, 2)]
        assert_line(lines[str(epoch)], [1, 2], means, half_width("gaussian"))


def test_epoch_subset_keeps_first_last_and_spacing():
    assert epoch_subset(np.arange(0, 101, 10)).tolist() == [0, 10, 30, 40, 60, 70, 90, 100]
    assert epoch_subset(np.array([5, 0, 5, 3])).tolist() == [0, 3, 5]


def test_training_curves_over_epochs(frame):
    lines = training_curves_series(frame, "train_loss", group_by="init")
    assert list(lines) == ["gaussian, 2", "gaussian, 20", "orthogonal, 2", "orthogonal, 20"]
    for init in SLOPE:
        means = [loss_mean(init, 0), loss_mean(init, 5)]
        assert_line(lines[f"{init}, 20"], [0, 5], means, half_width(init, 0.1))
    first = training_curves_series(frame, "grad_norm", group_by="init", layer=1)
    assert_line(first["gaussian, 2"], [0, 5], [7.0, 507.0], half_width("gaussian"))


def test_heatmap_over_two_swept_fields(frame):
    grid = heatmap_series(frame, "grad_norm", x="depth", y="init", epoch=0, layer=1)
    assert grid.xs.tolist() == [2, 20] and grid.ys.tolist() == ["gaussian", "orthogonal"]
    expected = [[grad_mean(L, init, 0, 1) for L in DEPTHS] for init in SLOPE]  # (ny, nx)
    np.testing.assert_allclose(grid.values, expected, atol=1e-12)
    assert grid.present.all()


def test_heatmap_layer_by_epoch_and_holes(frame):
    one = frame[(frame["depth"] == 20) & (frame["init"] == "orthogonal")]
    grid = heatmap_series(one, "grad_norm")  # x = epoch, y = layer
    ells = np.arange(1, 21)
    assert grid.xs.tolist() == [0, 5] and grid.ys.tolist() == ells.tolist()
    expected = np.stack([grad_mean(20, "orthogonal", e, ells) for e in (0, 5)], axis=1)
    np.testing.assert_allclose(grid.values, expected, atol=1e-12)
    # layers × depth: a depth-2 network has no layer 3..20, which is a hole, not a NaN value
    holes = heatmap_series(frame[frame["init"] == "gaussian"], "grad_norm", x="depth", epoch=0)
    assert holes.present[:2].all() and not holes.present[2:, 0].any() and holes.present[:, 1].all()


def test_theory_series_sorted_and_beside_measured(frame):
    theory = {"gaussian": ([3, 1, 2], [0.3, 0.1, 0.2])}
    measured, predicted = theory_overlay_series(
        gaps(frame), "isometry_gap/act", group_by="init", theory=theory
    )
    assert predicted["gaussian"]["x"].tolist() == [1, 2, 3]
    assert predicted["gaussian"]["value"].tolist() == [0.1, 0.2, 0.3]
    # default x = depth at the last layer, and the first epoch (the untrained network)
    means = [grad_mean(L, "gaussian", epoch=0, layer=L) for L in DEPTHS]
    assert_line(measured["gaussian"], DEPTHS, means, half_width("gaussian"))


def test_theory_overlay_against_layers(frame):
    one = gaps(frame[(frame["depth"] == 2) & (frame["init"] == "orthogonal")])
    measured, predicted = theory_overlay_series(one, "isometry_gap/act", x="layer")
    assert predicted == {} and list(measured) == ["0"]  # the first epoch, per layer
    means = [grad_mean(2, "orthogonal", 0, ell) for ell in (1, 2)]
    assert_line(measured["0"], [1, 2], means, half_width("orthogonal"))


# --- non-finite values ----------------------------------------------------------------------


def with_value(frame, value, *, depth=20, init="gaussian", seed=0, layer=20, epoch=5):
    out = frame.copy()
    hit = (
        (out["depth"] == depth) & (out["init"] == init) & (out["seed"] == seed)
        & (out["layer"] == layer) & (out["epoch"] == epoch) & (out["metric"] == "grad_norm")
    )  # fmt: skip
    assert hit.sum() == 1
    out.loc[hit, "value"] = value
    return out


def test_nonfinite_seed_makes_the_mean_nonfinite_and_is_counted(frame):
    lines = depth_scaling_series(with_value(frame, math.inf), "grad_norm", group_by="init")
    row = lines["gaussian"].iloc[1]  # depth 20
    assert row["mean"] == math.inf and (row["count"], row["n_finite"]) == (3, 2)
    assert math.isnan(row["lo"]) and math.isnan(row["hi"])
    nan_lines = depth_scaling_series(with_value(frame, math.nan), "grad_norm", group_by="init")
    assert math.isnan(nan_lines["gaussian"]["mean"].iloc[1])


def _pins(ax, gid):
    return [line for line in ax.lines if line.get_gid() == gid]


def test_nonfinite_points_are_pinned_and_explained(frame):
    f = with_value(with_value(frame, math.inf), math.nan, init="orthogonal", depth=2, layer=2)
    fig = build_figure("depth_scaling", f, metric="grad_norm", group_by="init", stat="mean")
    ax = fig.axes[0]
    (up,) = _pins(ax, "nonfinite-posinf")
    assert up.get_xdata().tolist() == [20] and up.get_ydata().tolist() == [1.0]  # top edge
    assert up.get_marker() == "^"
    (nan,) = _pins(ax, "nonfinite-nan")
    assert nan.get_xdata().tolist() == [2] and nan.get_ydata()[0] < 0.1  # at the bottom
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "mean = +∞: 1 point (at the top edge)" in legend
    assert "mean = NaN: 1 point (at the bottom)" in legend
    # the finite points are still drawn, at their means
    (g,) = [line for line in ax.lines if line.get_label() == "gaussian"]
    assert g.get_ydata()[0] == grad_mean(2, "gaussian", 5, 2) and np.isnan(g.get_ydata()[1])
    (o,) = [line for line in ax.lines if line.get_label() == "orthogonal"]
    assert o.get_ydata()[1] == grad_mean(20, "orthogonal", 5, 20)


def test_nonfinite_markers_reach_the_svg(frame):
    svg = render(
        "layer_profile",
        with_value(frame, -math.inf),
        metric="grad_norm",
        fmt="svg",
        group_by="init",
        stat="mean",
    )  # fmt: skip  (−∞ has no log: geomean is NaN)
    text = svg.decode()
    assert 'id="nonfinite-neginf' in text and "−∞" in text
    assert "nonfinite-posinf" not in text and "nonfinite-nan" not in text


def test_heatmap_colours_nonfinite_cells(frame):
    one = with_value(frame, math.inf, layer=3)
    one = one[(one["depth"] == 20) & (one["init"] == "gaussian")]
    fig = build_figure("heatmap", one, metric="grad_norm")
    ax = fig.axes[0]
    data, overlay = ax.images
    assert overlay.get_gid() == "nonfinite-cells"
    rgba = overlay.get_array()  # (layer, epoch, 4)
    assert tuple(rgba[2, 1]) == mcolors.to_rgba("#d62728")  # layer 3 (row 2), epoch 5 (col 1)
    assert rgba[..., 3].sum() == 1  # no other cell covered
    hidden = data.get_array().mask  # the finite layer shows no colour where the overlay does
    assert hidden[2, 1] and hidden.sum() == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["+∞ (1 cell)"]


def test_absent_trials_are_reported(frame):
    f = frame[~((frame["trial_id"] == 1) & (frame["epoch"] == 5))]  # stopped before epoch 5
    fig = build_figure("depth_scaling", f, metric="grad_norm", group_by="init")
    assert "1 of 12 trials have no record at epoch 5" in fig.axes[0].get_title(loc="left")


# --- drawing --------------------------------------------------------------------------------

KIND_ARGS = {
    "layer_profile": dict(metric="grad_norm", group_by="init"),
    "depth_scaling": dict(metric="grad_norm", group_by="init", layer=1),
    "training_curves": dict(metric=["train_loss", "grad_norm"], group_by="init"),
    "heatmap": dict(metric="grad_norm", x="depth", group_by="init"),
    "theory_overlay": dict(metric="isometry_gap/norm", theory={"gaussian": ([1, 2], [1.0, 0.5])}),
}


@pytest.mark.parametrize("kind", PLOT_KINDS)
def test_every_kind_renders_png_and_svg(frame, kind):
    f = gaps(frame, "isometry_gap/norm") if kind == "theory_overlay" else frame
    assert render(kind, f, **KIND_ARGS[kind]).startswith(b"\x89PNG\r\n\x1a\n")
    svg = render(kind, f, fmt="svg", **KIND_ARGS[kind])
    assert b"<svg" in svg and b"no data" not in svg


def test_axis_labels_name_metric_and_definition(frame):
    fig = build_figure("depth_scaling", frame, metric="grad_norm", group_by="init")
    ax = fig.axes[0]
    assert ax.get_ylabel().replace("\n", " ") == METRIC_LABELS["grad_norm"]
    assert ax.get_xlabel() == "depth L (hidden blocks)"


def test_metric_labels_cover_every_metric_with_a_definition():
    assert set(METRIC_LABELS) == set(METRICS)
    for name in ("isometry_gap/linear", "isometry_gap/norm", "isometry_gap/act"):
        assert "log(mean λ) − mean(log λ) of G = HHᵀ" in METRIC_LABELS[name]


def test_log_scales_where_they_fit():
    assert not wants_log([10, 100], 10.0)  # exactly a decade: linear
    assert wants_log([10, 30, 101], 10.0)
    assert wants_log([1e-3, 1.0, math.inf], 100.0)  # non-finite values do not decide
    assert not wants_log([0.0, 1e-3, 1.0], 100.0)  # zero has no logarithm
    assert not wants_log([math.nan], 100.0)


def test_depth_scaling_axes_turn_log(frame):
    f = frame.copy()
    f["depth"] = f["depth"].map({2: 10, 20: 1000})  # x spans two decades
    f.loc[f["metric"] == "grad_norm", "value"] = np.exp(f["depth"] / 100.0)  # y from e^0.1 to e^10
    ax = build_figure("depth_scaling", f, metric="grad_norm", layer=1).axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    ax = build_figure("depth_scaling", frame, metric="grad_norm", layer=1, yscale="auto").axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("linear", "linear")


def test_theory_line_takes_the_colour_of_its_measured_line(frame):
    f = gaps(frame)
    theory = {"orthogonal": ([1, 2, 3], [1.0, 0.5, 0.25])}
    ax = build_figure(
        "theory_overlay", f, metric="isometry_gap/act", group_by="init", theory=theory
    ).axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    assert lines["mean field: orthogonal"].get_color() == lines["orthogonal"].get_color()
    assert lines["mean field: orthogonal"].get_linestyle() == "--"


def test_empty_frame_gives_a_no_data_figure():
    empty = pd.DataFrame(columns=["trial_id", "seed", "epoch", "metric", "layer", "value"])
    fig = build_figure("layer_profile", empty, metric="grad_norm")
    assert any("no data" in t.get_text() for t in fig.axes[0].texts)
    assert render("heatmap", empty, metric="grad_norm", fmt="svg").count(b"<svg") == 1


def test_rendering_from_threads_matches_rendering_alone(frame):
    args = dict(metric="grad_norm", group_by="init")
    with memo.bypassed():  # each render draws
        alone = render("depth_scaling", frame, **args)
        with ThreadPoolExecutor(4) as pool:
            out = list(pool.map(lambda _: render("depth_scaling", frame, **args), range(4)))
    assert all(b == alone for b in out)


def test_a_shared_renderer_draws_what_a_figures_own_renderer_draws(frame):
    """Figures drawn here share an Agg renderer per size and one mathtext parser (faster text
    extents and tick labels): two kinds of the same size, drawn after one another and from
    threads at once, give the PNG bytes of a figure with a renderer of its own (matplotlib's
    plain canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from service.plots import build_figure
    from service.plots.draw import DPI

    args = {
        "depth_scaling": dict(metric="grad_norm", group_by="init"),
        "layer_profile": dict(metric="grad_norm"),
    }
    own = {}
    for kind, kw in args.items():
        fig = build_figure(kind, frame, **kw)
        FigureCanvasAgg(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI)
        own[kind] = buf.getvalue()
    assert own["depth_scaling"] != own["layer_profile"]
    with memo.bypassed(), ThreadPoolExecutor(4) as pool:
        out = list(pool.map(lambda k: (k, render(k, frame, **args[k])), list(args) * 4))
    assert all(png == own[kind] for kind, png in out)


def test_importing_plots_does_not_import_matplotlib():
    code = "import sys, service.plots; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "kwargs", "field", "allowed"),
    [
        ("pie", dict(metric="grad_norm"), "kind", "layer_profile"),
        ("heatmap", dict(metric="grad_norm", fmt="jpeg"), "format", "svg"),
        ("heatmap", dict(metric="gradnorm"), "metric", "isometry_gap/act"),
        ("heatmap", dict(metric=["grad_norm", "train_loss"]), "metric", None),
        ("depth_scaling", dict(metric="grad_norm", group_by="activation"), "group_by", "init"),
        ("depth_scaling", dict(metric="grad_norm", x="init"), "x", "depth"),
        ("depth_scaling", dict(metric="grad_norm", group_by="depth"), "group_by", "init"),
        ("depth_scaling", dict(metric="grad_norm", epoch=3), "epoch", "5"),
        ("depth_scaling", dict(metric="grad_norm", layer=21), "layer", "1..20"),
        ("depth_scaling", dict(metric="grad_norm", layer=0), "layer", "-1..-20"),
        ("layer_profile", dict(metric="train_loss"), "metric", "grad_norm"),
        ("layer_profile", dict(metric="grad_norm", layer=1), "layer", None),
        ("layer_profile", dict(metric="grad_norm", x="depth"), "x", "layer"),
        ("training_curves", dict(metric="train_loss", x="depth"), "x", "epoch"),
        ("heatmap", dict(metric="grad_norm"), "depth", "20"),
        ("heatmap", dict(metric="train_loss", x="depth"), "group_by", "init"),
        ("theory_overlay", dict(metric="weight_isometry_gap"), "metric", "grad_norm"),
        (
            "theory_overlay",
            dict(metric="isometry_gap/act", theory={"a": ([1, 2], [1])}),
            "theory",
            None,
        ),
        ("heatmap", dict(metric="grad_norm", theory={}), "theory", None),
    ],
)
def test_bad_input_names_the_field(frame, kind, kwargs, field, allowed):
    # grad_norm's rows as the metric asked for (weight_isometry_gap: recorded, never predicted)
    f = gaps(frame, kwargs["metric"]) if kind == "theory_overlay" else frame
    with pytest.raises(InvalidInput) as info:
        render(kind, f, **kwargs)
    assert info.value.field == field
    assert info.value.message.startswith(f"{field}: ")
    if allowed is not None:
        assert allowed in info.value.allowed


def test_a_frame_that_is_not_tidy_is_refused(frame):
    with pytest.raises(InvalidInput) as info:
        render("heatmap", frame.drop(columns=["layer"]), metric="grad_norm")
    assert info.value.field == "frame" and "layer" in info.value.allowed


def test_a_filtered_swept_field_is_named_in_the_figure(frame):
    one_init = frame[frame["init"] == "orthogonal"]
    fig = build_figure("depth_scaling", one_init, metric="grad_norm", layer=1)
    note = fig.axes[0].get_title(loc="left")
    assert "init = orthogonal" in note and "depth =" not in note
    fig = build_figure("depth_scaling", frame, metric="grad_norm", layer=1, group_by="init")
    assert "init =" not in fig.axes[0].get_title(loc="left")


@pytest.mark.parametrize(
    ("x", "group_by", "axes"),
    [
        (None, None, ("epoch", "layer")),
        ("layer", None, ("layer", "epoch")),
        ("depth", None, ("depth", "layer")),
        ("depth", "init", ("depth", "init")),
        (None, "depth", ("epoch", "depth")),
    ],
)
def test_heatmap_default_axes(frame, x, group_by, axes):
    assert heatmap_axes(x, group_by) == axes
    one = frame  # a cell holds one configuration: fix what is not an axis
    if "init" not in axes:
        one = one[one["init"] == "gaussian"]
    if "depth" not in axes:
        one = one[one["depth"] == 20]
    ax = build_figure("heatmap", one, metric="grad_norm", x=x, group_by=group_by).axes[0]
    drawn = (ax.get_xlabel(), ax.get_ylabel())
    assert tuple(label.replace("\n", " ") for label in drawn) == tuple(map(field_label, axes))


def test_gap_metrics_are_the_isometry_gaps_of_the_layers():
    assert GAP_METRICS == ("isometry_gap/linear", "isometry_gap/norm", "isometry_gap/act")
    assert set(GAP_METRICS) <= set(METRICS)
