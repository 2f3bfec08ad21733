"""The float64 factorizations behind the isometry gaps (workers/gaps.py), and for each a bound
on what it gets wrong (docs/science.md, "Precision": error bars).

Every route is backward stable: its result is exact for M + δM, ‖δM‖ ≤ p·ε·‖M‖ (`error_scale`),
and the tap's entries carry their own rounding (‖δH‖_F ≤ u·‖H‖_F). From that, each route's gap
moves by at most its bound:

- the LU of a square M or the Householder QR of a wide one (`_lu_log_det`, `_qr_log_det`):
  log det G = 2Σ log|U_ii| (or |R_ii|), the bound 2δ/σ_min (`_factor_errors`), σ_min from one
  inverse-iteration step through the factor;
- the SVD of M (`_svd_gaps_and_errors`): each σ moves by ≤ δ (Weyl);
- the top-r spectrum of a rank-deficient M (structural rank r < min(m, c)) from the
  eigenvalues of its formed Gram (`gram_eigh_gaps_and_errors`), where M's own rounding
  dominates what forming it loses; else the SVD.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

F64 = torch.float64
# The LU/QR gap is used where κ̂ = mean(λ)/λ̂_min ≤ KAPPA_MAX (`_lambda_min_estimate`: one
# inverse-iteration step from two start vectors, which undershoots κ by up to 1.7e4 on the 2160
# Grams below); above, the float64 SVD of M decides. Measured against the SVD gap on float32
# networks at n = d = 100 and 128 (tanh/BatchNorm, identity/batch_scale, ReLU with and without
# BatchNorm, tanh/layer_scale, Gaussian weights, depth 30; 2160 Grams): LU and QR alike within
# 3e-15 for κ < 1e8, 2e-13 below 1e12, 7e-10 below 1e20, 3.2e-9 up to 1e24, 9e-9 (LU; QR
# 3.7e-8) beyond — so 1e20 keeps a margin of > 300 under the 1e-6 that the tests ask even where
# κ̂ undershoots most. The bordered LU of centred H (720 BatchNorm outputs, n = 64..128): within
# 1e-9 of the SVD of QᵀH down to λ_min/λ_max = 1e-24.
KAPPA_MAX = 1e20
# σ_min/σ_max below ~max(n, d)·ε₆₄ (λ ratio ~1e-27 at n = d = 128) is below the float64 SVD's own
# resolution: there neither it nor LU/QR measures λ_min, and the factor's cheaper value is kept.
KAPPA_UNRESOLVED = 1e28
# The unit roundoff of the factorizations (float64): their error bars scale with it.
EPS64 = 2.0**-53


def error_scale(m: int, c: int) -> float:
    """p in the error model of every route: the computed σᵢ of an m × c matrix are those of
    M + δM with ‖δM‖₂ ≤ p·ε·‖M‖₂ (backward stability of SVD, Householder QR and partially
    pivoted LU with a modest growth factor; Higham 2002, Thms 19.4, 9.5), taken as
    p = max(m, c) — the worst case of the dimension-dependent constants, which the measured
    errors stay below (tests/workers/test_gap_error.py)."""
    return float(max(m, c))


def gaps_from_eigenvalues(lam: Tensor) -> Tensor:
    """log(mean λ) − mean(log λ) per row of lam (B, r) ≥ 0 (float64) → (B,): `service.isometry.
    gap_from_eigenvalues` in torch. A zero λ gives +∞; rounding below 0 is clipped (AM ≥ GM)."""
    if lam.shape[1] == 0:
        return torch.full(lam.shape[:1], math.inf, dtype=F64, device=lam.device)
    mean = lam.mean(dim=1, keepdim=True)
    gap = (-torch.log(lam / mean).mean(dim=1)).clamp_min(0.0)
    return torch.where(lam.min(dim=1).values > 0, gap, math.inf)


def _svd_gaps_and_errors(
    M: Tensor, r: int, eps: float = EPS64, rounding: float = 0.0
) -> tuple[Tensor, Tensor]:
    """(gaps, absolute error bounds) of the r largest λ = σ² of M (B, m, c). Each computed σᵢ
    is within δ = p·ε·σ₁ of the true one (`error_scale`; Weyl), plus rounding·‖M‖_F for the
    rounding of M's own entries (`tap_gaps_and_errors`), so the gap — log(mean λ) −
    mean(log λ) — is within 2δ·mean(1/σᵢ) + 2δ/σ₁ (its second term: the trace, ≤ λ₁); where
    δ ≥ σ_r no σ_r is resolved: +∞."""
    full = torch.linalg.svdvals(M.to(F64))  # (B, min(m, c)) descending
    s = full[:, :r]
    gap = gaps_from_eigenvalues(s.square())
    if s.shape[1] == 0:
        return gap, torch.zeros_like(gap)
    frobenius = torch.linalg.vector_norm(full, dim=1)
    delta = error_scale(*M.shape[1:]) * eps * s[:, 0] + rounding * frobenius
    err = 2.0 * delta * (s.reciprocal().mean(dim=1) + s[:, 0].reciprocal())
    return gap, torch.where(delta < s[:, -1], err, math.inf)


def gram_eigh_gaps_and_errors(
    M: Tensor, ranks: Tensor, eps: float = EPS64, rounding: float = 0.0
) -> tuple[Tensor, Tensor]:
    """(gaps, absolute error bounds) of the rᵢ largest λ of the Grams of finite float64 M[i]
    (B, m, c), 0 ≤ rᵢ = ranks[i] < min(m, c): from the eigenvalues of the Gram G formed on
    M's smaller side (q × q) where they resolve the top r as well as M's own rounding lets any
    route, else from the SVD (`_svd_gaps_and_errors`). Matrices of one shape share each call,
    whatever their ranks; ~1.3–1.5× faster than the SVD at q = 128 (bench/overhead.py).

    Forming G in float64 and its symmetric eigensolver move each λ by ≤ δλ = (p + q)·ε‖M‖²_F
    (Higham 2002, Thm 3.5; Weyl), so the gap moves by ≤ δλ·(mean(1/λᵢ) + 1/mean λ) — an error
    ~ε·κ(G) in λ_min where the SVD's is ~ε·√κ(G) — and the entries' own rounding (‖δM‖_F ≤
    u‖M‖_F) moves each σ = √λ by ≤ u‖M‖_F, the SVD route's bound. For a float32 tap the second
    dominates wherever it resolves λ_r; where the first is the larger (float64 taps, mostly)
    or δλ ≥ λ_r, the SVD decides — unless the entries' own rounding alone leaves λ_r
    unresolved and λ_r > 0: then no route resolves it, the bar is +∞ either way, and the value
    is the formed Gram's (it differs from the SVD's there by as much as either may from the
    truth)."""
    X = M if M.shape[1] <= M.shape[2] else M.mT  # (B, q, p): the Gram on the smaller side
    q, p = X.shape[1:]
    ranks = ranks.to(M.device)
    lam = torch.linalg.eigvalsh(X @ X.mT).flip(-1)  # (B, q) descending
    head = torch.arange(q, device=M.device)[None, :] < ranks[:, None]
    r = ranks.to(F64)
    last = lam.gather(1, (ranks - 1).clamp_min(0)[:, None])[:, 0]  # λ_r
    kept = torch.where(head, lam, 1.0)  # (B, q): the top r, 1 elsewhere
    mean = torch.where(head, lam, 0.0).sum(dim=1) / r
    logs = torch.where(head, torch.log(kept.clamp_min(1e-300) / mean[:, None]), 0.0)
    gap = (-logs.sum(dim=1) / r).clamp_min(0.0)
    inv = torch.where(head, kept.clamp_min(1e-300).reciprocal(), 0.0).sum(dim=1) / r
    total = torch.linalg.vector_norm(M, dim=(1, 2)).square()  # tr G = ‖M‖²_F
    dlam = (error_scale(p, q) + q) * eps * total
    own = rounding * torch.sqrt(total)  # what the entries' rounding moves each σ by
    sigma = torch.sqrt(kept.clamp_min(0.0))
    formed = dlam * (inv + 1.0 / mean)
    rounded = 2.0 * own * (torch.where(head, sigma.reciprocal(), 0.0).sum(dim=1) / r)
    rounded = rounded + 2.0 * own / sigma[:, 0]
    lost = own >= torch.sqrt(last.clamp_min(0.0))  # no route resolves λ_r
    err = torch.where((dlam < last) & ~lost, formed + rounded, math.inf)
    keep = (ranks > 0) & (last > 0) & torch.isfinite(gap)
    keep &= lost | ((dlam < last) & (formed <= rounded))
    for rank in ranks[~keep].unique().tolist():  # the SVD, one call per rank
        at = ~keep & (ranks == rank)
        gap[at], err[at] = _svd_gaps_and_errors(M[at], int(rank), eps, rounding)
    return gap, err


def _factor_errors(
    tr: Tensor, lam_min: Tensor, m: int, c: int, eps: float, rounding: float = 0.0
) -> Tensor:
    """Absolute error bounds of a gap from a factor (LU or QR) of M (m × c, tr = ‖M‖²_F) whose
    λ_min was estimated as lam_min: the factor is exact for M + δM, ‖δM‖₂ ≤ δ = p·ε·‖M‖_F
    (`error_scale`) + rounding·‖M‖_F (M's own entries' rounding: `tap_gaps_and_errors`), so
    (1/m) log det G moves by ≤ 2δ/σ_min (|log det(I + M⁻¹δM)| ≤ m‖M⁻¹δM‖₂), with σ_min ≈
    √lam_min; +∞ where δ ≥ √lam_min (unresolved). lam_min comes from one
    inverse-iteration step and may overshoot λ_min (κ under by 1/|u_minᵀv|): the measured
    errors stay within the bound all the same (tests/workers/test_gap_error.py)."""
    delta = (error_scale(m, c) * eps + rounding) * torch.sqrt(tr)
    sigma = torch.sqrt(lam_min)
    err = 2.0 * delta / sigma + 2.0 * eps * m
    return torch.where(delta < sigma, err, math.inf)


@functools.lru_cache(maxsize=64)
def _start_vectors(m: int, device: torch.device) -> Tensor:
    """Two fixed random unit vectors (m, 2), float64 (cached: read, never written)."""
    v = torch.randn(m, 2, generator=torch.Generator().manual_seed(m), dtype=F64)
    return (v / torch.linalg.vector_norm(v, dim=0)).to(device)


def _lambda_min_estimate(w: Tensor, diag: Tensor | None = None) -> Tensor:
    """An estimate of λ_min(G) from w = G⁻¹V (B, m, k) for unit start vectors V — one step of
    inverse iteration: ‖G⁻¹v‖ ≤ 1/λ_min, so 1/‖w‖ ≥ λ_min, undershooting κ by 1/|u_minᵀv|
    (measured ≤ 1.7e4 with two vectors) — and, for a triangular factor R with G = RᵀR, its
    diagonal (B, m): λ_min = σ_min(R)² ≤ min R_ii². The smaller of the two."""
    est = torch.linalg.vector_norm(w, dim=1).reciprocal().amin(dim=1)
    if diag is None or diag.shape[1] == 0:
        return est
    return torch.minimum(est, diag.abs().amin(dim=1).square())


def _qr_log_det(M: Tensor) -> tuple[Tensor, Tensor]:
    """(log det G, λ̂_min) of G = M Mᵀ, M (B, m, c) float64 with m ≤ c: Householder QR Mᵀ = QR
    gives G = RᵀR (σ(M) = σ(R)), log det G = 2Σ log|R_ii|; G⁻¹V by two triangular solves (only
    the upper triangle of geqrf's output is R, and only it is read)."""
    m = M.shape[1]
    A, _ = torch.geqrf(M.mT)
    R = A[:, :m, :]
    diag = torch.diagonal(R, dim1=-2, dim2=-1)
    V = _start_vectors(m, M.device).expand(len(M), -1, -1)
    w = torch.linalg.solve_triangular(R.mT, V, upper=False)
    w = torch.linalg.solve_triangular(R, w, upper=True)
    return 2.0 * torch.log(diag.abs()).sum(dim=1), _lambda_min_estimate(w, diag)


def _lu_log_det(M: Tensor, rhs: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(log det G, λ̂_min, M⁻¹·rhs) of G = M Mᵀ, M (B, m, m) float64 square: LU with partial
    pivoting gives log det G = 2Σ log|U_ii| at (2/3)m³ flops, half of QR's (4/3)m³, with the
    same backward-error bound up to the growth factor (Higham 2002, Thm 9.5 and §9.4; O(1) on
    the matrices measured here); G⁻¹V = M⁻ᵀ(M⁻¹V) by two LU solves, the first of which also
    solves for `rhs` (B, m, k) if given."""
    # The LU of Mᵀ (same |det|): a row-major M's transpose is already the column-major layout
    # LAPACK factors, so it is copied as is (~3× faster than a transposing copy of M).
    LU, piv, _ = torch.linalg.lu_factor_ex(M.mT)
    V = _start_vectors(M.shape[1], M.device).expand(len(M), -1, -1)
    k = 0 if rhs is None else rhs.shape[2]
    B = V if rhs is None else torch.cat([rhs, V], dim=2)
    w = torch.linalg.lu_solve(LU, piv, B, adjoint=True)  # (Mᵀ)ᵀ⁻¹B = M⁻¹B
    lam = _lambda_min_estimate(torch.linalg.lu_solve(LU, piv, w[..., k:]))  # M⁻ᵀ(M⁻¹V)
    log_det = 2.0 * torch.log(torch.diagonal(LU, dim1=-2, dim2=-1).abs()).sum(dim=1)
    return log_det, lam, None if rhs is None else w[..., :k]
