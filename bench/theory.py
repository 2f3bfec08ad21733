"""Benchmark of service/theory/: β of every registered activation from a cold cache, against a
plain 200-point Gauss–Hermite estimate measured in the same process, and the accuracy of both
against the closed forms (Joudaki et al. 2023, Table 5.1) or, where there is none, an adaptive
scipy.integrate.quad reference split at the kinks.

Run: .venv/bin/python bench/theory.py
"""

from __future__ import annotations

import itertools
import math
import time
import warnings

import numpy as np
from scipy import integrate

from service import theory
from service.activations import ACTIVATION_NAMES, ACTIVATIONS, LEAKY_SLOPE

S = LEAKY_SLOPE
CLOSED = {
    "identity": 1.0,
    "relu": (3 * math.pi - 4) / (2 * math.pi - 2),
    "leaky_relu": 2 - (1 + S) ** 2 / 4 / ((1 + S * S) / 2 - (1 - S) ** 2 / (2 * math.pi)),
    "sin": 2 - 2 * math.e / (math.e**2 - 1),
    "exp": 2 - 1 / (math.e - 1),
    "step": 2 - 2 / math.pi,
}


def quad_beta(name: str) -> float:
    """β by adaptive quadrature (scipy QUADPACK), split at the breakpoints: the slow reference."""
    f = ACTIVATIONS[name].numpy
    phi = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cuts = sorted({-40.0, 40.0, *ACTIVATIONS[name].breakpoints})

    def E(g):
        return sum(
            integrate.quad(lambda x: g(x) * phi(x), lo, hi, epsabs=1e-15, epsrel=1e-14, limit=200)[
                0
            ]
            for lo, hi in itertools.pairwise(cuts)
        )

    m = E(lambda x: float(f(np.float64(x))))
    var = E(lambda x: (float(f(np.float64(x))) - m) ** 2)
    c1 = E(lambda x: x * float(f(np.float64(x))))
    return 2 - c1 * c1 / var


def gauss_hermite_betas(x: np.ndarray, w: np.ndarray) -> dict[str, float]:
    out = {}
    for name in ACTIVATION_NAMES:
        s = ACTIVATIONS[name].numpy(x)
        m = w @ s
        out[name] = 2 - (w @ (x * s)) ** 2 / (w @ (s - m) ** 2)
    return out


def cold_betas() -> dict[str, float]:
    theory.clear_caches()
    return {name: theory.isometry_strength(name) for name in ACTIVATION_NAMES}


def best_of(fn, repeat: int = 7) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), result


def main() -> None:
    # QUADPACK flags roundoff at the 1e-15 tolerance we ask of it; the reference is still 1e-15
    warnings.filterwarnings("ignore", category=integrate.IntegrationWarning)
    x, w = np.polynomial.hermite_e.hermegauss(200)
    w = w / w.sum()
    t_gh, gh = best_of(lambda: gauss_hermite_betas(x, w))
    t_ours, ours = best_of(cold_betas)
    n = len(ACTIVATION_NAMES)
    print(f"β of all {n} registered activations, cold cache: {t_ours * 1e3:.1f} ms")
    print(f"plain 200-point Gauss–Hermite, same activations:  {t_gh * 1e3:.1f} ms")
    print(f"ratio (isosweep / Gauss–Hermite baseline): {t_ours / t_gh:.1f}x")
    print()
    print(
        f"{'activation':12s} {'β (isosweep)':>18s} {'reference':>10s} {'|err| isosweep':>15s} "
        f"{'|err| GH-200':>13s}"
    )
    for name in ACTIVATION_NAMES:
        kind, ref = ("closed", CLOSED[name]) if name in CLOSED else ("quad", quad_beta(name))
        print(
            f"{name:12s} {ours[name]:18.15f} {kind:>10s} {abs(ours[name] - ref):15.1e} "
            f"{abs(gh[name] - ref):13.1e}"
        )
    print()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100, 3)) @ rng.standard_normal((3, 200))
    G = theory.cosine_gram(X + 0.3 * rng.standard_normal((100, 200)))
    for p in (0.0, 0.4):
        theory.clear_caches()
        t = time.perf_counter()
        theory.mean_field_gaps("tanh", 1000, G, gain_exponent=p)
        print(
            f"mean-field gaps, tanh, depth 1000, n = 100, p = {p}: {time.perf_counter() - t:.2f} s"
        )


if __name__ == "__main__":
    main()
