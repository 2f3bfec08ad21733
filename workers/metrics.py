"""Measurements of one network on the probe batch: isometry gaps, weight gaps, gradient norms.

The isometry of an n × n Gram matrix G with eigenvalues λ₁..λₙ (Joudaki et al. 2023, Eq. 3) is
I(G) = det(G)^(1/n) / (tr(G)/n); its gap is −log I(G) = log(mean λ) − mean(log λ) ∈ [0, ∞]. The
definition — including when it is +∞ — is `service.isometry`'s; this module computes the same
formula batched in torch (CPU or CUDA), and the tests hold it to that module on the same inputs.

When a gap is +∞ is decided from the network, not from rounding (`structures`): a Gram is
singular exactly when the architecture forces rank(H) < n — n > d, a centring normalization and
the maps that carry its null space forward. Everything else is regular, however ill-conditioned,
and gets a finite gap. Exact zeros that the numbers show still give +∞: a row of H that is
exactly zero (a sample a ReLU maps to 0) or a column that is (a unit dead on the whole batch)
lowers the rank bound (`refine`). Other exact dependences that neither reveals (e.g. two ReLU
units alive on one and the same sample only) read as a large finite gap set by float64 rounding
(σ_min ~ 1e-16·σ_max): the tracker cannot see them, and no tolerance can tell them from the
regular Grams of deep Gaussian chains, which reach λ_min/λ_max ≈ 1e-35 (docs/architecture.md).

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
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from workers import nn
from workers.models.base import Fit, Net, Taps

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


@dataclass(frozen=True)
class Structure:
    """What the network forces on a representation H (n × d) whatever its numbers are.

    ones_in_null: 1ᵀH = 0 exactly (every feature centred over the batch), so G·1 = 0.
    rank: an upper bound on rank(H); G is structurally singular iff rank < n, with structural
    null dimension n − rank.
    """

    ones_in_null: bool
    rank: int


def _is_zero(t: Tensor | None) -> bool:
    return t is None or bool(torch.all(t == 0))


def support(H: Tensor) -> tuple[int, int]:
    """How many rows and columns of H (n, d) — or of a tap (n, ...) flattened to (n, d) — are
    not all zero."""
    nz = H.reshape(len(H), -1) != 0
    return int(nz.any(dim=1).sum()), int(nz.any(dim=0).sum())


def refine(s: Structure, H: Tensor, counts: tuple[int, int] | None = None) -> Structure:
    """What the numbers of H (n, d) force besides: rank ≤ its not-all-zero rows and columns (a
    zero row is a sample the layer maps to 0 — an exactly zero eigenvalue; a zero column a unit
    that is 0 on the whole batch, e.g. a dead ReLU); with 1 in the null space, ≤ rows − 1.
    `counts`: `support(H)` if already known."""
    rows, cols = counts or support(H)
    rank = min(s.rank, rows - int(s.ones_in_null), cols)
    return Structure(s.ones_in_null, max(rank, 0))


def input_structure(x: Tensor) -> Structure:
    """The probe inputs (n, d_in): nothing forced but their zero rows and columns."""
    return refine(Structure(False, min(x.shape)), x)


def _after_linear(s: Structure, n: int, d: int, bias: Tensor | None) -> Structure:
    """H Wᵀ keeps 1ᵀH = 0 and rank ≤ min(rank, d); a non-zero bias adds 1 bᵀ: rank + 1, and 1
    leaves the null space."""
    if _is_zero(bias):
        return Structure(s.ones_in_null, min(s.rank, d))
    return Structure(False, min(s.rank + 1, n, d))


def _after_norm(spec: nn.Spec, p: nn.Params, ell: int, s: Structure, n: int, d: int) -> Structure:
    """BatchNorm centres features over the batch: (I − 11ᵀ/n)H·D, rank ≤ min(rank, n − 1) and 1ᵀ
    out = 0 if β = 0 (else + 1βᵀ: rank + 1). LayerNorm centres samples over features:
    D·H(I − 11ᵀ/d), rank ≤ min(rank, d − 1) (+ 1 for β ≠ 0); its per-sample scaling moves 1 out
    of the null space. The scale-only variants scale columns (batch_scale: keeps both) or rows
    (layer_scale: keeps the rank only)."""
    if spec.norm == "batch":
        r = min(s.rank, n - 1)
        return Structure(True, r) if _is_zero(p[f"beta{ell}"]) else Structure(False, r + 1)
    if spec.norm == "layer":
        r = min(s.rank, d - 1) + (0 if _is_zero(p[f"beta{ell}"]) else 1)
        return Structure(False, min(r, n))
    if spec.norm == "layer_scale":
        return Structure(False, s.rank)
    return s  # batch_scale, none


def _after_act(spec: nn.Spec, s: Structure, n: int, d: int) -> Structure:
    """σ = identity (any gain) maps H to αH; a non-linear σ ends every forced dependence."""
    return s if spec.activation == "identity" else Structure(False, min(n, d))


def structures(
    spec: nn.Spec,
    p: nn.Params,
    x: Tensor,
    taps: list[tuple[Tensor, ...]],
    fit: Fit | None = None,
) -> list[tuple[Structure, ...]]:
    """Per block of the MLP, the Structure of its (Linear, norm, activation) outputs — the taps
    of `nn.forward` — followed in the block's order, each refined by its own zero rows and
    columns (`fit`, default `refine`) before it is carried on. Parameter values decide (β or b
    exactly 0?), not config flags, so trained networks and non-zero bias inits are judged as
    they are."""
    n, d = x.shape[0], spec.width
    s = input_structure(x)
    fit = fit or refine
    out = []
    for ell, (hz, hn, ha) in enumerate(taps, start=1):
        z = fit(_after_linear(s, n, d, p.get(f"b{ell}")), hz)
        if spec.order == "norm_act":
            nrm = fit(_after_norm(spec, p, ell, z, n, d), hn)
            a = fit(_after_act(spec, nrm, n, d), ha)
            s = a
        else:
            a = fit(_after_act(spec, z, n, d), ha)
            nrm = fit(_after_norm(spec, p, ell, a, n, d), hn)
            s = nrm
        out.append((z, nrm, a))
    return out


# ---------------------------------------------------------------------------------------------
# Gaps from numbers


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
    s = torch.linalg.svdvals(M.to(F64))  # (B, min(m, c)) descending
    return gaps_from_eigenvalues(s[:, :r].square())


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
    if bool(route.any()):
        gap[route] = _svd_gaps(M[route], m)
    gap = torch.where(zero_row, math.inf, gap)
    return torch.where(finite, gap, math.nan)


def _centred_square_gaps(H: Tensor) -> Tensor:
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
    if bool(route.any()):
        gap[route] = _full_rank_gaps(project_out_ones(H[route]))
    return gap


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
    out = []
    step = _chunk_size(M.shape[1:], M.device)
    bordered = ones_in_null and M.shape[1] == M.shape[2] == rank + 1
    for chunk in M.split(step):
        if bordered:
            out.append(_centred_square_gaps(chunk))
            continue
        if ones_in_null:
            chunk = project_out_ones(chunk)
        m, c = chunk.shape[1:]
        if rank >= min(m, c):
            out.append(_full_rank_gaps(chunk if m <= c else chunk.mT))
        else:
            finite = _all_finite(chunk)
            safe = torch.where(finite[:, None, None], chunk, 0.0)
            out.append(torch.where(finite, _svd_gaps(safe, rank), math.nan))
    return torch.cat(out)


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


def _unique(tensors: list[Tensor]) -> tuple[list[Tensor], list[int]]:
    """Distinct tensor objects and, per input, its index among them: σ = identity with α = 1
    returns its input itself, and a Gram measured once is enough."""
    seen: dict[int, int] = {}
    uniq: list[Tensor] = []
    where = []
    for t in tensors:
        if id(t) not in seen:
            seen[id(t)] = len(uniq)
            uniq.append(t)
        where.append(seen[id(t)])
    return uniq, where


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
    structure kinds[i], float64. `masks`: `_supports(H)` if already known.

    Zero rows and columns are dropped first (they add only zero eigenvalues, which the structure
    already counts); then one batched `range_gaps` per distinct (structure, shape) and chunk."""
    n = H[0].shape[0]
    gap = torch.empty(len(H), dtype=F64, device=H[0].device)
    rng = torch.empty_like(gap)
    rows, cols = masks if masks is not None else _supports(H)
    whole = (rows.all(dim=1) & cols.all(dim=1)).tolist()
    groups: dict[tuple, list[int]] = {}
    trimmed: dict[int, Tensor] = {}
    for i, s in enumerate(kinds):
        if not whole[i]:
            trimmed[i] = H[i][rows[i]][:, cols[i]]
        shape = tuple(trimmed[i].shape) if i in trimmed else tuple(H[i].shape)
        groups.setdefault((s, shape), []).append(i)
    for (s, _), idx in groups.items():
        where = torch.tensor(idx, device=gap.device)
        M = _stacked(trimmed if idx[0] in trimmed else H, idx, F64)
        r = torch.cat([range_gaps(m, s.rank, ones_in_null=s.ones_in_null) for m in M])
        rng[where] = r
        gap[where] = r if s.rank >= n else torch.where(torch.isnan(r), r, math.inf)
    return gap, rng


