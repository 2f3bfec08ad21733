"""Per-unit kernels of one layer at infinite width, for `service.theory.predict`.

At infinite width the n probe samples' representation in a layer is described, unit by unit, by
the n-vector u = (u₁..uₙ) of one unit's values: units are i.i.d., so the layer is its kernel
K = E[u uᵀ] (n × n, the Gram per unit: H Hᵀ/d → K) and its mean μ = E u (over units). A Linear
with i.i.d. zero-mean weights of variance s·g²/fan_in turns any input of kernel K into a
Gaussian u ~ N(0, s·g²·K). What each other layer does:

- σ(α·u) of a Gaussian u: E[σ(αuᵢ)σ(αuⱼ)] by the quadrature of service.theory (κ maps for equal
  variances, the first-layer machinery of service.theory.firstlayer for unequal ones) — exact to
  ~1e-11;
- LayerNorm (per sample, over units): at infinite width a deterministic per-sample rescaling by
  the unit statistics, (uᵢ − μᵢ)/√(Var uᵢ + ε) (layer) or uᵢ/√(E uᵢ² + ε) (layer_scale);
- BatchNorm (per unit, over the batch): y = √n·Pu/√(‖Pu‖² + nε), P = I − 11ᵀ/n (batch), or
  √n·u/√(‖u‖² + nε) (batch_scale) — an n-dimensional non-linear map of one unit's vector, whose
  kernel is Yang et al. (2019)'s recursion. For a Gaussian input N(0, Σ) it is exact here
  (`bn_gaussian`: a one-dimensional integral, Laplace's trick 1/x = ∫e^{−tx}dt); after a
  non-linearity it is a Monte Carlo average over `samples` draws with a fixed seed (`bn_samples`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate

from service.activations import Activation
from service.errors import InvalidInput
from service.theory.firstlayer import _homogeneous_dual, _series_dual
from service.theory.kappa import _kappa_map
from service.theory.quadrature import DUAL_GAIN_MAX, GAIN_MAX, _get_moments

ISOTROPIC_RTOL = 1e-9  # a centred kernel this close to c·P counts as isotropic on 1⊥
# Variances this close are one variance (κ at their mean gain): a LayerNorm's ε leaves its
# outputs' mean squares v/(v + ε) apart by O(ε/v) ~ 1e-5, which would send every later block to the
# slow unequal-variance series; the gain then moves by ≤ 5e-5 relative, κ by about as much.
EQUAL_VARIANCE_RTOL = 1e-4


def psd_sqrt(K: np.ndarray) -> np.ndarray:
    """R (n, n) with R Rᵀ = K for a symmetric PSD K (eigenvalues below 0 from rounding → 0)."""
    lam, U = np.linalg.eigh((K + K.T) / 2)
    return U * np.sqrt(np.maximum(lam, 0.0))


def gaussian_draws(K: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """(samples, n) i.i.d. draws of N(0, K): one row per unit."""
    return rng.standard_normal((samples, K.shape[0])) @ psd_sqrt(K).T


# --------------------------------------------------------------------- σ of a Gaussian, exact


def gaussian_act(act: Activation, alpha: float, K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(E σ(αu)σ(αu)ᵀ (n, n), E σ(αu) (n,)) for u ~ N(0, K), by quadrature.

    Raises:
        InvalidInput: a sample with zero variance, or a gain α·√Kᵢᵢ beyond the quadrature's range
            (GAIN_MAX; DUAL_GAIN_MAX for non-homogeneous σ with equal variances).
    """
    v = np.diag(K).copy()
    if not (np.isfinite(K).all() and (v > 0).all()):
        raise InvalidInput("a sample's pre-activation variance is 0 or not finite", field="inputs")
    d = np.sqrt(v)
    rho = np.clip(K / np.outer(d, d), -1.0, 1.0)
    np.fill_diagonal(rho, 1.0)
    gam = alpha * d
    if act.homogeneous:
        mean, D = _homogeneous_dual(act, rho, gam)
    elif v.max() <= v.min() * (1 + EQUAL_VARIANCE_RTOL):
        g = float(gam.mean())
        if g > DUAL_GAIN_MAX:
            raise InvalidInput(
                f"the pre-activation scale α·√q = {g:.3g} is over {DUAL_GAIN_MAX:g}, the 2-D "
                "quadrature's range",
                field="activation_gain",
            )
        m = _get_moments(act, g)
        f = _kappa_map(act, g)
        D = m["variance"] * f(rho)
        np.fill_diagonal(D, m["variance"])
        mean = np.full(v.size, m["mean"])
    else:
        if gam.max() > GAIN_MAX:
            raise InvalidInput(
                f"the largest pre-activation scale α·√q is {gam.max():.3g}, over {GAIN_MAX:g}",
                field="activation_gain",
            )
        mean, D = _series_dual(act, rho, gam)
    return np.outer(mean, mean) + D, mean


