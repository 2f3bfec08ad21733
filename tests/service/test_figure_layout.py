"""Figures that fit (docs/dashboard.md, "Figures that fit"): every plot kind, drawn on the Agg
canvas at a small, the default and a large figure size, keeps every text it draws (titles,
captions, axis and tick labels, legends, colorbar labels) inside the figure; legends move below
the axes when the figure is narrow; `theory_overlay` takes its y range from the measurements and
marks the prediction where it leaves it; default heatmap axes come from the sweep's spec."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text

from service.plots import PLOT_KINDS, build_figure, render
from service.plots.defaults import default_axes, swept_axes
from service.plots.spectra import jacobian_figure, spectrum_figure

SIZES = {"small": (4.5, 3.2), "default": None, "large": (14.0, 8.0)}  # inches (per panel row)
DEPTHS = (2, 5, 10, 20)
INITS = ("gaussian", "orthogonal", "kaiming")
TOL = 0.5  # px: rounding of the extents


def sweep_frame() -> pd.DataFrame:
    """4 depths × 3 inits × 3 seeds, epochs 0..3: per-layer gaps and gradient norms spread over
    decades, scalar losses; one +∞ and one NaN seed so that pins and their legend entries are
    drawn too."""
    rows, tid = [], 0
    for depth in DEPTHS:
        for k, init in enumerate(INITS):
            for seed in range(3):
                tid += 1
                base = dict(trial_id=tid, depth=depth, init=init, seed=seed)
                for epoch in range(4):
                    for ell in range(1, depth + 1):
                        gap = 10.0 ** (-(k + 1) * ell / depth) * (1 + 0.1 * seed) / (1 + epoch)
                        grad = 10.0 ** (k * ell / 5) * (1 + 0.2 * seed)
                        for metric, v in (("isometry_gap/norm", gap), ("grad_norm", grad)):
                            rows.append(base | dict(epoch=epoch, metric=metric, layer=ell, value=v))
                    for metric, v in (
                        ("train_loss", 2.0 / (1 + epoch + k)),
                        ("test_acc", 0.1 * epoch),
                    ):
                        rows.append(base | dict(epoch=epoch, metric=metric, layer=None, value=v))
    frame = pd.DataFrame(rows)
    frame["layer"] = frame["layer"].astype("Int64")
    pos = frame.index[(frame["metric"] == "grad_norm") & (frame["trial_id"] == 1)]
    frame.loc[pos[-1], "value"] = math.inf
    pos = frame.index[(frame["metric"] == "train_loss") & (frame["trial_id"] == 5)]
    frame.loc[pos[0], "value"] = math.nan
    return frame


def exp_prediction() -> dict:
    """A prediction falling exponentially to 1e-13 over 20 layers, for every init."""
    ell = np.arange(1, 21)
    return {init: (ell, 10.0 ** (-13 * ell / 20)) for init in INITS}


KIND_ARGS = {
    "layer_profile": dict(metric="grad_norm", group_by="init"),
    "depth_scaling": dict(metric="grad_norm", group_by="init", layer=1),
    "training_curves": dict(metric=["train_loss", "test_acc"], group_by="init"),
    "heatmap": dict(metric="grad_norm", x="depth", group_by="init"),
    "theory_overlay": dict(metric="isometry_gap/norm", x="layer", theory=exp_prediction()),
}


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return sweep_frame()


def figure(kind: str, frame: pd.DataFrame, size: tuple[float, float] | None):
    if kind == "spectrum":
        rng = np.random.default_rng(0)
        values = np.sort(rng.exponential(size=(20, 32)), axis=1)[:, ::-1] ** 3  # (L, n)
        note = "depth 20, width 256, tanh, norm batch, init orthogonal"
        title = "trial 7: spectrum/act eigenvalues per layer"
        layers = [1, 4, 8, 12, 16, 20]
        fig = spectrum_figure(values, name="spectrum/act", epoch=0, layers=layers, title=title,
                              note=note)  # fmt: skip
    elif kind == "jacobian_spectrum":
        rng = np.random.default_rng(1)
        lines = {f"trial {i}: depth {d}, init orthogonal": rng.lognormal(0, 0.1 * d, (4, 32))
                 for i, d in enumerate(DEPTHS, start=3)}  # fmt: skip
        fig = jacobian_figure(lines, epoch=0, title="input–output Jacobian singular values",
                              ordered=True)  # fmt: skip
    else:
        f = frame[(frame["depth"] == 20)] if kind == "theory_overlay" else frame
        if kind == "heatmap":
            f = f[f["epoch"] == 3]
        fig = build_figure(kind, f, **KIND_ARGS[kind])
    if size is not None:
        rows = len([ax for ax in fig.axes if ax.get_label() != "<colorbar>"])
        fig.set_size_inches(size[0], size[1] * rows)
    return fig


def drawn_texts(fig) -> list[Text]:
    """The texts the figure draws: visible, not empty, and for tick labels only those of the
    ticks the axis draws (Axis._update_ticks: matplotlib keeps Text objects for others)."""
    undrawn = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            drawn = {id(t) for t in axis._update_ticks()}
            every = axis.get_major_ticks() + axis.get_minor_ticks()
            undrawn |= {
                id(lab) for t in every if id(t) not in drawn for lab in (t.label1, t.label2)
            }
    return [
        t for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and id(t) not in undrawn
    ]  # fmt: skip


def outside(fig) -> list[tuple[str, tuple]]:
    """(text, its extent) of every drawn text whose window extent leaves the figure's bbox."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    out = []
    for t in drawn_texts(fig):
        b = t.get_window_extent(renderer)
        if b.x0 < box.x0 - TOL or b.y0 < box.y0 - TOL or b.x1 > box.x1 + TOL or b.y1 > box.y1 + TOL:
            out.append((t.get_text()[:50], tuple(round(v) for v in b.extents)))
    return out


