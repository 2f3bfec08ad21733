"""The theory module against closed forms, identities and limits (docs/science.md; Joudaki et
al. 2023 Table 5.1 / B.1, Theorem 5.1), a finite-width simulation, and the `isosweep theory`
command."""

import json
import math
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support import isosweep_command

from service import jsonfmt, theory
from service.activations import ACTIVATION_NAMES, ACTIVATIONS, LEAKY_SLOPE, Activation
from service.errors import InvalidInput, LimitExceeded
from service.isometry import gram_of, isometry_gap

PI, E = math.pi, math.e
REPO = Path(__file__).resolve().parents[2]
RED = "\x1b[1;31m"  # rich's bold red, what api.cli.common.fail prints "error:" in


def custom(name, f, breakpoints=()):
    """An activation outside the registry (the public functions take Activation objects too)."""
    return Activation(name, f, lambda t: None, tuple(breakpoints))


def log_fact(k):
    return math.lgamma(k + 1)


def relu_coefficients(K):
    """c₀ = 1/√(2π), c₁ = ½, and for even k ≥ 2: cₖ = (−1)^(k/2+1) (k−3)!! / √(2π k!); odd k ≥ 3: 0.

    From x·Heₖ = He_{k+1} + k·He_{k−1} and ∫₀^∞ Heₘ φ = He_{m−1}(0) φ(0).
    """
    c = np.zeros(K + 1)
    c[0], c[1] = 1 / math.sqrt(2 * PI), 0.5
    for k in range(2, K + 1, 2):
        log_dfact = sum(math.log(j) for j in range(k - 3, 0, -2))
        c[k] = (-1) ** (k // 2 + 1) * math.exp(log_dfact - 0.5 * log_fact(k)) / math.sqrt(2 * PI)
    return c


def step_coefficients(K):
    """c₀ = ½, cₖ = He_{k−1}(0) φ(0)/√k! (He_m(0) = (−1)^(m/2) (m−1)!! for even m, else 0)."""
    c = np.zeros(K + 1)
    c[0] = 0.5
    for k in range(1, K + 1, 2):
        m = k - 1
        log_dfact = sum(math.log(j) for j in range(m - 1, 0, -2))
        c[k] = (-1) ** (m // 2) * math.exp(log_dfact - 0.5 * log_fact(k)) / math.sqrt(2 * PI)
    return c


def exp_coefficients(a, K):
    """E[e^{αX} Heₖ(X)]/√k! = e^{α²/2} αᵏ/√k!."""
    return np.array(
        [math.exp(a * a / 2 + k * math.log(a) - 0.5 * log_fact(k)) for k in range(K + 1)]
    )


def sin_coefficients(a, K):
    """E[e^{iαX} Heₖ(X)] = (iα)ᵏ e^{−α²/2}: sin takes the imaginary part."""
    im = [0, 1, 0, -1]
    return np.array(
        [
            im[k % 4] * math.exp(-a * a / 2 + k * math.log(a) - 0.5 * log_fact(k))
            for k in range(K + 1)
        ]
    )


# ---------------------------------------------------------------------------------- β, closed forms


@pytest.mark.parametrize(
    ("activation", "beta"),
    [
        ("relu", (3 * PI - 4) / (2 * PI - 2)),
        ("step", 2 - 2 / PI),
        ("sin", 2 - 2 * E / (E**2 - 1)),
        ("exp", 2 - 1 / (E - 1)),
        ("identity", 1.0),
        (custom("exp(x-2)", lambda x: np.exp(x - 2)), 2 - 1 / (E - 1)),
        (custom("x^2-1", lambda x: x**2 - 1), 2.0),
        (custom("x", lambda x: x), 1.0),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "name", ""),
)
def test_beta_matches_the_papers_closed_forms(activation, beta):
    assert theory.isometry_strength(activation) == pytest.approx(beta, abs=1e-13)


def test_leaky_relu_beta_closed_form():
    s = LEAKY_SLOPE  # c₁ = (1+s)/2, Var = (1+s²)/2 − (1−s)²/(2π)
    var = (1 + s * s) / 2 - (1 - s) ** 2 / (2 * PI)
    assert theory.isometry_strength("leaky_relu") == pytest.approx(
        2 - (1 + s) ** 2 / 4 / var, 1e-13
    )


@pytest.mark.parametrize("a", [0.05, 0.3, 1.7, 4.0, 10.0])
def test_beta_of_sin_and_exp_depend_on_gain_as_table_b1(a):
    # sin: c₁ = α e^{−α²/2}, Var = (1 − e^{−2α²})/2 → β = 2 − α²/sinh(α²)
    # exp: c₁ = α e^{α²/2}, Var = e^{2α²} − e^{α²}  → β = 2 − α²/(e^{α²} − 1)
    assert theory.isometry_strength("sin", a) == pytest.approx(
        2 - a * a / math.sinh(a * a), abs=1e-12
    )
    assert theory.isometry_strength("exp", a) == pytest.approx(
        2 - a * a / math.expm1(a * a), abs=1e-12
    )


def test_beta_of_relu_does_not_depend_on_gain_but_tanh_does():
    ref = (3 * PI - 4) / (2 * PI - 2)
    for a in (1e-3, 0.1, 0.7, 3.0, 10.0):
        assert theory.isometry_strength("relu", a) == pytest.approx(ref, abs=1e-13)
        assert theory.isometry_strength("step", a) == pytest.approx(2 - 2 / PI, abs=1e-13)
    assert theory.isometry_strength("tanh", 3.0) - theory.isometry_strength("tanh", 0.3) > 0.1


@pytest.mark.parametrize("name", ["tanh", "gelu", "step", "selu", "sigmoid"])
def test_beta_is_unchanged_by_affine_maps_of_sigma(name):
    base = ACTIVATIONS[name]
    moved = custom(name + "'", lambda x: -3.0 * base.numpy(x) + 7.5, base.breakpoints)
    for a in (0.5, 2.0):
        assert theory.isometry_strength(moved, a) == pytest.approx(
            theory.isometry_strength(name, a), abs=1e-13
        )


@pytest.mark.parametrize("a", [1e-4, 0.1, 1.0, 3.0, 10.0])
def test_beta_lies_in_1_2_for_every_registered_activation(a):
    for name in ACTIVATION_NAMES:
        beta = theory.isometry_strength(name, a)
        assert 1.0 - 1e-12 <= beta <= 2.0 + 1e-12, name


def test_small_gain_limit_is_affine():
    # σ(αx) ≈ σ(0) + σ′(0)αx: β → 1 as α → 0 (no cancellation trouble at α = 1e-6)
    for name in ("tanh", "sigmoid", "sin", "softplus", "exp", "gelu"):
        assert theory.isometry_strength(name, 1e-6) == pytest.approx(1.0, abs=1e-9), name


# ------------------------------------------------------------------------------- coefficients


def test_first_relu_coefficients():
    c = theory.hermite_coefficients("relu", terms=3)
    assert c[:3] == pytest.approx([1 / math.sqrt(2 * PI), 0.5, 1 / (2 * math.sqrt(PI))], abs=1e-15)
    assert c.shape == (4,)


@pytest.mark.parametrize("a", [0.01, 0.6, 1.0, 3.3, 10.0])
def test_kinked_and_jumping_coefficients_match_closed_forms_to_k_200(a):
    # relu(αx) = α·relu(x); step(αx) = step(x); leaky = relu(x) − s·relu(−x)
    K = 200
    assert (
        np.abs(theory.hermite_coefficients("relu", a, K) / a - relu_coefficients(K)).max() < 1e-13
    )
    assert np.abs(theory.hermite_coefficients("step", a, K) - step_coefficients(K)).max() < 1e-13
    signs = (-1.0) ** np.arange(K + 1)
    leaky = relu_coefficients(K) * (1 - LEAKY_SLOPE * signs)
    assert np.abs(theory.hermite_coefficients("leaky_relu", a, K) / a - leaky).max() < 1e-13


@pytest.mark.parametrize("a", [0.1, 1.0, 2.0, 5.0])
def test_exp_and_sin_coefficients_match_closed_forms(a):
    K = 120
    c = theory.hermite_coefficients("exp", a, K)
    scale = math.exp(a * a)  # ‖e^{αx}‖ = e^{α²}: the accuracy is relative to it
    assert np.abs(c - exp_coefficients(a, K)).max() / scale < 1e-13
    assert np.abs(theory.hermite_coefficients("sin", a, K) - sin_coefficients(a, K)).max() < 1e-13


def test_coefficients_agree_with_plain_gauss_hermite_for_smooth_sigma():
    # an independent rule: for analytic, slowly varying σ, 200-point Gauss–Hermite is exact enough
    x, w = np.polynomial.hermite_e.hermegauss(200)
    w = w / w.sum()
    K = 30
    He = np.polynomial.hermite_e.hermevander(x, K) / np.exp(
        [0.5 * log_fact(k) for k in range(K + 1)]
    )
    for name in ("tanh", "gelu", "softplus", "silu"):
        ref = (w * ACTIVATIONS[name].numpy(0.8 * x)) @ He
        assert np.abs(theory.hermite_coefficients(name, 0.8, K) - ref).max() < 1e-12, name


def test_parseval_and_moments_are_consistent():
    # Σ cₖ² = E σ², c₀ = E σ, c₁ = E Xσ: the series and the direct moments are two computations
    for name in ("tanh", "gelu", "sin", "silu", "softplus"):  # smooth: the tail is tiny
        c = theory.hermite_coefficients(name, 0.9, 200)
        m = theory.moments(name, 0.9)
        assert (c**2).sum() == pytest.approx(m["mean_square"], rel=1e-12), name
        assert c[0] == pytest.approx(m["mean"], abs=1e-14)
        assert c[1] == pytest.approx(m["mean_x_sigma"], abs=1e-14)
        assert m["variance"] == pytest.approx(m["mean_square"] - m["mean"] ** 2, rel=1e-12)


def test_cached_arrays_cannot_be_corrupted_by_callers():
    c = theory.hermite_coefficients("gelu", 1.0, 5)
    c[:] = 0
    assert theory.hermite_coefficients("gelu", 1.0, 5)[1] != 0


# ------------------------------------------------------------------------------- dual, κ


def relu_dual(theta):
    """Arc-cosine kernel minus c₀²: (sin θ + (π − θ) cos θ − 1)/(2π), ρ = cos θ."""
    return (np.sin(theta) + (PI - theta) * np.cos(theta) - 1) / (2 * PI)


THETAS = np.array([1e-7, 1e-3, 0.2, 1.0, PI / 2, 2.2, 3.0, PI - 1e-4])


def test_dual_activation_closed_forms():
    rho = np.cos(THETAS)
    theta = np.arccos(
        rho
    )  # the angle of the rounded ρ: near ρ = ±1 it differs from THETAS by ~1e-9
    s = LEAKY_SLOPE
    k = lambda t: (np.sin(t) + (PI - t) * np.cos(t)) / (2 * PI)  # noqa: E731  E relu·relu
    leaky = (1 + s * s) * k(theta) - 2 * s * k(PI - theta) - (1 - s) ** 2 / (2 * PI)
    cases = [
        ("relu", 1.0, relu_dual(theta)),
        ("relu", 2.5, 2.5**2 * relu_dual(theta)),
        ("step", 1.0, (PI / 2 - theta) / (2 * PI)),  # arcsin(ρ)/(2π)
        ("leaky_relu", 1.0, leaky),
        ("identity", 0.7, 0.49 * rho),
    ]
    for a in (0.3, 1.0, 2.0, 4.0):
        cases.append(("sin", a, np.exp(-a * a) * np.sinh(a * a * rho)))
        cases.append(("exp", a, np.exp(a * a) * np.expm1(a * a * rho) / np.exp(2 * a * a)))
    for name, a, expected in cases:
        got = theory.dual_activation(name, a, rho)
        if name == "exp":
            got = got / np.exp(2 * a * a)  # compare relative to ‖σ‖²
        assert np.abs(got - expected).max() < 1e-13, (name, a)


def test_dual_is_the_hermite_series_where_the_series_converges():
    # |ρ| ≤ 0.6: Σ_{k≤200} cₖ² ρᵏ has a tail below 0.6²⁰⁰·Var, so it is an independent reference
    rho = np.linspace(-0.6, 0.6, 7)
    for name in ("tanh", "gelu", "selu", "elu", "silu", "softplus", "sigmoid"):
        for a in (0.4, 1.5):
            c2 = theory.hermite_coefficients(name, a, 200)[1:] ** 2
            series = np.array([(c2 * r ** np.arange(1, 201)).sum() for r in rho])
            var = theory.moments(name, a)["variance"]
            assert np.abs(theory.dual_activation(name, a, rho) - series).max() < 1e-13 * var


def test_kinks_away_from_zero_are_split_exactly():
    # max(x − ½, 0) and a hard tanh clip(x, −1, 1): kinks at ±1/(2α), ±1/α, not rays through 0
    acts = [
        custom("shifted_relu", lambda x: np.maximum(x - 0.5, 0.0), (0.5,)),
        custom("hardtanh", lambda x: np.clip(x, -1.0, 1.0), (-1.0, 1.0)),
    ]
    rho = np.array([-0.6, -0.2, 0.3, 0.6])
    for act in acts:
        for a in (0.7, 2.0):
            c2 = theory.hermite_coefficients(act, a, 200)[1:] ** 2
            series = np.array([(c2 * r ** np.arange(1, 201)).sum() for r in rho])
            assert np.abs(theory.dual_activation(act, a, rho) - series).max() < 1e-13
            # and continuity into ρ = ±1, computed by the 1-D rule
            near = theory.dual_activation(act, a, [1 - 1e-12, 1.0])
            assert near[0] == pytest.approx(near[1], abs=1e-5)


def test_kappa_identities_zero_one_and_slope_two_minus_beta():
    h = 1e-4
    for name in ACTIVATION_NAMES:
        for a in (0.5, 1.3):
            var = theory.moments(name, a)["variance"]
            k0, kp, km = theory.dual_activation(name, a, [0.0, h, -h]) / var
            assert abs(k0) < 1e-13, name  # X, Y independent: E[σσ] = (Eσ)²
            assert theory.kappa(name, a, 1.0) == 1.0 and abs(theory.kappa(name, a, 0.0)) < 1e-12
            # central difference of the 2-D quadrature vs the 1-D β: O(h²κ‴) apart
            slope = (kp - km) / (2 * h)
            assert slope == pytest.approx(2 - theory.isometry_strength(name, a), abs=1e-7), name
            assert theory.kappa_prime0(name, a) == pytest.approx(
                2 - theory.isometry_strength(name, a)
            )


RHO = np.concatenate(
    [np.random.default_rng(0).uniform(-1, 1, 12), [-1.0, -0.999999, 0.0, 0.97, 1 - 1e-9, 1.0]]
)


def check_interpolant(name, a):
    direct = theory.dual_activation(name, a, RHO) / theory.moments(name, a)["variance"]
    assert np.abs(theory.kappa(name, a, RHO) - direct).max() < 1e-10, (name, a)


@pytest.mark.parametrize("name", ACTIVATION_NAMES)
def test_kappa_interpolant_matches_direct_quadrature(name):
    check_interpolant(name, 1.3)


@pytest.mark.slow
@pytest.mark.parametrize("name", ACTIVATION_NAMES)
def test_kappa_interpolant_matches_direct_quadrature_over_gains(name):
    for a in (1e-3, 0.2, 3.0, theory.DUAL_GAIN_MAX):
        check_interpolant(name, a)


def test_homogeneous_flag_is_true_exactly_when_kappa_ignores_the_gain():
    rho = np.array([-0.8, -0.3, 0.4, 0.9])
    x = np.linspace(-3, 3, 61)
    for name, act in ACTIVATIONS.items():
        direct = [
            theory.dual_activation(name, a, rho) / theory.moments(name, a)["variance"]
            for a in (0.5, 2.0)
        ]
        same = np.abs(direct[0] - direct[1]).max() < 1e-12
        assert same == act.homogeneous, name
        if act.homogeneous:  # σ(2x) = 2ᵐ σ(x) for some m: the claim the flag makes
            with np.errstate(invalid="ignore"):  # step: 0/0 on x < 0
                ratio = act.numpy(2 * x[x != 0]) / act.numpy(x[x != 0])
            ok = np.isfinite(ratio)
            assert np.ptp(ratio[ok]) < 1e-12, name
            assert theory.kappa(name, 2.0, rho) == pytest.approx(direct[1], abs=1e-10)


# ------------------------------------------------------------------------------- mean field


def correlated_inputs(rng, n=6, d=40):
    return rng.standard_normal((n, 3)) @ rng.standard_normal((3, d)) + 0.3 * rng.standard_normal(
        (n, d)
    )


def test_one_block_applies_kappa_entrywise_and_relu_arccos_composes():
    G0 = theory.cosine_gram(correlated_inputs(np.random.default_rng(1)))
    grams = theory.mean_field_grams("relu", 2, G0)
    theta = np.arccos(np.clip(G0, -1, 1))
    G1 = relu_dual(theta) / relu_dual(0.0)
    assert np.abs(grams[0] - G1).max() < 1e-12
    G2 = relu_dual(np.arccos(np.clip(G1, -1, 1))) / relu_dual(0.0)
    assert np.abs(grams[1] - G2).max() < 1e-12
    step = theory.mean_field_grams("step", 1, G0)[0]
    assert np.abs(step - 2 / PI * np.arcsin(G0)).max() < 1e-12  # κ_step = (2/π) arcsin ρ


def test_identity_activation_keeps_the_cosine_gram():
    G0 = theory.cosine_gram(correlated_inputs(np.random.default_rng(2)))
    grams = theory.mean_field_grams("identity", 5, 3.0 * G0, gain=0.3)  # any scale: normalized
    assert np.abs(grams - G0).max() < 1e-12


def test_gap_decays_at_rate_kappa_prime0_squared_near_isometry():
    """Theorem 5.1 / docs/science.md: near isometry gap_{ℓ+1}/gap_ℓ → κ′(0)² = (2 − β)²."""
    G0 = theory.cosine_gram(correlated_inputs(np.random.default_rng(3)))
    for name in ("tanh", "relu", "sin", "gelu", "step"):
        gaps = theory.mean_field_gaps(name, 200, G0)
        assert np.all(np.diff(gaps[gaps > 1e-12]) < 0), name  # monotone, down to rounding
        # the last block whose gap (≈ ‖G − I‖²/2n) is still far above float64 resolution
        ell = np.flatnonzero(gaps > 1e-9)[-1]
        assert gaps[ell] < 1e-6, name  # and near isometry: the quadratic term of κ is negligible
        target = (2 - theory.isometry_strength(name)) ** 2
        assert gaps[ell] / gaps[ell - 1] == pytest.approx(target, rel=1e-3), name
    assert theory.mean_field_gaps("identity", 10, G0) == pytest.approx(isometry_gap(G0), rel=1e-12)


@pytest.mark.parametrize("depth", [4, 60])  # 60 > 48 gains: κ is interpolated in the gain
def test_layer_gains_follow_the_shaping_schedule(depth):
    G0 = theory.cosine_gram(correlated_inputs(np.random.default_rng(4)))
    gains = theory.layer_gains(1.5, 0.4, depth)
    assert gains == pytest.approx(1.5 * np.arange(1, depth + 1) ** -0.4, rel=1e-15)
    grams = theory.mean_field_grams("tanh", depth, G0, gain=1.5, gain_exponent=0.4)
    G = G0
    for ell, a in enumerate(gains):  # block by block, each with its own κ_α
        G = theory.kappa("tanh", a, G)
        np.fill_diagonal(G, 1.0)
        assert np.abs(grams[ell] - G).max() < 1e-11, ell
    constant = theory.mean_field_grams("tanh", depth, G0, gain=1.5)[-1]
    assert np.abs(grams[-1] - constant).max() > 1e-3


def test_stages_linear_act_norm():
    G0 = theory.cosine_gram(correlated_inputs(np.random.default_rng(5)))
    lin = theory.mean_field_grams("relu", 3, G0, stage="linear")
    norm = theory.mean_field_grams("relu", 3, G0, stage="norm")
    act = theory.mean_field_grams("relu", 3, G0, stage="act")
    assert np.abs(lin[0] - G0).max() < 1e-15 and np.abs(lin[1:] - norm[:-1]).max() < 1e-15
    c0sq = 1 / (2 * PI)  # uncentered relu Gram: (c₀² + σ̄(ρ))/(c₀² + σ̄(1))
    expected = (c0sq + relu_dual(np.arccos(np.clip(G0, -1, 1)))) / (c0sq + relu_dual(0.0))
    assert np.abs(act[0] - expected).max() < 1e-12
    # centering is what makes the difference: relu's mean c₀ keeps the act Gram far from isometry
    assert isometry_gap(act[-1]) > isometry_gap(norm[-1]) + 0.1


def simulate_layernorm_mlp(X, act, gains, d, rng, center=True):
    """Width-d numpy network: W ~ N(0, 1/fan_in), σ(α_ℓ·), center and rescale every sample."""
    H = X / np.linalg.norm(X, axis=1, keepdims=True) * math.sqrt(X.shape[1])  # (n, d0)
    grams = []
    for a in gains:
        W = rng.standard_normal((d, H.shape[1])) / math.sqrt(H.shape[1])  # (d, fan_in)
        S = act.numpy(a * (H @ W.T))  # (n, d)
        if center:
            S -= S.mean(axis=1, keepdims=True)
        H = S / np.linalg.norm(S, axis=1, keepdims=True) * math.sqrt(d)
        grams.append(gram_of(H) / d)
    return np.array(grams)


# Finite width d = 2048, 4 blocks, 8 inputs, the mean of 4 networks. Each block adds O(1/√d) noise
# to every Gram entry (an average of d products) and normalization keeps it from accumulating
# (Joudaki et al. 2023, Sec. 7). Measured over 25 seeds: one network's entry error has std
# ≈ 1.1–1.2/√d, so the 4-network mean has ≈ 0.013; its max over 28 entries × 4 blocks ranged
# 0.035–0.065. We allow 0.08 (≈ 6 std). The gaps' max error ranged 0.006–0.033: we allow 0.05.
WIDTH, ENTRY_TOL, GAP_TOL = 2048, 0.08, 0.05


@pytest.mark.parametrize(
    ("name", "gain", "p"),
    [("relu", 1.0, 0.0), ("tanh", 1.0, 0.0), ("sin", 1.5, 0.4), ("step", 1.0, 0.0)],
)
def test_mean_field_matches_a_finite_width_network(name, gain, p):
    rng = np.random.default_rng(7)
    X = correlated_inputs(rng, n=8, d=50)
    gains = theory.layer_gains(gain, p, 4)
    sims = [simulate_layernorm_mlp(X, ACTIVATIONS[name], gains, WIDTH, rng) for _ in range(4)]
    sim = np.mean(sims, axis=0)  # (4, n, n)
    mf = theory.mean_field_grams(name, 4, theory.cosine_gram(X), gain=gain, gain_exponent=p)
    assert np.abs(sim - mf).max() < ENTRY_TOL
    assert np.abs(isometry_gap(sim) - isometry_gap(mf)).max() < GAP_TOL
    assert isometry_gap(mf[0]) - isometry_gap(mf[-1]) > 0.1  # the curve has a shape to match


def test_scale_only_norm_matches_the_uncentered_recursion():
    # layer_scale: no centering, so relu's mean c₀ stays in the Gram and isometry is never reached
    rng = np.random.default_rng(9)
    X = correlated_inputs(rng, n=8, d=50)
    relu = ACTIVATIONS["relu"]
    sims = [simulate_layernorm_mlp(X, relu, [1.0] * 4, WIDTH, rng, center=False) for _ in range(4)]
    sim = np.mean(sims, axis=0)
    G0 = theory.cosine_gram(X)
    uncentered = theory.mean_field_grams("relu", 4, G0, centered=False)
    assert np.abs(sim - uncentered).max() < ENTRY_TOL
    assert np.abs(sim - theory.mean_field_grams("relu", 4, G0)).max() > 5 * ENTRY_TOL
    act = theory.mean_field_grams("relu", 4, G0, stage="act", centered=False)
    assert np.abs(act - uncentered).max() < 1e-15  # scale-only: the norm output is the act output
    far = theory.mean_field_gaps("relu", 200, G0, centered=False)
    assert np.all(np.diff(far) > 0) and far[-1] > 5.0  # drifting to the rank-one collapse


def test_finite_width_check_can_fail():
    # the same comparison rejects another activation's prediction, and no contraction at all
    rng = np.random.default_rng(8)
    X = correlated_inputs(rng, n=8, d=50)
    relu = ACTIVATIONS["relu"]
    sim = np.mean(
        [simulate_layernorm_mlp(X, relu, [1.0] * 4, WIDTH, rng) for _ in range(4)], axis=0
    )
    G0 = theory.cosine_gram(X)
    assert np.abs(sim - theory.mean_field_grams("relu", 4, G0)).max() < ENTRY_TOL
    assert np.abs(sim - theory.mean_field_grams("tanh", 4, G0)).max() > 5 * ENTRY_TOL
    assert np.abs(sim - theory.mean_field_grams("identity", 4, G0)).max() > 5 * ENTRY_TOL


# --------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("gain", [0, -1.0, math.nan, math.inf, 10.5, "abc", None])
def test_bad_gain_names_the_field_and_range(gain):
    with pytest.raises(InvalidInput, match=r"gain: .*\(0, 10\]") as exc:
        theory.isometry_strength("tanh", gain)
    assert exc.value.field == "gain"


def test_bad_names_terms_depth_stage_and_rho():
    with pytest.raises(InvalidInput, match="allowed: identity, relu") as exc:
        theory.hermite_coefficients("swish")
    assert exc.value.field == "activation"
    for terms in (0, 201, 2.5, True):
        with pytest.raises(InvalidInput, match=r"terms: must be an integer in 1\.\.200"):
            theory.hermite_coefficients("relu", 1.0, terms)
    G = np.eye(3)
    with pytest.raises(InvalidInput, match="depth: must be an integer in 1"):
        theory.mean_field_gaps("relu", 0, G)
    with pytest.raises(InvalidInput, match="allowed: linear, act, norm"):
        theory.mean_field_gaps("relu", 2, G, stage="pre")
    with pytest.raises(InvalidInput, match="gain_exponent"):
        theory.mean_field_gaps("relu", 2, G, gain_exponent=-0.5)
    with pytest.raises(InvalidInput, match=r"gain: must be in \(0, 5\]"):
        theory.kappa("tanh", 6.0, 0.5)
    with pytest.raises(InvalidInput, match="rho"):
        theory.dual_activation("tanh", 1.0, [0.5, 1.2])


@pytest.mark.parametrize(
    ("gram", "message"),
    [
        (np.ones((2, 3)), "square"),
        (np.array([[1.0, np.nan], [np.nan, 1.0]]), "NaN"),
        (np.array([[1.0, 0.5], [0.2, 1.0]]), "symmetric"),
        (np.array([[1.0, 0.0], [0.0, 0.0]]), "positive diagonal"),
        (np.array([[1.0, 2.0], [2.0, 1.0]]), "positive semi-definite"),
    ],
)
def test_bad_input_gram_is_named(gram, message):
    with pytest.raises(InvalidInput, match=message) as exc:
        theory.mean_field_grams("relu", 2, gram)
    assert exc.value.field == "input_gram"


def test_input_grams_are_rescaled_and_batches_checked():
    rng = np.random.default_rng(10)
    X = correlated_inputs(rng)
    G = theory.cosine_gram(X)
    D = np.diag(rng.uniform(0.1, 10.0, G.shape[0]))
    assert np.abs(theory.unit_gram(D @ gram_of(X) @ D) - G).max() < 1e-14
    assert np.allclose(np.diag(G), 1.0) and np.abs(G).max() <= 1.0
    with pytest.raises(InvalidInput, match="all zeros") as exc:
        theory.cosine_gram(np.vstack([X, np.zeros(X.shape[1])]))
    assert exc.value.field == "inputs"


def test_identical_inputs_stay_identical_and_read_infinity():
    X = correlated_inputs(np.random.default_rng(11))
    X[1] = 2.0 * X[0]  # same direction: a singular input Gram, and κ(1) = 1 keeps it so
    gaps = theory.mean_field_gaps("tanh", 3, theory.cosine_gram(X))
    assert np.all(gaps == math.inf)
    assert json.loads(jsonfmt.dumps({"gaps": gaps}))["gaps"] == ["Infinity"] * 3


def test_moments_that_do_not_exist_are_refused():
    # E[e^{2x²}] diverges: the integrand never decays, and the error says so instead of a number
    with pytest.raises(InvalidInput, match="gain") as exc:
        theory.isometry_strength(custom("exp_square", lambda x: np.exp(x * x)))
    assert exc.value.field == "gain"
    with pytest.raises(InvalidInput, match="constant"):
        theory.isometry_strength(custom("zero", lambda x: np.zeros_like(x)))


@pytest.mark.slow
def test_big_stacks_are_refused_but_gaps_are_not():
    """The same depth·n² = 3.6·10⁷ > GRAM_CELLS_MAX: the stack is refused, its gaps are not.
    An equicorrelated Gram (1 − c)I + c·11ᵀ stays one under κ, with c_ℓ = κ(c_{ℓ−1}) and
    eigenvalues 1 − c (n − 1 times) and 1 + (n − 1)c: the gaps in closed form."""
    n, depth, c = 600, 100, 0.5
    G = np.full((n, n), c)
    np.fill_diagonal(G, 1.0)
    with pytest.raises(LimitExceeded, match="mean_field_gaps"):
        theory.mean_field_grams("relu", depth, G)
    expected = []
    for _ in range(depth):
        c = theory.kappa("relu", 1.0, c)
        expected.append(-((n - 1) * math.log1p(-c) + math.log1p((n - 1) * c)) / n)
    gaps = theory.mean_field_gaps("relu", depth, G)
    assert gaps == pytest.approx(expected, rel=1e-9, abs=1e-14)
    assert gaps[0] > 0.5 and gaps[20] > 1e-5  # not vanishing from the start


# ----------------------------------------------------------------------------------- summaries


def test_summaries_are_json_ready_and_complete():
    s = theory.activation_summary("leaky_relu", 2.0, terms=5)
    assert s["params"] == {"negative_slope": LEAKY_SLOPE} and s["breakpoints"] == [0.0]
    assert len(s["coefficients"]) == 6 and s["gain"] == 2.0
    assert s["beta"] + s["kappa_prime0"] == pytest.approx(2.0, abs=1e-15)
    assert s["beta"] == theory.isometry_strength("leaky_relu", 2.0)  # the same numbers, exactly
    assert s["kappa_prime0"] == theory.kappa_prime0("leaky_relu", 2.0)
    assert s["moments"] == theory.moments("leaky_relu", 2.0)
    assert json.loads(jsonfmt.dumps(s))["coefficients"][1] == pytest.approx(
        2.0 * (1 + LEAKY_SLOPE) / 2
    )
    rows = theory.registry_summary()
    assert [r["name"] for r in rows] == list(ACTIVATION_NAMES)
    assert json.loads(jsonfmt.dumps(rows))[1]["beta"] == pytest.approx((3 * PI - 4) / (2 * PI - 2))


# ------------------------------------------------------------------------------------------ CLI


def isosweep(*args, env=None):
    """`isosweep theory ARGS` as a user runs it (support.isosweep_command); `env`: more
    environment variables."""
    cmd = [*isosweep_command(), "theory", *args]
    environ = {**os.environ, **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120, env=environ)


def test_cli_json_summary():
    r = isosweep("relu", "--json", "--terms", "4")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["beta"] == pytest.approx((3 * PI - 4) / (2 * PI - 2), abs=1e-13)
    assert data["coefficients"][:3] == pytest.approx(
        [1 / math.sqrt(2 * PI), 0.5, 1 / (2 * math.sqrt(PI))]
    )


def test_cli_list_and_table():
    r = isosweep("--list", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["count"] == len(ACTIVATION_NAMES)
    r = isosweep("list")
    assert r.returncode == 0 and "leaky_relu" in r.stdout and "1.2665288965" in r.stdout
    r = isosweep("step", "--gain", "3")
    assert r.returncode == 0 and "1.363380227632" in r.stdout and "1[x>0]" in r.stdout


def test_cli_gap_curve_from_a_gram_file(tmp_path):
    X = correlated_inputs(np.random.default_rng(9))
    G = theory.cosine_gram(X)
    np.save(tmp_path / "g.npy", G)
    (tmp_path / "g.json").write_text(jsonfmt.dumps({"input_gram": G}))
    np.savetxt(tmp_path / "x.csv", X, delimiter=",")
    expected = theory.mean_field_gaps("tanh", 5, G, gain_exponent=0.4)
    for source in (
        ["--input-gram", str(tmp_path / "g.npy")],
        ["--input-gram", str(tmp_path / "g.json")],
        ["--inputs", str(tmp_path / "x.csv")],
    ):
        r = isosweep("tanh", "--depth", "5", "--gain-exponent", "0.4", "--json", *source)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["mean_field"]["gaps"] == pytest.approx(expected, rel=1e-12)
    r = isosweep("tanh", "--depth", "5", "--input-gram", str(tmp_path / "g.npy"))
    assert r.returncode == 0 and "κ′(0)²" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["swish"], "allowed: identity, relu"),
        (["relu", "--gain", "-2"], "gain: must be finite and in (0, 10]"),
        (["relu", "--terms", "500"], "terms: must be an integer in 1..200"),
        (["relu", "--depth", "3"], "--input-gram"),
        (["relu", "--depth", "3", "--input-gram", "missing.npy"], "cannot read"),
    ],
)
def test_cli_errors_are_red_and_exit_1(args, message):
    r = isosweep(*args, env={"FORCE_COLOR": "1", "TERM": "xterm"})  # rich colours into a pipe
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith(RED + "error:"), r.stderr
    assert message in re.sub(r"\x1b\[[0-9;]*m", "", r.stderr)  # the message, without colours