def gaussian_act_derivative(
    act: Activation, alpha: float, K: np.ndarray, samples: int, rng: np.random.Generator
) -> np.ndarray:
    """E[α²σ′(αuᵢ)σ′(αuⱼ)] (n, n) for u ~ N(0, K), Monte Carlo (σ′ by central differences,
    which is 0 almost everywhere for step, as autograd's)."""
    Z = alpha * gaussian_draws(K, samples, rng)
    S = alpha * derivative(act, Z)
    return S.T @ S / samples


def derivative(act: Activation, x: np.ndarray) -> np.ndarray:
    """σ′(x) by a central difference (h = 1e-6·max(1, |x|)); exact for piecewise-linear σ away
    from their kinks."""
    h = 1e-6 * np.maximum(1.0, np.abs(x))
    with np.errstate(over="ignore", invalid="ignore"):
        return (act.numpy(x + h) - act.numpy(x - h)) / (2 * h)


# ------------------------------------------------------------------------------ BatchNorm


def centring(n: int) -> np.ndarray:
    return np.eye(n) - 1.0 / n


# The exp-sinh rule for ∫₀^∞ (t = exp(π/2·sinh u)): the integrands below are smooth in u and
# decay double-exponentially at both ends (like a power of t for large t), so the trapezoid rule
# in u converges geometrically; this step and range agree with adaptive quadrature (scipy's
# quad_vec, epsrel 1e-12) to ~1e-13 relative, ranks 1..n, ε = 0 and > 0.
DE_STEP, DE_RANGE = 1.0 / 16.0, 5.0


def _exp_sinh_nodes() -> tuple[np.ndarray, np.ndarray]:
    u = np.arange(-DE_RANGE, DE_RANGE + DE_STEP / 2, DE_STEP)
    t = np.exp(0.5 * np.pi * np.sinh(u))
    return t, DE_STEP * 0.5 * np.pi * np.cosh(u) * t  # nodes, weights


