"""service.plots.stored: what a plot reads from the store and the per-trial filter (the theory
overlay's predictions: tests/service/test_plots_overlay.py)."""

from __future__ import annotations

import matplotlib
import pytest
from records import record, unit_gram

from service.errors import InvalidInput, LimitExceeded, NotFound
from service.plots import PLOT_KINDS, stored
from service.settings import Settings
from service.spec import parse_spec
from service.store import Store


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


def test_each_gap_metric_has_its_theory_stage():
    from service.plots import GAP_METRICS
    from service.theory import STAGES

    assert list(stored.STAGE_OF) == list(GAP_METRICS)
    assert sorted(stored.STAGE_OF.values()) == sorted(STAGES)