# ----------------------------------------------------------- the first block from the real input


def spread_inputs(rng, n=8, d=50, lo=0.3, hi=3.0):
    """Correlated inputs whose RMS ‖xᵢ‖/√d spans lo..hi (digits: 0.58–4.3)."""
    X = correlated_inputs(rng, n, d)
    X /= np.linalg.norm(X, axis=1, keepdims=True) / math.sqrt(d)
    return X * np.geomspace(lo, hi, n)[:, None]


def moments_of(X):
    return (X**2).mean(axis=1)


def exp_cross_dual(ga, gb, rho):
    """E[(e^{aX} − E)(e^{bY} − E)] = e^{(a² + b²)/2}(e^{abρ} − 1) (Mehler, or the MGF)."""
    return np.exp((ga**2 + gb**2) / 2) * np.expm1(ga * gb * rho)


def test_first_block_of_exp_is_mehlers_closed_form():
    rng = np.random.default_rng(11)
    X = spread_inputs(rng, lo=0.2, hi=4.0)  # gains 0.26..5.2 at α = 1.3
    G, m = theory.cosine_gram(X), moments_of(X)
    gam = 1.3 * np.sqrt(m)
    D = exp_cross_dual(gam[:, None], gam[None, :], G)
    d = np.sqrt(np.diag(D))
    for stage, expected in [
        ("norm", D / np.outer(d, d)),
        ("act", (np.outer(np.exp(gam**2 / 2), np.exp(gam**2 / 2)) + D)),
        ("linear", np.sqrt(np.outer(m, m)) * G),
    ]:
        got = theory.mean_field_grams("exp", 1, G, gain=1.3, stage=stage, input_variances=m)[0]
        expected = expected / np.diag(expected).mean() if stage != "norm" else expected
        assert np.abs(got - expected).max() <= 1e-13 * np.abs(expected).max(), stage
        assert isometry_gap(got) == pytest.approx(isometry_gap(expected), rel=1e-9), stage
    unit = theory.mean_field_gaps("exp", 1, G, gain=1.3)[0]
    assert abs(isometry_gap(D / np.outer(d, d)) - unit) > 0.03  # the norms matter for exp


