"""fit(): the records, determinism, measurement that changes nothing, divergence, the science."""

import copy
import itertools
import math

import numpy as np
import pytest
import torch

from service.config import LAYER_METRICS, RECORD_KEYS, SCALAR_METRICS, TrialConfig, config_hash
from service.errors import InvalidInput
from service.models import layer_metrics
from workers import metrics, nn
from workers.train import Trial, fit, generator

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
    recorded = layer_metrics(TrialConfig(**SMALL))
    assert set(r0) == set(SCALAR_METRICS) | set(recorded) | set(RECORD_KEYS)
    assert "input_gram" not in recs[1]
    for k in recorded:
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
    # the update ratio is between recorded epochs: 3 → 4 in one, 0 → 4 in the other
    since = ("update_ratio", "head_update_ratio")
    ratio = (every[4]["update_ratio"], sparse[1]["update_ratio"])
    assert not np.array_equal(*ratio)
    trim = [{k: v for k, v in r.items() if k not in since} for r in (every[0], every[4], *sparse)]
    assert_records_equal(trim[:2], trim[2:])


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
    m = metrics.probe_metrics(t.net, t.params, t.state, *t.probe)
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


# --- training-record edges (issue 9) ------------------------------------------------------------


def test_a_blow_up_on_the_last_step_is_diverged():
    """One step per epoch (100 samples, batch 100) at lr 1e20: the weights stay finite but the
    network after the step overflows. Checked only before each step, the record read
    `completed`; the epoch's last step is now checked too, and the trial stops there."""
    cfg = dict(depth=4, max_train_samples=100, lr=1e20)
    recs = list(fit(TrialConfig(**cfg, epochs=1), threads=1))
    assert [r["epoch"] for r in recs] == [0, 1]
    assert recs[1]["diverged"]
    assert len(list(fit(TrialConfig(**cfg, epochs=3), threads=1))) == 2  # stopped after it


def test_no_false_divergence_on_a_healthy_last_step():
    recs = records(epochs=2, max_train_samples=64)  # two steps per epoch, lr 0.01
    assert not any(r["diverged"] for r in recs)


@pytest.mark.parametrize("norm", ["batch", "batch_scale"])
def test_a_diverging_batch_leaves_the_running_statistics_as_they_were(norm):
    """The diverging minibatch's forward pass would write its (non-finite) statistics into the
    running ones although no step is taken on it; they are put back."""
    trial = Trial(TrialConfig(**SMALL, norm=norm, epochs=1))
    trial.train_epoch()
    with torch.no_grad():
        trial.params["W1"][0, 0] = math.inf  # every later forward is non-finite
    before = {k: v.clone() for k, v in trial.state.items()}
    stats = trial.train_epoch()
    assert stats.diverged and not math.isfinite(stats.loss)
    for k, v in trial.state.items():
        assert torch.equal(v, before[k]), k
    assert all(torch.isfinite(v).all() for v in trial.state.values())


def test_diverged_record_test_metrics_use_the_statistics_before_the_diverging_batch():
    """One training sample made infinite: the minibatch holding it has a NaN loss and NaN batch
    statistics, while the weights — never stepped on it — are fine. The diverged record's test
    metrics were NaN (the running statistics had taken that batch's); they are now those of the
    network as it stood."""
    trial = Trial(TrialConfig(**SMALL, epochs=2))
    trial.train_epoch()
    trial.data.X_train[0] = math.inf  # a subset's own copy, not the cached dataset
    before: list[tuple[dict, dict]] = []  # (params, running statistics) as each step began
    forward = nn.forward

    def spy(spec, p, s, x, mode, **kw):
        if mode == "train":
            before.append(({k: v.detach().clone() for k, v in p.items()}, copy.deepcopy(s)))
        return forward(spec, p, s, x, mode, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nn, "forward", spy)
        stats = trial.train_epoch()
    assert stats.diverged and not math.isfinite(stats.loss)
    record = trial.record(2, stats)
    assert record["diverged"] and math.isfinite(record["test_loss"])
    assert all(torch.isfinite(v).all() for v in trial.state.values())
    # The test metrics are those of the network as it was before the diverging batch: its
    # weights and the running statistics of the steps before, evaluated in one forward pass.
    params, state = before[-1]  # the last forward in training was the diverging batch's
    X, y = trial.data.X_test, trial.data.y_test
    with torch.no_grad():
        logits, _ = nn.forward(trial.spec, params, state, X, "running")
    want_loss = torch.nn.functional.cross_entropy(logits.double(), y).item()
    assert record["test_loss"] == pytest.approx(want_loss, rel=1e-5)
    assert record["test_acc"] == (logits.argmax(dim=1) == y).double().mean().item()


def test_epoch_zero_test_metrics_use_batch_statistics():
    """Before any step the running statistics are torch's placeholders (0, 1), which make every
    BatchNorm the identity: epoch 0's test metrics use each test batch's own statistics under
    either eval_norm, and eval_norm matters from epoch 1 on."""
    for norm in ("batch", "batch_scale"):
        run = records(epochs=1, norm=norm, eval_norm="running")
        bat = records(epochs=1, norm=norm, eval_norm="batch")
        assert run[0]["test_loss"] == bat[0]["test_loss"], norm
        assert run[0]["test_acc"] == bat[0]["test_acc"], norm
        assert run[1]["test_loss"] != bat[1]["test_loss"], norm


