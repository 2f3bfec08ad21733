"""Benchmark of the mean-field first block from the real input (service.theory.firstlayer): the
prediction with per-sample variances against the unit-variance one and against the same series
built from one 1-D rule per gain (the baseline the shared rule replaced), all in this process,
with the error against exp's closed form (Mehler: e^{(a²+b²)/2}(e^{abρ} − 1)).

Run: .venv/bin/python bench/meanfield_inputs.py
"""

from __future__ import annotations

import time

import numpy as np

from service import theory
from service.theory import firstlayer


def per_gain_expansions(act, gam, K):
    """The baseline: a 1-D rule, Hermite functions and moments for every gain."""
    from service.theory.quadrature import _coefficients, _get_moments

    C = np.array([_coefficients(act, float(g), K) for g in gam])
    m = [_get_moments(act, float(g)) for g in gam]
    return C, np.array([x["mean"] for x in m]), np.array([x["variance"] for x in m])


def timed(f, repeat=3):
    best = np.inf
    for _ in range(repeat):
        theory.clear_caches()
        t = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t)
    return best, out


def bench_one(name: str, G: np.ndarray, m: np.ndarray) -> str:
    def predict(variances):
        return lambda: theory.mean_field_grams(name, 1, G, input_variances=variances)[0]

    t_new, got = timed(predict(m))
    t_unit, _ = timed(predict(None))
    shared = firstlayer._expansions
    firstlayer._expansions = per_gain_expansions
    try:
        t_old, base = timed(predict(m))
    finally:
        firstlayer._expansions = shared
    line = f"{name:5s} n={len(m)}: {t_new * 1e3:7.1f} ms; per-gain rules {t_old * 1e3:7.1f} ms"
    line += f" (ratio {t_old / t_new:.1f}); unit variance {t_unit * 1e3:6.1f} ms"
    line += f"; |shared − per-gain| {np.abs(got - base).max():.1e}"
    if name == "exp":
        g = np.sqrt(m)
        D = np.exp((g[:, None] ** 2 + g[None, :] ** 2) / 2) * np.expm1(np.outer(g, g) * G)
        d = np.sqrt(np.diag(D))
        line += f"; error vs closed form {np.abs(got - D / np.outer(d, d)).max():.1e}"
    return line


def main() -> None:
    rng = np.random.default_rng(0)
    n = 100
    X = rng.standard_normal((n, 64)) * np.sqrt(np.geomspace(0.34, 18, n))[:, None]  # digits' span
    G, m = theory.cosine_gram(X), (X**2).mean(axis=1)
    for name in ("exp", "tanh", "selu"):
        print(bench_one(name, G, m))


if __name__ == "__main__":
    main()
