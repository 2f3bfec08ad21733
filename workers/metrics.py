"""Measurements of one network on the probe batch: isometry gaps, weight gaps, gradient norms.

The isometry of an n × n Gram matrix G with eigenvalues λ₁..λₙ (Joudaki et al. 2023, Eq. 3) is
I(G) = det(G)^(1/n) / (tr(G)/n); its gap is −log I(G) = log(mean λ) − mean(log λ) ∈ [0, ∞].
Every gap here is computed from float64 eigenvalues of Grams stacked into as few `eigvalsh` calls
as there are distinct Gram sizes — never one call per layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from workers import nn

# Grams of one eigvalsh call hold at most this many float64 entries (≈ 128 MiB): depth 1000 at
# batch 100 fits in two calls, and a huge batch cannot take the machine's memory.
MAX_EIG_ENTRIES = 1 << 24
F64 = torch.float64


def singular_tol(n: int, d: int, dtype: torch.dtype) -> float:
    """Relative size below which the smallest eigenvalue of G = H Hᵀ (H: n × d) counts as zero.

    tol = k·(ε_H² + 64·ε₆₄), k = max(n, d). Why:
    - H is known to the precision of its dtype: rounding each entry (|δh| ≤ ε_H|h|) moves a
      singular value by at most ‖δH‖_F ≤ ε_H‖H‖_F ≤ √k·ε_H·σ_max, so σ_min/σ_max below √k·ε_H —
      λ_min/λ_max below k·ε_H² — cannot be told from 0 (float32, k = 100: 1.4e-12).
    - Forming G and `eigvalsh` in float64 err by O(k·ε₆₄·λ_max): the floor for float64 H.
    Measured on float32 networks, exactly singular Grams (centering BatchNorm/LayerNorm outputs,
    identity σ or Linear right after them) read λ_min/λ_max ≲ 1e-14, ≥ 20× under tol at any
    n = d ≥ 8, while ill-conditioned Grams of Gaussian-init layers read 1e-9..1e-12 and stay
    finite. The worst-case bound (k·ε_H)² would turn those into +inf.
    """
    k = max(n, d)
    return k * (torch.finfo(dtype).eps ** 2 + 64 * torch.finfo(F64).eps)


def gaps_from_eigenvalues(lam: Tensor, tol: Tensor | float) -> Tensor:
    """Isometry gaps from ascending eigenvalues. lam: (B, n) float64 → (B,).

    Singular (λ_min ≤ tol·λ_max, or λ_max ≤ 0: the zero Gram) gives +inf. Rounding can make a
    perfect isometry read −1e-16; the gap is ≥ 0 by AM ≥ GM, so it is clamped there.
    """
    lam_min, lam_max = lam[:, 0], lam[:, -1]
    singular = (lam_max <= 0) | (lam_min <= tol * lam_max)
    safe = torch.where(singular.unsqueeze(1), torch.ones_like(lam), lam)  # keeps log finite
    gap = torch.log(safe.mean(dim=1)) - torch.log(safe).mean(dim=1)
    return torch.where(singular, torch.full_like(gap, math.inf), gap.clamp_min(0.0))


def gram_gaps(G: Tensor, tol: Tensor | float) -> Tensor:
    """Isometry gaps of symmetric PSD Grams. G: (B, n, n) → (B,) float64.

    A Gram with a non-finite entry has no defined gap: NaN (it is swapped for I before the
    eigenvalue call, which would otherwise fail or return garbage). For a Gram H Hᵀ a non-finite
    entry implies a non-finite diagonal, so the trace tells, at O(n) per matrix.
    """
    G = G.to(F64)
    finite = torch.isfinite(torch.diagonal(G, dim1=-2, dim2=-1).sum(dim=-1))  # (B,)
    if not bool(finite.all()):
        eye = torch.eye(G.shape[-1], dtype=F64, device=G.device)
        G = torch.where(finite[:, None, None], G.nan_to_num(0.0, 0.0, 0.0), eye)
    per_call = max(1, MAX_EIG_ENTRIES // G.shape[-1] ** 2)
    lam = torch.cat([torch.linalg.eigvalsh(c) for c in G.split(per_call)])  # (B, n) ascending
    gaps = gaps_from_eigenvalues(lam, tol)
    return torch.where(finite, gaps, torch.full_like(gaps, math.nan))


@dataclass
class _Job:
    """A stack M (B, r, c) whose Grams M Mᵀ (B, r, r) need gaps; r > c means singular by rank."""

    M: Tensor
    tol: float

    @property
    def rank_deficient(self) -> bool:
        return self.M.shape[1] > self.M.shape[2]


def _batched_gaps(jobs: list[_Job]) -> list[Tensor]:
    """Gaps of every job's Grams, with one `eigvalsh` per distinct Gram size (chunked by memory).

    The float64 Grams of equal size are written straight into one buffer (no copies), from
    float64 chunks of each stack.
    """
    out: list[Tensor] = [torch.empty(0)] * len(jobs)
    sizes: dict[int, list[int]] = {}  # Gram size r → the jobs that have it
    for i, job in enumerate(jobs):
        if job.rank_deficient:  # n > d: G = H Hᵀ has rank ≤ d < n, singular exactly
            finite = torch.isfinite(job.M).flatten(1).all(dim=1)
            out[i] = torch.where(finite, math.inf, math.nan).to(F64)
        else:
            sizes.setdefault(job.M.shape[1], []).append(i)
    for r, idx in sizes.items():
        counts = [len(jobs[i].M) for i in idx]
        device = jobs[idx[0]].M.device
        G = torch.empty(sum(counts), r, r, dtype=F64, device=device)  # (ΣB, r, r)
        tol = torch.tensor([jobs[i].tol for i in idx], dtype=F64)
        tol = tol.repeat_interleave(torch.tensor(counts))  # (ΣB,)
        start = 0
        for i in idx:
            M = jobs[i].M  # (B, r, c)
            for Mc in M.split(max(1, MAX_EIG_ENTRIES // (r * M.shape[2]))):
                m = Mc.to(F64)
                torch.matmul(m, m.mT, out=G[start : start + len(m)])
                start += len(m)
        gaps = gram_gaps(G, tol.to(device))
        for i, g in zip(idx, gaps.split(counts), strict=True):
            out[i] = g
    return out


def isometry_gaps(H: Tensor) -> Tensor:
    """Gaps of the sample Grams G = H Hᵀ of a stack of representations. H: (B, n, d) → (B,).

    G is over samples (n × n; Joudaki et al. 2023, Sec. 3), formed and diagonalized in float64;
    n > d makes G singular (+inf), as does any H whose rows are linearly dependent to within the
    precision of H's dtype (see `singular_tol`).
    """
    n, d = H.shape[1:]
    return _batched_gaps([_Job(H, singular_tol(n, d, H.dtype))])[0]


def isometry_gap(H: Tensor) -> float:
    """gap(H Hᵀ) of one (n, d) representation."""
    return float(isometry_gaps(H.unsqueeze(0))[0])


def _weight_job(W: Tensor) -> _Job:
    """The Gram on W's smaller side: W Wᵀ (out ≤ in) or Wᵀ W (out > in) — the same non-zero
    spectrum, and exactly I for a semi-orthogonal W, so an orthogonal init reads 0 also for the
    first layer (in ≠ width) and the head."""
    out, inp = W.shape[-2:]
    M = W if out <= inp else W.mT
    return _Job(M, singular_tol(out, inp, W.dtype))


def weight_isometry_gaps(W: Tensor) -> Tensor:
    """Weight isometry gaps gap(W Wᵀ) (SCIENCE.md; Meterez et al. 2024, Sec. 6) of a stack of
    equal-shape weights W: (B, out, in) → (B,), Gram on the smaller side (see `_weight_job`)."""
    return _batched_gaps([_weight_job(W)])[0]


def weight_isometry_gap(W: Tensor) -> float:
    return float(weight_isometry_gaps(W.unsqueeze(0))[0])


def frobenius_norms(tensors: Sequence[Tensor]) -> Tensor:
    """‖T‖_F of each of a non-empty sequence of equal-shape tensors, accumulated in float64 → (len,)
    float64."""
    return torch.linalg.vector_norm(torch.stack(tensors).flatten(1), dim=1, dtype=F64)


def cosine_gram(x: Tensor) -> np.ndarray:
    """The unit-diagonal Gram x_i·x_j / (‖x_i‖‖x_j‖) of (n, d) inputs, float64 (n, n): the
    starting point of the mean-field Gram recursion (Joudaki et al. 2023, Thm 5.1)."""
    x = x.to(F64)
    u = x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
    return (u @ u.T).cpu().numpy()


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


def probe_metrics(
    spec: nn.Spec, params: nn.Params, state: nn.State, x: Tensor, y: Tensor
) -> dict[str, np.ndarray | float]:
    """The per-layer metrics of the network on the probe batch x (n, d_in), y (n,).

    As the papers measure (Meterez et al. 2024, Sec. 6): normalization layers use the probe
    batch's own statistics (train-mode behaviour), and ‖∂L/∂W_ℓ‖_F is the gradient of the mean
    cross-entropy of that batch. Nothing is written: running statistics are neither read nor
    updated, gradients come from `torch.autograd.grad` on detached copies of the weights (so no
    `.grad` changes), and no optimizer is involved.

    Returns the record fields "isometry_gap/linear", "isometry_gap/norm" (absent for norm =
    "none"), "isometry_gap/act", "weight_isometry_gap", "grad_norm" as float64 arrays (L,), index
    0 ↔ block 1, and the floats "head_grad_norm", "head_weight_isometry_gap".
    """
    L = spec.depth
    names = [f"W{ell}" for ell in range(1, L + 1)] + ["W_head"]
    p = {k: v.detach().requires_grad_(k in names) for k, v in params.items()}
    with torch.enable_grad():
        logits, taps = nn.forward(spec, p, state, x, "batch", taps=True)
        loss = F.cross_entropy(logits, y)
        grads = torch.autograd.grad(loss, [p[k] for k in names])
    kinds = ["linear", "norm", "act"] if spec.norm != "none" else ["linear", "act"]
    slot = {"linear": 0, "norm": 1, "act": 2}
    # Deduplicated before detaching (which makes new objects): an identity σ returns its input.
    uniq, where = _unique([t[slot[k]] for k in kinds for t in taps])  # kind-major, block-minor
    H = torch.stack([t.detach() for t in uniq])
    # Equal-shape groups, in block order: W_1 (d × d_in), W_2..W_L (d × d), W_head (C × d).
    W = [p[k].detach() for k in names]
    groups = [slice(0, 1), slice(1, L), slice(L, L + 1)]  # the middle one is empty when L = 1
    jobs = [_Job(H, singular_tol(*H.shape[1:], H.dtype))]
    jobs += [_weight_job(torch.stack(W[g])) for g in groups if W[g]]
    rep_gaps, *w_gaps = _batched_gaps(jobs)
    rep = rep_gaps[torch.tensor(where, device=rep_gaps.device)].cpu().numpy()
    wgap = torch.cat(w_gaps).cpu().numpy()  # (L + 1,): blocks 1..L, then the head
    gnorm = torch.cat([frobenius_norms(grads[g]) for g in groups if grads[g]]).cpu().numpy()
    out: dict[str, np.ndarray | float] = {
        f"isometry_gap/{k}": r for k, r in zip(kinds, rep.reshape(len(kinds), L), strict=True)
    }
    out["weight_isometry_gap"] = wgap[:L]
    out["grad_norm"] = gnorm[:L]
    out["head_grad_norm"] = float(gnorm[L])
    out["head_weight_isometry_gap"] = float(wgap[L])
    return out