def bn_gaussian(Sigma: np.ndarray, eps: float, centred: bool) -> np.ndarray:
    """E[y yᵀ] for y = BN(u), u ~ N(0, Σ): exact (Yang et al. 2019, the linear case).

    y = √n·w/√(‖w‖² + nε) with w = Pu (centred) or u. With w's covariance C = U diag(λ) Uᵀ,
    E[y yᵀ] = U diag(m) Uᵀ, m_k = n·∫₀^∞ e^{−tnε}·λ_k/(1 + 2tλ_k)·Π_j(1 + 2tλ_j)^{−1/2} dt
    (1/(x + nε) = ∫e^{−tx}dt, and the Gaussian integral of x_k²e^{−t‖w‖²}), by the exp-sinh rule
    (DE_STEP, DE_RANGE; relative accuracy ~1e-13). At an isotropic C = c·P this is
    (n/(n − 1))·P for ε = 0.
    """
    n = Sigma.shape[0]
    C = centring(n) @ Sigma @ centring(n) if centred else Sigma
    lam, U = np.linalg.eigh((C + C.T) / 2)
    lam = np.where(lam > n * 1e-15 * max(lam.max(), 0.0), lam, 0.0)
    scale = lam.max()
    if not scale > 0:
        raise InvalidInput("a BatchNorm input is zero on the whole batch", field="inputs")
    lam_s = lam / scale  # t in units of 1/scale: integrand of order 1
    e = n * eps / scale
    t, w = _exp_sinh_nodes()
    tl = 2.0 * t[:, None] * lam_s[None, :]  # (nodes, n)
    with np.errstate(under="ignore"):
        weight = np.exp(np.log(w) - 0.5 * np.log1p(tl).sum(axis=1) - t * e)  # (nodes,)
    m = weight @ (lam_s[None, :] / (1.0 + tl))
    return (U * (n * m)) @ U.T


def bn_backward_gaussian(Sigma: np.ndarray, D: np.ndarray, eps: float, centred: bool) -> np.ndarray:
    """E[J D Jᵀ] (n, n) for the BN Jacobian J at u ~ N(0, Σ): exact, any Σ.

    J = (√n/r)(P − wwᵀ/r²), w = Pu, r² = ‖w‖² + nε (bn_backward_samples), so with D′ = PDP
    E[J D Jᵀ] = n(a·D′ − (D′B + BD′) + Q), a = E[1/r²], B = E[wwᵀ/r⁴], Q = E[wwᵀD′wwᵀ/r⁶].
    Laplace's 1/r^{2k} = ∫t^{k−1}e^{−tr²}dt/(k − 1)! and the Gaussian tilt e^{−t‖w‖²} (in the
    eigenbasis of PΣP = U diag(λ) Uᵀ: a factor Π_j(1 + 2tλ_j)^{−1/2} and the covariance
    M = diag(λ/(1 + 2tλ))) turn each into a 1-D integral; Isserlis gives the quartic one,
    E_M[wwᵀD̃wwᵀ] = 2(μμᵀ)∘D̃ + M·tr(D̃M). By the exp-sinh rule, as bn_gaussian.
    """
    n = Sigma.shape[0]
    P = centring(n) if centred else np.eye(n)
    C = P @ Sigma @ P
    lam, U = np.linalg.eigh((C + C.T) / 2)
    lam = np.where(lam > n * 1e-15 * max(lam.max(), 0.0), lam, 0.0)
    scale = lam.max()
    if not scale > 0:
        raise InvalidInput("a BatchNorm input is zero on the whole batch", field="inputs")
    lam_s, e = lam / scale, n * eps / scale
    Dp = P @ D @ P
    Dt = U.T @ Dp @ U  # D′ in the eigenbasis
    t, w = _exp_sinh_nodes()
    tl = 2.0 * t[:, None] * lam_s[None, :]
    with np.errstate(under="ignore"):
        weight = np.exp(np.log(w) - 0.5 * np.log1p(tl).sum(axis=1) - t * e)  # (nodes,)
    mu = lam_s[None, :] / (1.0 + tl)  # (nodes, n): M(t) per node
    a = weight.sum()
    b = (weight * t) @ mu  # diag of B
    w2 = weight * t * t / 2.0
    quartic = 2.0 * ((mu.T * w2) @ mu) * Dt
    quartic += np.diag((w2 * (mu @ np.diag(Dt))) @ mu)  # M·tr(D̃M), node by node
    inner = a * Dt - (Dt * b[None, :] + b[:, None] * Dt) + quartic
    return n / scale * (U @ inner @ U.T)


def bn_samples(U: np.ndarray, eps: float, centred: bool) -> np.ndarray:
    """BN of each row of U (samples, n): one unit's batch vector per row."""
    n = U.shape[1]
    W = U - U.mean(axis=1, keepdims=True) if centred else U
    return math.sqrt(n) * W / np.sqrt((W * W).sum(axis=1, keepdims=True) + n * eps)


