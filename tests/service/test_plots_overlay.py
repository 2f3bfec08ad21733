"""The theory overlay of a stored sweep (service.plots.overlay): each measured line gets
service.theory.predict's values of the same metric, from each seed's stored input Gram, averaged
over the seeds; grad_norm relative to the last block's; a key predict cannot give is a 422 naming
why. Closed forms: a LayerNorm linear network keeps its input's gap, a linear network without a
norm has relative gradients [√(d_in/d), 1, …, 1], an attention stack without skips collapses."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from records import record, unit_gram

from service.errors import InvalidInput
from service.isometry import isometry_gap
from service.plots import overlay, stored
from service.plots.select import THEORY_METRICS
from service.spec import parse_spec
from service.store import Store
from service.theory.predict import predict


@pytest.fixture
def store(sqlite_url):
    with Store(sqlite_url) as s:
        yield s


def _sweep(store, seeds=3, n=6, **params):
    base = {"epochs": 1, "batch_size": n, "width": 8, "norm": "layer", "order": "act_norm",
            "norm_eps": 0.0}  # fmt: skip
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


def _overlay(store, sweep, metric, **kw):
    frame = store.read_metrics(sweep.id, metrics=metric, epoch=[0])
    if metric == "grad_norm":
        frame = overlay.relative_to_last_block(frame)
    args = {"x": None, "group_by": None, "epoch": None, "layer": None, **kw}
    return overlay.overlay_predictions(store, frame, metric, **args)


def test_a_linear_layernorm_network_keeps_its_inputs_gap_at_every_depth(store):
    """σ = identity, LayerNorm, ε = 0: the Gram never changes; against depth, each depth's point
    is its own last layer's prediction (one point per depth, not the deepest trial's profile)."""
    sweep, _ = _sweep(store, depth=[3, 5], activation="identity")
    theory, title = _overlay(store, sweep, "isometry_gap/norm", x="depth")
    assert list(theory) == ["measured"]
    xs, gaps = theory["measured"]
    assert list(xs) == [3, 5]
    expected = np.mean([isometry_gap(unit_gram(6, 100 + s)) for s in range(3)])
    np.testing.assert_allclose(gaps, expected, rtol=1e-9)
    profile, _ = _overlay(store, sweep, "isometry_gap/norm", x="layer", group_by="depth")
    assert list(profile["5"][0]) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(profile["5"][1], expected, rtol=1e-9)
    assert title.startswith("isometry_gap/norm: measured and mean-field prediction")


@pytest.mark.parametrize(
    "metric", ["isometry_gap/act", "rms", "mean_cosine", "range_isometry_gap/act"]
)
def test_each_line_is_predict_averaged_over_its_own_seeds(store, metric):
    sweep, _ = _sweep(store, seeds=2, depth=3, activation=["identity", "tanh"], norm="batch",
                      order="norm_act")  # fmt: skip
    theory, _ = _overlay(store, sweep, metric, x="layer", group_by="activation")
    assert sorted(theory) == ["identity", "tanh"]
    for act, (layers, values) in theory.items():
        cfg = {"depth": 3, "width": 8, "batch_size": 6, "norm": "batch", "activation": act,
               "norm_eps": 0.0}  # fmt: skip
        per_seed = [
            predict({**cfg, "seed": s}, input_kernel=unit_gram(6, 100 + s), gradients=False)[metric]
            for s in (0, 1)
        ]
        np.testing.assert_allclose(values, np.mean(per_seed, axis=0), rtol=1e-12)
        assert list(layers) == [1, 2, 3]
    if metric == "isometry_gap/act":  # a linear BatchNorm network's act is batch-centred
        assert np.isinf(theory["identity"][1]).all() and np.isfinite(theory["tanh"][1]).all()


def test_grad_norm_is_drawn_relative_to_the_last_block(store):
    """A linear network without a norm: every hidden block's gradient is the last one's, the
    first's √(d_in/d) times it (digits: d_in = 64, width 8), at every depth."""
    sweep, _ = _sweep(store, seeds=2, depth=[3, 5], activation="identity", norm="none")
    theory, title = _overlay(store, sweep, "grad_norm", x="depth", layer=1)
    xs, rel = theory["measured"]
    assert list(xs) == [3, 5]
    np.testing.assert_allclose(rel, math.sqrt(64 / 8), rtol=1e-10)
    assert "relative to the last block" in title
    profile, _ = _overlay(store, sweep, "grad_norm", x="layer", group_by="depth")
    np.testing.assert_allclose(profile["5"][1], [math.sqrt(8), 1, 1, 1, 1], rtol=1e-10)


