"""service.theory.predict and its BatchNorm kernels against closed forms: the linear BatchNorm
recursion's fixed point n/(n − 1)·P and gradient rate (n − 2)/(n − 3) per block (Yang et al.
2019), De & Smith's +c² per residual block, a linear network's powers, the LayerNorm recursion
of service.theory.mean_field_gaps, and Monte Carlo against the exact Gaussian case."""

import math

import numpy as np
import pytest

from service import theory
from service.config import parse_trial_config
from service.errors import InvalidInput
from service.isometry import isometry_gap
from service.models import layer_metrics
from service.plots.stored import theory_inputs
from service.theory import kernels as kn
from service.theory.predict import predict

EXACT = {"norm_eps": 0.0, "dataset": "digits", "epochs": 0}


def _random_cov(n, rng, rank=None):
    A = rng.standard_normal((n, rank or 2 * n)) * rng.uniform(0.3, 2.0, (n, 1))
    return A @ A.T / A.shape[1]


# ---------------------------------------------------------------------- BatchNorm, one layer


@pytest.mark.parametrize("n", [2, 3, 10, 40])
def test_linear_batchnorm_of_an_isotropic_batch_is_n_over_n_minus_1_times_p(n):
    P = np.eye(n) - 1.0 / n
    for c in (0.3, 1.0, 7.0):
        K = kn.bn_gaussian(c * P + 5.0 * np.ones((n, n)), 0.0, centred=True)  # the mean: removed
        np.testing.assert_allclose(K, n / (n - 1) * P, atol=1e-10)
    # scale-only of an isotropic batch: n·E[uuᵀ/‖u‖²] = I
    np.testing.assert_allclose(
        kn.bn_gaussian(2.5 * np.eye(n), 0.0, centred=False), np.eye(n), atol=1e-10
    )


def test_two_sample_batchnorm_is_plus_minus_one():
    K = kn.bn_gaussian(np.array([[2.0, 0.3], [0.3, 0.5]]), 0.0, centred=True)
    np.testing.assert_allclose(K, [[1.0, -1.0], [-1.0, 1.0]], atol=1e-10)


@pytest.mark.parametrize("centred", [True, False])
@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_exact_linear_batchnorm_matches_monte_carlo(centred, eps):
    rng = np.random.default_rng(1)
    n, M = 6, 400_000
    S = _random_cov(n, rng, rank=3)  # ill-conditioned: rank 3 of 6
    exact = kn.bn_gaussian(S, eps, centred)
    Y = kn.bn_samples(kn.gaussian_draws(S, M, rng), eps, centred)
    mc = Y.T @ Y / M
    se = np.sqrt(((Y[:, :, None] * Y[:, None, :]) ** 2).mean(axis=0) / M)
    assert np.abs(mc - exact).max() < 5 * se.max(), (np.abs(mc - exact).max(), se.max())
    # ε shrinks every sample's mean square below 1; without ε it is exactly n over the batch
    tr = np.trace(exact)
    assert tr == pytest.approx(n, rel=1e-10) if eps == 0 else tr < n - 1e-3


@pytest.mark.parametrize("centred", [True, False])
@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_isotropic_batchnorm_backward_matches_monte_carlo(centred, eps):
    rng = np.random.default_rng(2)
    n, M, c = 8, 400_000, 1.7
    P = np.eye(n) - 1.0 / n if centred else np.eye(n)
    D = _random_cov(n, rng)
    closed = kn.bn_backward_isotropic(D, c, eps, centred)
    U = kn.gaussian_draws(c * P, M, rng)
    G = kn.gaussian_draws(D, M, rng)
    Gu = kn.bn_backward_samples(U, G, eps, centred)
    mc = Gu.T @ Gu / M
    assert np.abs(mc - closed).max() < 0.02 * np.abs(closed).max()
    if (
        eps == 0
    ):  # the trace contracts by (m − 1)/(m − 2)/c·… : tr E[JDJ] = n/(c(m−2))·(m−1)/m·tr D′
        m = n - 1 if centred else n
        expected = n / (c * (m - 2)) * (m - 1) / m * np.trace(P @ D @ P)
        assert np.trace(closed) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("centred", [True, False])
@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_gaussian_batchnorm_backward_is_the_isotropic_closed_form_and_monte_carlo(centred, eps):
    """The exact backward map at any Gaussian input (kernels.bn_backward_gaussian) reduces to
    the sphere's closed form at c·P, and agrees with 400k draws elsewhere (rank 6 of 8: the
    draws' variance, E[1/‖Pu‖⁴], is finite only for a rank over 4)."""
    rng = np.random.default_rng(7)
    n, M = 8, 400_000
    P = np.eye(n) - 1.0 / n if centred else np.eye(n)
    D = _random_cov(n, rng)
    iso = kn.bn_backward_gaussian(1.7 * P + (5.0 if centred else 0.0), D, eps, centred)
    np.testing.assert_allclose(iso, kn.bn_backward_isotropic(D, 1.7, eps, centred), atol=1e-10)
    S = _random_cov(n, rng, rank=6)
    exact = kn.bn_backward_gaussian(S, D, eps, centred)
    Gu = kn.bn_backward_samples(kn.gaussian_draws(S, M, rng), kn.gaussian_draws(D, M, rng),
                                eps, centred)  # fmt: skip
    mc = Gu.T @ Gu / M
    assert np.abs(mc - exact).max() < 0.03 * np.abs(exact).max()


