"""The isometry gaps of stacks of representations, in float64 from a factor (the numerical core
that workers/metrics.py and workers/token_metrics.py both use; the factorizations and their
error bounds are workers/factors.py's).

The isometry of an n × n Gram matrix G with eigenvalues λ₁..λₙ (Joudaki et al. 2023, Eq. 3) is
I(G) = det(G)^(1/n) / (tr(G)/n); its gap is −log I(G) = log(mean λ) − mean(log λ) ∈ [0, ∞]. The
definition — including when it is +∞ — is `service.isometry`'s; this module computes the same
formula batched in torch (CPU or CUDA), and the tests hold it to that module on the same inputs.
Whether a Gram is singular comes from its `Structure` (workers/structure.py), not from rounding.

How (`range_gaps`): a regular Gram is never formed. log det G comes from a float64 factor of M:
the LU PM = LU of a square M (G = MMᵀ, log det G = 2Σ log|U_ii|, (2/3)n³ flops) or the
Householder QR of Mᵀ otherwise (G = RᵀR, (4/3)n³ at n = d), so gap = log(‖M‖²_F/n) − (1/n)
log det G, accurate to ~ ε₆₄·κ(M) = ε₆₄·√κ(G) (Cholesky of a formed G would be ~ ε₆₄·κ(G), and
eigvalsh worse). A batch-centred square H (1 in the null space, rank n − 1) goes through one LU
of the bordered H + 1wᵀ (`_centred_square_gaps`). An inverse-iteration step through the factor
estimates κ(G); the few beyond KAPPA_MAX go to the float64 singular values σ of M instead
(λ = σ²). Range gaps of fewer eigenvalues than the smaller side (a rank-deficient tap) take the
top eigenvalues of the formed Gram where the tap's own rounding dominates what forming it
loses (float32 taps), the SVD elsewhere (`gram_eigh_gaps_and_errors`). All of it is batched over
layers, one call per distinct (structure, shape) — rank-deficient taps per shape, whatever
their ranks — and cache-sized chunk (CPU_CHUNK_ENTRIES).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from workers.factors import (
    EPS64,
    F64,
    KAPPA_MAX,
    KAPPA_UNRESOLVED,
    _factor_errors,
    _lambda_min_estimate,
    _lu_log_det,
    _qr_log_det,
    _start_vectors,
    _svd_gaps_and_errors,
    error_scale,
    gaps_from_eigenvalues,
    gram_eigh_gaps_and_errors,
)
from workers.structure import Structure

__all__ = [  # the factors' names that workers/metrics.py and the tests read from here
    "EPS64",
    "KAPPA_MAX",
    "KAPPA_UNRESOLVED",
    "_factor_errors",
    "_lambda_min_estimate",
    "_start_vectors",
    "error_scale",
    "gaps_from_eigenvalues",
]

# Matrices of one batched float64 call hold at most this many entries (≈ 128 MiB): a huge batch
# cannot take the machine's memory.
MAX_GRAM_ENTRIES = 1 << 24
# On the CPU, batched calls take at most this many entries (2 MiB of float64): a stack that
# stays in cache and in the allocator's reused memory runs ~1.7× faster than one large one
# (each fresh allocation of tens of MiB is page-faulted in anew; bench/overhead.py).
CPU_CHUNK_ENTRIES = 1 << 18


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
    `_full_rank_gaps`; otherwise the top eigenvalues of its formed Gram or its float64
    singular values (`range_gaps_and_errors`). Non-finite M gives NaN.
    Chunked (`_chunk_size`).
    """
    return range_gaps_and_errors(M, rank, ones_in_null=ones_in_null)[0]