def test_later_blocks_continue_the_recursion_from_the_first():
    rng = np.random.default_rng(12)
    X = spread_inputs(rng)
    G, m = theory.cosine_gram(X), moments_of(X)
    grams = theory.mean_field_grams("tanh", 3, G, gain=1.5, gain_exponent=0.4, input_variances=m)
    rest = theory.mean_field_grams("tanh", 2, grams[0], gain=1.5 * 2**-0.4, gain_exponent=0.0)
    # block 3's gain is 1.5·3^(−0.4), not 1.5·2^(−0.4): only block 2 can be compared this way
    assert np.abs(grams[1] - rest[0]).max() < 1e-14
    lin = theory.mean_field_grams("tanh", 3, G, gain=1.5, stage="linear", input_variances=m)
    assert np.abs(lin[1] - grams[0]).max() < 1e-15 and np.abs(lin[2] - grams[1]).max() > 0


def test_homogeneous_activations_keep_their_normalized_grams():
    # relu(γx) = γ·relu(x): the norms factor out of the normalized Gram, not out of the act Gram
    rng = np.random.default_rng(13)
    X = spread_inputs(rng)
    G, m = theory.cosine_gram(X), moments_of(X)
    with_m = theory.mean_field_grams("relu", 2, G, input_variances=m)
    assert np.abs(with_m - theory.mean_field_grams("relu", 2, G)).max() < 1e-14
    act = theory.mean_field_grams("relu", 1, G, stage="act", input_variances=m)[0]
    theta = np.arccos(np.clip(G, -1, 1))
    expected = np.sqrt(np.outer(m, m)) * (np.sin(theta) + (PI - theta) * np.cos(theta))
    expected /= np.diag(expected).mean()
    assert np.abs(act - expected).max() < 1e-12 * np.abs(expected).max()