def _runs(shapes: list[tuple[int, ...]]) -> list[slice]:
    """Slices of 0..B−1 in order: the first and the last alone (an MLP's W_1 (d × d_in) and
    head (C × d)), the rest in runs of equal shape (W_2..W_L)."""
    B = len(shapes)
    if B <= 2:
        return [slice(i, i + 1) for i in range(B)]
    out, lo = [slice(0, 1)], 1
    for i in range(2, B):
        if shapes[i] != shapes[lo] or i == B - 1:
            out.append(slice(lo, i))
            lo = i
    out.append(slice(B - 1, B))
    return [g for g in out if g.stop > g.start]


def _weight_stacks(W: list[Tensor]) -> list[Tensor]:
    """Equal-shape groups in block order (`_runs`) — for the MLP W_1 (d × d_in), W_2..W_L
    (d × d), W_head (C × d) — each turned to its smaller side (W Wᵀ and Wᵀ W share their
    non-zero spectrum). A kernel (out, in, k, k) counts as the matrix (out, in·k·k)."""
    W = [w.reshape(w.shape[0], -1) for w in W]
    stacks = [torch.stack(W[g]) for g in _runs([tuple(w.shape) for w in W])]
    return [s if s.shape[1] <= s.shape[2] else s.mT for s in stacks]


