"""What the theory predicts: Hermite coefficients, isometry strength β, the dual activation κ and
the mean-field Gram recursion of a LayerNorm MLP. numpy + scipy only.

References (see ../shared/SCIENCE.md): Joudaki, Daneshmand, Bach, "On the impact of activation and
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

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.fft import dct

from service.activations import ACTIVATION_NAMES, ACTIVATIONS, Activation, get_activation
from service.errors import InvalidInput, LimitExceeded
from service.isometry import isometry_gap

GAIN_MAX = 10.0  # coefficients and β (1-D); exp(αx) nears float64 overflow soon after
DUAL_GAIN_MAX = 5.0  # σ̄, κ, mean field (2-D): the polar rule needs ~α² points per ρ
TERMS_MAX = 200
DEPTH_MAX = 100_000
GRAM_CELLS_MAX = 25_000_000  # depth·n² of a stacked (depth, n, n) answer: 200 MB of float64
STAGES = ("linear", "act", "norm")  # which sub-layer's Gram the recursion reports, per block
KAPPA_TOL = 1e-11  # relative accuracy the κ interpolant is built to

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


def _angle_cuts(act: Activation, a: float, theta: float) -> np.ndarray:
    """Angles ψ ∈ [−π, π] where the integrand of the polar rule is not analytic.

    X = r cos ψ has its kink lines' direction at ψ = ±π/2, Y = r cos(ψ − θ) at θ ± π/2 (for a kink
    at 0 these rays are the kink itself); two kink lines X = b/α, Y = b'/α meet at one point, whose
    direction is a cut as well.
    """
    cuts = [-np.pi, np.pi, np.pi / 2, -np.pi / 2, theta + np.pi / 2, theta - np.pi / 2]
    ks = _kinks(act, a)
    s, c = np.sin(theta), np.cos(theta)
    for bx in ks:
        for by in ks:
            if bx != 0 or by != 0:  # U = bx, V = (by − ρ·bx)/sin θ
                cuts.append(math.atan2((by - c * bx) / s, bx))
    cuts = (np.asarray(cuts) + np.pi) % (2 * np.pi) - np.pi
    return np.unique(np.concatenate([cuts, [-np.pi, np.pi]]))


def _radial_rule(act: Activation, a: float, psi: np.ndarray, theta: float, R: float, h: float):
    """Radial nodes r (A, M) and weights (A, M) on [0, R] for each angle, split at the kinks."""
    ks = _kinks(act, a)
    ks = ks[ks != 0]
    with np.errstate(divide="ignore"):
        cross = np.concatenate(  # where each ray meets X = b/α and Y = b/α, (A, 2·#kinks)
            [ks / np.cos(psi)[:, None], ks / np.cos(psi - theta)[:, None]], axis=1
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


def _dual_direct(act: Activation, a: float, mean: float, theta: float, R: float) -> float:
    """σ̄(cos θ) = E[(σ(αX) − m)(σ(αY) − m)], corr(X, Y) = cos θ, θ ∈ (0, π), over r ≤ R.

    Polar coordinates of (U, V) iid N(0, 1): X = U = r cos ψ, Y = ρU + √(1−ρ²)V = r cos(ψ − θ),
    and E f = (1/2π) ∫dψ ∫ r e^{−r²/2} f dr.
    """
    h = min(_HR, _HR * 2.0 / a)
    # A kink off 0 crosses each ray at r = b/cos ψ, which leaves through r = ∞ at ψ = ±π/2: the
    # angular integrand is smooth but not analytic there (e^{−b²/2cos²ψ}); 3× finer panels keep
    # 1e-15 (measured on max(x − ½, 0), clip(x, −1, 1), clip(x/4 + ½, 0, 1)).
    ha = _HA if not np.any(_kinks(act, a)) else _HA / 3
    psi, wpsi = _composite_cuts(_angle_cuts(act, a, theta), min(ha, ha * 2.0 / (a * R)))
    r, wr = _radial_rule(act, a, psi, theta, R, h)  # (A, M)
    g = np.exp(-(r**2) / 4)  # split the Gaussian between the factors: e^{αx} may be huge
    fx = (_sigma(act, a, r * np.cos(psi)[:, None]) - mean) * g  # (A, M)
    fy = (_sigma(act, a, r * np.cos(psi - theta)[:, None]) - mean) * g
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


# ------------------------------------------------------------------- κ: a Chebyshev interpolant


@dataclass(frozen=True)
class _KappaMap:
    """θ ↦ κ(cos θ) as a Chebyshev series in t = 2θ/π − 1 (θ ∈ [0, π], ρ = cos θ).

    In θ rather than ρ because the dual of a kinked σ has √(1−ρ²)-type terms at ρ = ±1 that are
    analytic in θ (relu: sin θ + (π − θ) cos θ; step: π/2 − θ).
    """

    coef: np.ndarray  # (N+1,)
    at_minus_one: float  # κ(−1)
    offset: float  # c₀²/σ̄(1): the uncentered (act) Gram is (offset + κ)/(offset + 1)
    err: float = 0.0  # estimated max error of κ at the last refinement

    def __call__(self, rho: np.ndarray) -> np.ndarray:
        rho = np.clip(rho, -1.0, 1.0)
        k = np.polynomial.chebyshev.chebval(2.0 * np.arccos(rho) / np.pi - 1.0, self.coef)
        return np.where(rho == 1.0, 1.0, np.where(rho == -1.0, self.at_minus_one, k))


def _lobatto_coef(v: np.ndarray) -> np.ndarray:
    """Chebyshev coefficients of the interpolant through v at t_j = cos(πj/N), j = 0..N."""
    N = v.size - 1
    c = dct(v, type=1) / N
    c[0] /= 2
    c[-1] /= 2
    return c


def _dual_at_ends(act: Activation, a: float, mean: float) -> tuple[float, float]:
    """σ̄(1) and σ̄(−1) = E[(σ(αX) − m)(σ(−αX) − m)] by the 1-D rule."""
    x, s = _rule(act, a)
    u = (_sigma(act, a, x) - mean) * s
    return float(u @ u), float(u @ ((_sigma(act, a, -x) - mean) * s))


def _build_kappa_map(act: Activation, a: float, n_max: int = 256) -> _KappaMap:
    """Refine n = 16, 32, … Lobatto points (nested: each step adds the odd ones) until the n-point
    interpolant predicts the new points' direct values to KAPPA_TOL·σ̄(1)."""
    mean = _get_moments(act, a)["mean"]
    one, minus_one = _dual_at_ends(act, a, mean)
    R = _polar_radius(act, a)

    def direct(j: np.ndarray, n: int) -> np.ndarray:
        theta = np.pi * (1.0 + np.cos(np.pi * j / n)) / 2.0  # t = cos(πj/n); t = 1 is θ = π
        return np.array([_dual_direct(act, a, mean, th, R) for th in theta])

    n = 16
    v = np.concatenate([[minus_one], direct(np.arange(1, n), n), [one]])
    while True:
        odd = np.arange(1, 2 * n, 2)
        new = direct(odd, 2 * n)
        guess = np.polynomial.chebyshev.chebval(np.cos(np.pi * odd / (2 * n)), _lobatto_coef(v))
        err = float(np.abs(guess - new).max())
        v2 = np.empty(2 * n + 1)
        v2[0::2], v2[1::2] = v, new
        v, n = v2, 2 * n
        if err <= KAPPA_TOL * one or n >= n_max:
            return _KappaMap(_lobatto_coef(v) / one, minus_one / one, mean**2 / one, err / one)