def test_the_measured_grad_norm_is_divided_by_each_trials_last_block():
    frame = pd.DataFrame(
        {
            "trial_id": [1, 1, 1, 2, 2, 1],
            "epoch": [0, 0, 0, 0, 0, 1],
            "metric": ["grad_norm"] * 5 + ["grad_norm"],
            "layer": [1, 2, 3, 1, 2, 1],
            "value": [6.0, 3.0, 2.0, 5.0, 0.0, 7.0],
        }
    )
    other = pd.DataFrame({"trial_id": [1], "epoch": [0], "metric": ["rms"], "layer": [1],
                          "value": [4.0]})  # fmt: skip
    out = overlay.relative_to_last_block(pd.concat([frame, other], ignore_index=True))
    np.testing.assert_array_equal(out["value"], [3.0, 1.5, 1.0, np.inf, np.nan, 1.0, 4.0])


def test_a_transformer_without_skips_collapses_whatever_its_inputs(store):
    """No skips, uniform attention: every sequence is one token from block 1 on (token_cosine 1,
    token_isometry_gap +∞) — the one prediction that does not need the probe's tokens."""
    sweep, _ = _sweep(store, seeds=2, depth=3, model="transformer", mlp_ratio=0, skip=False,
                      norm="layer")  # fmt: skip
    theory, title = _overlay(store, sweep, "token_cosine", x="layer")
    ((layers, cosine),) = theory.values()  # one line (labelled by its epoch, 0)
    assert list(layers) == [1, 2, 3]
    np.testing.assert_array_equal(cosine, [1.0, 1.0, 1.0])
    assert "uniform" in title
    theory, _ = _overlay(store, sweep, "token_isometry_gap", x="layer")
    assert np.isinf(next(iter(theory.values()))[1]).all()
    with pytest.raises(InvalidInput) as exc:  # pooled taps need the tokens: not stored
        _overlay(store, sweep, "isometry_gap/residual", x="layer")
    assert exc.value.field == "metric" and "tokens" in exc.value.message
    assert set(exc.value.allowed) == {"token_cosine", "token_isometry_gap"}


@pytest.mark.parametrize(
    ("params", "metric", "why"),
    [
        ({}, "weight_isometry_gap", "unknown value"),  # not a metric the theory draws at all
        ({"model": "transformer"}, "token_cosine", "mlp_ratio 0"),  # MLP sublayers
        ({"model": "transformer", "mlp_ratio": 0}, "grad_norm", "softmax"),
        ({"model": "transformer", "mlp_ratio": 0}, "token_cosine", "tokens"),  # with skips
    ],
)
def test_a_metric_without_a_prediction_is_a_422_naming_why(store, params, metric, why):
    sweep, _ = _sweep(store, seeds=1, depth=2, **params)
    with pytest.raises(InvalidInput) as exc:
        stored.make_plot(store, sweep.id, "theory_overlay", metric=metric)
    assert exc.value.field == "metric" and why in exc.value.message, exc.value.message
    assert set(exc.value.allowed) <= set(THEORY_METRICS)


def test_a_line_outside_the_quadratures_range_says_so_and_the_rest_renders(store):
    sweep, _ = _sweep(store, seeds=2, depth=[2, 3])
    png = stored.make_plot(store, sweep.id, "theory_overlay", metric="isometry_gap/norm")
    assert png.startswith(b"\x89PNG")
    big, _ = _sweep(store, seeds=1, depth=2, activation="tanh", activation_gain=8.0)
    theory, title = _overlay(store, big, "isometry_gap/norm")
    assert theory == {} and "no prediction for 0 (the recursion leaves" in title
    svg = stored.make_plot(store, big.id, "theory_overlay", metric="rms", fmt="svg")
    assert svg.lstrip().startswith(b"<?xml")


def test_every_metric_the_overlay_takes_is_one_predict_gives_somewhere():
    configs = [
        {"model": "resmlp", "norm": "batch"},
        {"model": "mlp", "norm": "layer"},
        {"model": "transformer", "mlp_ratio": 0, "skip": True, "dataset": "gaussian"},
    ]
    given = set()
    for c in configs:
        p = predict({"depth": 2, "width": 16, "batch_size": 4, **c}, samples=256)
        given |= {k for k in p if k not in ("unpredicted", "notes")}
    assert given == set(THEORY_METRICS)
