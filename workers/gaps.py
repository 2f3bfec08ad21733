"""The isometry gaps of stacks of representations, in float64 from a factor, never a formed Gram
(the numerical core that workers/metrics.py and workers/token_metrics.py both use).

The isometry of an n × n Gram matrix G with eigenvalues λ₁..λₙ (Joudaki et al. 2023, Eq. 3) is
I(G) = det(G)^(1/n) / (tr(G)/n); its gap is −log I(G) = log(mean λ) − mean(log λ) ∈ [0, ∞]. The
definition — including when it is +∞ — is `service.isometry`'s; this module computes the same
formula batched in torch (CPU or CUDA), and the tests hold it to that module on the same inputs.
Whether a Gram is singular comes from its `Structure` (workers/structure.py), not from rounding.

How (`range_gaps`): no Gram is formed. log det G comes from a float64 factor of M: the LU
PM = LU of a square M (G = MMᵀ, log det G = 2Σ log|U_ii|, (2/3)n³ flops) or the Householder QR
of Mᵀ otherwise (G = RᵀR, (4/3)n³ at n = d), so gap = log(‖M‖²_F/n) − (1/n) log det G,
accurate to ~ ε₆₄·κ(M) = ε₆₄·√κ(G) (Cholesky of a formed G would be ~ ε₆₄·κ(G), and eigvalsh
worse). A batch-centred square H (1 in the null space, rank n − 1) goes through one LU of the
bordered H + 1wᵀ (`_centred_square_gaps`). An inverse-iteration step through the factor
estimates κ(G); the few beyond KAPPA_MAX go to the float64 singular values σ of M instead
(λ = σ²), as do range gaps of fewer eigenvalues than the smaller side. All of it is batched
over layers, one call per distinct (structure, shape) and cache-sized chunk (CPU_CHUNK_ENTRIES).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from workers.structure import Structure

# Matrices of one batched float64 call hold at most this many entries (≈ 128 MiB): a huge batch
# cannot take the machine's memory.
MAX_GRAM_ENTRIES = 1 << 24
# On the CPU, batched calls take at most this many entries (2 MiB of float64): a stack that
# stays in cache and in the allocator's reused memory runs ~1.7× faster than one large one
# (each fresh allocation of tens of MiB is page-faulted in anew; bench/overhead.py).
CPU_CHUNK_ENTRIES = 1 << 18
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


def project_out_ones(H: Tensor) -> Tensor:
    """Qᵀ H (B, n − 1, d) in float64 for the orthonormal basis Q of 1⊥ of `service.isometry.
    centred_basis` (a Householder reflection, O(nd)): all of a batch-centred H, without the
    rounding it leaves along 1."""
    H = H.to(F64)
    n = H.shape[-2]
    u = torch.full((n, 1), 1 / math.sqrt(n), dtype=F64, device=H.device)
    u[0] -= 1.0
    PH = H - (2.0 / float(u.T @ u)) * u * (u.T @ H)  # (B, n, d)
    return PH[..., 1:, :]


def _svd_gaps(M: Tensor, r: int) -> Tensor:
    """Gaps of the r largest λ = σ² of M (B, m, c), σ from float64 SVD (no Gram formed)."""
    return _svd_gaps_and_errors(M, r)[0]


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


def _full_rank_gaps(M: Tensor) -> Tensor:
    return _full_rank_gaps_and_errors(M)[0]


def _full_rank_gaps_and_errors(
    M: Tensor, eps: float = EPS64, rounding: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Gaps of the regular Grams G = M Mᵀ of M (B, m, c), m ≤ c, without forming G: gap =
    log(‖M‖²_F/m) − (1/m) log det G, log det G from the LU of a square M (`_lu_log_det`) or the
    Householder QR of Mᵀ (`_qr_log_det`). Either errs by ~ ε₆₄·κ(M) = ε₆₄·√κ(G) (Cholesky of
    a formed G would be ~ ε₆₄·κ(G)); where the estimated κ(G) exceeds KAPPA_MAX (or the
    factor is unusable) the float64 singular values of M decide instead."""
    m = M.shape[1]
    M = M.to(F64)
    rows = torch.linalg.vector_norm(M, dim=2).square()  # (B, m): the diagonal of G
    tr = rows.sum(dim=1)
    finite = torch.isfinite(tr)
    zero_row = (rows == 0).any(dim=1)  # an exactly zero sample: G singular, from the numbers
    usable = finite & ~zero_row
    if not bool(usable.all()):
        M = torch.where(
            usable[:, None, None], M, torch.eye(m, M.shape[2], dtype=F64, device=M.device)
        )
    log_det, lam_min = _lu_log_det(M)[:2] if m == M.shape[2] else _qr_log_det(M)
    gap = (torch.log(tr / m) - log_det / m).clamp_min(0.0)
    kappa = (tr / m) / lam_min
    # Above KAPPA_UNRESOLVED (κ̂ ≤ κ always) no float64 method resolves λ_min — the SVD's σ err
    # by ~ε₆₄σ_max — and the factor's value stays: as close to the truth as the SVD's (measured
    # on the scale-only chain of docs/architecture.md, Measurements).
    route = usable & ~(kappa <= KAPPA_MAX) & ~(kappa > KAPPA_UNRESOLVED)  # NaN κ̂ routes too
    err = _factor_errors(tr, lam_min, m, M.shape[2], eps, rounding)
    if bool(route.any()):
        gap[route], err[route] = _svd_gaps_and_errors(M[route], m, eps, rounding)
    gap = torch.where(zero_row, math.inf, gap)
    err = torch.where(zero_row, 0.0, err)  # +∞ from an exactly zero row: exact
    return torch.where(finite, gap, math.nan), torch.where(finite, err, math.nan)