def test_bn_jacobian_is_the_derivative():
    rng = np.random.default_rng(3)
    for centred in (True, False):
        u, g = rng.standard_normal(5), rng.standard_normal(5)
        h = 1e-6
        J = np.array(
            [
                (
                    kn.bn_samples((u + h * e)[None], 0.1, centred)
                    - kn.bn_samples((u - h * e)[None], 0.1, centred)
                )[0]
                / (2 * h)
                for e in np.eye(5)
            ]
        )  # row k: ∂y/∂u_k
        np.testing.assert_allclose(
            kn.bn_backward_samples(u[None], g[None], 0.1, centred)[0], J @ g, atol=1e-7
        )


# --------------------------------------------------------------------------- whole networks


@pytest.mark.parametrize("n", [8, 20])
def test_linear_batchnorm_gradients_grow_by_the_closed_form_rate(n):
    """Yang et al. 2019: a linear BatchNorm network at its fixed point multiplies the gradient's
    squared norm by (n − 2)/(n − 3) per block (m = n − 1: (m − 1)/(m − 2)), whatever the init
    gain; the representation stays n/(n − 1)·P."""
    cfg = {**EXACT, "norm": "batch", "order": "norm_act", "activation": "identity",
           "depth": 12, "width": 200, "batch_size": n, "init_gain": 1.7}  # fmt: skip
    p = predict(cfg)
    g = p["grad_norm"]
    np.testing.assert_allclose(g[1:-1] / g[2:], math.sqrt((n - 2) / (n - 3)), rtol=1e-9)
    np.testing.assert_allclose(p["rms"], 1.0, rtol=1e-10)
    np.testing.assert_allclose(p["mean_cosine"], -1 / (n - 1), rtol=1e-9)
    np.testing.assert_allclose(p["range_isometry_gap/norm"], 0.0, atol=1e-10)
    assert np.isinf(p["isometry_gap/norm"]).all() and np.isinf(p["isometry_gap/act"]).all()
    assert "Monte Carlo" not in p["notes"]["method"]


@pytest.mark.parametrize("order", ["act_norm", "norm_act"])
@pytest.mark.parametrize("c", [0.0, 0.5, 1.0])
def test_residual_stream_gains_c_squared_per_block_with_batchnorm(order, c):
    """De & Smith 2020: with BatchNorm the branch has unit mean square, the stream adds c² per
    block: mean square q_ℓ = q₀ + ℓ·c² (exact for σ = identity)."""
    cfg = {**EXACT, "model": "resmlp", "norm": "batch", "order": order,
           "activation": "identity", "depth": 6, "width": 64, "batch_size": 10,
           "residual_scale": c, "init_gain": 0.8}  # fmt: skip
    p = predict(cfg)
    q0 = 0.8**2  # inputs: unit-RMS, orthonormal; W_in gaussian N(0, g²/d_in)
    np.testing.assert_allclose(p["rms"] ** 2, q0 + c * c * np.arange(1, 7), rtol=1e-10)


def test_residual_stream_with_a_nonlinear_branch_follows_de_and_smith():
    cfg = {**EXACT, "model": "resmlp", "norm": "batch", "order": "act_norm", "activation": "tanh",
           "depth": 5, "width": 64, "batch_size": 10, "residual_scale": 0.7}  # fmt: skip
    p = predict(cfg, samples=1 << 15)
    np.testing.assert_allclose(p["rms"] ** 2, 1 + 0.49 * np.arange(1, 6), rtol=2e-3)
    assert p["isometry_gap/residual"][-1] < p["isometry_gap/residual"][0] + 1  # finite, recorded


@pytest.mark.parametrize("gain", [0.5, 1.3])
def test_linear_network_without_norm_is_a_power(gain):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((7, 64)) * rng.uniform(0.5, 2, (7, 1))
    cfg = {**EXACT, "norm": "none", "activation": "identity", "depth": 5, "width": 100,
           "batch_size": 7, "activation_gain": gain, "init_gain": 1.1}  # fmt: skip
    p = predict(cfg, X)
    q0 = (X**2).mean()
    np.testing.assert_allclose(p["rms"], np.sqrt(q0) * (1.1 * gain) ** np.arange(1, 6), rtol=1e-10)
    K = X @ X.T
    d = np.sqrt(np.diag(K))
    cos = K / np.outer(d, d)
    np.testing.assert_allclose(p["mean_cosine"], (cos.sum() - 7) / 42, rtol=1e-10)
    np.testing.assert_allclose(p["isometry_gap/act"], isometry_gap(K), rtol=1e-10)
    # every hidden block's gradient is the same size; the first has fan-in 64 for 100
    np.testing.assert_allclose(p["grad_norm"], [math.sqrt(64 / 100), 1, 1, 1, 1], rtol=1e-10)