ALL_KINDS = (*PLOT_KINDS, "spectrum", "jacobian_spectrum")


def test_the_kinds_are_all_covered():
    assert set(KIND_ARGS) == set(PLOT_KINDS)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_every_text_lies_inside_the_figure(frame, kind, size):
    fig = figure(kind, frame, SIZES[size])
    assert outside(fig) == []
    assert len(drawn_texts(fig)) > 5  # title, caption, labels, ticks, legend: something drawn


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_the_svg_fits_as_the_png_does(frame, kind):
    """Saving re-fits the texts at the SVG's 72 dpi: still inside, and the figure's size kept."""
    fig = figure(kind, frame, SIZES["small"])
    import io

    fig.savefig(io.BytesIO(), format="svg")
    assert outside(fig) == []


def test_long_texts_wrap_to_the_width_they_have(frame):
    captions = {}
    for size in ("small", "large"):
        fig = figure("depth_scaling", frame, SIZES[size])
        fig.canvas.draw()
        captions[size] = fig.axes[0].get_title(loc="left")
    assert captions["small"].count("\n") > captions["large"].count("\n")
    assert captions["small"].split() == captions["large"].split()  # the same words, re-broken


def test_the_legend_sits_beside_the_axes_or_below_them(frame):
    for size, where in (("default", "beside"), ("large", "beside"), ("small", "below")):
        fig = figure("layer_profile", frame, SIZES[size])
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        ax = fig.axes[0]
        leg = ax.get_legend().get_window_extent(r)
        if where == "beside":
            assert leg.x0 >= ax.bbox.x1, size
        else:
            assert leg.y1 <= ax.bbox.y0, size


def test_a_figure_redrawn_keeps_its_texts(frame):
    fig = figure("theory_overlay", frame, None)
    fig.canvas.draw()
    first = [t.get_text() for t in drawn_texts(fig)]
    fig.canvas.draw()
    assert [t.get_text() for t in drawn_texts(fig)] == first


# --- theory_overlay: the range is the measurements' -----------------------------------------