def test_adam_ignores_momentum_and_hashes_it_away():
    a = TrialConfig(**SMALL, optimizer="adam", lr=1e-3, momentum=0.9, epochs=1)
    b = TrialConfig(**SMALL, optimizer="adam", lr=1e-3, epochs=1)
    assert a == b and a.momentum == 0.0 and config_hash(a) == config_hash(b)
    assert_records_equal(list(fit(a, threads=1)), list(fit(b, threads=1)))


def test_fit_runs_at_the_thread_count_it_is_given_and_puts_it_back():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cfg = TrialConfig(**SMALL, epochs=1, momentum=0.9)
        gen = fit(cfg, threads=1)
        next(gen)
        assert torch.get_num_threads() == 1
        a = [next(gen)]
        assert torch.get_num_threads() == 1
        assert list(gen) == [] and torch.get_num_threads() == 2
        torch.set_num_threads(1)
        b = list(fit(cfg, threads=1))[1:]
        assert_records_equal(a, b)  # the process's own setting played no part
    finally:
        torch.set_num_threads(before)
    with pytest.raises(InvalidInput, match="threads"):
        next(fit(cfg, threads=0))


def test_default_float32_trials_are_unchanged():
    """Numbers computed by the code before the new options (dtype, norm_eps, bias_init, …)
    existed: a default-valued trial must reproduce them (the init draws exactly; a trained epoch
    to float32 round-off, which differs across CPUs)."""
    c = TrialConfig()
    p = nn.init_params_of(nn.make_spec(c), c, generator(0, "init"))
    assert p["W1"][0, :3].tolist() == [
        0.05556595325469971,
        -0.13927394151687622,
        -0.024431895464658737,
    ]
    assert p["W_head"][0, :3].tolist() == [
        0.10839451849460602,
        -0.015584497712552547,
        -0.1298602819442749,
    ]
    c = TrialConfig(init="orthogonal", init_gain=1.3, bias=True, width=16, depth=3)
    p = nn.init_params_of(nn.make_spec(c), c, generator(0, "init"))
    np.testing.assert_allclose(
        p["W2"][0, :3].numpy(),
        [-0.19567912817001343, -0.32756543159484863, 0.18749208748340607],
        rtol=1e-6,
    )
    assert p["b1"].abs().max() == 0
    r = list(fit(TrialConfig(**SMALL, epochs=1, momentum=0.9), threads=1))[1]
    assert r["train_loss"] == pytest.approx(2.3696959018707275, rel=1e-5)
    assert r["test_loss"] == pytest.approx(2.1909198337131075, rel=1e-5)
    np.testing.assert_allclose(
        r["grad_norm"], [1.2895479099215459, 0.7919357981196604, 0.6677699089734427], rtol=1e-4
    )
    np.testing.assert_allclose(
        r["isometry_gap/act"],
        [1.9488280211375102, 1.8000533053197891, 2.0670171996215347],
        rtol=1e-4,
    )


# --- dtype and input_norm ------------------------------------------------------------------------


def test_float64_trial_is_float64_throughout_and_starts_from_its_float32_twin():
    t64 = Trial(TrialConfig(**SMALL, dtype="float64", bias=True, bias_init="torch"))
    t32 = Trial(TrialConfig(**SMALL, bias=True, bias_init="torch"))
    assert all(v.dtype == torch.float64 for v in t64.params.values())
    assert all(v.dtype == torch.float64 for v in t64.state.values())
    assert t64.data.X_train.dtype == t64.probe[0].dtype == torch.float64
    for k, v in t32.params.items():  # the same draws, rounded once to float32 in the twin
        np.testing.assert_allclose(t64.params[k].detach().numpy(), v.detach().numpy(), rtol=1e-7)
    assert torch.equal(t64.data.X_train, t32.data.X_train.double())
    r64 = list(fit(TrialConfig(**SMALL, dtype="float64", epochs=1), threads=1))
    r32 = list(fit(TrialConfig(**SMALL, epochs=1), threads=1))
    assert r64[1]["train_loss"] == pytest.approx(r32[1]["train_loss"], rel=1e-4)
    np.testing.assert_allclose(r64[1]["grad_norm"], r32[1]["grad_norm"], rtol=1e-3)


def test_float64_orthogonal_init_is_orthogonal_to_float64_rounding():
    t64 = Trial(TrialConfig(**SMALL, dtype="float64", init="orthogonal", norm="none", epochs=0))
    t32 = Trial(TrialConfig(**SMALL, init="orthogonal", norm="none", epochs=0))
    W64, W32 = t64.params["W2"].detach(), t32.params["W2"].detach()
    eye = torch.eye(32, dtype=torch.float64)
    assert (W64 @ W64.T - eye).abs().max() < 1e-14
    assert (W32.double() @ W32.double().T - eye).abs().max() > 1e-9  # float32 rounding


