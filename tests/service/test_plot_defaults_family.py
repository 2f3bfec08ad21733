"""Family-aware plot defaults (service.plots.defaults) and distinguishable lines past the palette
(service.plots.draw.line_styles): the default metric of a sweep is one its family records, its
range gap where every Gram is singular by its shape (n > d), and 16 lines get 16 distinct
(colour, line style, marker) triples."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib import colors as mcolors

from service.config import TrialConfig
from service.models import layer_metrics
from service.plots import build_figure
from service.plots.defaults import (
    default_metric,
    default_metric_of,
    family_gap,
    preferred_gaps,
    singular_by_shape,
    sweep_configs,
)
from service.plots.draw import LINE_STYLES, line_styles, palette


def spec(**parameters):
    return {"parameters": parameters}


# --- the default metric is one the family records ---------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "metric"),
    [
        ({}, "isometry_gap/act"),  # the MLP: n = d = 100
        ({"model": "mlp", "width": 64, "batch_size": 32}, "isometry_gap/act"),
        ({"model": "cnn", "width": 8, "batch_size": 64}, "isometry_gap/act"),  # d·H·W ≥ n
        ({"model": "resmlp"}, "isometry_gap/act"),
        ({"model": "transformer", "width": 64, "batch_size": 16}, "isometry_gap/residual"),
        ({"model": "transformer", "mlp_ratio": 0, "norm": "none"}, "isometry_gap/residual"),
        ({"model": "wide_mlp"}, "isometry_gap/output"),  # registered: its tapped outputs
        # n > d: every gap +∞ at every layer; the range gap carries the finite value
        ({"model": "transformer", "width": 32, "batch_size": 100}, "range_isometry_gap/residual"),
        ({"model": "mlp", "width": 16, "batch_size": 64}, "range_isometry_gap/act"),
        # one width with n ≤ d: that shape has finite gaps, so the gap stays
        ({"model": "mlp", "width": [16, 128], "batch_size": 64}, "isometry_gap/act"),
    ],
)
def test_layer_profile_and_heatmap_default_to_a_gap_the_family_records(parameters, metric):
    for kind in ("layer_profile", "heatmap"):
        assert default_metric(kind, spec(**parameters)) == metric
    for config in sweep_configs(spec(**parameters)):
        assert metric in layer_metrics(config)


def test_the_old_default_was_not_recorded_by_a_transformer():
    # what the dashboard asked for before ("does not record 'isometry_gap/act'")
    assert "isometry_gap/act" not in layer_metrics(TrialConfig(model="transformer"))


def test_a_swept_model_takes_the_gap_most_of_its_families_record():
    both = spec(model=["mlp", "transformer", "cnn"])
    assert default_metric("layer_profile", both) == "isometry_gap/act"  # mlp and cnn have it
    assert default_metric("layer_profile", spec(model=["transformer", "resmlp"])) == (
        "isometry_gap/residual"  # both record it
    )


def test_a_sampled_family_field_counts_each_choice():
    sampled = spec(model="mlp", width={"choice": [8, 64]}, batch_size=32)
    assert {c.width for c in sweep_configs(sampled)} == {8, 64}
    assert default_metric("layer_profile", sampled) == "isometry_gap/act"


def test_theory_overlay_draws_the_norm_gap_only_where_it_is_recorded():
    assert default_metric("theory_overlay", spec(norm="layer")) == "isometry_gap/norm"
    assert default_metric("theory_overlay", spec(norm="none")) == "isometry_gap/act"
    assert default_metric("theory_overlay", spec(norm=["none", "layer"])) == "isometry_gap/act"
    assert default_metric("theory_overlay", spec(model="transformer")) == "isometry_gap/residual"


def test_other_kinds_keep_their_defaults():
    t = spec(model="transformer")
    assert default_metric("depth_scaling", t) == "grad_norm"
    assert default_metric("training_curves", t) == ["train_loss", "test_acc"]
    assert default_metric("no_such_kind", t) == []


def test_a_comparison_pools_the_sweeps_families():
    mlp, transformer = spec(model="mlp"), spec(model="transformer", width=64, batch_size=16)
    assert default_metric_of("layer_profile", [transformer]) == "isometry_gap/residual"
    # the MLP records act, the transformer does not: the one both record is none, so the one
    # most record, in the preferred order
    assert default_metric_of("layer_profile", [mlp, transformer]) == "isometry_gap/act"
    assert default_metric_of("layer_profile", [transformer, spec(model="resmlp")]) == (
        "isometry_gap/residual"
    )


def test_singular_by_shape_is_n_over_the_taps_features():
    assert singular_by_shape(TrialConfig(width=16, batch_size=17))
    assert not singular_by_shape(TrialConfig(width=16, batch_size=16))
    # a cnn tap has width·H·W features (digits: 8 × 8)
    assert not singular_by_shape(TrialConfig(model="cnn", width=1, batch_size=64))
    assert singular_by_shape(TrialConfig(model="cnn", width=1, batch_size=65))


def test_preferred_gaps_put_every_gap_before_the_range_gaps():
    order = preferred_gaps(layer_metrics(TrialConfig(model="resmlp")))
    assert order[:2] == ["isometry_gap/act", "isometry_gap/residual"]
    assert all(m.startswith("isometry_gap/") for m in order[:4])
    assert all(m.startswith("range_isometry_gap/") for m in order[4:]) and len(order) == 8
    assert family_gap([TrialConfig(model="transformer", mlp_ratio=0)]) == "isometry_gap/residual"


# --- lines past the palette -------------------------------------------------------------------


def _triples(ax):
    return [
        (mcolors.to_hex(line.get_color()), str(line.get_linestyle()), line.get_marker())
        for line in ax.lines
        if not line.get_label().startswith("_")
    ]


def sixteen_lines() -> pd.DataFrame:
    rows = []
    for k in range(16):
        for ell in (1, 2, 3):
            rows.append(dict(trial_id=k + 1, activation=f"act{k:02d}", seed=0, epoch=0,
                             metric="grad_norm", layer=ell, value=1.0 + k + ell))  # fmt: skip
    frame = pd.DataFrame(rows)
    frame["layer"] = frame["layer"].astype("Int64")
    return frame


def test_sixteen_lines_have_sixteen_distinct_colour_and_style_pairs():
    fig = build_figure("layer_profile", sixteen_lines(), metric="grad_norm", group_by="activation")
    (ax,) = fig.axes[:1]
    triples = _triples(ax)
    assert len(triples) == 16
    assert len(set(triples)) == 16
    # the palette has 10 colours: the colours alone repeat (what the old figure showed)
    assert len({c for c, _, _ in triples}) == 10
    # and the legend shows each line's own style
    legend = ax.get_legend() or fig.legends[0]
    shown = {(mcolors.to_hex(h.get_color()), str(h.get_linestyle()), h.get_marker())
             for h in legend.legend_handles if hasattr(h, "get_marker")}  # fmt: skip
    assert set(triples) <= shown


def test_line_styles_keep_pairs_distinct_up_to_the_palette_times_the_styles():
    labels = [str(k) for k in range(10 * len(LINE_STYLES))]
    colors = palette(labels, sequential=False)
    styles = line_styles(colors)
    pairs = {(mcolors.to_hex(colors[lab]), str(styles[lab]["linestyle"]), styles[lab]["marker"])
             for lab in labels}  # fmt: skip
    assert len(pairs) == len(labels)
    # a first use of a colour is the plain solid line with dots, as before
    assert styles["0"] == {"linestyle": "-", "marker": "o"}
    # no measured line is dashed: dashes are a theory prediction's
    assert all(s["linestyle"] != "--" for s in styles.values())