def range_gaps_and_errors(
    M: Tensor,
    rank: int | Tensor,
    *,
    ones_in_null: bool = False,
    eps: float = EPS64,
    rounding: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """`range_gaps` and, for each, a bound on its absolute error from the route that computed
    it (workers/factors.py) at unit roundoff eps, with M's own entries each rounded once at
    unit roundoff `rounding` (‖δM‖_F ≤ rounding·‖M‖_F): +∞ where λ_min is below what that
    precision resolves; NaN for a non-finite M. `rank` may also be one rank per matrix (B,),
    each below min(n, d): rank-deficient matrices of one shape share their calls."""
    out, errs = [], []
    step = _chunk_size(M.shape[1:], M.device)
    per = isinstance(rank, Tensor)
    bordered = not per and ones_in_null and M.shape[1] == M.shape[2] == rank + 1
    for lo in range(0, len(M), step):
        chunk = M[lo : lo + step]
        if bordered:
            g, e = _centred_square_gaps(chunk, eps, rounding)
            out.append(g)
            errs.append(e)
            continue
        if ones_in_null:
            chunk = project_out_ones(chunk)
        m, c = chunk.shape[1:]
        if not per and rank >= min(m, c):
            g, e = _full_rank_gaps_and_errors(chunk if m <= c else chunk.mT, eps, rounding)
        else:
            ranks = rank[lo : lo + step] if per else torch.full((len(chunk),), rank)
            finite = _all_finite(chunk)
            safe = chunk.to(F64)
            if not bool(finite.all()):
                safe = torch.where(finite[:, None, None], safe, 0.0)
            g, e = gram_eigh_gaps_and_errors(safe, ranks, eps, rounding)
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
    H: Sequence[Tensor],
    kinds: list[Structure],
    masks: tuple[Tensor, Tensor] | None = None,
    visit: Callable[[list[int], Tensor], None] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(gap, range gap, the gap's relative error bound) of each representation H[i] (n, d) (a
    list or a stack (B, n, d)) with structure kinds[i], float64. `masks`: `_supports(H)` if
    already known. `visit(indices, M)`, if given, sees each float64 stack M (b, n', d') of the
    H[i], i in indices, before it is factored — each tap is cast to float64 once, and what
    else needs it in float64 reads it there (workers/metrics.py: rms and mean_cosine); M holds
    the tap without its zero rows and columns.

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
    all_rows, all_cols = rows.all(dim=1).tolist(), cols.all(dim=1).tolist()
    groups: dict[tuple, list[int]] = {}
    trimmed: dict[int, Tensor] = {}
    for i, s in enumerate(kinds):
        if not all_rows[i]:
            trimmed[i] = H[i][rows[i]]
        if not all_cols[i]:
            trimmed[i] = trimmed.get(i, H[i])[:, cols[i]]
        shape = tuple(trimmed[i].shape) if i in trimmed else tuple(H[i].shape)
        # rank-deficient taps (the top-r spectrum of fewer than the smaller side) of one shape
        # share their calls whatever their ranks
        deficient = s.rank < min(shape[0] - int(s.ones_in_null), shape[1])
        key = (s.ones_in_null, s.known, None if deficient else s.rank, shape, H[i].dtype)
        groups.setdefault(key, []).append(i)
    for (ones, known, rank, _, dtype), idx in groups.items():
        where = torch.tensor(idx, device=gap.device)
        mats = [trimmed[i] if i in trimmed else H[i] for i in idx]
        ranks = torch.tensor([kinds[i].rank for i in idx])
        u = torch.finfo(dtype).eps / 2  # the tap's unit roundoff
        eps = EPS64 if known else max(EPS64, u)
        parts, done = [], 0
        for m in _stacked(mats, list(range(len(idx))), F64):
            if visit is not None:
                visit(idx[done : done + len(m)], m)
            r_arg = rank if rank is not None else ranks[done : done + len(m)]
            done += len(m)
            parts.append(range_gaps_and_errors(m, r_arg, ones_in_null=ones, eps=eps, rounding=u))
        r = torch.cat([q[0] for q in parts])
        rng[where] = r
        if rank is not None and rank >= n:
            e = torch.cat([q[1] for q in parts])
            gap[where] = r
            rel = torch.where(r > 0, e / r, torch.where(e == 0, 0.0, math.inf))
            err[where] = torch.where(torch.isnan(r) | torch.isnan(e), math.nan, rel)
        else:
            gap[where] = torch.where(torch.isnan(r), r, math.inf)
            err[where] = torch.where(torch.isnan(r), r, 0.0)
    return gap, rng, err