@lru_cache(maxsize=4096)
def _kappa_map_cached(name: str, a: float) -> _KappaMap:
    return _build_kappa_map(ACTIVATIONS[name], a)


def _kappa_map(act: Activation, a: float) -> _KappaMap:
    if ACTIVATIONS.get(act.name) is not act:
        return _build_kappa_map(act, a)
    return _kappa_map_cached(act.name, 1.0 if act.homogeneous else a)


def _barycentric(nodes: np.ndarray, values: np.ndarray, x: float) -> np.ndarray:
    """Interpolate values (m+1, V) given at Chebyshev–Lobatto nodes cos(πj/m) to x ∈ [−1, 1]."""
    hit = np.flatnonzero(nodes == x)
    if hit.size:
        return values[hit[0]]
    w = (-1.0) ** np.arange(nodes.size)
    w[0] /= 2
    w[-1] /= 2
    c = w / (x - nodes)
    return c @ values / c.sum()


def _pack(maps: list[_KappaMap]) -> np.ndarray:
    """(len, N+3): coefficients padded to one length, then κ(−1) and the offset."""
    n = max(m.coef.size for m in maps)
    return np.array(
        [
            np.concatenate([m.coef, np.zeros(n - m.coef.size), [m.at_minus_one, m.offset]])
            for m in maps
        ]
    )


