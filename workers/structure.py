"""What a network forces on the rank of its representations, whatever their numbers are: the
structural-rank tracker that the model families (workers/models) and the measurement
(workers/metrics.py) both use.

A Gram G = HHᵀ of a representation H (n × d) is singular exactly when the architecture forces
rank(H) < n — n > d, a centring normalization and the maps that carry its null space forward —
and then its isometry gap is +∞ (docs/science.md). `Structure` is that upper bound on the rank
(and whether 1 is in G's null space); each family follows it through its blocks with the rules
below (`structures` for the MLP; the other families' `Net.structures`), and each tap's bound is
refined by its own exactly zero rows and columns (`refine`). A registered module's taps are
followed through the module itself (workers/models/registered.py, `module_structures`), with the
same rules per torch.nn layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from workers import nn


@dataclass(frozen=True)
class Structure:
    """What the network forces on a representation H (n × d) whatever its numbers are.

    ones_in_null: 1ᵀH = 0 exactly (every feature centred over the batch), so G·1 = 0.
    rank: an upper bound on rank(H); G is structurally singular iff rank < n, with structural
    null dimension n − rank.
    """

    ones_in_null: bool
    rank: int
    # False where the network's structure could not be derived (a registered module that
    # tracing cannot see and no declaration covers): rank is then only min(n, features) and
    # its zero rows and columns, and the gap's error bar is at the forward pass's precision
    # (workers/metrics.py): a Gram that may be exactly singular is never reported as resolved.
    known: bool = True


# refines a tap's structural rank bound by its own zero rows and columns (`refine`)
Fit = Callable[[Structure, Tensor], Structure]


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
    return Structure(s.ones_in_null, max(rank, 0), s.known)


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
