"""κ for the mean-field recursion: an adaptive Chebyshev interpolant of θ ↦ σ̄(cos θ), and its
interpolation across layer gains (see service.theory)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.fft import dct

from service.activations import ACTIVATIONS, Activation
from service.theory.quadrature import (
    _dual_direct,
    _get_moments,
    _polar_radius,
    _rule,
    _sigma,
)

KAPPA_TOL = 1e-11  # relative accuracy the κ interpolant is built to


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
        merged: list[_KappaMap] = [maps[0]] * (2 * m + 1)  # every slot is set next
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


def _kappa_maps(act: Activation, gains: np.ndarray) -> Callable[[float], _KappaMap]:
    """α ↦ κ_α for the recursion: a map per distinct gain, or a gain family if there are many."""
    distinct = np.unique(gains)
    if act.homogeneous or distinct.size <= _FAMILY_MIN:
        maps = {float(a): _kappa_map(act, float(a)) for a in distinct}
        return lambda a: maps[float(a)]
    return _gain_family(act, float(distinct[0]), float(distinct[-1]))