def test_the_theory_overlay_range_follows_the_measurements(frame):
    f = frame[frame["depth"] == 20]
    fig = build_figure("theory_overlay", f, **KIND_ARGS["theory_overlay"])
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    measured = [ln for ln in ax.lines if ln.get_label() in INITS]
    ys = np.concatenate([ln.get_ydata() for ln in measured])
    lo, hi = ax.get_ylim()
    # the gaps span 10^-3 .. ~1.2 (with bands): the axis spans that and 5% padding, not 1e-13
    assert lo >= 10 ** (np.log10(ys.min()) - 0.5) and lo > 1e-4
    assert hi <= 10 ** (np.log10(ys.max()) + 0.5)
    # the prediction falls to 1e-13: marked where it leaves the range, at the bottom edge
    below = [ln for ln in ax.lines if ln.get_gid() == "prediction-below"]
    assert len(below) == len(INITS)
    ell = np.arange(1, 21)
    predicted = 10.0 ** (-13 * ell / 20)
    exit_at = ell[predicted < lo][0]  # it stays below from there on: one exit
    for ln in below:
        assert ln.get_xdata().tolist() == [exit_at]
        assert ln.get_ydata().tolist() == [0.0]  # axes coordinates: the bottom edge
        assert ln.get_markerfacecolor() == "none"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "mean field leaves the y range" in legend
    note = ax.get_title(loc="left").replace("\n", " ")
    assert f"mean field below it from ℓ = {exit_at} (to 1e-13)" in note


def test_a_prediction_inside_the_range_is_not_marked(frame):
    f = frame[frame["depth"] == 20]
    ell = np.arange(1, 21)
    theory = {"gaussian": (ell, 10.0 ** (-1 * ell / 20))}  # the gaussian line's own decay
    fig = build_figure("theory_overlay", f, metric="isometry_gap/norm", x="layer", theory=theory)
    ax = fig.axes[0]
    assert not [ln for ln in ax.lines if ln.get_gid() == "prediction-below"]
    assert "mean field below" not in ax.get_title(loc="left")


def test_the_theory_overlay_png_and_svg_render(frame):
    f = frame[frame["depth"] == 20]
    assert render("theory_overlay", f, **KIND_ARGS["theory_overlay"]).startswith(b"\x89PNG")
    svg = render("theory_overlay", f, fmt="svg", **KIND_ARGS["theory_overlay"]).decode()
    assert 'id="prediction-below' in svg


# --- default axes from the spec -------------------------------------------------------------


def spec_of(**parameters) -> dict:
    return {"name": "s", "parameters": {"epochs": 2, **parameters}, "seeds": 2}


@pytest.mark.parametrize(
    ("parameters", "metric", "axes", "held"),
    [
        ({}, "grad_norm", {"x": "epoch", "group_by": "layer"}, {}),
        ({}, "train_loss", {"x": "epoch"}, {}),
        ({"depth": [2, 4]}, "grad_norm", {"x": "depth", "group_by": "layer"}, {}),
        ({"depth": [2, 4]}, "train_loss", {"x": "depth", "group_by": "epoch"}, {}),
        ({"depth": [2, 4], "init": ["gaussian", "orthogonal"]}, "grad_norm",
         {"x": "depth", "group_by": "init"}, {}),
        ({"init": ["gaussian", "orthogonal"], "depth": [2, 4], "width": [8, 16]}, "grad_norm",
         {"x": "init", "group_by": "depth"}, {"width": 8}),
        ({"lr": {"loguniform": [1e-3, 1e-1]}, "depth": [2, 4]}, "grad_norm",
         {"x": "lr", "group_by": "depth"}, {}),
    ],
)  # fmt: skip
def test_default_heatmap_axes_are_the_sweeps_swept_fields(parameters, metric, axes, held):
    assert default_axes("heatmap", spec_of(**parameters), metric) == (axes, held)


def test_filters_narrow_the_swept_fields():
    spec = spec_of(depth=[2, 4, 8], init=["gaussian", "orthogonal"])
    assert swept_axes(spec) == {"depth": [2, 4, 8], "init": ["gaussian", "orthogonal"]}
    assert swept_axes(spec, {"init": "gaussian"}) == {"depth": [2, 4, 8]}
    narrowed = {"depth": [2, 8], "init": ["gaussian", "orthogonal"]}
    assert swept_axes(spec, {"depth": ["2", "8"]}) == narrowed
    assert default_axes("heatmap", spec, "grad_norm", where={"init": ["gaussian"]}) == (
        {"x": "depth", "group_by": "layer"}, {},
    )  # fmt: skip


def test_theory_overlay_x_follows_the_spec_not_the_rows():
    assert default_axes("theory_overlay", spec_of(depth=[2, 4]), "isometry_gap/norm")[0] == {
        "x": "depth"
    }
    assert default_axes("theory_overlay", spec_of(init=["a", "b"]), "isometry_gap/norm")[0] == {
        "x": "layer"
    }
    assert default_axes("layer_profile", spec_of(depth=[2, 4]), "grad_norm") == ({}, {})
