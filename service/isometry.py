"""The isometry gap of a sample Gram matrix: the reference (numpy, float64) definition.

Joudaki, Daneshmand, Bach (NeurIPS 2023), Sec. 3: for a PSD Gram G (n × n) with eigenvalues λ,

    I(G)   = det(G)^(1/n) / (tr(G)/n)          geometric over arithmetic mean of λ
    gap(G) = −log I(G) = log(mean λ) − mean(log λ)

Scale invariant, gap ∈ [0, ∞], 0 iff G ∝ identity, ∞ iff G is singular. The workers' batched
torch version is tested against the same mathematics; the theory and the plots use this one.
"""

from __future__ import annotations

import numpy as np

# A Gram is singular when λ_min ≤ n·ε·λ_max (ε = float64 machine epsilon): the rank tolerance of
# numpy.linalg.matrix_rank. Below it, eigvalsh cannot tell λ_min from rounding error (it returns
# tiny values of either sign for an exactly singular G), so the honest gap is +∞.
EPS = np.finfo(np.float64).eps


def gram_of(H: np.ndarray) -> np.ndarray:
    """Sample Gram H Hᵀ in float64: rows of H (n, d) are samples; stacks (..., n, d) work too."""
    H = np.asarray(H, dtype=np.float64)
    if H.ndim < 2:
        raise ValueError(f"gram_of needs an (n, d) matrix or a stack of them, got shape {H.shape}")
    return H @ np.swapaxes(H, -1, -2)  # (..., n, n)


def isometry_gap(gram: np.ndarray, *, rtol: float | None = None) -> float | np.ndarray:
    """gap(G) = log(mean λ) − mean(log λ) of one (n, n) Gram (→ float) or a stack (→ array).

    Singular Grams (λ_min ≤ rtol·λ_max, rtol = n·ε by default; G = 0 included) give +inf, never
    NaN or a finite value. A caller that knows how G was formed may pass a larger rtol (e.g. the
    resolution of a float32 H). A Gram with NaN or ±inf entries gives NaN: nothing to measure.
    """
    G = np.asarray(gram, dtype=np.float64)
    if G.ndim < 2 or G.shape[-1] != G.shape[-2]:
        raise ValueError(f"isometry_gap needs square (..., n, n) Grams, got shape {G.shape}")
    n = G.shape[-1]
    stack = G.reshape(-1, n, n)  # (m, n, n)
    finite = np.isfinite(stack).all(axis=(1, 2))
    lam = np.ones((stack.shape[0], n))  # placeholder eigenvalues for the non-finite ones
    if finite.any():
        lam[finite] = np.linalg.eigvalsh(stack[finite])  # ascending, (m, n)
    lam_max = lam[:, -1]
    singular = lam[:, 0] <= (n * EPS if rtol is None else rtol) * lam_max
    singular |= lam_max <= 0  # the zero matrix (and anything not PSD at all)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = lam.mean(axis=1, keepdims=True)
        # −mean(log(λ/mean λ)) rather than log(mean) − mean(log): exact cancellation near isometry
        gap = -np.log(lam / mean).mean(axis=1)
    gap = np.where(singular, np.inf, np.maximum(gap, 0.0))  # AM ≥ GM: clip rounding below 0
    gap = np.where(finite, gap, np.nan).reshape(G.shape[:-2])
    return float(gap) if gap.ndim == 0 else gap


def isometry(gram: np.ndarray, *, rtol: float | None = None) -> float | np.ndarray:
    """I(G) = exp(−gap(G)) ∈ [0, 1]: 1 for G ∝ identity, 0 for a singular G."""
    gap = isometry_gap(gram, rtol=rtol)
    return float(np.exp(-gap)) if np.ndim(gap) == 0 else np.exp(-gap)
