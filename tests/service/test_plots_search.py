"""service.plots.search: the numbers each search plot draws, checked against the records written
(the best so far is the running minimum of the stored objectives, importances sum to 1 and a
parameter with no effect ranks last, the rungs hold the values recorded there), every kind as PNG
and SVG, and a 422 naming why where a kind does not apply."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
from records import record

from service.errors import InvalidInput
from service.plots import search
from service.spec import parse_spec
from service.store import Store

matplotlib.use("Agg")

BASE = {"activation": "relu", "norm": "batch", "width": 8, "batch_size": 8, "dataset": "digits",
        "optimizer": "sgd"}  # fmt: skip


@pytest.fixture
def store(sqlite_url):
    with Store(sqlite_url) as s:
        yield s


def lr_effect(config) -> float:
    """The synthetic objective: a bowl in log10 lr (minimum at 1e-2), a mild linear effect of the
    activation gain, none of the depth."""
    return (math.log10(config["lr"]) + 2.0) ** 2 + 0.3 * config["activation_gain"]


def _lr_search(store, *, statuses=None, nan_at=(), **extra):
    """examples/lr_search.yaml's shape (depth grid × 8 log-uniform lrs × 2 seeds) with a sampled
    activation_gain; train_loss at the last epoch = lr_effect(config), higher before."""
    spec = parse_spec({
        "name": "lr", "seeds": 2, "search": {"kind": "random", "n": 8, "seed": 0},
        "parameters": {**BASE, "depth": [5, 20], "lr": {"loguniform": [1e-4, 1.0]},
                       "activation_gain": {"uniform": [0.5, 2.0]}, "epochs": 3, **extra},
    })  # fmt: skip
    sweep = store.create_sweep(spec)
    trials, _ = store.list_trials(sweep.id, limit=1000)
    statuses = statuses or {}
    batch = []
    for t in trials:
        if statuses.get(t.index) == "failed":
            continue
        f = math.nan if t.index in nan_at else lr_effect(t.config)
        for e in range(4):
            batch.append((t.id, record(t.id, e, t.config["depth"], train_loss=f + (3 - e))))
    store.write_records(batch)
    for t in trials:
        store.finish_trial(t.id, statuses.get(t.index, "completed"))
    return sweep, trials


def test_objective_follows_the_query_then_the_search_then_train_loss():
    tpe = {"search": {"kind": "tpe", "objective": "grad_norm", "layer": 2, "mode": "max",
                      "epoch": 3, "n": 4}}  # fmt: skip
    assert search.resolve_objective({}) == search.Objective("train_loss", "min", "last", None)
    assert search.resolve_objective(tpe) == search.Objective("grad_norm", "max", 3, 2)
    halving = {"early_stop": {"kind": "successive_halving", "metric": "test_loss", "mode": "min"}}
    assert search.resolve_objective(halving).metric == "test_loss"
    asked = search.resolve_objective(tpe, "test_acc", "max")
    assert asked == search.Objective("test_acc", "max", 3, None)  # the spec's layer is not its
    with pytest.raises(InvalidInput) as exc:
        search.resolve_objective({}, "grad_norm")
    assert exc.value.field == "layer"
    with pytest.raises(InvalidInput) as exc:
        search.resolve_objective({}, mode="lowest")
    assert exc.value.field == "mode"
    with pytest.raises(InvalidInput):
        search.resolve_objective({}, "train_loss", layer=1)


def test_history_is_each_studys_objective_and_its_running_best(store):
    statuses = {3: "failed", 5: "diverged"}
    sweep, trials = _lr_search(store, statuses=statuses, nan_at=(9,))
    s = search.load_search(store, sweep.id)
    lines = search.history_series(s)
    assert len(lines) == 4  # 2 depths × 2 seeds: one study each
    drawn = 0
    for label, part in lines.items():
        mine = [t for t in trials if s.frame.set_index("trial_id").loc[t.id, "study"] == label]
        mine.sort(key=lambda t: t.index)
        ok = [(k, t) for k, t in enumerate(mine) if t.index not in (3, 5, 9)]
        assert part["number"].tolist() == [k for k, _ in ok]  # every status counted in order
        expected = np.array([lr_effect(t.config) for _, t in ok])
        np.testing.assert_allclose(part["value"], expected, rtol=1e-12)
        np.testing.assert_array_equal(part["best"], np.minimum.accumulate(part["value"]))
        assert label.startswith("depth=") and "seed=" in label
        drawn += len(part)
    assert drawn == len(trials) - 3
    assert s.left_out() == "not drawn: 1 failed, 1 diverged, 1 completed without a finite value"
    # mode max: the running maximum
    s_max = search.load_search(store, sweep.id, search.resolve_objective({}, "train_loss", "max"))
    for part in search.history_series(s_max).values():
        np.testing.assert_array_equal(part["best"], np.maximum.accumulate(part["value"]))


def test_history_pools_the_studies_when_there_are_too_many(store, monkeypatch):
    sweep, trials = _lr_search(store)
    monkeypatch.setattr(search, "MAX_STUDY_LINES", 3)
    lines = search.history_series(search.load_search(store, sweep.id))
    assert list(lines) == ["all studies"]
    part = lines["all studies"]
    assert part["number"].tolist() == sorted(t.index for t in trials)
    expected = [lr_effect(t.config) for t in sorted(trials, key=lambda t: t.index)]
    np.testing.assert_allclose(part["value"], expected, rtol=1e-12)
    np.testing.assert_array_equal(part["best"], np.minimum.accumulate(expected))


def test_history_figure_draws_the_stored_best(store):
    sweep, _ = _lr_search(store)
    s = search.load_search(store, sweep.id)
    fig = search.build_search_figure(store, sweep.id, "search_history")
    steps = {ln.get_label(): ln.get_ydata() for ln in fig.axes[0].get_lines()}
    for label, part in search.history_series(s).items():
        np.testing.assert_array_equal(steps[label], part["best"])


def test_parameters_are_the_sampled_then_the_varying_grid_fields(store):
    sweep, _ = _lr_search(store)
    s = search.load_search(store, sweep.id)
    assert list(s.params) == ["lr", "activation_gain", "depth"]
    assert search.is_log(s.params["lr"]) and not search.is_log(s.params["activation_gain"])


def test_slice_panels_hold_each_parameter_against_the_objective(store):
    sweep, trials = _lr_search(store)
    fig = search.build_search_figure(store, sweep.id, "search_slice")
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.collections and ax.get_xlabel()]
    assert [ax.get_xlabel() for ax in panels] == ["lr", "activation_gain", "depth"]
    assert [ax.get_xscale() for ax in panels] == ["log", "linear", "linear"]
    by_index = sorted(trials, key=lambda t: t.index)
    for ax, name in zip(panels, ["lr", "activation_gain", "depth"], strict=True):
        xy = ax.collections[0].get_offsets()
        np.testing.assert_allclose(xy[:, 0], [t.config[name] for t in by_index], rtol=1e-12)
        np.testing.assert_allclose(xy[:, 1], [lr_effect(t.config) for t in by_index], rtol=1e-12)


def test_parallel_coordinates_scale_each_axis_to_its_range(store):
    sweep, trials = _lr_search(store)
    fig = search.build_search_figure(store, sweep.id, "parallel_coordinates")
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 4]  # 3 parameters + objective
    assert len(lines) == len(trials)
    ys = np.array([ln.get_ydata() for ln in lines])
    assert ys.min() == 0.0 and ys.max() == 1.0
    f = np.array([lr_effect(t.config) for t in trials])
    scaled = np.sort((f - f.min()) / (f.max() - f.min()))
    np.testing.assert_allclose(np.sort(ys[:, 3]), scaled, rtol=1e-9, atol=1e-12)
    lr = np.log10([t.config["lr"] for t in trials])
    np.testing.assert_allclose(
        np.sort(ys[:, 0]), np.sort((lr - lr.min()) / (lr.max() - lr.min())), atol=1e-12
    )


def test_importances_sum_to_one_and_a_parameter_without_effect_ranks_last(store):
    sweep, _ = _lr_search(store)
    imp = search.param_importances(search.load_search(store, sweep.id))
    assert set(imp) == {"lr", "activation_gain", "depth"}
    assert math.isclose(sum(imp.values()), 1.0, rel_tol=1e-9)
    assert next(iter(imp)) == "lr" and list(imp)[-1] == "depth"  # largest first
    assert imp["depth"] < 0.05 < imp["lr"]
    again = search.param_importances(search.load_search(store, sweep.id))
    assert again == imp  # the evaluator is seeded


def test_importances_refuse_too_few_trials_and_no_varying_parameter(store):
    sweep, _ = _lr_search(store, statuses={i: "failed" for i in range(1, 32)})
    with pytest.raises(InvalidInput, match="at least 2 completed") as exc:
        search.param_importances(search.load_search(store, sweep.id))
    assert exc.value.field == "kind"
    fixed = parse_spec({"name": "fixed", "seeds": 3, "parameters": {**BASE, "depth": 3}})
    sw = store.create_sweep(fixed)
    for t in store.list_trials(sw.id)[0]:
        store.write_records([(t.id, record(t.id, 0, 3))])
        store.finish_trial(t.id, "completed")
    for kind in ("search_slice", "parallel_coordinates", "param_importances"):
        with pytest.raises(InvalidInput, match="no sampled or varying swept parameter"):
            search.make_search_plot(store, sw.id, kind)
    assert search.make_search_plot(store, sw.id, "search_history").startswith(b"\x89PNG")
    with pytest.raises(InvalidInput, match="no early_stop"):
        search.make_search_plot(store, sw.id, "halving_rungs")


def _halving(store):
    """examples/lr-depth-trainability.yaml's shape, one depth: rungs at epochs 1, 2, 4, 8; the
    trials of odd index stop after epoch 2. test_loss at epoch e = (index + 1) · (1 + 1/(e+1))."""
    spec = parse_spec({
        "name": "asha", "seeds": 2, "search": {"kind": "random", "n": 4, "seed": 0},
        "parameters": {**BASE, "depth": 5, "lr": {"loguniform": [1e-4, 1.0]}, "epochs": 8},
        "early_stop": {"kind": "successive_halving", "metric": "test_loss", "mode": "min",
                       "grace_epochs": 1, "reduction": 2},
    })  # fmt: skip
    sweep = store.create_sweep(spec)
    trials, _ = store.list_trials(sweep.id, limit=100)
    batch = []
    for t in trials:
        last = 2 if t.index % 2 else 8
        for e in range(last + 1):
            v = (t.index + 1) * (1 + 1 / (e + 1))
            batch.append((t.id, record(t.id, e, 5, test_loss=v, train_loss=v)))
    store.write_records(batch)
    for t in trials:
        store.finish_trial(t.id, "stopped" if t.index % 2 else "completed")
    return sweep, trials


def test_halving_rungs_hold_the_recorded_values_and_the_stops(store):
    sweep, trials = _halving(store)
    r = search.halving_series(store, sweep.id)
    assert r.rungs == [1, 2, 4, 8] and r.reduction == 2 and r.mode == "min"
    for t in trials:
        xs, ys = r.values[t.id]
        expect = [1, 2] if t.index % 2 else [1, 2, 4, 8]
        assert xs.tolist() == expect
        np.testing.assert_allclose(ys, [(t.index + 1) * (1 + 1 / (e + 1)) for e in expect])
    assert r.stopped == {t.id: 2 for t in trials if t.index % 2}
    for rung in r.rungs:  # R = 2: the top half's boundary is the median of the rung's values
        vals = [ys[xs.tolist().index(rung)] for xs, ys in r.values.values() if rung in xs]
        assert math.isclose(r.boundary[rung], float(np.median(vals)), rel_tol=1e-12)


@pytest.mark.parametrize("kind", search.SEARCH_PLOT_KINDS)
@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_every_kind_renders(store, kind, fmt):
    sweep, _ = _halving(store)
    image = search.make_search_plot(store, sweep.id, kind, fmt=fmt)
    assert image.startswith(b"\x89PNG") if fmt == "png" else b"<svg" in image[:2000]


def test_a_parameter_the_kind_does_not_take_is_named(store):
    sweep, _ = _halving(store)
    with pytest.raises(InvalidInput) as exc:
        search.make_search_plot(store, sweep.id, "halving_rungs", metric="train_loss")
    assert exc.value.field == "metric"
    with pytest.raises(InvalidInput) as exc:
        search.make_search_plot(store, sweep.id, "search_history", yscale="cubic")
    assert exc.value.field == "yscale"
    with pytest.raises(InvalidInput) as exc:
        search.make_search_plot(store, sweep.id, "parallel_coordinates", yscale="log")
    assert exc.value.field == "yscale"


def test_a_tpe_search_draws_its_own_objective_layer_mode_and_epoch(store):
    from service.config import parse_trial_config
    from service.search.tpe import cells

    spec = parse_spec({
        "name": "tpe", "seeds": 1,
        "search": {"kind": "tpe", "n": 4, "objective": "grad_norm", "layer": 1, "mode": "max",
                   "epoch": 1, "seed": 0},
        "parameters": {**BASE, "depth": [2, 3], "lr": {"loguniform": [1e-4, 1.0]}, "epochs": 2},
    })  # fmt: skip
    sweep = store.create_sweep(spec)
    lrs = [0.3, 0.001, 0.05, 0.0002]
    configs = [parse_trial_config(spec.resolve({**base, "lr": lr}))
               for _, base in cells(spec) for lr in lrs]  # fmt: skip
    trials = store.append_trials(sweep.id, configs)
    for t in trials:  # grad_norm at ℓ = 1: 10·lr + 100·epoch; ℓ = 2 is far larger (never drawn)
        d = t.config["depth"]
        store.write_records([
            (t.id, record(t.id, e, d, grad_norm=np.array([10 * t.config["lr"] + 100 * e]
                                                         + [1e6] * (d - 1))))
            for e in range(3)
        ])  # fmt: skip
        store.finish_trial(t.id, "completed")
    s = search.load_search(store, sweep.id)
    assert s.objective == search.Objective("grad_norm", "max", 1, 1)
    lines = search.history_series(s)
    assert sorted(lines) == ["depth=2, seed=0", "depth=3, seed=0"]
    for part in lines.values():
        expected = 10 * np.array(lrs) + 100  # epoch 1's record, not the last (epoch 2)
        np.testing.assert_allclose(part["value"], expected, rtol=1e-12)
        np.testing.assert_array_equal(part["best"], np.maximum.accumulate(expected))


def test_importances_refuse_an_objective_that_does_not_vary(store):
    sweep, trials = _lr_search(store)
    for t in trials:  # every trial's last train_loss the same
        store.write_records([(t.id, record(t.id, 3, t.config["depth"], train_loss=0.5))])
    with pytest.raises(InvalidInput, match="no variance to apportion"):
        search.make_search_plot(store, sweep.id, "param_importances")


def test_a_search_not_run_yet_draws_no_data_and_importances_say_why(store):
    spec = parse_spec({
        "name": "unrun", "seeds": 1, "search": {"kind": "sobol", "n": 4, "seed": 0},
        "early_stop": {"kind": "successive_halving", "metric": "test_loss"},
        "parameters": {**BASE, "depth": 2, "epochs": 2, "lr": {"loguniform": [1e-3, 1.0]}},
    })  # fmt: skip
    sweep = store.create_sweep(spec)
    for kind in ("search_history", "search_slice", "parallel_coordinates", "halving_rungs"):
        fig = search.build_search_figure(store, sweep.id, kind)
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert any(t.startswith("no data") for t in texts), (kind, texts)
    with pytest.raises(InvalidInput, match="the sweep has 0"):
        search.make_search_plot(store, sweep.id, "param_importances")