def test_equal_variances_are_a_gain_on_the_first_block():
    rng = np.random.default_rng(14)
    G = theory.cosine_gram(correlated_inputs(rng, n=8))
    v = np.full(8, 2.25)
    got = theory.mean_field_gaps("tanh", 3, G, gain=1.0, input_variances=v)
    first = theory.mean_field_gaps("tanh", 1, G, gain=1.5)
    assert got[0] == pytest.approx(first[0], rel=1e-14)
    later = theory.mean_field_gaps("tanh", 3, G, gain=1.0)  # unit variance everywhere
    assert got[0] != pytest.approx(later[0], rel=1e-3)
    # a spread below EQUAL_RTOL is "equal"; just above it the series path agrees continuously
    tiny = v * (1 + np.linspace(0, 1e-9, 8))
    near = theory.mean_field_gaps("tanh", 3, G, gain=1.0, input_variances=tiny)
    assert np.abs(near - got).max() < 1e-7


def test_two_gain_quadrature_against_closed_forms():
    from service.theory.firstlayer import _cross_dual

    exp, relu = ACTIVATIONS["exp"], ACTIVATIONS["relu"]
    for a, b, rho in [(1.0, 2.0, 0.3), (0.5, 3.0, -0.7), (2.0, 2.0, 0.999), (0.3, 4.5, 0.9)]:
        ma, mb = math.exp(a * a / 2), math.exp(b * b / 2)
        got = _cross_dual(exp, a, b, ma, mb, rho)
        assert got == pytest.approx(exp_cross_dual(a, b, rho), rel=1e-13)
        th = math.acos(rho)
        arccos = a * b * (math.sin(th) + (PI - th) * math.cos(th) - 1) / (2 * PI)
        c0 = 1 / math.sqrt(2 * PI)
        assert _cross_dual(relu, a, b, a * c0, b * c0, rho) == pytest.approx(arccos, rel=1e-12)
    with pytest.raises(InvalidInput, match="unit_rms"):
        _cross_dual(exp, 1.0, 5.5, 1.0, 1.0, 0.5)


