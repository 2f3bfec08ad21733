"""The first mean-field block started from the real input: samples of different norms.

The recursion of service.theory.meanfield assumes that every sample enters the first block with
the same pre-activation variance. Real inputs do not: on digits ‖xᵢ‖²/d_in spans 0.34–18. For a
Linear with i.i.d. weights of variance s·g²/fan_in (s of `weight_variance_scale`), the first
pre-activations are jointly Gaussian in the infinite-width limit with covariance

    Q_ij = g²·s·(xᵢ·xⱼ)/d_in = g²·s·√(mᵢmⱼ)·ρᵢⱼ,   mᵢ = ‖xᵢ‖²/d_in,  ρ = the cosine Gram,

so sample i meets the activation as σ(α·√Qᵢᵢ·X) with X ~ N(0, 1), and the pair (i, j) is a
ρᵢⱼ-correlated pair with *different* gains γᵢ = α·√Qᵢᵢ. With cₖ(γ) the Hermite coefficients of
σ(γ·) (service.theory.hermite_coefficients), Mehler's formula gives

    E[σ(γᵢX)σ(γⱼY)] = Σ_{k≥0} cₖ(γᵢ)cₖ(γⱼ)ρᵢⱼᵏ,

the centring of a LayerNorm removes k = 0 (Joudaki et al. 2023, App. A.2 with per-sample gains),
and the normalization rescales the result to unit diagonal. From there on every sample has unit
variance and the equal-gain recursion applies. Evaluation:

- homogeneous σ (σ(γx) = γᵐσ(x)): the gains factor out of every entry, D_ij = sᵢsⱼ·σ̄₁(ρᵢⱼ),
  sᵢ² = Var σ(γᵢX)/Var σ(X); κ at gain 1 is exact (service.theory.kappa);
- otherwise the Hermite series to `SERIES_TERMS`, with the rigorous tail bound
  |Σ_{k>K} aₖbₖρᵏ| ≤ |ρ|^{K+1}·√(TᵢTⱼ), Tᵢ = Var σ(γᵢX) − Σ_{k=1..K} cₖ(γᵢ)² (from the 1-D
  quadrature, not from the series). A pair whose bound exceeds `SERIES_TOL` of its scale (a kinked
  σ such as selu on nearly parallel inputs) is integrated directly by the 2-D polar rule with two
  gains.
"""

from __future__ import annotations

import numpy as np

from service.activations import ACTIVATIONS, Activation
from service.errors import InvalidInput
from service.theory.kappa import _kappa_map
from service.theory.quadrature import (
    DUAL_GAIN_MAX,
    GAIN_MAX,
    TERMS_MAX,
    _coefficients,
    _coefficients_cached,
    _dual_direct,
    _get_moments,
    _hermite_functions,
    _polar_radius,
    _rule,
    _sigma,
)

SERIES_TERMS = TERMS_MAX  # Hermite terms of the first block's cross-gain dual
SERIES_TOL = 1e-10  # bound on a truncated entry's error, relative to √(Var_i·Var_j)
EQUAL_RTOL = 1e-12  # variances closer than this are one variance (unit-RMS inputs, say)

# -------------------------------------------------------------------------- variance of a Linear


def weight_variance_scale(init: str, fan_in: int, fan_out: int) -> float:
    """s = fan_in·E[W_uj²]/g²: the factor by which a Linear with init gain g multiplies the mean
    square ‖x‖²/fan_in of its input, per output unit (workers.nn.init_weight's inits).

    gaussian N(0, g²/fan_in): 1; kaiming N(0, 2g²/fan_in): 2; xavier N(0, 2g²/(fan_in + fan_out)):
    2·fan_in/(fan_in + fan_out); orthogonal g·Q (Haar): rows orthonormal if fan_out ≤ fan_in, so
    E[(q_uᵀx)²] = ‖x‖²/fan_in → 1; columns orthonormal otherwise, ‖Qx‖ = ‖x‖ spread over fan_out
    units → fan_in/fan_out. (Orthogonal pre-activations are Gaussian only as fan_out → ∞ with the
    correlations xᵢ·xⱼ preserved exactly; the Gaussian inits are Gaussian at any width.)
    """
    if not (isinstance(fan_in, int) and isinstance(fan_out, int) and fan_in > 0 and fan_out > 0):
        raise InvalidInput(f"fan_in and fan_out must be positive, got {fan_in}, {fan_out}")
    scales = {
        "gaussian": 1.0,
        "kaiming": 2.0,
        "xavier": 2.0 * fan_in / (fan_in + fan_out),
        "orthogonal": min(1.0, fan_in / fan_out),
    }
    if init not in scales:
        raise InvalidInput(f"unknown init {init!r}", field="init", allowed=tuple(scales))
    return scales[init]


def check_variances(variances: np.ndarray, n: int) -> np.ndarray:
    """Validate the first block's per-sample pre-activation variances: finite, > 0, shape (n,)."""
    v = np.asarray(variances, dtype=np.float64)
    if v.shape != (n,):
        raise InvalidInput(
            f"must have one entry per sample ({n}), got shape {v.shape}", field="input_variances"
        )
    if not (np.isfinite(v).all() and (v > 0).all()):
        raise InvalidInput("must be finite and > 0 (an all-zero input?)", field="input_variances")
    return v


# ------------------------------------------------------------------------------- the first block


