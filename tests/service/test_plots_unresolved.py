"""Unresolved gaps in the line plots (service.plots.series.mark_unresolved; docs/plots.md): a
point of an isometry gap whose error bar (isometry_gap_error/<kind>) is +∞ or ≥ 10% for some
seed carries n_unresolved > 0 in the series — a plain column of the line, for any rendering —
and is ringed in the drawn figure with a legend entry; points whose bars are small, and other
metrics, carry 0. Checked on a stored sweep whose error bars are known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from records import record

from service.plots import (
    build_figure,
    depth_scaling_series,
    layer_profile_series,
    stored,
    training_curves_series,
)
from service.spec import parse_spec
from service.store import Store

DEPTH = 3


@pytest.fixture
def store(sqlite_url):
    with Store(sqlite_url) as s:
        yield s


def _bars(seed: int, depth: int, epoch: int) -> np.ndarray:
    """Known error bars: at epoch 1, seed 0's layer 2 is +∞ (beyond float64) and seed 1's
    layer 3 is 0.2; everything else 1e-9 (epoch 0: all resolved)."""
    bars = np.full(depth, 1e-9)
    if epoch == 1 and seed == 0:
        bars[1] = math.inf
    if epoch == 1 and seed == 1 and depth >= 3:
        bars[2] = 0.2
    return bars


def _sweep(store, depths=(DEPTH,)):
    spec = parse_spec({"name": "u", "parameters": {"epochs": 1, "depth": list(depths),
                                                   "norm": "batch"}, "seeds": 2})  # fmt: skip
    sweep = store.create_sweep(spec)
    trials, _ = store.list_trials(sweep.id, limit=100)
    batch = []
    for t in trials:
        c = t.config
        for epoch in (0, 1):
            rec = record(t.id, epoch, c["depth"])
            rec["isometry_gap/act"] = np.linspace(1.0, 2.0, c["depth"]) + c["seed"]
            rec["isometry_gap_error/act"] = _bars(c["seed"], c["depth"], epoch)
            batch.append((t.id, rec))
    store.write_records(batch)
    return sweep


def _frame(store, sweep):
    return store.read_metrics(
        sweep.id, metrics=["isometry_gap/act", "isometry_gap_error/act", "grad_norm"]
    )


def test_layer_profile_counts_the_unresolved_seeds_per_point(store):
    frame = _frame(store, _sweep(store))
    lines = layer_profile_series(frame, "isometry_gap/act", group_by="epoch")
    by_epoch = {label: s for label, s in lines.items()}
    assert by_epoch["0"]["n_unresolved"].tolist() == [0, 0, 0]
    assert by_epoch["1"]["n_unresolved"].tolist() == [0, 1, 1]  # seed 0 at ℓ = 2, seed 1 at 3
    assert by_epoch["1"]["count"].tolist() == [2, 2, 2]
    # another metric has no error bar: nothing is marked
    other = layer_profile_series(frame, "grad_norm", group_by="epoch")
    assert all((s["n_unresolved"] == 0).all() for s in other.values())
    # a frame without the error rows (an older sweep): nothing is marked either
    bare = frame[frame["metric"] != "isometry_gap_error/act"]
    bare_lines = layer_profile_series(bare, "isometry_gap/act", group_by="epoch")
    assert all((s["n_unresolved"] == 0).all() for s in bare_lines.values())


def test_depth_scaling_and_training_curves_carry_the_flag(store):
    frame = _frame(store, _sweep(store, depths=(2, 3)))
    lines = depth_scaling_series(frame, "isometry_gap/act", layer=2)
    (line,) = lines.values()
    assert line["x"].tolist() == [2, 3] and line["n_unresolved"].tolist() == [1, 1]
    curves = training_curves_series(frame, "isometry_gap/act", group_by="depth", layer=-1)
    # the last layer: seed 0's +∞ is at ℓ = 2 (the last of depth 2), seed 1's 0.2 at ℓ = 3
    assert {k: s["n_unresolved"].tolist() for k, s in curves.items()} == {
        "2": [0, 1],
        "3": [0, 1],
    }


def test_the_drawn_figure_rings_them_and_says_so(store):
    frame = _frame(store, _sweep(store))
    fig = build_figure("layer_profile", frame, metric="isometry_gap/act", group_by="epoch",
                       stat="mean")  # fmt: skip
    ax = fig.axes[0]
    (rings,) = [line for line in ax.lines if line.get_gid() == "unresolved"]
    assert rings.get_xdata().tolist() == [2, 3]  # on the epoch-1 line, at its means
    assert rings.get_ydata().tolist() == [2.0, 2.5]  # (1.5 + 2.5)/2, (2 + 3)/2
    assert rings.get_markerfacecolor() == "none"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "unresolved (error bar ≥ 10% or +∞ for a seed): 2 points" in legend
    plain = build_figure("layer_profile", frame, metric="grad_norm", group_by="epoch")
    assert not [line for line in plain.axes[0].lines if line.get_gid() == "unresolved"]
    assert not any("unresolved" in t.get_text() for t in plain.axes[0].get_legend().get_texts())


def test_a_stored_plot_reads_the_error_bars_with_the_gap(store):
    sweep = _sweep(store)
    assert stored.error_bars_to_read("layer_profile", ["isometry_gap/act"]) == [
        "isometry_gap_error/act"
    ]
    assert stored.error_bars_to_read("heatmap", ["isometry_gap/act"]) == []
    svg = stored.make_plot(store, sweep.id, "layer_profile", metric="isometry_gap/act",
                           fmt="svg", group_by="epoch")  # fmt: skip
    assert svg.decode().count('id="unresolved') == 1  # the rings, from the bars read with it
