"""The isometry gap: the project's one definition (numpy, float64).

Joudaki, Daneshmand, Bach (NeurIPS 2023), Sec. 3: for a PSD Gram G (n × n) with eigenvalues λ,

    I(G)   = det(G)^(1/n) / (tr(G)/n)          geometric over arithmetic mean of λ
    gap(G) = −log I(G) = log(mean λ) − mean(log λ)

Scale invariant, gap ∈ [0, ∞], 0 iff G ∝ identity, ∞ iff G is singular.

Whether G is singular is not read off the size of λ_min: rounding leaves an exactly singular
Gram of a float32 representation with λ_min/λ_max ~ 1e-15 and a regular one can sit far below
that (a square Gaussian layer divides λ_min/λ_max by ~e² per layer). So the definition takes an
explicit *structural null dimension* k — how many eigenvalues are zero by construction (n > d, a
centring normalization; workers/structure.py derives k from the network) — and

    gap       = +∞ if k > 0 or some λ ≤ 0 (exactly zero), else log(mean λ) − mean(log λ);
    range gap = the gap of the n − k largest eigenvalues (G on the complement of its structural
                null space; equal to the gap when k = 0).

`gap_from_eigenvalues` / `gap_from_singular_values` are the definition; `gap_of_features` is the
reference computation from a representation H (float64 singular values, λ = σ², no Gram formed);
`isometry_gap(gram)` serves Grams given as numbers (the mean-field theory), whose k is their
numerical rank deficiency at float64 resolution. workers/gaps.py computes the same formula
batched in torch (with a bound on each gap's error) and is tested against these functions on the
same inputs.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from service.errors import InvalidInput

# For a Gram given as numbers (nothing known about how it was formed) an eigenvalue ≤ n·ε·λ_max
# (ε = float64 machine epsilon) cannot be told from 0: the rank tolerance of
# numpy.linalg.matrix_rank. This applies to Grams that are the data (theory); measured
# representations get their null dimension from the network's structure instead.
EPS = np.finfo(np.float64).eps


def gap_from_eigenvalues(lam: np.ndarray, null_dim: int = 0) -> float | np.ndarray:
    """The range gap of eigenvalues lam (..., n), any order: log(mean λ) − mean(log λ) over the
    n − null_dim largest (→ float for one Gram, else an array of the leading shape).

    An exactly zero (or negative) eigenvalue among those kept gives +∞; a non-finite one NaN;
    rounding below 0 is clipped (AM ≥ GM). null_dim ≥ n gives +∞ (nothing left, or G = 0).
    """
    lam = np.asarray(lam, dtype=np.float64)
    n = lam.shape[-1]
    if not 0 <= null_dim <= n:
        raise ValueError(f"null_dim must be in 0..{n}, got {null_dim}")
    flat = lam.reshape(-1, n)
    finite = np.isfinite(flat).all(axis=1)
    kept = -np.sort(-np.where(finite[:, None], flat, 1.0), axis=1)[:, : n - null_dim]
    gap = np.full(len(flat), np.inf)
    if kept.shape[1] > 0:
        positive = kept[:, -1] > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = kept.mean(axis=1, keepdims=True)
            # −mean(log(λ/mean λ)) rather than log(mean) − mean(log): no cancellation near 0
            value = np.maximum(-np.log(kept / mean).mean(axis=1), 0.0)
        gap = np.where(positive, value, np.inf)
    out = np.where(finite, gap, np.nan).reshape(lam.shape[:-1])
    return float(out) if out.ndim == 0 else out


def gap_from_singular_values(s: np.ndarray, null_dim: int = 0) -> float | np.ndarray:
    """The range gap from singular values s (..., n) of H (n × d): λ = σ² (pad with zeros for
    n > d, or pass null_dim ≥ n − d)."""
    return gap_from_eigenvalues(np.square(np.asarray(s, dtype=np.float64)), null_dim)


def centred_basis(n: int) -> np.ndarray:
    """An orthonormal basis Q (n, n − 1) of 1⊥ = {v : Σ v_i = 0}: the last n − 1 columns of the
    Householder reflection that maps 1/√n to e₁. Qᵀ H keeps all of a batch-centred H (1ᵀH = 0)
    and drops the rounding left along 1."""
    v = np.ones(n) / np.sqrt(n)
    v[0] -= 1.0  # P = I − 2uuᵀ/uᵀu with u = 1/√n − e₁ maps 1/√n to e₁
    P = np.eye(n) - 2.0 * np.outer(v, v) / (v @ v) if n > 1 else np.eye(1)
    return P[:, 1:]


def gap_of_features(
    H: np.ndarray, *, null_dim: int = 0, ones_in_null: bool = False, rank: bool = False
) -> float:
    """The reference gap of G = H Hᵀ from float64 singular values of H (n, d) — no Gram formed.

    null_dim: the structural null dimension k of G (n > d adds n − d on its own). With
    ones_in_null (batch-centred features: 1ᵀH = 0), H is first projected onto 1⊥
    (`centred_basis`), which is exact for the true H and removes the rounding along 1. rank=False
    gives the gap (+∞ when k > 0), rank=True the range gap: the gap of the n − k largest
    eigenvalues.
    """
    H = np.asarray(H, dtype=np.float64)
    n, d = H.shape
    k = max(null_dim, n - d, int(ones_in_null))
    if not rank and k > 0:
        return np.nan if not np.isfinite(H).all() else np.inf
    if not np.isfinite(H).all():
        return np.nan
    M = centred_basis(n).T @ H if ones_in_null else H
    s = np.linalg.svd(M, compute_uv=False)  # min(n', d) values, descending
    return float(gap_from_singular_values(s[: n - k]))


def gram_of(H: np.ndarray) -> np.ndarray:
    """Sample Gram H Hᵀ in float64: rows of H (n, d) are samples; stacks (..., n, d) work too."""
    H = np.asarray(H, dtype=np.float64)
    if H.ndim < 2:
        raise ValueError(f"gram_of needs an (n, d) matrix or a stack of them, got shape {H.shape}")
    return H @ np.swapaxes(H, -1, -2)  # (..., n, n)


def isometry_gap(
    gram: np.ndarray, *, rtol: float | None = None, null_dim: int | None = None
) -> float | np.ndarray:
    """gap(G) of one (n, n) Gram given as numbers (→ float) or a stack (→ array).

    null_dim=None: the Gram is the data, and its null dimension is numerical — eigenvalues
    ≤ rtol·λ_max (rtol = n·ε by default) count as zero, so a singular Gram (G = 0 included) gives
    +∞, never NaN or a huge finite value. An int null_dim is structural: exactly as
    `gap_from_eigenvalues(λ, null_dim)` with k = null_dim. A Gram with NaN or ±inf entries
    gives NaN: nothing to measure.
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
    lam[~finite] = np.nan
    if null_dim is None:
        tol = (n * EPS if rtol is None else rtol) * np.maximum(lam[:, -1:], 0.0)
        lam = np.where(lam <= tol, 0.0, lam)  # below the Gram's resolution: zero
        gap = gap_from_eigenvalues(lam)
    else:
        gap = np.inf if null_dim > 0 else gap_from_eigenvalues(lam)
        gap = np.where(finite, gap, np.nan)
    gap = np.asarray(gap, dtype=np.float64).reshape(G.shape[:-2])
    return float(gap) if gap.ndim == 0 else gap