def test_kinked_pairs_beyond_the_series_bound_are_integrated_directly():
    # selu has a kink at 0: cₖ² decays like a power of k, and at ρ = 0.99999 the truncated series
    # (200 terms) misses ~1e-5·Var. Two samples of equal norm form such a pair; for them the entry
    # must be the equal-gain dual, which the κ interpolant gives independently.
    rng = np.random.default_rng(15)
    X = spread_inputs(rng, n=6)
    X[1] = X[0] * 0.99999 + 0.01 * np.linalg.norm(X[0]) / math.sqrt(50) * rng.standard_normal(50)
    X[1] *= np.linalg.norm(X[0]) / np.linalg.norm(X[1])  # same norm, cosine ≈ 0.99995
    G, m = theory.cosine_gram(X), moments_of(X)
    assert G[0, 1] > 0.9999
    got = theory.mean_field_grams("selu", 1, G, gain=1.0, input_variances=m)[0]
    gamma = math.sqrt(m[0])
    assert got[0, 1] == pytest.approx(theory.kappa("selu", gamma, G[0, 1]), abs=1e-10)
    # and elsewhere (ρ bounded away from 1) the series is the 2-D rule's value
    from service.theory.firstlayer import _cross_dual

    mom = [theory.moments("selu", math.sqrt(x)) for x in m[2:4]]
    D23 = _cross_dual(
        ACTIVATIONS["selu"], *np.sqrt(m[2:4]), mom[0]["mean"], mom[1]["mean"], G[2, 3]
    )
    expected = D23 / math.sqrt(mom[0]["variance"] * mom[1]["variance"])
    assert got[2, 3] == pytest.approx(expected, abs=1e-10)