def _grad_norms(grads: list[list[Tensor]]) -> Tensor:
    """‖∂L/∂θ‖_F over each layer's listed weights (float64, NaN for a layer without any): one
    stacked reduction per equal-shape run where every layer has one weight (the MLP)."""
    if all(len(g) == 1 for g in grads):
        flat = [g[0] for g in grads]
        runs = _runs([tuple(g.shape) for g in flat])
        return torch.cat([frobenius_norms(flat[r]) for r in runs])
    device = next(t.device for g in grads for t in g)
    return torch.stack(
        [
            torch.linalg.vector_norm(torch.cat([t.reshape(-1) for t in g]), dtype=F64)
            if g
            else torch.tensor(math.nan, dtype=F64, device=device)
            for g in grads
        ]
    )


def rms_and_mean_cosine(H: Tensor) -> tuple[float, float]:
    """Of a representation H (n, ...): its root mean square over every entry (the "length" q of
    mean-field theory: √(tr G/(n·d)) for the Gram G = HHᵀ of the flattened samples) and the mean
    off-diagonal cosine similarity between its samples (the "correlation"), from
    Σ_{i≠j} cos(h_i, h_j) = ‖Σ_i h_i/‖h_i‖‖² − k in O(nd). Samples that are exactly zero have no
    direction and are left out (k counts the others); fewer than two → NaN. float64."""
    M = H.detach().reshape(H.shape[0], -1).to(F64)
    rms = float(torch.sqrt(M.square().mean()))
    norms = torch.linalg.vector_norm(M, dim=1)
    keep = norms != 0
    k = int(keep.sum())
    if k < 2:
        return rms, math.nan
    u = (M[keep] / norms[keep, None]).sum(dim=0)
    return rms, float((u.square().sum() - k) / (k * (k - 1)))