def isometry(gram: np.ndarray, *, rtol: float | None = None) -> float | np.ndarray:
    """I(G) = exp(−gap(G)) ∈ [0, 1]: 1 for G ∝ identity, 0 for a singular G."""
    gap = isometry_gap(gram, rtol=rtol)
    return float(np.exp(-gap)) if np.ndim(gap) == 0 else np.exp(-gap)


# --- cosine Grams: the start of the mean-field recursion, and the recorded input Gram ---------


def cosine_gram(inputs: np.ndarray, *, zero: Literal["raise", "nan"] = "raise") -> np.ndarray:
    """The cosine Gram xᵢ·xⱼ/(‖xᵢ‖‖xⱼ‖) (unit diagonal, float64) of a batch of inputs (n, d): the
    mean-field recursion's start (Joudaki et al. 2023, Thm 5.1) and the engine's recorded
    `input_gram` — the one definition of both.

    Args:
        zero: an all-zero sample has no direction: "raise" (InvalidInput), or "nan" — its row and
            column are NaN and the others are as without it (the engine records what it saw).
    """
    X = np.asarray(inputs, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 1 or not np.isfinite(X).all():
        raise InvalidInput(f"need a finite (n, d) batch, got shape {X.shape}", field="inputs")
    norms = np.linalg.norm(X, axis=1)
    alive = norms > 0
    if alive.all():
        U = X / norms[:, None]
        return _unit_diagonal(U @ U.T)  # positive semi-definite by construction: no check
    if zero == "raise":
        raise InvalidInput("a sample is all zeros: its direction is undefined", field="inputs")
    C = np.full((len(X), len(X)), np.nan)
    if alive.any():
        C[np.ix_(alive, alive)] = cosine_gram(X[alive])
    return C


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
    C = _rescaled(G)
    lam_min = np.linalg.eigvalsh(C)[0]
    if lam_min < -1e-8 * C.shape[0]:
        raise InvalidInput(
            f"is not positive semi-definite (smallest eigenvalue {lam_min:.3g})", field="input_gram"
        )
    return _clipped(C)


def _unit_diagonal(G: np.ndarray) -> np.ndarray:
    """G (symmetric, positive diagonal) rescaled to unit diagonal, symmetrized, entries clipped
    to [−1, 1] and the diagonal set to exactly 1."""
    return _clipped(_rescaled(G))


def _rescaled(G: np.ndarray) -> np.ndarray:
    """G / √(d dᵀ) for d = diag(G), symmetrized."""
    d = np.diag(G)
    C = G / np.sqrt(np.outer(d, d))
    return (C + C.T) / 2


def _clipped(C: np.ndarray) -> np.ndarray:
    """C's entries clipped to [−1, 1], its diagonal set to exactly 1."""
    C = np.clip(C, -1.0, 1.0)
    np.fill_diagonal(C, 1.0)
    return C