@pytest.mark.parametrize(("name", "gain"), [("sin", 1.0), ("gelu", 1.5), ("exp", 0.7)])
def test_first_block_matches_a_finite_width_network_on_unequal_norms(name, gain):
    # the finite-width check of the recursion, with the inputs' norms kept (RMS 0.3–3): same
    # width, networks and tolerances as above. Measured: entry error 0.016 / 0.027 / 0.065 with
    # the norms, 0.53 / 0.15 / 0.38 without.
    rng = np.random.default_rng(16)
    X = spread_inputs(rng, lo=0.3, hi=3.0)
    act, d0 = ACTIVATIONS[name], X.shape[1]
    sims = []
    for _ in range(4):
        W = rng.standard_normal((WIDTH, d0)) / math.sqrt(d0)
        S = act.numpy(gain * (X @ W.T))
        S -= S.mean(axis=1, keepdims=True)
        H = S / np.linalg.norm(S, axis=1, keepdims=True) * math.sqrt(WIDTH)
        sims.append(gram_of(H) / WIDTH)
    sim = np.mean(sims, axis=0)
    G, m = theory.cosine_gram(X), moments_of(X)
    mf = theory.mean_field_grams(name, 1, G, gain=gain, input_variances=m)[0]
    unit = theory.mean_field_grams(name, 1, G, gain=gain)[0]
    assert np.abs(sim - mf).max() < ENTRY_TOL
    assert abs(isometry_gap(sim) - isometry_gap(mf)) < GAP_TOL
    assert np.abs(sim - unit).max() > ENTRY_TOL  # unit variance: rejected


