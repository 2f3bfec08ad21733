"""service.plots.stored: what a plot reads from the store, the per-trial filter, and the mean-field
predictions of the theory overlay (averaged over seeds, labelled like the measured lines)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from records import record, unit_gram

from service.errors import InvalidInput, LimitExceeded, NotFound
from service.isometry import isometry_gap
from service.plots import PLOT_KINDS, stored
from service.settings import Settings
from service.spec import parse_spec
from service.store import Store
from service.theory import mean_field_gaps


@pytest.fixture
def store(sqlite_url):
    with Store(sqlite_url) as s:
        yield s


def _sweep(store, seeds=3, n=6, **params):
    base = {"epochs": 1, "batch_size": n, "width": 8, "norm": "layer", "order": "act_norm"}
    spec = parse_spec({"name": "f", "parameters": {**base, **params}, "seeds": seeds})
    sweep = store.create_sweep(spec)
    trials, _ = store.list_trials(sweep.id, limit=1000)
    batch = []
    for t in trials:
        c = t.config
        gram = unit_gram(n, 100 + c["seed"])  # one input Gram per seed, as the engine records
        batch.append((t.id, record(t.id, 0, c["depth"], input_gram=gram)))
        batch.append((t.id, record(t.id, 1, c["depth"])))
    store.write_records(batch)
    return sweep, trials


def test_identity_prediction_is_the_mean_input_gap_at_every_layer(store):
    # κ(ρ) = ρ for σ(x) = x (only c₁ ≠ 0): the Gram, hence the gap, never changes with depth.
    sweep, _ = _sweep(store, depth=[3, 5], activation="identity")
    frame = store.read_metrics(sweep.id, metrics="isometry_gap/norm", epoch=[0])
    theory, title = stored.overlay_predictions(
        store, frame, "isometry_gap/norm", x="depth", group_by=None, epoch=None, layer=None
    )
    assert list(theory) == ["measured"]  # one line: depth is the x axis, nothing else varies
    layers, gaps = theory["measured"]
    assert list(layers) == [1, 2, 3, 4, 5]  # the deepest trial of each seed
    expected = np.mean([isometry_gap(unit_gram(6, 100 + s)) for s in range(3)])
    np.testing.assert_allclose(gaps, expected, rtol=1e-9)
    assert "assumes" not in title  # LayerNorm, act_norm, Gaussian: the theory's own setting


def test_each_line_averages_its_own_seeds_and_labels_match(store):
    sweep, _ = _sweep(store, seeds=2, depth=4, activation=["relu", "tanh"], norm="batch")
    frame = store.read_metrics(sweep.id, metrics="isometry_gap/act", epoch=[0])
    theory, title = stored.overlay_predictions(
        store, frame, "isometry_gap/act", x="layer", group_by="activation", epoch=None, layer=None
    )
    assert sorted(theory) == ["relu", "tanh"]
    for act, (layers, gaps) in theory.items():
        per_seed = [mean_field_gaps(act, 4, unit_gram(6, 100 + s), stage="act") for s in (0, 1)]
        np.testing.assert_allclose(gaps, np.mean(per_seed, axis=0), rtol=1e-12)
        assert list(layers) == [1, 2, 3, 4]
    assert "norm=layer" in title and "this sweep has norm=batch" in title


def test_overlay_renders_with_predictions_and_without_a_gram(store):
    sweep, _ = _sweep(store, seeds=2, depth=[2, 3])
    png = stored.make_plot(store, sweep.id, "theory_overlay", metric="isometry_gap/norm")
    assert png.startswith(b"\x89PNG")
    big = parse_spec(
        {
            "name": "g",
            "parameters": {
                "depth": 2,
                "activation_gain": 8.0,
                "activation": "tanh",
                "epochs": 0,
                "batch_size": 4,
            },
        }
    )
    s2 = store.create_sweep(big)
    (t,), _ = store.list_trials(s2.id)
    store.write_records([(t.id, record(t.id, 0, 2, input_gram=unit_gram(4, 1)))])
    frame = store.read_metrics(s2.id, metrics="isometry_gap/norm", epoch=[0])
    theory, title = stored.overlay_predictions(
        store, frame, "isometry_gap/norm", x=None, group_by=None, epoch=None, layer=None
    )
    assert theory == {} and "no prediction for 0 (gain" in title  # gain 8 > 5; line "epoch 0"


@pytest.mark.parametrize(
    ("kind", "epoch", "x", "group_by", "reads"),
    [
        ("depth_scaling", None, None, None, "last"),
        ("depth_scaling", 3, None, None, [3]),
        ("depth_scaling", "last", None, None, "last"),
        ("heatmap", None, None, None, None),  # epoch is its default x axis
        ("heatmap", 3, "depth", "init", [3]),
        ("heatmap", None, "depth", "init", "last"),
        ("heatmap", 3, "layer", None, None),  # layer × epoch
        ("training_curves", 3, None, None, None),
        ("layer_profile", None, None, None, None),
        ("layer_profile", 2, None, None, [2]),
        ("theory_overlay", None, None, None, [0]),
        ("theory_overlay", "last", None, None, "last"),
    ],
)
def test_a_plot_reads_only_the_epochs_it_draws(kind, epoch, x, group_by, reads):
    assert stored.epochs_to_read(kind, epoch, x, group_by) == reads


def test_one_trial_and_its_errors(store):
    sweep, trials = _sweep(store, seeds=2, depth=[2, 3])
    chosen = trials[2]
    where = stored._one_trial(store, sweep.id, chosen.id, {})
    frame = store.read_metrics(sweep.id, metrics="train_loss", where=where)
    assert set(frame["trial_id"]) == {chosen.id} and len(frame) == 2
    clash = stored._one_trial(store, sweep.id, chosen.id, {"depth": [2]})  # chosen has depth 3
    assert store.read_metrics(sweep.id, metrics="train_loss", where=clash).empty
    other, _ = _sweep(store, seeds=1, depth=2)
    with pytest.raises(NotFound, match=f"belongs to sweep {sweep.id}"):
        stored.make_plot(
            store, other.id, "training_curves", metric="train_loss", trial_id=chosen.id
        )
    with pytest.raises(NotFound) as exc:
        stored.make_plot(store, sweep.id, "violin", metric="train_loss")
    assert all(k in exc.value.message for k in PLOT_KINDS)
    with pytest.raises(InvalidInput) as bad:
        stored.make_plot(store, sweep.id, "heatmap", metric="train_loss", fmt="jpeg")
    assert bad.value.field == "format"


@pytest.mark.parametrize(
    ("kind", "layer", "x", "group_by", "depths", "reads"),
    [
        ("depth_scaling", 3, None, None, [10, 20], [3, 10, 20]),
        ("depth_scaling", None, None, None, [10, 20], [10, 20]),  # the default: ℓ = L
        ("depth_scaling", -2, None, None, [10, 20], [9, 10, 19, 20]),
        ("depth_scaling", -15, None, None, [10, 20], [6, 10, 20]),  # no ℓ < 1
        ("depth_scaling", 0, None, None, [10], None),  # no layer 0: select_layer says so
        ("training_curves", 2, None, None, [4], [2, 4]),
        ("theory_overlay", 1, "depth", None, [4, 8], [1, 4, 8]),
        ("theory_overlay", 1, "layer", None, [4, 8], None),
        ("theory_overlay", 1, None, None, [4, 8], None),  # x may turn out to be the layer
        ("heatmap", 2, "depth", "init", [4], [2, 4]),
        ("heatmap", None, "depth", "epoch", [4], [4]),
        ("heatmap", 2, None, None, [4], None),  # layer is its default y axis
        ("heatmap", 2, "layer", None, [4], None),
        ("layer_profile", None, None, None, [4], None),
    ],
)
def test_a_plot_reads_only_the_layers_it_draws(kind, layer, x, group_by, depths, reads):
    assert stored.layers_to_read(kind, layer, x, group_by, depths) == reads


@pytest.mark.parametrize(
    ("kind", "metric", "options"),
    [
        ("depth_scaling", "grad_norm", {"layer": 3}),
        ("depth_scaling", "grad_norm", {"layer": -2, "epoch": 0}),
        ("depth_scaling", "grad_norm", {}),
        ("training_curves", ["grad_norm", "train_loss"], {"layer": -1}),
        ("theory_overlay", "isometry_gap/norm", {"x": "depth", "layer": 2}),
        ("heatmap", "grad_norm", {"x": "depth", "group_by": "epoch", "layer": 4}),
    ],
)
def test_a_single_layer_plot_reads_one_layer_and_draws_the_same(
    sqlite_url, monkeypatch, kind, metric, options
):
    with Store(sqlite_url) as store:
        sweep, _ = _sweep(store, seeds=2, n=4, depth=[10, 20])  # 2 × 10 + 2 × 20 values per metric
    small = Settings(max_points=40)  # fewer than every layer of one metric at one epoch, × 2
    with Store(sqlite_url, settings=small) as store, matplotlib.rc_context({"svg.hashsalt": "t"}):
        plot = stored.make_plot(store, sweep.id, kind, metric=metric, fmt="svg", **options)
        assert plot.lstrip().startswith(b"<?xml")
        monkeypatch.setattr(stored, "layers_to_read", lambda *args: None)  # as it was
        with pytest.raises(LimitExceeded):
            stored.make_plot(store, sweep.id, kind, metric=metric, fmt="svg", **options)
    with Store(sqlite_url) as store, matplotlib.rc_context({"svg.hashsalt": "t"}):
        every_layer = stored.make_plot(store, sweep.id, kind, metric=metric, fmt="svg", **options)
    assert plot == every_layer  # the same figure, byte for byte


def test_a_layer_a_trial_lacks_is_still_named(store):
    sweep, _ = _sweep(store, seeds=1, depth=[3, 5])
    with pytest.raises(InvalidInput) as exc:
        stored.make_plot(store, sweep.id, "depth_scaling", metric="grad_norm", layer=7)
    assert exc.value.field == "layer" and exc.value.allowed == ["1..5", "-1..-5"]


def test_the_prediction_uses_the_init_gain_and_the_centering(store):
    sweep, _ = _sweep(
        store, seeds=1, depth=3, activation="sigmoid", activation_gain=0.8, init_gain=[1.0, 2.0],
        norm=["layer", "layer_scale"],
    )  # fmt: skip
    frame = store.read_metrics(sweep.id, metrics="isometry_gap/act", epoch=[0])
    theory, title = stored.overlay_predictions(
        store, frame, "isometry_gap/act", x="layer", group_by="init_gain", epoch=None, layer=None
    )
    assert sorted(theory) == ["1, layer", "1, layer_scale", "2, layer", "2, layer_scale"]
    for label, (layers, gaps) in theory.items():
        g, norm = label.split(", ")
        expected = mean_field_gaps(
            "sigmoid", 3, unit_gram(6, 100), gain=0.8 * float(g), stage="act",
            centered=norm == "layer",
        )  # fmt: skip
        np.testing.assert_allclose(gaps, expected, rtol=1e-12)
        assert list(layers) == [1, 2, 3]
    different = [theory[k][1] for k in ("1, layer", "2, layer", "2, layer_scale")]
    assert not np.allclose(different[0], different[1])  # the gain enters
    assert not np.allclose(different[1], different[2])  # and the centering
    assert "assumes" not in title  # layer_scale is the theory's too (centered=False)


def test_each_gap_metric_has_its_theory_stage():
    from service.plots import GAP_METRICS
    from service.theory import STAGES

    assert list(stored.STAGE_OF) == list(GAP_METRICS)
    assert sorted(stored.STAGE_OF.values()) == sorted(STAGES)
