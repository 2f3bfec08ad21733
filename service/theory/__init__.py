"""What the theory predicts: Hermite coefficients, isometry strength β, the dual activation κ and
the mean-field Gram recursion of a LayerNorm MLP, and `predict`: a trial's whole epoch-0 record
at infinite width (MLPs and residual MLPs with any norm, gradients included;
service.theory.predict). numpy + scipy only.

References (docs/science.md): Joudaki, Daneshmand, Bach, "On the impact of activation and
normalization in obtaining isometric embeddings at initialization", NeurIPS 2023 — Definition 3
(β), Table 5.1 / B.1 (closed forms), Theorem 5.1 and App. A.2–A.4 (mean-field Gram dynamics,
Daniely's dual activation).

Every expectation is over X ~ N(0, 1) of x ↦ σ(α·x), computed by quadrature, never Monte Carlo:

- 1-D: composite Gauss–Legendre on [−T, T], panels no wider than min(1, 2/α), with panel edges at
  the kinks and jumps of σ (at x = t/α for a breakpoint t). Each piece is analytic, so the rule
  converges geometrically where plain Gauss–Hermite converges like a power of the node count.
  Nodes carry s = √(w·φ(x)) so that σ(αx)·s and the Hermite functions Heₖ(x)/√k!·s never overflow.
- 2-D (the dual activation, a ρ-correlated pair): polar coordinates of two independent normals,
  X = r cos ψ, Y = r cos(ψ − θ) with ρ = cos θ. The kinks of σ at 0 are then rays, so the angle is
  split there and every sector is analytic, uniformly as ρ → ±1 (the sector shrinks, it does not
  get sharp). Kinks away from 0 split each ray radially where it crosses them.
- κ for the recursion: an adaptive Chebyshev interpolant of θ ↦ σ̄(cos θ), built from the 2-D
  values and checked against new ones until it agrees to `KAPPA_TOL`. With a layer-dependent
  gain (α_ℓ = α·ℓ^(−p)) and many layers, these maps are in turn interpolated in log α.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.activations import ACTIVATION_NAMES, ACTIVATIONS, Activation, gain_schedule
from service.isometry import cosine_gram, unit_gram
from service.theory.firstlayer import SERIES_TERMS, SERIES_TOL, weight_variance_scale
from service.theory.kappa import KAPPA_TOL, _dual_at_ends, _kappa_map, _kappa_map_cached
from service.theory.meanfield import (
    layer_gains,
    mean_field_gaps,
    mean_field_grams,
)
from service.theory.predict import predict
from service.theory.quadrature import (
    DEPTH_MAX,
    DUAL_GAIN_MAX,
    GAIN_MAX,
    GRAM_CELLS_MAX,
    STAGES,
    TERMS_MAX,
    _check_dual_gain,
    _check_gain,
    _check_int,
    _check_rho,
    _coefficients,
    _coefficients_cached,
    _dual_direct,
    _get_moments,
    _line_rule_cached,
    _moments_cached,
    _polar_radius,
    _resolve,
)

__all__ = [
    "DEPTH_MAX",
    "DUAL_GAIN_MAX",
    "GAIN_MAX",
    "GRAM_CELLS_MAX",
    "KAPPA_TOL",
    "SERIES_TERMS",
    "SERIES_TOL",
    "STAGES",
    "TERMS_MAX",
    "activation_summary",
    "clear_caches",
    "cosine_gram",
    "dual_activation",
    "gain_schedule",
    "hermite_coefficients",
    "isometry_strength",
    "kappa",
    "kappa_prime0",
    "layer_gains",
    "mean_field_gaps",
    "mean_field_grams",
    "moments",
    "predict",
    "registry_summary",
    "unit_gram",
    "weight_variance_scale",
]


# ------------------------------------------------------------------------------------ public API


def clear_caches() -> None:
    """Forget every cached rule, moment, coefficient vector and κ map (benchmarks, tests)."""
    for cached in (_line_rule_cached, _moments_cached, _coefficients_cached, _kappa_map_cached):
        cached.cache_clear()


def hermite_coefficients(
    activation: str | Activation, gain: float = 1.0, terms: int = 20
) -> np.ndarray:
    """c₀..c_terms of x ↦ σ(gain·x) in the orthonormal basis Heₖ(x)/√k! of N(0, 1).

    cₖ = E[σ(αX) Heₖ(X)]/√k! (Joudaki et al. 2023, Sec. 5, Eq. for the Hermite expansion).
    Accurate to ~1e-15·‖σ‖ for the registry, kinks and jumps included (tests compare with the
    closed forms of relu, step, exp and sin up to k = 200).

    Raises:
        InvalidInput: unknown activation (lists the names), gain outside (0, GAIN_MAX], terms
            outside 1..TERMS_MAX.
    """
    act, a = _resolve(activation), _check_gain(gain)
    K = _check_int(terms, "terms", 1, TERMS_MAX)
    if ACTIVATIONS.get(act.name) is act:
        return _coefficients_cached(act.name, a, K).copy()
    return _coefficients(act, a, K)


def moments(activation: str | Activation, gain: float = 1.0) -> dict[str, float]:
    """E σ(αX), E σ(αX)², E X·σ(αX) and Var σ(αX) = Σ_{k≥1} cₖ², X ~ N(0, 1), by quadrature.

    Keys: mean (= c₀), mean_square, mean_x_sigma (= c₁), variance (= σ̄(1)).
    """
    return _get_moments(_resolve(activation), _check_gain(gain))


def isometry_strength(activation: str | Activation, gain: float = 1.0) -> float:
    """β_σ(α) = 2 − c₁² / Σ_{k≥1} cₖ² (Joudaki et al. 2023, Definition 3), 1 ≤ β ≤ 2.

    From the moments directly — c₁ = E Xσ, Σ_{k≥1} cₖ² = Var σ — not from a truncated series, so
    it is exact to quadrature accuracy. β = 1 for affine σ; β is unchanged by σ → aσ + b.
    """
    m = moments(activation, gain)
    return 2.0 - m["mean_x_sigma"] ** 2 / m["variance"]


def kappa_prime0(activation: str | Activation, gain: float = 1.0) -> float:
    """κ′(0) = c₁²/σ̄(1) = 2 − β: the per-layer contraction of small correlations near isometry."""
    m = moments(activation, gain)
    return m["mean_x_sigma"] ** 2 / m["variance"]


def dual_activation(
    activation: str | Activation, gain: float, rho: np.ndarray | float
) -> np.ndarray | float:
    """Mean-reduced dual activation σ̄(ρ) = Σ_{k≥1} cₖ² ρᵏ = E[σ(αX)σ(αY)] − (E σ(αX))².

    (X, Y) standard normals with correlation ρ (Daniely et al. 2016; Joudaki et al. 2023, App. A.4).
    Computed directly for every ρ by the 2-D polar quadrature (ρ = ±1 by the 1-D rule): the series
    converges like a power of k for kinked σ (step: cₖ² ~ k^{−3/2}) and cannot be truncated near
    |ρ| = 1. About a millisecond per value; `kappa` is the fast, interpolated version.
    """
    act, a = _resolve(activation), _check_dual_gain(gain)
    r = _check_rho(rho)
    mean = _get_moments(act, a)["mean"]
    one, minus_one = _dual_at_ends(act, a, mean)
    R, out = _polar_radius(act, a), np.empty(r.shape)
    for i, v in np.ndenumerate(r):
        if abs(v) == 1.0:
            out[i] = one if v > 0 else minus_one
        else:
            out[i] = _dual_direct(act, a, mean, float(np.arccos(v)), R)
    return float(out) if out.ndim == 0 else out


def kappa(activation: str | Activation, gain: float, rho: np.ndarray | float) -> np.ndarray | float:
    """κ(ρ) = σ̄(ρ)/σ̄(1): the mean-field map of one Linear → σ → center → normalize block.

    κ(0) = 0, κ(1) = 1, κ′(0) = 2 − β. Evaluated from a cached Chebyshev interpolant of the direct
    2-D values (relative accuracy KAPPA_TOL, checked as it is built).
    """
    act, a = _resolve(activation), _check_dual_gain(gain)
    k = _kappa_map(act, a)(_check_rho(rho))
    return float(k) if np.ndim(k) == 0 else k


# --------------------------------------------------------------------------------- summaries


def activation_summary(
    name: str | Activation, gain: float = 1.0, terms: int = 20
) -> dict[str, Any]:
    """JSON-ready facts about σ(gain·x): what the API and `isosweep theory` return."""
    act, a = _resolve(name), _check_gain(gain)
    return {
        "name": act.name,
        "gain": a,
        "formula": act.formula,
        "params": dict(act.params),
        "breakpoints": list(act.breakpoints),
        "homogeneous": act.homogeneous,
        "coefficients": hermite_coefficients(act, a, terms).tolist(),
        "beta": isometry_strength(act, a),
        "kappa_prime0": kappa_prime0(act, a),
        "moments": moments(act, a),
    }


def registry_summary(gain: float = 1.0, terms: int = 20) -> list[dict[str, object]]:
    """`activation_summary` of every registered activation, in registry order."""
    return [activation_summary(name, gain, terms) for name in ACTIVATION_NAMES]