@pytest.mark.parametrize(
    ("variances", "message"),
    [
        (np.ones(5), "one entry per sample"),
        (np.array([1.0, 2.0, 0.0, 1.0]), "> 0"),
        (np.array([1.0, np.nan, 1.0, 1.0]), "finite"),
        (np.array([1.0, 2.0, 1.0, 200.0]), "unit_rms"),
    ],
)
def test_bad_input_variances_are_named(variances, message):
    G = theory.cosine_gram(np.random.default_rng(17).standard_normal((4, 6)))
    with pytest.raises(InvalidInput, match=message) as exc:
        theory.mean_field_gaps("tanh", 2, G, input_variances=variances)
    assert exc.value.field == "input_variances"


def test_weight_variance_scale_of_each_init():
    s = theory.weight_variance_scale
    assert (s("gaussian", 64, 100), s("kaiming", 64, 100)) == (1.0, 2.0)
    assert s("xavier", 64, 192) == 0.5 and s("xavier", 100, 100) == 1.0
    assert s("orthogonal", 64, 256) == 0.25 and s("orthogonal", 256, 64) == 1.0
    with pytest.raises(InvalidInput, match="unknown init") as exc:
        s("lecun", 3, 3)
    assert exc.value.field == "init"


@pytest.mark.parametrize("name", ["exp", "tanh", "selu", "gelu", "softplus"])
def test_one_rule_for_all_gains_gives_each_gains_coefficients(name):
    # kinks only at 0: the largest gain's 1-D rule serves every smaller gain to rounding
    from service.theory.firstlayer import _expansions

    gam = np.geomspace(0.2, 6.0, 12)
    C, mean, var = _expansions(ACTIVATIONS[name], gam, 200)
    for i, g in enumerate(gam):
        scale = math.sqrt(theory.moments(name, g)["mean_square"])
        assert np.abs(C[i] - theory.hermite_coefficients(name, g, 200)).max() < 1e-14 * scale
        assert mean[i] == pytest.approx(theory.moments(name, g)["mean"], abs=1e-14 * scale)
        assert var[i] == pytest.approx(theory.moments(name, g)["variance"], rel=1e-13)


def test_kinks_off_zero_take_one_rule_per_gain():
    # hardtanh-like clip(x, −1, 1) has kinks at ±1, which move with the gain (x = ±1/γ)
    clip = custom("clip", lambda x: np.clip(x, -1.0, 1.0), breakpoints=(-1.0, 1.0))
    G = theory.cosine_gram(correlated_inputs(np.random.default_rng(18), n=5))
    v = np.array([0.5, 1.0, 2.0, 3.0, 4.0])
    got = theory.mean_field_grams(clip, 1, G, input_variances=v)[0]
    from service.theory.firstlayer import _cross_dual

    g = np.sqrt(v)
    mom = [theory.moments(clip, x) for x in g[:2]]
    D01 = _cross_dual(clip, g[0], g[1], mom[0]["mean"], mom[1]["mean"], G[0, 1])
    expected = D01 / math.sqrt(mom[0]["variance"] * mom[1]["variance"])
    assert got[0, 1] == pytest.approx(expected, abs=1e-9)
