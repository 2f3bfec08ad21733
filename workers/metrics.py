"""Measurements of one network on the probe batch: isometry gaps, weight gaps, gradient norms.

The isometry of an n × n Gram matrix G with eigenvalues λ₁..λₙ (Joudaki et al. 2023, Eq. 3) is
I(G) = det(G)^(1/n) / (tr(G)/n); its gap is −log I(G) = log(mean λ) − mean(log λ) ∈ [0, ∞]. The
definition — including when it is +∞ — is `service.isometry`'s; this module computes the same
formula batched in torch (CPU or CUDA), and the tests hold it to that module on the same inputs.

When a gap is +∞ is decided from the network, not from rounding (workers/structure.py): a Gram is
singular exactly when the architecture forces rank(H) < n — n > d, a centring normalization and
the maps that carry its null space forward. Everything else is regular, however ill-conditioned,
and gets a finite gap. Exact zeros that the numbers show still give +∞: a row of H that is
exactly zero (a sample a ReLU maps to 0) or a column that is (a unit dead on the whole batch)
lowers the rank bound (`refine`). Other exact dependences that neither reveals (e.g. two ReLU
units alive on one and the same sample only) read as a large finite gap set by float64 rounding
(σ_min ~ 1e-16·σ_max): the tracker cannot see them, and no tolerance can tell them from the
regular Grams of deep Gaussian chains, which reach λ_min/λ_max ≈ 1e-35 (docs/architecture.md).

The gaps themselves are workers/gaps.py's (float64 factors of each tap, batched over layers:
workers/factors.py); the structures workers/structure.py's. This module runs the probe and
assembles the record, reading each tap in float64 once: its gaps, range gaps and error bars,
and — where the tap is its block's output — rms and mean_cosine come from the same cast stack.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from workers import custom_metrics, nn
from workers.gaps import (
    CPU_CHUNK_ENTRIES,
    F64,
    KAPPA_MAX,
    KAPPA_UNRESOLVED,
    MAX_GRAM_ENTRIES,
    _full_rank_gaps,
    _lu_log_det,
    _qr_log_det,
    _stacked,
    _supports,
    _tap_gaps,
    frobenius_norms,
    gaps_from_eigenvalues,
    isometry_gap,
    isometry_gaps,
    project_out_ones,
    range_gaps,
    spectra,
    tap_gaps_and_errors,
    weight_isometry_gap,
    weight_isometry_gaps,
)
from workers.models.base import Net, Taps
from workers.structure import (
    Structure,
    _after_act,
    _after_linear,
    _after_norm,
    input_structure,
    refine,
    structures,
    support,
)
from workers.token_metrics import token_metrics

# the names other modules and the tests read from here (moved to workers/gaps.py and
# workers/structure.py; re-exported so that `metrics.isometry_gap` and the like keep working)
__all__ = [
    "CPU_CHUNK_ENTRIES",
    "F64",
    "KAPPA_MAX",
    "KAPPA_UNRESOLVED",
    "MAX_GRAM_ENTRIES",
    "Structure",
    "_after_act",
    "_after_linear",
    "_after_norm",
    "_full_rank_gaps",
    "_lu_log_det",
    "_qr_log_det",
    "_supports",
    "_tap_gaps",
    "frobenius_norms",
    "gaps_from_eigenvalues",
    "input_structure",
    "isometry_gap",
    "isometry_gaps",
    "probe_metrics",
    "probe_metrics_packed",
    "project_out_ones",
    "range_gaps",
    "refine",
    "rms_and_mean_cosine",
    "spectra",
    "structures",
    "support",
    "weight_isometry_gap",
    "weight_isometry_gaps",
]


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


def _grad_norms(grads: list[list[Tensor]]) -> np.ndarray:
    """‖∂L/∂θ‖_F over each layer's listed weights (float64, NaN for a layer without any), each
    weight's gradient read once (no stacked copy)."""
    out = np.full(len(grads), math.nan)
    norms = [
        torch.linalg.vector_norm(g[0] if len(g) == 1 else torch.cat([t.reshape(-1) for t in g]),
                                 dtype=F64)
        for g in grads
        if g
    ]  # fmt: skip
    if norms:
        out[[i for i, g in enumerate(grads) if g]] = torch.stack(norms).cpu().numpy()
    return out