def _gain_family(act: Activation, lo: float, hi: float, m_max: int = 64):
    """α ↦ κ_α for every α in [lo, hi]: maps built at Chebyshev–Lobatto nodes in log α and
    interpolated between them (κ is smooth in α), refined m = 8, 16, … until the m-node
    interpolant predicts the new nodes' maps to 10·KAPPA_TOL in the ℓ¹ norm of their coefficients
    (which bounds the error of κ, |Tₖ| ≤ 1). Deep shaped networks (α_ℓ = α·ℓ^(−p)) need a few
    dozen maps instead of one per layer."""
    ulo, uhi = math.log(lo), math.log(hi)

    def build(j: np.ndarray, m: int) -> list[_KappaMap]:
        u = (ulo + uhi) / 2 + (uhi - ulo) / 2 * np.cos(np.pi * j / m)
        return [_kappa_map(act, float(math.exp(v))) for v in u]

    m = 8
    maps = build(np.arange(m + 1), m)
    while True:
        odd = np.arange(1, 2 * m, 2)
        new = build(odd, 2 * m)
        V = _pack(maps + new)
        old_v, new_v = V[: m + 1], V[m + 1 :]
        nodes = np.cos(np.pi * np.arange(m + 1) / m)
        pred = np.array([_barycentric(nodes, old_v, x) for x in np.cos(np.pi * odd / (2 * m))])
        err = float(np.abs(pred - new_v).sum(axis=1).max())
        merged = [None] * (2 * m + 1)
        merged[0::2], merged[1::2] = maps, new
        maps, m = merged, 2 * m
        if err <= 10 * KAPPA_TOL or m >= m_max:
            break
    V, nodes = _pack(maps), np.cos(np.pi * np.arange(m + 1) / m)

    def at(a: float) -> _KappaMap:
        x = np.clip((2 * math.log(a) - ulo - uhi) / (uhi - ulo), -1.0, 1.0)
        v = _barycentric(nodes, V, x)
        return _KappaMap(v[:-2], float(v[-2]), float(v[-1]))

    return at


_FAMILY_MIN = 48  # more distinct layer gains than this: interpolate κ in the gain


def _kappa_maps(act: Activation, gains: np.ndarray):
    """α ↦ κ_α for the recursion: a map per distinct gain, or a gain family if there are many."""
    distinct = np.unique(gains)
    if act.homogeneous or distinct.size <= _FAMILY_MIN:
        maps = {float(a): _kappa_map(act, float(a)) for a in distinct}
        return lambda a: maps[float(a)]
    return _gain_family(act, float(distinct[0]), float(distinct[-1]))


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


# ----------------------------------------------------------------------- mean-field Gram recursion