def _indices_by_shape(tensors: Sequence[Tensor]) -> list[list[int]]:
    """The indices of `tensors`, grouped by shape (groups in order of first appearance)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(tuple(t.shape), []).append(i)
    return list(groups.values())


def _by_shape(H: list[Tensor]) -> list[tuple[list[int], Tensor, Tensor]]:
    """Per distinct shape of the H[i] (n, d_i): its indices and `_supports` masks (one group
    for an MLP, whose taps are all (n, d))."""
    return [(idx, *_supports([H[i] for i in idx])) for idx in _indices_by_shape(H)]


def probe_metrics(
    net: Net | nn.Spec,
    params: nn.Params,
    state: nn.State,
    x: Tensor,
    y: Tensor,
    *,
    spectra: bool = False,
) -> dict[str, np.ndarray | float]:
    """The per-layer metrics of a network (a `Net` of workers/models, or an MLP's nn.Spec) on the
    probe batch x (n, d_in), y (n,).

    As the papers measure (Meterez et al. 2024, Sec. 6): normalization layers use the probe
    batch's own statistics (train-mode behaviour), and ‖∂L/∂W_ℓ‖_F is the gradient of the mean
    cross-entropy of that batch. Nothing is written: running statistics are neither read nor
    updated, gradients come from `torch.autograd.grad` on detached copies of the weights (so no
    `.grad` changes), and no optimizer is involved.

    Returns the record fields "isometry_gap/<kind>" and "range_isometry_gap/<kind>" for each of
    the net's kinds (MLP: linear, norm — absent for norm = "none" — and act), "weight_isometry_gap"
    (of each block's first listed weight), "grad_norm" (over all of the block's listed weights),
    "rms" and "mean_cosine" (of each block's output, `rms_and_mean_cosine`) — float64 arrays (L,),
    index 0 ↔ block 1 — the floats "head_grad_norm", "head_weight_isometry_gap", and for nets
    with tokens "token_isometry_gap", "token_cosine" (workers/token_metrics.py). isometry_gap
    is +∞ where the network forces rank(H) < n (`Net.structures`); range_isometry_gap is the gap
    on the complement of that structural null space (equal elsewhere). A tap's sample Gram is of
    the tap reshaped (n, −1).

    With spectra, also "spectrum/<kind>" (L, n) and "spectrum/weight" (L, the largest
    min(out, in)); NaN-padded for smaller ones): every Gram's eigenvalues, descending,
    unnormalized, as squared float64 singular values (the last n − d of an n > d Gram are exact
    zeros).
    """
    if isinstance(net, nn.Spec):
        from workers.models.mlp import MLPNet

        net = MLPNet.of_spec(net)
    names = _weight_names(net)
    p = {k: v.detach().requires_grad_(k in names) for k, v in params.items()}
    with torch.enable_grad():
        logits, taps = net.forward(p, state, x, "batch", taps=True)
        loss = F.cross_entropy(logits, y)
        grads = _grads(loss, [p[k] for k in names], names)
    assert taps is not None
    return _measure(net, [_Member(p, x, taps, grads)], spectra=spectra)[0]


def probe_metrics_packed(
    net: Net,
    params: nn.Params,
    state: nn.State,
    X: Tensor,
    Y: Tensor,
    *,
    spectra: bool = False,
) -> list[dict[str, np.ndarray | float]]:
    """`probe_metrics` of K networks of one shape at once (a pack: workers/packed.py): params
    and state stacked (K, …), probe batches X (K, n, d_in), Y (K, n). One vmap'd forward and
    backward for all, the float64 factorizations of all members' taps in shared batched calls;
    member k's record fields are those probe_metrics gives for its slices, up to the batched
    kernels' rounding of the forward pass (bit-identical where they round alike)."""
    from torch.func import vmap

    K, n = X.shape[0], X.shape[1]
    names = _weight_names(net)
    p = {k: v.detach().requires_grad_(k in names) for k, v in params.items()}

    def one(p_: nn.Params, s_: nn.State, x_: Tensor) -> tuple:
        logits, taps = net.forward(p_, s_, x_, "batch", taps=True)
        assert taps is not None
        return logits, taps.layers, taps.outputs, taps.tokens or []

    with torch.enable_grad():
        logits, layers, outputs, tokens = vmap(one)(p, state, X)
        per_member = F.cross_entropy(logits.flatten(0, 1), Y.flatten(), reduction="none")
        loss = per_member.view(K, n).mean(dim=1).sum()  # each member's gradient is its own
        grads = _grads(loss, [p[k] for k in names], names)
    members = [
        _Member(
            {k: v[m] for k, v in p.items()},
            X[m],
            Taps(
                {k: [t[m] for t in ts] for k, ts in layers.items()},
                [t[m] for t in outputs],
                [t[m] for t in tokens] if tokens else None,
            ),
            {k: g[m] for k, g in grads.items()},
        )
        for m in range(K)
    ]
    return _measure(net, members, spectra=spectra)


def _weight_names(net: Net) -> list[str]:
    """The weights whose gradients are measured: every block's listed ones, then the head's."""
    return [w for ws in net.layer_weights() for w in ws] + [net.head_weight]


def _grads(loss: Tensor, wrt: list[Tensor], names: list[str]) -> dict[str, Tensor]:
    # a weight the loss does not reach (a registered model's unused one) has gradient 0
    g = torch.autograd.grad(loss, wrt, allow_unused=True, materialize_grads=True)
    return dict(zip(names, g, strict=True))


@dataclass
class _Member:
    """One network's forward pass on its probe batch: what `_measure` turns into its record."""

    p: nn.Params
    x: Tensor
    taps: Taps
    grads: dict[str, Tensor]


def _measure(
    net: Net, members: list[_Member], *, spectra: bool = False
) -> list[dict[str, np.ndarray | float]]:
    """The record fields of each member (see probe_metrics): its taps' structures member by
    member, the factorizations of every member's taps grouped by (structure, shape) into shared
    batched calls, the weights' likewise."""
    L, kinds = net.depth, list(net.kinds)
    layer_weights = net.layer_weights()
    # Per member, its distinct taps (an identity σ returns its input: one Gram is enough),
    # deduplicated before detaching (which makes new objects); kind-major, block-minor.
    uniqs, wheres, H = [], [], []
    for m in members:
        uniq, where = _unique([t for k in kinds for t in m.taps.layers[k]])
        uniqs.append(uniq)
        wheres.append(where)
        H += [t.detach().reshape(len(m.x), -1) for t in uniq]  # stacked only in chunks
    owner = [(j, i) for j, u in enumerate(uniqs) for i in range(len(u))]
    groups = _by_shape(H)  # zero rows and columns, counted once per tap
    known: dict[int, tuple[int, int]] = {}
    for at, rows, cols in groups:
        counts = torch.stack([rows.sum(dim=1), cols.sum(dim=1)], dim=1).tolist()
        for g, c in zip(at, counts, strict=True):
            j, i = owner[g]
            known[id(uniqs[j][i])] = (c[0], c[1])

    def fit(s: Structure, h: Tensor) -> Structure:
        return refine(s, h, known.get(id(h)))

    kind_of: list[Structure] = []
    for m, where in zip(members, wheres, strict=True):
        forced = net.structures(m.p, m.x, m.taps, fit)
        first = {}
        for i, w in enumerate(where):
            first.setdefault(w, forced[kinds[i // L]][i % L])
        kind_of += [first[w] for w in range(len(first))]
    device = members[0].x.device
    gap = torch.empty(len(H), dtype=F64, device=device)
    rng = torch.empty_like(gap)
    for at, rows, cols in groups:
        sub = torch.tensor(at, device=device)
        gap[sub], rng[sub] = _tap_gaps([H[g] for g in at], [kind_of[g] for g in at], (rows, cols))
    firsts = [ws[0] if ws else None for ws in layer_weights]
    has_weight = [i for i, k in enumerate(firsts) if k is not None] + [L]
    wgaps = _weight_gaps(
        [[m.p[k].detach() for k in firsts if k is not None] + [m.p[net.head_weight].detach()]
         for m in members]
    )  # fmt: skip
    rms, cos = _rms_and_cosines([t for m in members for t in m.taps.outputs], len(members), L)
    tokens = None
    if members[0].taps.tokens is not None:
        from workers.token_metrics import token_metrics

        flat = token_metrics([t.detach() for m in members for t in m.taps.tokens or []])
        tokens = {k: v.reshape(len(members), L) for k, v in flat.items()}
    outs: list[dict[str, np.ndarray | float]] = []
    start = 0
    for j, m in enumerate(members):
        mine = slice(start, start + len(uniqs[j]))
        start = mine.stop
        idx = torch.tensor(wheres[j], device=device)
        out: dict[str, np.ndarray | float] = {}
        for name, values in (("isometry_gap", gap[mine]), ("range_isometry_gap", rng[mine])):
            per_kind = values[idx].cpu().numpy().reshape(len(kinds), L)
            out.update({f"{name}/{k}": v for k, v in zip(kinds, per_kind, strict=True)})
        wgap = np.full(L + 1, math.nan)
        wgap[has_weight] = wgaps[j]
        gnorm = (
            _grad_norms(
                [[m.grads[k] for k in ws] for ws in layer_weights] + [[m.grads[net.head_weight]]]
            )
            .cpu()
            .numpy()
        )
        out["weight_isometry_gap"] = wgap[:L]
        out["grad_norm"] = gnorm[:L]
        out["head_grad_norm"] = float(gnorm[L])
        out["head_weight_isometry_gap"] = float(wgap[L])
        out["rms"], out["mean_cosine"] = rms[j], cos[j]
        if tokens is not None:
            out.update({k: v[j] for k, v in tokens.items()})
        if spectra:
            W = [m.p[k].detach() for k in firsts if k is not None]
            out.update(_spectra(H[mine], idx, kinds, W, L))
        outs.append(out)
    return outs


def _weight_gaps(W: list[list[Tensor]]) -> list[np.ndarray]:
    """weight_isometry_gaps of each member's weights (lists of equal layout), the members'
    equal-shape stacks (`_weight_stacks`) joined into one batched call each."""
    stacks = [_weight_stacks(w) for w in W]
    joined = [torch.cat([s[i] for s in stacks]) for i in range(len(stacks[0]))]
    gaps = [weight_isometry_gaps(s).cpu().numpy() for s in joined]
    sizes = [len(s) for s in stacks[0]]
    return [
        np.concatenate([g[j * size : (j + 1) * size] for g, size in zip(gaps, sizes, strict=True)])
        for j in range(len(W))
    ]


def _rms_and_cosines(outputs: list[Tensor], K: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """`rms_and_mean_cosine` of K·L block outputs (member-major) as (K, L) arrays, batched per
    shape."""
    rms = np.empty(K * L)
    cos = np.empty(K * L)
    for at in _indices_by_shape(outputs):
        M = torch.stack([outputs[i].detach() for i in at]).flatten(2).to(F64)  # (B, n, f)
        r = torch.sqrt(M.square().mean(dim=(1, 2)))
        norms = torch.linalg.vector_norm(M, dim=2)  # (B, n)
        keep = norms != 0
        k = keep.sum(dim=1).to(F64)
        unit = torch.where(keep[..., None], M / torch.where(keep, norms, 1.0)[..., None], 0.0)
        u = unit.sum(dim=1).square().sum(dim=1)
        c = torch.where(k >= 2, (u - k) / (k * (k - 1)).clamp_min(1), math.nan)
        rms[at], cos[at] = r.cpu().numpy(), c.cpu().numpy()
    return rms.reshape(K, L), cos.reshape(K, L)


def _spectra(H: list[Tensor], idx: Tensor, kinds: list[str], W: list[Tensor], L: int) -> dict:
    """The "spectrum/*" record fields of `probe_metrics`."""
    n = H[0].shape[0]
    lam = torch.empty(len(H), n, dtype=F64, device=H[0].device)
    for group in _indices_by_shape(H):
        lam[torch.tensor(group, device=lam.device)] = torch.cat(
            [spectra(c, n) for c in _stacked(H, group)]
        )
    per_kind = lam[idx].cpu().numpy().reshape(len(kinds), L, n)
    out = {f"spectrum/{k}": v for k, v in zip(kinds, per_kind, strict=True)}
    if not W:
        return out
    W = [w.reshape(w.shape[0], -1) for w in W]
    size = max(min(w.shape) for w in W)
    small = [w if w.shape[0] <= w.shape[1] else w.mT for w in W]
    # W_1 alone, then runs of equal shape (`_runs` keeps its last slot for a head; a
    # placeholder takes it, so W_L stays in the run of W_2..W_L as before the families)
    runs = _runs([tuple(w.shape) for w in small] + [()])[:-1]
    out["spectrum/weight"] = (
        torch.cat([spectra(torch.stack(small[r]), size) for r in runs]).cpu().numpy()
    )
    return out