def _centred_square_gaps(
    H: Tensor, eps: float = EPS64, rounding: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Range gaps of square H (B, n, n) with 1 in the null space of H Hᵀ (structure (True,
    n − 1)): the gap of the n − 1 eigenvalues σᵢ² of K = (I − 11ᵀ/n)H, from one LU of a
    square matrix instead of a QR of the (n − 1) × n QᵀH.

    Bordering: H' = H + 1wᵀ = K + 1w̃ᵀ (w̃ = w + Hᵀ1/n: H's own rounding along 1 only moves w).
    With x = H'⁻¹1, Kx = 1 − 1(w̃ᵀx), and 1ᵀK = 0 gives w̃ᵀx = 1, Kx = 0: x spans K's null
    space. K = U diag(σ₁..σₙ₋₁, 0) Vᵀ has adj(K) = ±(Πσᵢ) v uᵀ (u = 1/√n, v = x/‖x‖), so
    det H' = 1ᵀ adj(K)… = ±(Πσᵢ)·√n·w̃ᵀv, i.e. Σ log σᵢ = log|det H'| + log‖x‖ − ½ log n
    (matrix determinant lemma on the adjugate; Horn & Johnson 2013, §0.8). tr(K Kᵀ) =
    ‖H‖²_F − ‖1ᵀH‖²/n. w: a fixed random direction, √n‖w‖ the RMS σ, so H' is as well
    conditioned as K on 1⊥. Where the estimated κ(H'H'ᵀ) exceeds KAPPA_MAX, or the numbers are
    unusable, `project_out_ones` and `_full_rank_gaps` decide instead."""
    n = H.shape[1]
    H = H.to(F64)
    ones_t = H.sum(dim=1)  # (B, n): 1ᵀH
    tr = torch.linalg.vector_norm(H, dim=(1, 2)).square() - ones_t.square().sum(dim=1) / n
    omega = _start_vectors(n, H.device)[:, 0]
    w = torch.sqrt(tr.clamp_min(0) / (n * (n - 1)))[:, None] * omega
    usable = torch.isfinite(tr) & (tr > 0)
    Hb = H + w[:, None, :]
    if not bool(usable.all()):
        Hb = torch.where(usable[:, None, None], Hb, torch.eye(n, dtype=F64, device=H.device))
    ones = torch.ones(len(H), n, 1, dtype=F64, device=H.device)
    log_det, lam_min, x = _lu_log_det(Hb, ones)
    log_sigma = 0.5 * log_det + torch.log(torch.linalg.vector_norm(x, dim=(1, 2)))
    gap = (torch.log(tr / (n - 1)) - 2.0 * (log_sigma - 0.5 * math.log(n)) / (n - 1)).clamp_min(0)
    kappa = (tr / (n - 1)) / lam_min
    route = ~usable | ~(kappa <= KAPPA_MAX) | ~torch.isfinite(gap)
    err = _factor_errors(tr, lam_min, n, n, eps, rounding)
    if bool(route.any()):
        gap[route], err[route] = _full_rank_gaps_and_errors(
            project_out_ones(H[route]), eps, rounding
        )
    return gap, err


def _all_finite(M: Tensor) -> Tensor:
    """Whether each M[i] of a stack (B, m, c) is finite: its max and min are (NaN propagates
    through both, +∞ shows in the max, −∞ in the min), two reductions with no mask formed."""
    if M.numel() == 0:
        return torch.ones(len(M), dtype=torch.bool, device=M.device)
    flat = M.flatten(1)
    return torch.isfinite(flat.amax(dim=1)) & torch.isfinite(flat.amin(dim=1))


def range_gaps(M: Tensor, rank: int, *, ones_in_null: bool = False) -> Tensor:
    """Gaps of the `rank` largest eigenvalues of the Grams M Mᵀ of M (B, n, d) → (B,) float64:
    the range gap of a structure (ones_in_null, rank); the gap itself when rank = n.

    With ones_in_null, M is first projected onto 1⊥ (`project_out_ones`). Where rank is all of
    the smaller side, the Gram on that side (same non-zero spectrum) goes through
    `_full_rank_gaps`; otherwise the float64 singular values of M. Non-finite M gives NaN.
    Chunked (`_chunk_size`).
    """
    return range_gaps_and_errors(M, rank, ones_in_null=ones_in_null)[0]


def range_gaps_and_errors(
    M: Tensor, rank: int, *, ones_in_null: bool = False, eps: float = EPS64, rounding: float = 0.0
) -> tuple[Tensor, Tensor]:
    """`range_gaps` and, for each, a bound on its absolute error from the route that computed
    it (`_factor_errors`, `_svd_gaps_and_errors`) at unit roundoff eps, with M's own entries
    each rounded once at unit roundoff `rounding` (‖δM‖_F ≤ rounding·‖M‖_F): +∞ where λ_min is
    below what that precision resolves; NaN for a non-finite M."""
    out, errs = [], []
    step = _chunk_size(M.shape[1:], M.device)
    bordered = ones_in_null and M.shape[1] == M.shape[2] == rank + 1
    for chunk in M.split(step):
        if bordered:
            g, e = _centred_square_gaps(chunk, eps, rounding)
            out.append(g)
            errs.append(e)
            continue
        if ones_in_null:
            chunk = project_out_ones(chunk)
        m, c = chunk.shape[1:]
        if rank >= min(m, c):
            g, e = _full_rank_gaps_and_errors(chunk if m <= c else chunk.mT, eps, rounding)
        else:
            finite = _all_finite(chunk)
            safe = torch.where(finite[:, None, None], chunk, 0.0)
            g, e = _svd_gaps_and_errors(safe, rank, eps, rounding)
            g, e = torch.where(finite, g, math.nan), torch.where(finite, e, math.nan)
        out.append(g)
        errs.append(e)
    return torch.cat(out), torch.cat(errs)


def isometry_gaps(H: Tensor, structure: Structure | None = None) -> Tensor:
    """Gaps of the sample Grams G = H Hᵀ of a stack H (B, n, d) → (B,) float64 (n × n Grams over
    samples; Joudaki et al. 2023, Sec. 3). +∞ when the structure (default: nothing forced but
    rank ≤ min(n, d)) leaves rank < n; NaN for a non-finite H."""
    n, d = H.shape[1:]
    s = structure or Structure(False, min(n, d))
    if s.rank < n:
        finite = _all_finite(H)
        return torch.where(finite, math.inf, math.nan).to(F64)
    return range_gaps(H, n)


def isometry_gap(H: Tensor, structure: Structure | None = None) -> float:
    """gap(H Hᵀ) of one (n, d) representation."""
    return float(isometry_gaps(H.unsqueeze(0), structure)[0])


def weight_isometry_gaps(W: Tensor) -> Tensor:
    """Weight isometry gaps gap(W Wᵀ) (Meterez et al. 2024, Sec. 6) of a stack of equal-shape
    weights W: (B, out, in) → (B,), with the Gram on the smaller side: W Wᵀ (out ≤ in) or Wᵀ W —
    the same non-zero spectrum, and exactly I for a semi-orthogonal W, so an orthogonal init
    reads 0 also for the first layer (in ≠ width) and the head."""
    return range_gaps(W, min(W.shape[1:]))


def weight_isometry_gap(W: Tensor) -> float:
    return float(weight_isometry_gaps(W.unsqueeze(0))[0])


def frobenius_norms(tensors: Sequence[Tensor]) -> Tensor:
    """‖T‖_F of each of a non-empty sequence of equal-shape tensors, accumulated in float64 → (len,)
    float64."""
    return torch.linalg.vector_norm(torch.stack(tensors).flatten(1), dim=1, dtype=F64)


def spectra(M: Tensor, size: int) -> Tensor:
    """Eigenvalues of the Grams M Mᵀ (B, m, c) → (B, size) float64, descending, as squared
    float64 singular values of M; zero-padded to m (an m > c Gram has m − c zero eigenvalues),
    then NaN-padded to `size`."""
    lam = torch.linalg.svdvals(M.to(F64)).square()
    m = M.shape[1]
    lam = F.pad(lam, (0, m - lam.shape[1]), value=0.0)
    return F.pad(lam, (0, size - m), value=math.nan)


def _chunk_size(shape: Sequence[int], device: torch.device) -> int:
    """How many (n, d) matrices one batched call takes: MAX_GRAM_ENTRIES (a memory bound), on
    the CPU also CPU_CHUNK_ENTRIES (speed); at least one."""
    n, d = shape
    limit = MAX_GRAM_ENTRIES if device.type != "cpu" else min(MAX_GRAM_ENTRIES, CPU_CHUNK_ENTRIES)
    return max(1, limit // max(n * d, n * n, 1))


def _stacked(
    H: Sequence[Tensor] | dict[int, Tensor], idx: list[int], dtype: torch.dtype | None = None
) -> Iterator[Tensor]:
    """H[i] for i in idx, stacked (and converted to `dtype`) in chunks of `_chunk_size`, each
    written into one buffer that the next chunk reuses: consume each before taking the next."""
    first = H[idx[0]]
    step = _chunk_size(first.shape, first.device)
    buf = torch.empty(
        min(step, len(idx)), *first.shape, dtype=dtype or first.dtype, device=first.device
    )
    for k in range(0, len(idx), step):
        part = idx[k : k + step]
        yield torch.stack([H[i] for i in part], out=buf[: len(part)])


def _supports(H: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Masks of the not-all-zero rows (B, n) and columns (B, d) of equal-shape H[i] (n, d)
    (a row with a NaN is not all zero)."""
    rows, cols = [], []
    for chunk in _stacked(H, list(range(len(H)))):
        # (one pass of max over each side beats two passes of `!= 0` then `any`); a NaN
        # propagates through max and is != 0: a non-finite row is not a zero row
        A = torch.abs(chunk, out=chunk)
        rows.append(A.amax(dim=2) != 0)
        cols.append(A.amax(dim=1) != 0)
    return torch.cat(rows), torch.cat(cols)