def first_layer_inputs(trial: Trial, monkeypatch) -> torch.Tensor:
    """Every row block 1's Linear receives in one training epoch and its record (test metrics,
    probe metrics), stacked."""
    seen: list[torch.Tensor] = []
    linear = nn.linear

    def tapped(p, name, x):
        if name == "1":
            seen.append(x.detach().double().clone())
        return linear(p, name, x)

    with monkeypatch.context() as mp:
        mp.setattr(nn, "linear", tapped)
        trial.record(1, trial.train_epoch())
    return torch.cat(seen)


def test_unit_rms_inputs_reach_the_first_layer(monkeypatch):
    t = Trial(TrialConfig(**SMALL, input_norm="unit_rms", epochs=1))
    plain = Trial(TrialConfig(**SMALL, epochs=1))
    for X in (t.data.X_train, t.data.X_test, t.probe[0]):
        np.testing.assert_allclose(X.double().pow(2).mean(dim=1).numpy(), 1.0, rtol=1e-6)
    x, x0 = t.probe[0].double(), plain.probe[0].double()  # the same samples, rescaled
    scale = x0.pow(2).mean(dim=1, keepdim=True).sqrt()
    np.testing.assert_allclose(x.numpy(), (x0 / scale).numpy(), rtol=1e-6, atol=1e-7)
    # What the first Linear is given, in training, test evaluation and the probe's metrics
    seen = first_layer_inputs(t, monkeypatch)
    n = len(t.data.X_test) + len(t.probe[0])  # at least every test and probe sample once
    assert len(seen) >= n + (len(t.data.X_train) // 32) * 32
    np.testing.assert_allclose(seen.pow(2).mean(dim=1).numpy(), 1.0, rtol=1e-6)
    raw = first_layer_inputs(plain, monkeypatch).pow(2).mean(dim=1)  # contrast: not unit RMS
    assert raw.min() < 0.5 and raw.max() > 2.0


# --- epoch 0's training-set pass on a bounded subset (TrialConfig.epoch0_train_samples) --------


def test_default_epoch0_bound_leaves_digits_and_gaussian_whole():
    """The default bound (5000) exceeds digits' 1437 and gaussian's 4000 training samples: their
    records are bit-identical to measuring the whole set (None)."""
    for dataset in ("digits", "gaussian"):
        kw = dict(depth=3, width=32, batch_size=100, dataset=dataset, epochs=1)
        assert TrialConfig(**kw).epoch0_train_samples == 5000
        assert_records_equal(records(**kw), records(**kw, epoch0_train_samples=None))


def per_sample_losses(trial):
    """Cross-entropy and correctness of every training sample, one forward (no norm: a
    sample's output does not depend on its batch-mates)."""
    with torch.no_grad():
        logits, _ = nn.forward(trial.spec, trial.params, trial.state, trial.data.X_train, "batch")
    y = trial.data.y_train
    loss = torch.nn.functional.cross_entropy(logits.double(), y, reduction="none")
    return loss, (logits.argmax(dim=1) == y).double()


def test_epoch0_stats_are_the_mean_over_a_seeded_subset_and_nothing_else_moves():
    base = dict(SMALL, max_train_samples=1000, norm="none", epochs=1)
    whole = Trial(TrialConfig(**base, epoch0_train_samples=None))
    part = Trial(TrialConfig(**base, epoch0_train_samples=300))
    rows = torch.randperm(1000, generator=generator(0, "epoch0"))[:300]
    assert torch.equal(part.epoch0_rows, rows) and whole.epoch0_rows is None
    loss, correct = per_sample_losses(part)
    stats = part.initial_stats()
    assert stats.loss == pytest.approx(float(loss[rows].mean()), rel=1e-5)
    assert stats.acc == float(correct[rows].mean())
    assert whole.initial_stats().loss == pytest.approx(float(loss.mean()), rel=1e-5)
    # the probe batch, the parameters and the training are those of the unbounded trial
    a = records(**base, epoch0_train_samples=None)
    b = records(**base, epoch0_train_samples=300)
    assert a[0]["train_loss"] != b[0]["train_loss"]  # the subset is a real subset
    for r in (a[0], b[0]):  # epoch 0's training-set stats are what differs, by design
        del r["train_loss"], r["train_acc"]
    assert_records_equal(a, b)


def test_epoch0_pass_forwards_only_the_bounded_subset(monkeypatch):
    """What bounds the cost: epoch 0's training-set pass forwards k samples, not N (gaussian:
    N = 4000), in whole minibatches with batch norm; and never fewer than one minibatch."""
    seen = []
    forward = nn.forward

    def counting(spec, params, state, x, mode, **kw):
        seen.append(len(x))
        return forward(spec, params, state, x, mode, **kw)

    kw = dict(depth=3, width=32, batch_size=100, dataset="gaussian", epochs=0)
    trial = Trial(TrialConfig(**kw, epoch0_train_samples=500))
    monkeypatch.setattr(nn, "forward", counting)
    trial.initial_stats()
    assert seen == [100] * 5
    seen.clear()
    Trial(TrialConfig(**kw, epoch0_train_samples=30)).initial_stats()
    assert seen == [100]  # raised to batch_size