def bn_backward_samples(U: np.ndarray, G: np.ndarray, eps: float, centred: bool) -> np.ndarray:
    """Jᵀg per row: the gradient at the BN input U (samples, n) of output gradients G.

    J = (√n/r)(P − Pu uᵀP/r²), r² = ‖Pu‖² + nε (P = I for batch_scale); J is symmetric."""
    n = U.shape[1]
    if centred:
        W = U - U.mean(axis=1, keepdims=True)
        PG = G - G.mean(axis=1, keepdims=True)
    else:
        W, PG = U, G
    r2 = (W * W).sum(axis=1, keepdims=True) + n * eps
    return math.sqrt(n) / np.sqrt(r2) * (PG - W * (W * PG).sum(axis=1, keepdims=True) / r2)


def isotropic_scale(Sigma: np.ndarray, centred: bool) -> float | None:
    """c when the BN input's (centred) covariance is c·P (c·I for batch_scale) to ISOTROPIC_RTOL,
    else None."""
    n = Sigma.shape[0]
    C = centring(n) @ Sigma @ centring(n) if centred else Sigma
    m = n - 1 if centred else n
    c = float(np.trace(C)) / m
    target = c * (centring(n) if centred else np.eye(n))
    if c > 0 and np.abs(C - target).max() <= ISOTROPIC_RTOL * c:
        return c
    return None


def bn_backward_isotropic(D: np.ndarray, c: float, eps: float, centred: bool) -> np.ndarray:
    """E[J D J] for u with covariance c·P (c·I for batch_scale): closed form.

    With m = rank, w = Pu/‖Pu‖ uniform on the unit sphere of the range and ‖Pu‖² = c·χ²_m
    independent of it, J = √n/r·(P − ρ²/r²·wwᵀ) (ρ = ‖Pu‖). For ε = 0 the sphere's fourth moments
    E[wₐw_bw_cw_d] = (δδ + δδ + δδ)/(m(m + 2)) give
    E[J D J] = n·E[1/ρ²]·(D′(1 − 2/m + 2/(m(m + 2))) + tr(D′)·P/(m(m + 2))), D′ = PDP,
    E[1/ρ²] = 1/(c(m − 2)). With ε > 0 the moments of ρ enter through 1-D integrals over
    χ²_m. Needs m > 2 (ε = 0)."""
    n = D.shape[0]
    P = centring(n) if centred else np.eye(n)
    m = n - 1 if centred else n
    Dp = P @ D @ P
    ne = n * eps
    # E over ρ² = cX, X ~ χ²_m, of a(ρ²) = 1/r², b(ρ²) = ρ²/r⁴ (the wwᵀ term's weight), ρ⁴/r⁶
    if ne == 0:
        if m <= 2:
            raise InvalidInput(
                "BatchNorm's gradient needs a batch of at least 4", field="batch_size"
            )
        e1 = 1.0 / (c * (m - 2))
        e2 = e1
        e3 = e1
    else:
        from scipy import stats

        def moment(f):
            return integrate.quad(
                lambda x: f(c * x) * stats.chi2.pdf(x, m), 0, np.inf, epsrel=1e-12, limit=200
            )[0]

        e1 = moment(lambda q: 1 / (q + ne))
        e2 = moment(lambda q: q / (q + ne) ** 2)
        e3 = moment(lambda q: q * q / (q + ne) ** 3)
    # J D J = (n/r²)(D′ − s(wwᵀD′ + D′wwᵀ) + s² wwᵀD′wwᵀ), s = ρ²/r²
    Eww = P / m
    four = (2 * Dp + np.trace(Dp) * P) / (m * (m + 2))
    return n * (e1 * Dp - e2 * (Eww @ Dp + Dp @ Eww) + e3 * four)
