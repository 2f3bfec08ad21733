"""The quadrature rules behind service.theory (see its docstring): 1-D composite Gauss–Legendre
split at the kinks of σ, and the 2-D polar rule for a ρ-correlated pair."""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np

from service.activations import ACTIVATIONS, Activation, get_activation
from service.errors import InvalidInput

GAIN_MAX = 10.0  # coefficients and β (1-D); exp(αx) nears float64 overflow soon after
DUAL_GAIN_MAX = 5.0  # σ̄, κ, mean field (2-D): the polar rule needs ~α² points per ρ
TERMS_MAX = 200
DEPTH_MAX = 100_000
GRAM_CELLS_MAX = 25_000_000  # depth·n² of a stacked (depth, n, n) answer: 200 MB of float64
STAGES = ("linear", "act", "norm")  # which sub-layer's Gram the recursion reports, per block
_Q = 20  # Gauss–Legendre nodes per panel
_GL_T, _GL_W = np.polynomial.legendre.leggauss(_Q)  # on [−1, 1]
# 2-D panels: radial ≤ _HR·min(1, 2/α), angular ≤ _HA·min(1, 2/(α·R)) (α·R bounds how fast ψ ↦
# σ(α r cos ψ) turns). Measured: 1e-14 against the closed forms and series at (3, 4); margin kept.
_HR, _HA = 2.5, 3.5
_TAIL = 1e-17  # |σ(αT)|·√φ(T) relative to its peak: where the integration range stops

# ---------------------------------------------------------------------------------- validation


def _resolve(activation: str | Activation) -> Activation:
    if isinstance(activation, Activation):
        return activation
    if not isinstance(activation, str):
        raise InvalidInput(f"expected a name, got {activation!r}", field="activation")
    return get_activation(activation)


def _check_gain(gain: float, field: str = "gain") -> float:
    message = f"must be finite and in (0, {GAIN_MAX:g}], got {gain!r}"
    try:
        a = float(gain)
    except (TypeError, ValueError):
        raise InvalidInput(message, field=field) from None
    if not (math.isfinite(a) and 0.0 < a <= GAIN_MAX):
        raise InvalidInput(message, field=field)
    return a


