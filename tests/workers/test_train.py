"""fit(): the records, determinism, measurement that changes nothing, divergence, the science."""

import copy
import itertools
import math

import numpy as np
import pytest
import torch

from service.config import LAYER_METRICS, SCALAR_METRICS, TrialConfig
from service.errors import InvalidInput
from workers import metrics
from workers.train import Trial, fit

SMALL = dict(depth=3, width=32, batch_size=32, dataset="digits", max_train_samples=256)


def records(**kw):
    return list(fit(TrialConfig(**{**SMALL, **kw})))


def assert_records_equal(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            if k != "epoch_time_s":
                np.testing.assert_array_equal(ra[k], rb[k], err_msg=k)


# --- the record --------------------------------------------------------------------------------


def test_record_contents():
    recs = records(epochs=3, record_every=2)
    assert [r["epoch"] for r in recs] == [0, 2, 3]
    r0 = recs[0]
    assert set(r0) == set(SCALAR_METRICS) | set(LAYER_METRICS) | {"epoch", "diverged", "input_gram"}
    assert "input_gram" not in recs[1]
    for k in LAYER_METRICS:
        assert isinstance(r0[k], np.ndarray) and r0[k].shape == (3,) and r0[k].dtype == np.float64
    for k in SCALAR_METRICS:
        assert isinstance(r0[k], float)
    assert r0["epoch_time_s"] == 0.0 and recs[1]["epoch_time_s"] > 0
    assert not any(r["diverged"] for r in recs)
    G = r0["input_gram"]
    assert G.shape == (32, 32)
    np.testing.assert_allclose(np.diag(G), 1.0, rtol=1e-12)
    # digits has 64 input features ≥ n = 32; batch norm at n = d = 32 centers → singular
    assert (r0["isometry_gap/norm"] == math.inf).all()
    assert 0 <= r0["train_acc"] <= 1 and 0 <= r0["test_acc"] <= 1


def test_no_norm_gap_without_norm_and_first_linear_singular_when_inputs_are_few():
    r0 = records(norm="none", batch_size=100, epochs=0)[0]
    assert "isometry_gap/norm" not in r0
    assert r0["isometry_gap/linear"][0] == math.inf  # 64 input features < n = 100: rank ≤ 64


def test_training_learns():
    recs = records(
        dataset="gaussian",
        depth=2,
        width=64,
        epochs=3,
        lr=0.1,
        norm="layer",
        max_train_samples=None,
    )
    assert recs[-1]["train_loss"] < recs[0]["train_loss"] - 0.3
    assert recs[-1]["test_acc"] > 0.5  # chance: 0.1


def test_train_loss_at_epoch_zero_is_the_untrained_network_on_the_training_set():
    cfg = TrialConfig(**SMALL, epochs=0, norm="layer")
    trial = Trial(cfg)
    logits, _ = __import__("workers.nn", fromlist=["forward"]).forward(
        trial.spec, trial.params, trial.state, trial.data.X_train, "batch"
    )
    expected = torch.nn.functional.cross_entropy(logits, trial.data.y_train).item()
    assert next(fit(cfg))["train_loss"] == pytest.approx(expected, rel=1e-5)


def test_eval_norm_running_vs_batch():
    run = records(epochs=1, eval_norm="running")
    bat = records(epochs=1, eval_norm="batch")
    assert run[1]["test_loss"] != bat[1]["test_loss"]  # BN: running vs own statistics
    assert run[1]["train_loss"] == bat[1]["train_loss"]  # training is the same
    lrun = records(epochs=1, eval_norm="running", norm="layer")
    lbat = records(epochs=1, eval_norm="batch", norm="layer")
    assert lrun[1]["test_loss"] == pytest.approx(lbat[1]["test_loss"], rel=1e-6)  # no BN


def test_batch_larger_than_training_set_names_the_field():
    with pytest.raises(InvalidInput, match="batch_size"):
        records(batch_size=300)


def test_dict_config_is_validated():
    with pytest.raises(InvalidInput, match="depht: unknown field"):
        next(fit({"depht": 3}))


# --- determinism -------------------------------------------------------------------------------


def test_same_config_and_seed_give_identical_records():
    torch.manual_seed(1)  # the global RNG must play no part
    a = records(epochs=2, seed=7, momentum=0.9)
    torch.manual_seed(2)
    b = records(epochs=2, seed=7, momentum=0.9)
    assert_records_equal(a, b)
    c = records(epochs=2, seed=8, momentum=0.9)
    assert c[0]["train_loss"] != a[0]["train_loss"]
    assert not np.array_equal(c[2]["grad_norm"], a[2]["grad_norm"])


# --- measuring changes nothing -----------------------------------------------------------------


def snapshot(trial):
    return (
        {k: v.detach().clone() for k, v in trial.params.items()},
        {k: (None if v.grad is None else v.grad.clone()) for k, v in trial.params.items()},
        {k: v.clone() for k, v in trial.state.items()},
        copy.deepcopy(trial.optimizer.state_dict()),
        trial.shuffle.get_state().clone(),
    )


def assert_snapshots_equal(a, b):
    params, grads, state, opt, rng = a
    params2, grads2, state2, opt2, rng2 = b
    assert all(torch.equal(params[k], params2[k]) for k in params)
    assert all(
        (grads[k] is None and grads2[k] is None) or torch.equal(grads[k], grads2[k]) for k in grads
    )
    assert all(torch.equal(state[k], state2[k]) for k in state)
    assert torch.equal(rng, rng2)
    assert opt["param_groups"] == opt2["param_groups"]
    assert opt["state"].keys() == opt2["state"].keys()
    for i in opt["state"]:
        for k, v in opt["state"][i].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(opt2["state"][i][k]))