@pytest.mark.parametrize(
    "config",
    [
        {"activation": "tanh", "init_gain": 1.5},
        {"activation": "exp", "init": "kaiming", "init_gain": 0.7},
        {"activation": "relu", "norm": "layer_scale"},
    ],
    ids=["tanh", "exp-kaiming", "relu-scale"],
)
def test_layernorm_mlp_is_the_mean_field_recursion(config):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((12, 64)) * rng.uniform(0.6, 1.6, (12, 1))
    cfg = {**EXACT, "norm": "layer", "order": "act_norm", "depth": 4, "width": 512,
           "batch_size": 12, **config}  # fmt: skip
    p = predict(cfg, X)
    c = parse_trial_config(cfg).model_dump()
    gain, Q, v = theory_inputs(c, theory.cosine_gram(X), (X**2).mean(axis=1))
    for stage in ("norm", "act"):
        expected = theory.mean_field_gaps(
            c["activation"], 4, Q, gain=gain, stage=stage,
            centered=c["norm"] == "layer", input_variances=v,
        )  # fmt: skip
        np.testing.assert_allclose(p[f"isometry_gap/{stage}"], expected, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(p["rms"], 1.0, rtol=1e-12)  # ε = 0: LayerNorm's unit mean square


@pytest.mark.parametrize("activation", theory.ACTIVATION_NAMES)
def test_monte_carlo_batchnorm_agrees_with_the_exact_gaussian_case(activation):
    """Every registered activation: the BatchNorm block's kernel by the exact Gaussian integral
    and by Monte Carlo over the same batch, forward and backward (measured spread at 2¹⁶ draws:
    within 0.02·|x| + 3e-3 with room left of at least 2e-3 for every activation). An activation
    whose gradient kernel is not finite (step: σ′ is a delta) says so in both."""
    rng = np.random.default_rng(6)
    X = rng.standard_normal((10, 64))
    cfg = {**EXACT, "norm": "batch", "order": "norm_act", "activation": activation, "depth": 3,
           "width": 100, "batch_size": 10}  # fmt: skip
    exact = predict(cfg, X)
    mc = predict(cfg, X, exact=False, samples=1 << 16)
    assert set(mc["unpredicted"]) == set(exact["unpredicted"])
    keys = ("rms", "mean_cosine", "range_isometry_gap/norm", "isometry_gap/act", "grad_norm")
    for k in keys:
        if k in exact["unpredicted"]:
            assert activation == "step" and k == "grad_norm", exact["unpredicted"][k]
            continue
        np.testing.assert_allclose(mc[k], exact[k], rtol=0.02, atol=3e-3, err_msg=k)


# --------------------------------------------------------------------- layout and bad input


@pytest.mark.parametrize(
    "config",
    [
        {"norm": "batch"},
        {"norm": "none", "activation": "relu"},
        {"model": "resmlp", "norm": "layer"},
        {"model": "transformer"},
        {"model": "cnn"},
    ],
)
def test_keys_are_the_records_layer_metrics(config):
    cfg = {"depth": 3, "width": 32, "batch_size": 6, **config}
    p = predict(cfg, samples=512)
    wanted = set(layer_metrics(parse_trial_config(cfg)))
    got = {k for k in p if k not in ("unpredicted", "notes")}
    assert got <= wanted and got | set(p["unpredicted"]) == wanted
    for k in got:
        assert p[k].shape == (3,) and p[k].dtype == np.float64
    if config.get("model") in (None, "resmlp"):
        assert {"rms", "mean_cosine", "grad_norm", "isometry_gap/act"} <= got
        assert p["grad_norm"][-1] == 1.0
    else:
        assert not got


def test_batch_larger_than_the_width_is_plus_infinity():
    p = predict({"depth": 2, "width": 4, "batch_size": 6, "norm": "layer", "order": "act_norm"})
    assert np.isinf(p["isometry_gap/act"]).all()
    # the measured range gap is then over a rank-4 Gram's 4 eigenvalues: not the mean field's
    assert "range_isometry_gap/act" not in p
    assert "finite-width" in p["unpredicted"]["range_isometry_gap/act"]


@pytest.mark.parametrize(
    ("config", "inputs", "labels", "field"),
    [
        ({"depth": 0}, None, None, "depth"),
        ({"activation": "nope"}, None, None, "activation"),
        ({}, np.ones(5), None, "inputs"),
        ({}, np.full((3, 4), np.nan), None, "inputs"),
        ({"batch_size": 3}, np.eye(3), [0, 1], "labels"),
        ({"batch_size": 3}, np.eye(3), [0, 1, 10], "labels"),
    ],
)
def test_bad_input_names_the_field(config, inputs, labels, field):
    with pytest.raises(InvalidInput) as exc:
        predict({"depth": 2, **config}, inputs, labels=None if labels is None else np.array(labels))
    assert exc.value.field == field


def test_too_large_a_gain_is_unpredicted_with_the_reason():
    p = predict({"depth": 2, "norm": "layer", "order": "act_norm", "activation": "tanh",
                 "activation_gain": 9.0})  # fmt: skip
    assert "rms" not in p and "range" in p["unpredicted"]["rms"]