def rms_and_mean_cosine(H: Tensor) -> tuple[float, float]:
    """Of a representation H (n, ...): its root mean square over every entry (the "length" q of
    mean-field theory: √(tr G/(n·d)) for the Gram G = HHᵀ of the flattened samples) and the mean
    off-diagonal cosine similarity between its samples (the "correlation"), from
    Σ_{i≠j} cos(h_i, h_j) = ‖Σ_i h_i/‖h_i‖‖² − k in O(nd). Samples that are exactly zero have no
    direction and are left out (k counts the others); fewer than two → NaN. float64."""
    M = H.detach().reshape(1, H.shape[0], -1).to(F64)
    rms, cos = _rms_and_cosines(M, torch.tensor([float(M.numel())], dtype=F64, device=M.device))
    return float(rms[0]), float(cos[0])


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
    tap_metrics: bool = False,
) -> dict[str, np.ndarray | float]:
    """The per-layer metrics of a network (a `Net` of workers/models, or an MLP's nn.Spec) on the
    probe batch x (n, d_in), y (n,).

    As the papers measure (Meterez et al. 2024, Sec. 6): normalization layers use the probe
    batch's own statistics (train-mode behaviour), and ‖∂L/∂W_ℓ‖_F is the gradient of the mean
    cross-entropy of that batch. Nothing is written: running statistics are neither read nor
    updated, gradients come from `torch.autograd.grad` on detached copies of the weights (so no
    `.grad` changes), and no optimizer is involved.

    Returns the record fields "isometry_gap/<kind>", "range_isometry_gap/<kind>" and
    "isometry_gap_error/<kind>" (a bound on the gap's relative error,
    `gaps.tap_gaps_and_errors`) for each of the net's kinds (MLP: linear, norm — absent for
    norm = "none" — and act), "weight_isometry_gap" (of each block's first listed weight),
    "grad_norm" (over all of the block's listed weights),
    "rms" and "mean_cosine" (of each block's output, `rms_and_mean_cosine`) — float64 arrays (L,),
    index 0 ↔ block 1 — the floats "head_grad_norm", "head_weight_isometry_gap", and for nets
    with tokens "token_isometry_gap", "token_cosine" (workers/token_metrics.py). isometry_gap
    is +∞ where the network forces rank(H) < n (`Net.structures`); range_isometry_gap is the gap
    on the complement of that structural null space (equal elsewhere). A tap's sample Gram is of
    the tap reshaped (n, −1). For nets with attention layers (Taps.attention) also
    "attention_entropy" (L,) and "attention_entropy_heads" (L, heads)
    (workers/custom_metrics.py).

    With tap_metrics, also the per-tap metrics of each block's output — the token stream
    (n, T, d) where the net has one, else Taps.outputs —: "effective_rank", "stable_rank" and
    every registered one (workers/custom_metrics.py; docs/probe.md), float64 arrays (L,).

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
    member = _Member(p, x, taps, grads)
    return _measure(net, [member], spectra=spectra, tap_metrics=tap_metrics)[0]


def probe_metrics_packed(
    net: Net,
    params: nn.Params,
    state: nn.State,
    X: Tensor,
    Y: Tensor,
    *,
    spectra: bool = False,
    tap_metrics: bool = False,
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
        return logits, taps.layers, taps.outputs, taps.tokens or [], taps.attention or []

    with torch.enable_grad():
        logits, layers, outputs, tokens, attention = vmap(one)(p, state, X)
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
                [a[m] for a in attention] if attention else None,
            ),
            {k: g[m] for k, g in grads.items()},
        )
        for m in range(K)
    ]
    return _measure(net, members, spectra=spectra, tap_metrics=tap_metrics)


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
    net: Net, members: list[_Member], *, spectra: bool = False, tap_metrics: bool = False
) -> list[dict[str, np.ndarray | float]]:
    """The record fields of each member (see probe_metrics): its taps' structures member by
    member, the factorizations of every member's taps grouped by (structure, shape) into shared
    batched calls — each tap cast to float64 once, its block's rms and mean_cosine read from
    that same cast where the block output is a tap (the MLP's) —, the weights' likewise, the
    per-tap metrics' singular values too."""
    L, kinds = net.depth, list(net.kinds)
    taps = _TapSet(members, kinds)
    gap, rng, err, rms, cos = _tap_gaps_and_outputs(net, members, taps)
    layer_weights = net.layer_weights()
    firsts = [ws[0] if ws else None for ws in layer_weights]
    has_weight = [i for i, k in enumerate(firsts) if k is not None] + [L]
    wgaps = _weight_gaps(
        [[m.p[k] for k in firsts if k is not None] + [m.p[net.head_weight]] for m in members]
    )
    tokens = None
    if members[0].taps.tokens is not None:
        flat = token_metrics([t.detach() for m in members for t in m.taps.tokens or []])
        tokens = {k: v.reshape(len(members), L) for k, v in flat.items()}
    per_tap = _tap_metrics(members, L) if tap_metrics else {}
    outs: list[dict[str, np.ndarray | float]] = []
    for j, m in enumerate(members):
        mine, idx = taps.slice(j), taps.where(j)
        out: dict[str, np.ndarray | float] = {}
        for name, values in (
            ("isometry_gap", gap[mine]),
            ("range_isometry_gap", rng[mine]),
            ("isometry_gap_error", err[mine]),
        ):
            per_kind = values[idx].cpu().numpy().reshape(len(kinds), L)
            out.update({f"{name}/{k}": v for k, v in zip(kinds, per_kind, strict=True)})
        wgap = np.full(L + 1, math.nan)
        wgap[has_weight] = wgaps[j]
        gnorm = _grad_norms(
            [[m.grads[k] for k in ws] for ws in layer_weights] + [[m.grads[net.head_weight]]]
        )
        out["weight_isometry_gap"] = wgap[:L]
        out["grad_norm"] = gnorm[:L]
        out["head_grad_norm"] = float(gnorm[L])
        out["head_weight_isometry_gap"] = float(wgap[L])
        out["rms"], out["mean_cosine"] = rms[j], cos[j]
        if tokens is not None:
            out.update({k: v[j] for k, v in tokens.items()})
        out.update({k: v[j] for k, v in per_tap.items()})
        if m.taps.attention is not None:
            out.update(custom_metrics.attention_record(m.taps.attention))
        if spectra:
            W = [m.p[k].detach() for k in firsts if k is not None]
            out.update(_spectra(taps.H[mine], idx, kinds, W, L))
        outs.append(out)
    return outs


class _TapSet:
    """Every member's distinct taps (an identity σ returns its input: one Gram is enough),
    deduplicated before detaching (which makes new objects); kind-major, block-minor, member
    after member, as the (n, −1) matrices H whose Grams are measured."""

    def __init__(self, members: list[_Member], kinds: list[str]) -> None:
        self.uniqs: list[list[Tensor]] = []
        self.wheres: list[list[int]] = []
        self.H: list[Tensor] = []
        for m in members:
            uniq, where = _unique([t for k in kinds for t in m.taps.layers[k]])
            self.uniqs.append(uniq)
            self.wheres.append(where)
            self.H += [t.detach().reshape(len(m.x), -1) for t in uniq]  # stacked in chunks
        self.starts = np.cumsum([0] + [len(u) for u in self.uniqs]).tolist()

    def slice(self, j: int) -> slice:
        return slice(self.starts[j], self.starts[j + 1])

    def where(self, j: int) -> Tensor:
        return torch.tensor(self.wheres[j], device=self.H[0].device)


def _tap_gaps_and_outputs(
    net: Net, members: list[_Member], taps: _TapSet
) -> tuple[Tensor, Tensor, Tensor, np.ndarray, np.ndarray]:
    """(gap, range gap, error) of every tap of `taps` (float64 (len(H),)) and the rms and
    mean_cosine (K, L) of every member's block outputs: the supports first (the structures
    need them), then the structures member by member, then one float64 pass per (structure,
    shape) group that factors the taps and reads the block outputs among them."""
    H, L = taps.H, net.depth
    groups = _by_shape(H)  # zero rows and columns, counted once per tap, on the taps' dtype
    known: dict[int, tuple[int, int]] = {}
    for at, rows, cols in groups:
        counts = torch.stack([rows.sum(dim=1), cols.sum(dim=1)], dim=1).tolist()
        for g, c in zip(at, counts, strict=True):
            known[id(_owner(taps, g))] = (c[0], c[1])

    def fit(s: Structure, h: Tensor) -> Structure:
        return refine(s, h, known.get(id(h)))

    kind_of: list[Structure] = []
    for m, where in zip(members, taps.wheres, strict=True):
        forced = net.structures(m.p, m.x, m.taps, fit)
        first: dict[int, Structure] = {}
        for i, w in enumerate(where):
            first.setdefault(w, forced[net.kinds[i // L]][i % L])
        kind_of += [first[w] for w in range(len(first))]
    outputs = [t.detach() for m in members for t in m.taps.outputs]  # member-major (K·L)
    stats = _OutputStats(outputs, H)
    gap = torch.empty(len(H), dtype=F64, device=members[0].x.device)
    rng, err = torch.empty_like(gap), torch.empty_like(gap)
    for at, rows, cols in groups:
        sub = torch.tensor(at, device=gap.device)

        def visit(idx: list[int], M: Tensor, at: list[int] = at) -> None:
            stats.read([at[i] for i in idx], M)

        gap[sub], rng[sub], err[sub] = tap_gaps_and_errors(
            [H[g] for g in at], [kind_of[g] for g in at], (rows, cols), visit
        )
    rms, cos = stats.rest()
    return gap, rng, err, rms.reshape(len(members), L), cos.reshape(len(members), L)


def _owner(taps: _TapSet, g: int) -> Tensor:
    """The tap object (before detaching) of H[g]."""
    j = int(np.searchsorted(taps.starts, g, side="right")) - 1
    return taps.uniqs[j][g - taps.starts[j]]


def _key(t: Tensor) -> tuple:
    """What identifies a tensor's values whatever view object holds them (a pack's member
    slices are new objects each time)."""
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)


class _OutputStats:
    """rms and mean_cosine of the block outputs (`rms_and_mean_cosine`): read from a tap's
    float64 stack where the output is a tap (`read`, the visitor of `tap_gaps_and_errors`), the
    others in a float64 pass of their own (`rest`)."""

    def __init__(self, outputs: list[Tensor], H: list[Tensor]) -> None:
        self.outputs = outputs
        self.rms = np.full(len(outputs), math.nan)
        self.cos = np.full(len(outputs), math.nan)
        self.done = np.zeros(len(outputs), dtype=bool)
        by_key: dict[tuple, list[int]] = {}
        for i, o in enumerate(outputs):
            by_key.setdefault(_key(o.reshape(len(o), -1)), []).append(i)
        # tap g → the outputs it is (an output is one tap at most: the taps are distinct)
        self.of_tap = {g: by_key[_key(h)] for g, h in enumerate(H) if _key(h) in by_key}

    def read(self, taps: list[int], M: Tensor) -> None:
        """M (b, n', d'): float64 H[g] for g in taps, without their zero rows and columns."""
        pos = [p for p, g in enumerate(taps) if g in self.of_tap]
        if not pos:
            return
        sel = M if len(pos) == len(M) else M[torch.tensor(pos, device=M.device)]
        size = [self.outputs[self.of_tap[taps[p]][0]].numel() for p in pos]
        r, c = _rms_and_cosines(sel, torch.tensor(size, dtype=F64, device=M.device))
        for p, rms, cos in zip(pos, r.tolist(), c.tolist(), strict=True):
            at = self.of_tap[taps[p]]
            self.rms[at], self.cos[at], self.done[at] = rms, cos, True

    def rest(self) -> tuple[np.ndarray, np.ndarray]:
        """Every output's (rms, mean_cosine) once the taps were read: the outputs that are no
        tap (a residual stream, a pooled token stream) stacked by shape in float64 chunks."""
        todo = [i for i in range(len(self.outputs)) if not self.done[i]]
        flat = {i: self.outputs[i].reshape(len(self.outputs[i]), -1) for i in todo}
        for idx in _indices_by_shape([flat[i] for i in todo]):
            at = [todo[i] for i in idx]
            pos = 0
            for M in _stacked(flat, at, F64):
                part = at[pos : pos + len(M)]
                size = torch.full((len(M),), float(M[0].numel()), dtype=F64, device=M.device)
                r, c = _rms_and_cosines(M, size)
                self.rms[part], self.cos[part] = r.cpu().numpy(), c.cpu().numpy()
                pos += len(M)
        return self.rms, self.cos


def _rms_and_cosines(M: Tensor, size: Tensor) -> tuple[Tensor, Tensor]:
    """`rms_and_mean_cosine` of each float64 M[i] (b, n, f) of `size[i]` entries (zero rows and
    columns may have been dropped: they add nothing to either), in one pass over M for the
    samples' norms and one product for Σᵢ hᵢ/‖hᵢ‖."""
    norms = torch.linalg.vector_norm(M, dim=2)  # (b, n)
    rms = torch.sqrt(norms.square().sum(dim=1) / size)
    keep = norms != 0
    k = keep.sum(dim=1).to(F64)
    inv = torch.where(keep, norms.reciprocal(), 0.0)
    u = (inv[:, None, :] @ M)[:, 0]  # (b, f)
    cos = (u.square().sum(dim=1) - k) / (k * (k - 1)).clamp_min(1)
    return rms, torch.where(k >= 2, cos, math.nan)


def _tap_metrics(members: list[_Member], L: int) -> dict[str, np.ndarray]:
    """workers/custom_metrics.py's per-tap metrics of every member's block outputs (the token
    streams where there are), all members' in one call: name → (K, L)."""
    feats = [
        t for m in members for t in (m.taps.tokens if m.taps.tokens is not None else m.taps.outputs)
    ]
    flat = custom_metrics.tap_metrics(feats, per=L)
    return {k: v.reshape(len(members), L) for k, v in flat.items()}


def _weight_gaps(W: list[list[Tensor]]) -> list[np.ndarray]:
    """weight_isometry_gaps of each member's weights (lists of equal layout; a kernel (out,
    in, k, k) counts as the matrix (out, in·k·k)): per run of equal shape (`_runs`: W_1, then
    W_2..W_L, then the head), every member's weights cast to float64 in shared chunks, one
    batched call each (the Gram on the smaller side: `range_gaps`)."""
    K, B = len(W), len(W[0])
    flat = [w.detach().reshape(w.shape[0], -1) for ws in W for w in ws]  # member-major
    out = np.empty(K * B)
    for run in _runs([tuple(w.shape) for w in flat[:B]]):
        idx = [j * B + i for j in range(K) for i in range(run.start, run.stop)]
        vals = [range_gaps(M, min(M.shape[1:])) for M in _stacked(flat, idx, F64)]
        out[idx] = torch.cat(vals).cpu().numpy()
    return list(out.reshape(K, B))


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