@pytest.mark.parametrize("norm", ["batch", "batch_scale"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_measuring_writes_nothing(norm, optimizer):
    trial = Trial(TrialConfig(**SMALL, norm=norm, optimizer=optimizer, momentum=0.9, epochs=2))
    trial.train_epoch()
    before = snapshot(trial)
    assert before[3]["state"]  # optimizer state exists (momentum / Adam moments)
    trial.record(1, trial.initial_stats())
    assert_snapshots_equal(before, snapshot(trial))


@pytest.mark.parametrize("eval_norm", ["running", "batch"])
def test_training_trajectory_is_the_same_measured_or_not(eval_norm):
    cfg = TrialConfig(**SMALL, norm="batch", optimizer="adam", lr=1e-3, eval_norm=eval_norm)
    measured, plain = Trial(cfg), Trial(cfg)
    measured.record(0, measured.initial_stats())
    for epoch in (1, 2, 3):
        sm, sp = measured.train_epoch(), plain.train_epoch()
        measured.record(epoch, sm)
        assert sm.loss == sp.loss and sm.acc == sp.acc
    assert_snapshots_equal(snapshot(measured), snapshot(plain))


def test_record_every_does_not_change_the_numbers():
    every = records(epochs=4, record_every=1, momentum=0.5)
    sparse = records(epochs=4, record_every=4, momentum=0.5)
    assert [r["epoch"] for r in sparse] == [0, 4]
    assert_records_equal([every[0], every[4]], sparse)


# --- divergence --------------------------------------------------------------------------------


def test_huge_learning_rate_diverges_and_stops():
    recs = records(norm="none", activation="relu", lr=1e6, epochs=5)
    last = recs[-1]
    assert last["diverged"] and not math.isfinite(last["train_loss"])
    assert 1 <= last["epoch"] < 5  # stopped: no record after the divergent one
    assert not any(r["diverged"] for r in recs[:-1])
    assert [r["epoch"] for r in recs] == list(range(last["epoch"] + 1))
    for k in LAYER_METRICS:
        if k in last:
            assert last[k].shape == (3,)  # measured as it stands, NaN/inf kept as values


def test_untrained_network_with_non_finite_loss_diverges_at_epoch_zero():
    """exp(exp(exp(·))) overflows float32: the untrained loss is already not finite."""
    recs = records(norm="none", activation="exp", init_gain=3.0, epochs=3)
    assert len(recs) == 1
    r0 = recs[0]
    assert r0["epoch"] == 0 and r0["diverged"] and not math.isfinite(r0["train_loss"])
    assert np.isnan(r0["grad_norm"]).any() or np.isinf(r0["grad_norm"]).any()


# --- the science: Meterez et al. 2024 ------------------------------------------------------------


def log_grad_norm_layer1(depth, init, seed):
    cfg = TrialConfig(
        depth=depth,
        width=100,
        batch_size=100,
        dataset="gaussian",
        activation="identity",
        norm="batch",
        init=init,
        seed=seed,
    )
    t = Trial(cfg)
    m = metrics.probe_metrics(t.spec, t.params, t.state, *t.probe)
    return math.log(m["grad_norm"][0])


@pytest.mark.slow
def test_gradient_explosion_gaussian_vs_orthogonal():
    """Linear activation, BatchNorm, width = batch = 100. Gaussian weights: log‖∂L/∂W_1‖ grows
    with depth (Yang et al. 2019: exponentially, whatever the activation). Orthogonal weights:
    bounded at any depth (Meterez et al. 2024, Thm 5) — flat to within seed noise."""
    depths = (10, 50, 100, 200)
    seeds = range(3)
    mean = {
        init: [np.mean([log_grad_norm_layer1(L, init, s) for s in seeds]) for L in depths]
        for init in ("gaussian", "orthogonal")
    }
    g, o = mean["gaussian"], mean["orthogonal"]
    assert all(b > a for a, b in itertools.pairwise(g))  # increasing in depth
    assert g[-1] - g[0] > 0.3  # ≥ 35% larger gradient at 200 than at 10 layers
    assert max(o) - min(o) < 0.1  # flat
    assert g[-1] - g[0] > 5 * (max(o) - min(o))


@pytest.mark.slow
def test_depth_1000_width_100_trains_and_records():
    recs = list(
        fit(
            TrialConfig(
                depth=1000,
                width=100,
                batch_size=100,
                dataset="gaussian",
                max_train_samples=200,
                activation="tanh",
                gain_exponent=0.4,
                init="orthogonal",
                epochs=1,
                lr=1e-3,
            )
        )
    )
    assert [r["epoch"] for r in recs] == [0, 1] and not recs[1]["diverged"]
    assert recs[1]["grad_norm"].shape == (1000,) and np.isfinite(recs[1]["grad_norm"]).all()
    assert (recs[1]["weight_isometry_gap"] < 1e-3).all()  # two small SGD steps from orthogonal