def first_block(
    act: Activation, rho: np.ndarray, gain: float, variances: np.ndarray
) -> dict[str, np.ndarray]:
    """The first block's Grams (n, n) for samples of variances v (relative to gain²): "linear"
    (√vᵢ√vⱼρᵢⱼ), "act" (E σσ), "centered" (E σσ − E σ E σ) — each divided by its mean diagonal —
    and "norm" / "scaled": "centered" / "act" rescaled to unit diagonal (LayerNorm / the
    scale-only norm)."""
    gam = gain * np.sqrt(variances)
    if gam.max() > GAIN_MAX:
        raise InvalidInput(
            f"the largest first-layer gain α·g·√(‖x‖²/d_in) is {gam.max():.3g}, over {GAIN_MAX:g};"
            " normalize the inputs (input_norm = unit_rms) or lower the gains",
            field="input_variances",
        )
    if act.homogeneous:
        mean, D = _homogeneous_dual(act, rho, gam)
    else:
        mean, D = _series_dual(act, rho, gam)
    A = np.outer(mean, mean) + D
    out = {
        "linear": np.sqrt(np.outer(variances, variances)) * rho,
        "act": A,
        "centered": D,
        "norm": _unit(D),
        "scaled": _unit(A),
    }
    for k in ("linear", "act", "centered"):
        out[k] = out[k] / np.diag(out[k]).mean()
    return out


def _unit(G: np.ndarray) -> np.ndarray:
    d = np.sqrt(np.diag(G))
    C = np.clip(G / np.outer(d, d), -1.0, 1.0)
    np.fill_diagonal(C, 1.0)
    return C


def _homogeneous_dual(act: Activation, rho: np.ndarray, gam: np.ndarray):
    """Means (n,) and centered dual (n, n) of a positively homogeneous σ: the gains factor out."""
    one = _get_moments(act, 1.0)
    m = [_get_moments(act, float(g)) for g in gam]
    mean = np.array([x["mean"] for x in m])
    s = np.sqrt(np.array([x["variance"] for x in m]) / one["variance"])
    D = np.outer(s, s) * one["variance"] * _kappa_map(act, 1.0)(rho)
    np.fill_diagonal(D, s**2 * one["variance"])
    return mean, D


def _expansions(act: Activation, gam: np.ndarray, K: int):
    """c₀..c_K (n, K+1), means (n,) and variances (n,) of σ(γᵢ·) for every sample.

    When σ's kinks are all at 0 (every registered σ), one 1-D rule serves every gain: the rule of
    the largest gain has the finest panels and the widest range, and its kink (0) does not move
    with the gain. Then the Hermite functions are formed once, and the coefficients are one
    matrix product. Otherwise each gain gets its own rule.
    """
    if not np.any(np.asarray(act.breakpoints, dtype=np.float64)):
        x, s = _rule(act, float(gam.max()))
        u = _sigma(act, 1.0, np.outer(gam, x)) * s  # (n, N): σ(γᵢx)·√(wφ)
        C = u @ _hermite_functions(x, s, K).T  # (n, K+1)
        mean = u @ s
        v = u - mean[:, None] * s
        return C, mean, np.einsum("ij,ij->i", v, v)
    registered = ACTIVATIONS.get(act.name) is act
    rows, moments = {}, {}
    for g in np.unique(gam):
        a = float(g)
        rows[a] = _coefficients_cached(act.name, a, K) if registered else _coefficients(act, a, K)
        moments[a] = _get_moments(act, a)
    C = np.array([rows[float(g)] for g in gam])
    mean = np.array([moments[float(g)]["mean"] for g in gam])
    return C, mean, np.array([moments[float(g)]["variance"] for g in gam])


def _series_dual(act: Activation, rho: np.ndarray, gam: np.ndarray):
    """Means (n,) and centered dual (n, n) by Mehler's series, bounded tail, direct fallback."""
    K = SERIES_TERMS
    C, mean, var = _expansions(act, gam, K)  # (n, K+1), (n,), (n,)
    if not (var > 0).all():
        raise InvalidInput(f"{act.name}(α·x) is constant under N(0, 1)", field="activation")
    D, power = np.zeros_like(rho), np.ones_like(rho)
    for k in range(1, K + 1):  # Σ_{k≥1} cₖ(γᵢ)cₖ(γⱼ)ρᵏ
        power = power * rho
        D += np.outer(C[:, k], C[:, k]) * power
    tail = np.maximum(var - (C[:, 1:] ** 2).sum(axis=1), 0.0)
    scale = np.sqrt(np.outer(var, var))
    bound = np.abs(rho) ** (K + 1) * np.sqrt(np.outer(tail, tail))
    bad = np.argwhere(np.triu(bound > SERIES_TOL * scale, k=1))
    for i, j in bad:
        D[i, j] = D[j, i] = _cross_dual(
            act, float(gam[i]), float(gam[j]), mean[i], mean[j], rho[i, j]
        )
    np.fill_diagonal(D, var)
    return mean, D


def _cross_dual(act: Activation, a: float, b: float, ma: float, mb: float, rho: float) -> float:
    """E[(σ(aX) − ma)(σ(bY) − mb)], corr(X, Y) = ρ, by the 2-D polar rule."""
    if max(a, b) > DUAL_GAIN_MAX:
        raise InvalidInput(
            f"a pair of nearly parallel inputs needs the 2-D rule at gain {max(a, b):.3g}, over "
            f"{DUAL_GAIN_MAX:g}; normalize the inputs (input_norm = unit_rms)",
            field="input_variances",
        )
    rho = float(np.clip(rho, -1.0, 1.0))
    if abs(rho) == 1.0:  # Y = ±X: the 1-D rule through the 2-D one at θ ∈ {0, π} is singular
        rho = np.sign(rho) * (1.0 - 1e-15)
    R = max(_polar_radius(act, a), _polar_radius(act, b))
    return _dual_direct(act, a, ma, float(np.arccos(rho)), R, b, mb)
