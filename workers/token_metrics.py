"""Token metrics of a transformer's stream (docs/models.md): per layer, over the probe batch,

- "token_isometry_gap": for each sample its T × T token Gram G = X Xᵀ (X: the sample's T tokens,
  (T, d)), gap(G) = −log(det(G)^(1/T) / (tr(G)/T)) (Joudaki et al. 2023, Eq. 3, with a token as
  the "sample": their Appendix B), averaged over the probe samples. +∞ where a sample's Gram is
  singular in a way the numbers show exactly — T > d (the Gram has rank ≤ d), a token that is
  exactly 0, two exactly equal tokens (a rank-collapsed sample: all its tokens identical to float
  precision), or fewer non-zero features than tokens — and hence +∞ for the layer if any
  sample's is; NaN for non-finite tokens. Everything else is finite, however ill-conditioned
  (computed as workers/gaps.py computes the sample gaps, batched over samples, in float64).
- "token_cosine": the mean off-diagonal cosine similarity between a sample's tokens,
  (‖Σ_t u_t‖² − T) / (T(T − 1)) with u_t = x_t/‖x_t‖, averaged over the samples: 1 is rank
  collapse (all tokens parallel), 0 for orthogonal tokens. A sample with an exactly zero token
  has no cosine: NaN, and then the layer's average is NaN too (an undefined value is shown, not
  dropped); T = 1 has no pairs: NaN.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from workers.gaps import F64, isometry_gaps
from workers.structure import Structure

TOKEN_METRICS = ("token_isometry_gap", "token_cosine")


def repeated_tokens(X: Tensor) -> Tensor:
    """Whether a sample has two exactly equal tokens, X (n, T, d) → (n,) bool: each token's bit
    pattern (−0 made +0) is hashed with integer arithmetic — exact, so equal tokens hash equal
    whatever kernel computed them — the hashes sorted, and each adjacent equal pair compared
    value by value (no false positive; a hash collision between different tokens, ~2⁻⁶⁴, can
    only hide a repeat)."""
    n, t, d = X.shape
    if t < 2 or X.numel() == 0:
        return torch.zeros(n, dtype=torch.bool, device=X.device)
    Z = (X + 0.0).contiguous()
    bits = Z.view(torch.int32 if Z.element_size() == 4 else torch.int64).to(torch.int64)
    h = (bits * _multipliers(d, X.device)).sum(dim=2)  # (n, T), wrapping int64
    hs, order = h.sort(dim=1)
    same = hs[:, 1:] == hs[:, :-1]  # (n, T − 1) candidate pairs
    if not bool(same.any()):
        return torch.zeros(n, dtype=torch.bool, device=X.device)
    idx = order.unsqueeze(2).expand(-1, -1, d)
    Y = Z.gather(1, idx)  # tokens in hash order
    equal = (Y[:, 1:] == Y[:, :-1]).all(dim=2) & same
    return equal.any(dim=1)


def _multipliers(d: int, device: torch.device) -> Tensor:
    """d fixed odd int64 multipliers (the same for every call)."""
    g = torch.Generator().manual_seed(0x70CE + d)
    m = torch.randint(-(2**62), 2**62, (d,), generator=g, dtype=torch.int64) * 2 + 1
    return m.to(device)


def token_gaps(X: Tensor) -> Tensor:
    """gap of each sample's token Gram, X (n, T, d) → (n,) float64 (module docstring)."""
    _, t, d = X.shape
    if d < t:  # rank ≤ d < T for every sample
        return isometry_gaps(X, Structure(False, d))
    nz = X != 0
    rows = nz.any(dim=2).sum(dim=1)  # non-zero tokens
    cols = nz.any(dim=1).sum(dim=1)  # non-zero features
    # rank < T whatever the numbers are: a zero token, too few non-zero features, or a repeat
    forced = (rows < t) | (cols < t) | repeated_tokens(X)
    if not bool(forced.any()):
        return isometry_gaps(X, Structure(False, t))  # NaN for non-finite samples
    gap = isometry_gaps(X, Structure(False, 0))  # +∞, or NaN for non-finite samples
    keep = ~forced
    if bool(keep.any()):
        gap[keep] = isometry_gaps(X[keep], Structure(False, t))
    return gap


def token_cosines(X: Tensor) -> Tensor:
    """Mean off-diagonal cosine between each sample's tokens, X (n, T, d) → (n,) float64."""
    t = X.shape[1]
    X = X.to(F64)
    norms = torch.linalg.vector_norm(X, dim=2, keepdim=True)  # (n, T, 1); 0 → NaN below
    u = torch.where(norms > 0, X / norms, math.nan)
    if t < 2:
        return torch.full(X.shape[:1], math.nan, dtype=F64, device=X.device)
    s = u.sum(dim=1).square().sum(dim=1)  # ‖Σ u_t‖² = Σ_{s,t} cos(s, t)
    return (s - t) / (t * (t - 1))


def token_metrics(tokens: list[Tensor]) -> dict[str, np.ndarray]:
    """ "token_isometry_gap" and "token_cosine", float64 arrays (L,), from the L stream tensors
    (n, T, d) of `Taps.tokens` (index 0 ↔ block 1)."""
    if not tokens:
        return {k: np.zeros(0) for k in TOKEN_METRICS}
    n = tokens[0].shape[0]
    with torch.no_grad():  # one batched call over all L·n token sets (the shapes are equal)
        X = torch.cat([t.detach() for t in tokens])
        gaps = token_gaps(X).reshape(len(tokens), n).mean(dim=1)
        cos = token_cosines(X).reshape(len(tokens), n).mean(dim=1)
    return {"token_isometry_gap": gaps.cpu().numpy(), "token_cosine": cos.cpu().numpy()}