def _tap_gaps(
    H: Sequence[Tensor], kinds: list[Structure], masks: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor]:
    """(gap, range gap) of each representation H[i] (n, d) (a list or a stack (B, n, d)) with
    structure kinds[i], float64 (`tap_gaps_and_errors` without the errors)."""
    return tap_gaps_and_errors(H, kinds, masks)[:2]


def tap_gaps_and_errors(
    H: Sequence[Tensor], kinds: list[Structure], masks: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(gap, range gap, the gap's relative error bound) of each representation H[i] (n, d) (a
    list or a stack (B, n, d)) with structure kinds[i], float64. `masks`: `_supports(H)` if
    already known.

    Zero rows and columns are dropped first (they add only zero eigenvalues, which the structure
    already counts); then one batched `range_gaps_and_errors` per distinct (structure, shape)
    and chunk. The error bound is relative, |computed − true| / gap: 0 for a structural +∞
    (exact); for a regular Gram the route's bound at float64's unit roundoff plus what rounding
    each entry of the tap once to its own dtype can do (‖δH‖_F ≤ u·‖H‖_F, u = 2⁻²⁴ for a
    float32 tap: a float32 Gram is unresolved where σ_min ≤ ~u·‖H‖_F, whatever float64 does
    after), +∞ where λ_min is beyond that resolution (and for a gap of 0, whose relative error
    has no bound); for a tap whose structure is unknown (`Structure.known` False) the route's
    bound at the unit roundoff of the tap's own dtype — the forward's rounding could be all that
    keeps such a Gram regular. Neither covers the rounding the forward pass accumulated before
    the tap (the precision check measures that: workers/precision.py)."""
    n = H[0].shape[0]
    gap = torch.empty(len(H), dtype=F64, device=H[0].device)
    rng = torch.empty_like(gap)
    err = torch.empty_like(gap)
    rows, cols = masks if masks is not None else _supports(H)
    whole = (rows.all(dim=1) & cols.all(dim=1)).tolist()
    groups: dict[tuple, list[int]] = {}
    trimmed: dict[int, Tensor] = {}
    for i, s in enumerate(kinds):
        if not whole[i]:
            trimmed[i] = H[i][rows[i]][:, cols[i]]
        shape = tuple(trimmed[i].shape) if i in trimmed else tuple(H[i].shape)
        groups.setdefault((s, shape, H[i].dtype), []).append(i)
    for (s, _, dtype), idx in groups.items():
        where = torch.tensor(idx, device=gap.device)
        src = trimmed if idx[0] in trimmed else H
        u = torch.finfo(dtype).eps / 2  # the tap's unit roundoff
        eps = EPS64 if s.known else max(EPS64, u)
        M = _stacked(src, idx, F64)
        parts = [
            range_gaps_and_errors(m, s.rank, ones_in_null=s.ones_in_null, eps=eps, rounding=u)
            for m in M
        ]
        r = torch.cat([q[0] for q in parts])
        rng[where] = r
        if s.rank >= n:
            e = torch.cat([q[1] for q in parts])
            gap[where] = r
            rel = torch.where(r > 0, e / r, torch.where(e == 0, 0.0, math.inf))
            err[where] = torch.where(torch.isnan(r) | torch.isnan(e), math.nan, rel)
        else:
            gap[where] = torch.where(torch.isnan(r), r, math.inf)
            err[where] = torch.where(torch.isnan(r), r, 0.0)
    return gap, rng, err