def cosine_gram(inputs: np.ndarray) -> np.ndarray:
    """The cosine Gram (unit diagonal) of a batch of inputs (n, d): the recursion's start."""
    X = np.asarray(inputs, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 1 or not np.isfinite(X).all():
        raise InvalidInput(f"need a finite (n, d) batch, got shape {X.shape}", field="inputs")
    norms = np.linalg.norm(X, axis=1)
    if not (norms > 0).all():
        raise InvalidInput("a sample is all zeros: its direction is undefined", field="inputs")
    U = X / norms[:, None]
    return unit_gram(U @ U.T)


def unit_gram(gram: np.ndarray) -> np.ndarray:
    """Validate a Gram and rescale it to unit diagonal (a cosine Gram), the recursion's start.

    Raises:
        InvalidInput (field "input_gram"): not square, not finite, not symmetric, a diagonal entry
            ≤ 0, or not positive semi-definite.
    """
    G = np.asarray(gram, dtype=np.float64)
    if G.ndim != 2 or G.shape[0] != G.shape[1] or G.shape[0] < 1:
        raise InvalidInput(
            f"must be a square (n, n) matrix, got shape {G.shape}", field="input_gram"
        )
    if not np.isfinite(G).all():
        raise InvalidInput("has NaN or infinite entries", field="input_gram")
    scale = np.abs(G).max()
    if np.abs(G - G.T).max() > 1e-8 * scale:
        raise InvalidInput("is not symmetric", field="input_gram")
    d = np.diag(G)
    if not (d > 0).all():
        raise InvalidInput("needs a positive diagonal (an all-zero input?)", field="input_gram")
    C = G / np.sqrt(np.outer(d, d))
    C = (C + C.T) / 2
    lam_min = np.linalg.eigvalsh(C)[0]
    if lam_min < -1e-8 * C.shape[0]:
        raise InvalidInput(
            f"is not positive semi-definite (smallest eigenvalue {lam_min:.3g})", field="input_gram"
        )
    C = np.clip(C, -1.0, 1.0)
    np.fill_diagonal(C, 1.0)
    return C


def layer_gains(gain: float, gain_exponent: float, depth: int) -> np.ndarray:
    """α_ℓ = gain·ℓ^(−p), ℓ = 1..depth (Meterez et al. 2024, activation shaping)."""
    a, L = _check_gain(gain), _check_int(depth, "depth", 1, DEPTH_MAX)
    try:
        p = float(gain_exponent)
    except (TypeError, ValueError):
        p = math.nan
    if not (math.isfinite(p) and p >= 0):
        raise InvalidInput(f"must be finite and ≥ 0, got {gain_exponent!r}", field="gain_exponent")
    return a * np.arange(1, L + 1, dtype=np.float64) ** (-p)


def _iterate_grams(
    activation: str | Activation,
    depth: int,
    input_gram: np.ndarray,
    gain: float,
    gain_exponent: float,
    stage: str,
    centered: bool,
) -> Iterator[np.ndarray]:
    """Yield the predicted (n, n) Gram of `stage` in block ℓ = 1..depth.

    Mean field (Joudaki et al. 2023, Eq. 10 and App. A.2): with weights N(0, 1/fan_in), block ℓ's
    pre-activations are Gaussian with covariance G_{ℓ−1} (a cosine Gram), so its centered and
    normalized output has Gram G_ℓ = κ_{α_ℓ}(G_{ℓ−1}) entrywise. "linear" is G_{ℓ−1}, "norm" is
    G_ℓ, "act" is the uncentered (c₀² + σ̄(G_{ℓ−1}))/(c₀² + σ̄(1)) — which is also G_ℓ when the
    norm only scales (centered=False: the `layer_scale` variant).
    """
    act = _resolve(activation)
    L = _check_int(depth, "depth", 1, DEPTH_MAX)
    a = _check_dual_gain(gain)
    if stage not in STAGES:
        raise InvalidInput(f"unknown stage {stage!r}", field="stage", allowed=STAGES)
    G = unit_gram(input_gram)
    gains = layer_gains(a, gain_exponent, L)
    kappa_at = _kappa_maps(act, gains)
    for a_l in gains:
        f = kappa_at(a_l)
        K = f(G)  # (n, n) κ(G)
        U = (f.offset + K) / (f.offset + 1.0)  # uncentered: E[σσ]/E[σ²]
        if stage == "linear":
            yield G
        elif stage == "act":
            yield U
        G = K if centered else U
        np.fill_diagonal(G, 1.0)  # κ(1) = 1 exactly
        if stage == "norm":
            yield G


def mean_field_grams(
    activation: str | Activation,
    depth: int,
    input_gram: np.ndarray,
    *,
    gain: float = 1.0,
    gain_exponent: float = 0.0,
    stage: str = "norm",
    centered: bool = True,
) -> np.ndarray:
    """Predicted Grams (depth, n, n) of a LayerNorm MLP (Linear → σ(α_ℓ·) → center → normalize)
    in the infinite-width limit, index 0 ↔ block ℓ = 1, from the probe batch's input Gram
    (rescaled to unit diagonal, as the engine records it). `stage` picks the sub-layer ("linear",
    "act", "norm"); centered=False drops the centering (scale-only norm). See `_iterate_grams`.

    Assumes the first block's inputs have equal norms (only their directions enter; exact for
    homogeneous σ) and unit pre-activation variance: with init N(0, g²/fan_in) pass gain = α·g.

    Raises:
        InvalidInput: bad activation, depth, gain (≤ DUAL_GAIN_MAX), gain_exponent, stage, or an
            input Gram that is not a finite symmetric PSD matrix with positive diagonal.
        LimitExceeded: depth·n² over GRAM_CELLS_MAX (use mean_field_gaps).
    """
    n = np.shape(input_gram)[0] if np.ndim(input_gram) == 2 else 0
    if isinstance(depth, int) and depth * n * n > GRAM_CELLS_MAX:
        raise LimitExceeded(
            f"depth·n² = {depth * n * n} exceeds {GRAM_CELLS_MAX}; mean_field_gaps needs no stack",
            field="depth",
        )
    grams = _iterate_grams(activation, depth, input_gram, gain, gain_exponent, stage, centered)
    return np.stack(list(grams))


def mean_field_gaps(
    activation: str | Activation,
    depth: int,
    input_gram: np.ndarray,
    *,
    gain: float = 1.0,
    gain_exponent: float = 0.0,
    stage: str = "norm",
    centered: bool = True,
) -> np.ndarray:
    """Predicted isometry gaps (depth,) of `mean_field_grams`, without holding the stack.

    Near isometry the per-block gap ratio tends to κ′(0)² = (2 − β)² (Joudaki et al. 2023,
    Theorem 5.1); a singular Gram reads +inf.
    """
    grams = _iterate_grams(activation, depth, input_gram, gain, gain_exponent, stage, centered)
    return np.array([isometry_gap(G) for G in grams])


# --------------------------------------------------------------------------------- summaries


def activation_summary(
    name: str | Activation, gain: float = 1.0, terms: int = 20
) -> dict[str, object]:
    """JSON-ready facts about σ(gain·x): what the API and `isosweep theory` return."""
    act, a = _resolve(name), _check_gain(gain)
    m = moments(act, a)
    return {
        "name": act.name,
        "gain": a,
        "formula": act.formula,
        "params": dict(act.params),
        "breakpoints": list(act.breakpoints),
        "homogeneous": act.homogeneous,
        "coefficients": hermite_coefficients(act, a, terms).tolist(),
        "beta": 2.0 - m["mean_x_sigma"] ** 2 / m["variance"],
        "kappa_prime0": m["mean_x_sigma"] ** 2 / m["variance"],
        "moments": m,
    }


def registry_summary(gain: float = 1.0, terms: int = 20) -> list[dict[str, object]]:
    """`activation_summary` of every registered activation, in registry order."""
    return [activation_summary(name, gain, terms) for name in ACTIVATION_NAMES]