def _check_int(value: int, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not lo <= value <= hi:
        raise InvalidInput(f"must be an integer in {lo}..{hi}, got {value!r}", field=field)
    return int(value)


def _check_rho(rho: np.ndarray | float) -> np.ndarray:
    r = np.asarray(rho, dtype=np.float64)
    if not (np.isfinite(r).all() and (np.abs(r) <= 1.0 + 1e-12).all()):
        raise InvalidInput("correlations must be finite and in [−1, 1]", field="rho")
    return np.clip(r, -1.0, 1.0)


def _check_dual_gain(gain: float) -> float:
    a = _check_gain(gain)
    if a > DUAL_GAIN_MAX:
        raise InvalidInput(
            f"must be in (0, {DUAL_GAIN_MAX:g}] for the dual activation and the mean-field "
            f"recursion (2-D quadrature), got {gain!r}",
            field="gain",
        )
    return a


# ------------------------------------------------------------------------------ 1-D quadrature


def _composite(edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes and weights on each [edges[i], edges[i+1]] (edges increasing)."""
    lo, hi = edges[:-1, None], edges[1:, None]  # (P, 1)
    x = lo + (hi - lo) * (_GL_T + 1.0) / 2.0  # (P, Q)
    w = (hi - lo) / 2.0 * _GL_W
    return x.ravel(), w.ravel()


def _edges(T: float, h: float, cuts: np.ndarray) -> np.ndarray:
    """Panel edges covering [−T, T], at most h apart, with every cut in (−T, T) as an edge."""
    grid = np.linspace(-T, T, math.ceil(2 * T / h) + 1)
    cuts = cuts[np.abs(cuts) < T]
    e = np.unique(np.concatenate([grid, cuts]))
    return e[np.concatenate([[True], np.diff(e) > 1e-12 * T])]  # drop slivers next to a cut


def _sigma(act: Activation, a: float, x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.asarray(act.numpy(a * x), dtype=np.float64)
    if not np.isfinite(v).all():
        raise InvalidInput(
            f"{act.name}(α·x) overflows float64 within the integration range at α = {a:g}",
            field="gain",
        )
    return v


def _kinks(act: Activation, a: float) -> np.ndarray:
    return np.asarray(act.breakpoints, dtype=np.float64) / a  # a kink of σ at t sits at x = t/α


def _radius(act: Activation, a: float) -> float:
    """T such that |σ(αx)|·√φ(x) beyond ±T is below `_TAIL` of its peak (both tails)."""
    for T in np.arange(12.0, 200.0, 2.0):
        x = np.linspace(-T, T, 4001)
        f = np.abs(_sigma(act, a, x)) * np.exp(-(x**2) / 4)  # ∝ |σ|√φ
        if f[np.abs(x) >= T - 1].max() <= _TAIL * f.max():  # the last unit: no lucky zero of σ
            return float(T)
    raise InvalidInput(f"{act.name}(α·x) grows too fast to integrate at α = {a:g}", field="gain")


@lru_cache(maxsize=256)
def _line_rule_cached(name: str, a: float) -> tuple[np.ndarray, np.ndarray]:
    return _line_rule(ACTIVATIONS[name], a)


def _line_rule(act: Activation, a: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes x (N,) and s = √(w·φ(x)) (N,): E f(X) ≈ Σ s² f(x), split at the kinks of σ(α·)."""
    T = _radius(act, a)
    k = _kinks(act, a)
    x, w = _composite(_edges(T, min(1.0, 2.0 / a), np.concatenate([k, -k])))  # ± for σ(−αx)
    s = np.sqrt(w) * np.exp(-(x**2) / 4) / (2 * np.pi) ** 0.25
    return x, s


def _rule(act: Activation, a: float) -> tuple[np.ndarray, np.ndarray]:
    if ACTIVATIONS.get(act.name) is act:
        return _line_rule_cached(act.name, a)
    return _line_rule(act, a)


def _hermite_functions(x: np.ndarray, s: np.ndarray, K: int) -> np.ndarray:
    """(K+1, N): hₖ(x)·s with hₖ = Heₖ/√k! by h_{k+1} = (x·hₖ − √k·h_{k−1})/√(k+1)."""
    H = np.empty((K + 1, x.size))
    H[0] = s
    if K >= 1:
        H[1] = x * s
    for k in range(1, K):
        H[k + 1] = (x * H[k] - np.sqrt(k) * H[k - 1]) / np.sqrt(k + 1)
    return H


def _coefficients(act: Activation, a: float, K: int) -> np.ndarray:
    x, s = _rule(act, a)
    return _hermite_functions(x, s, K) @ (_sigma(act, a, x) * s)  # (K+1,)


def _moments(act: Activation, a: float) -> dict[str, float]:
    x, s = _rule(act, a)
    u = _sigma(act, a, x) * s  # σ(αx)·√(wφ)
    mean = float(u @ s)
    v = u - mean * s  # two passes: no cancellation in E σ² − (E σ)² at small gains
    return {
        "mean": mean,  # E σ(αX) = c₀
        "mean_square": float(u @ u),  # E σ(αX)²
        "mean_x_sigma": float(u @ (x * s)),  # E X σ(αX) = c₁
        "variance": float(v @ v),  # Σ_{k≥1} cₖ² = σ̄(1)
    }


@lru_cache(maxsize=1024)
def _moments_cached(name: str, a: float) -> dict[str, float]:
    return _moments(ACTIVATIONS[name], a)


@lru_cache(maxsize=1024)
def _coefficients_cached(name: str, a: float, K: int) -> np.ndarray:
    return _coefficients(ACTIVATIONS[name], a, K)


def _get_moments(act: Activation, a: float) -> dict[str, float]:
    m = _moments_cached(act.name, a) if ACTIVATIONS.get(act.name) is act else _moments(act, a)
    if not m["variance"] > 0:
        raise InvalidInput(f"{act.name}(α·x) is constant under N(0, 1)", field="activation")
    return dict(m)


# ------------------------------------------------------------------------------ 2-D quadrature


def _angle_cuts(act: Activation, a: float, theta: float, b: float | None = None) -> np.ndarray:
    """Angles ψ ∈ [−π, π] where the integrand of the polar rule is not analytic.

    X = r cos ψ has its kink lines' direction at ψ = ±π/2, Y = r cos(ψ − θ) at θ ± π/2 (for a kink
    at 0 these rays are the kink itself); two kink lines X = t/α, Y = t'/β meet at one point, whose
    direction is a cut as well. β = b is the gain of Y (default α).
    """
    cuts = [-np.pi, np.pi, np.pi / 2, -np.pi / 2, theta + np.pi / 2, theta - np.pi / 2]
    ks, ky = _kinks(act, a), _kinks(act, a if b is None else b)
    s, c = np.sin(theta), np.cos(theta)
    for bx in ks:
        for by in ky:
            if bx != 0 or by != 0:  # U = bx, V = (by − ρ·bx)/sin θ
                cuts.append(math.atan2((by - c * bx) / s, bx))
    wrapped = (np.asarray(cuts) + np.pi) % (2 * np.pi) - np.pi
    return np.unique(np.concatenate([wrapped, [-np.pi, np.pi]]))


def _radial_rule(
    act: Activation,
    a: float,
    psi: np.ndarray,
    theta: float,
    R: float,
    h: float,
    b: float | None = None,
):
    """Radial nodes r (A, M) and weights (A, M) on [0, R] for each angle, split at the kinks
    (of σ(αX) and of σ(βY), β = b, default α)."""
    ks, ky = _kinks(act, a), _kinks(act, a if b is None else b)
    ks, ky = ks[ks != 0], ky[ky != 0]
    with np.errstate(divide="ignore"):
        cross = np.concatenate(  # where each ray meets X = t/α and Y = t/β, (A, 2·#kinks)
            [ks / np.cos(psi)[:, None], ky / np.cos(psi - theta)[:, None]], axis=1
        )
    cross = np.where((cross > 0) & (cross < R), cross, R)
    zero, end = np.zeros((psi.size, 1)), np.full((psi.size, 1), R)
    edges = np.sort(np.concatenate([zero, cross, end], axis=1), axis=1)  # (A, S+1)
    P = math.ceil(R / h)  # panels per segment (each segment ≤ R long)
    lo, hi = edges[:, :-1, None, None], edges[:, 1:, None, None]  # (A, S, 1, 1)
    step = (hi - lo) / P
    j = np.arange(P)[:, None]  # (P, 1)
    r = lo + step * (j + (_GL_T + 1.0) / 2.0)  # (A, S, P, Q)
    w = np.broadcast_to(step / 2.0 * _GL_W, r.shape)
    return r.reshape(psi.size, -1), w.reshape(psi.size, -1)


def _dual_direct(
    act: Activation,
    a: float,
    mean: float,
    theta: float,
    R: float,
    b: float | None = None,
    mean_b: float | None = None,
) -> float:
    """σ̄(cos θ) = E[(σ(αX) − m)(σ(αY) − m)], corr(X, Y) = cos θ, θ ∈ (0, π), over r ≤ R.

    Polar coordinates of (U, V) iid N(0, 1): X = U = r cos ψ, Y = ρU + √(1−ρ²)V = r cos(ψ − θ),
    and E f = (1/2π) ∫dψ ∫ r e^{−r²/2} f dr. With b (and mean_b = E σ(bY)), Y's factor is
    σ(bY) − mean_b instead: the cross-gain dual of the first mean-field layer (inputs of
    different norms); R must then cover both gains.
    """
    if b is None:
        b, mean_b = a, mean
    top = max(a, b)
    h = min(_HR, _HR * 2.0 / top)
    # A kink off 0 crosses each ray at r = b/cos ψ, which leaves through r = ∞ at ψ = ±π/2: the
    # angular integrand is smooth but not analytic there (e^{−b²/2cos²ψ}); 3× finer panels keep
    # 1e-15 (measured on max(x − ½, 0), clip(x, −1, 1), clip(x/4 + ½, 0, 1)).
    ha = _HA if not np.any(_kinks(act, a)) else _HA / 3
    psi, wpsi = _composite_cuts(_angle_cuts(act, a, theta, b), min(ha, ha * 2.0 / (top * R)))
    r, wr = _radial_rule(act, a, psi, theta, R, h, b)  # (A, M)
    g = np.exp(-(r**2) / 4)  # split the Gaussian between the factors: e^{αx} may be huge
    fx = (_sigma(act, a, r * np.cos(psi)[:, None]) - mean) * g  # (A, M)
    fy = (_sigma(act, b, r * np.cos(psi - theta)[:, None]) - mean_b) * g
    radial = (wr * r * fx * fy).sum(axis=1)  # (A,)
    return float(radial @ wpsi) / (2 * np.pi)


def _polar_radius(act: Activation, a: float) -> float:
    return _radius(act, a) * 1.05  # a little beyond 1-D: |σ(αX)σ(αY)| reaches the corner


def _composite_cuts(cuts: np.ndarray, h: float) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss–Legendre on each [cuts[i], cuts[i+1]], panels at most h wide."""
    edges = [
        np.linspace(lo, hi, math.ceil((hi - lo) / h) + 1) for lo, hi in itertools.pairwise(cuts)
    ]
    e = np.unique(np.concatenate(edges))
    return _composite(e[np.concatenate([[True], np.diff(e) > 1e-15])])
