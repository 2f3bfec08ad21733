"""The residual MLP (model: resmlp) as a `Net` (docs/models.md): an input Linear to `width`,
then L residual blocks with a scaled branch, then the head.

    x_0 = W_in x (+ b_in)                                       (n, d_in) → (n, d)
    x_ℓ = x_{ℓ−1} + c · f_ℓ(x_{ℓ−1}),   c = residual_scale,     ℓ = 1..L
    logits = W_head x_L (+ b_head)

f_ℓ is the plain MLP's block (workers/nn.py `block`, on an `nn.Spec` of width → width blocks,
so its arithmetic is the MLP's): z = W_ℓ x (+ b_ℓ), then norm and σ(α_ℓ ·) in `order`; its
output is σ's (norm_act) or the norm's (act_norm). c = 1 adds f as it is (no product); any
other c, 0 included, is the formula as written: with c = 0 the stream is x_0 exactly (x + 0·f = x
for a finite f), the branch still runs — its taps are measured, in "train" mode its BatchNorm
statistics move — and its weights get exactly zero gradients (grad_norm 0, as a torch module
computing x + 0·f(x) gives them; weight decay still shrinks them).

Parameters: "W_in" (d × d_in), "W1".."WL" (d × d), "W_head" (C × d); with bias "b_in",
"b1".."bL", "b_head"; with torch's affine norms "gamma{ℓ}", "beta{ℓ}". Draw order from the
generator: W_in, W1..WL, W_head (init `init`, W_head `head_init`, gain init_gain); then, with
bias_init "torch", b_in, b1..bL, b_head — as nn.init_params, so the weights do not depend on
bias_init. Running statistics: nn.init_state's, per block.

Taps: layers "linear" (z), "norm" (the norm's output; absent with norm "none"), "act" (σ's
output) of each branch, and "residual" (the stream x_ℓ); outputs = the stream x_ℓ (rms,
mean_cosine). Per-layer weights: the branch Linear W_ℓ (weight_isometry_gap, grad_norm). W_in is
trained but is no block's weight, so it has no per-layer metric.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from service.config import DATASET_SHAPES, TrialConfig
from workers import nn
from workers.models.base import Fit, Mode, Params, State, Taps
from workers.models.mlp import SpecBlocks

# Norms that act on each feature (column) alone by an affine map, over the batch: with σ the
# identity the branch is then x ↦ x·M + 1vᵀ — a right-multiplication of its input (whatever M
# depends on) plus a row-constant — and the stream stays in the span of x_{ℓ−1} and 1
# (`ResMLPNet.structures`). LayerNorm scales rows, which that span does not survive.
COLUMN_NORMS = ("none", "batch", "batch_scale")


def _nonzero(t: Tensor | None) -> bool:
    return t is not None and bool(torch.any(t != 0))


@dataclass(frozen=True)
class ResMLPNet(SpecBlocks):
    config: TrialConfig
    # the L width → width blocks (its d_in is the width; the network's own is `d_in`)
    spec: nn.Spec = field(init=False)
    d_in: int = field(init=False)

    def __post_init__(self) -> None:
        spec = nn.make_spec(self.config)
        object.__setattr__(self, "d_in", DATASET_SHAPES[self.config.dataset][0])
        object.__setattr__(self, "spec", dataclasses.replace(spec, d_in=spec.width))

    @property
    def scale(self) -> float:
        return self.config.residual_scale

    @property
    def kinds(self) -> tuple[str, ...]:
        return (*super().kinds, "residual")

    def init_params(self, generator: torch.Generator) -> Params:
        c, dt, d = self.config, self.spec.dtype, self.spec.width
        p: Params = {
            "W_in": nn.init_weight(
                d,
                self.d_in,
                c.init,
                c.init_gain,
                generator,
                dtype=dt,
                orthogonal_gain=c.orthogonal_gain,
            )
        }
        if self.spec.bias:
            p["b_in"] = torch.zeros(d, dtype=dt)
        # W1..WL, W_head, zero biases, norm gains/shifts; torch biases are drawn below, after
        # every weight, b_in first
        blocks = nn.init_params(
            self.spec,
            c.init,
            c.init_gain,
            generator,
            head_init=c.head_init,
            orthogonal_gain=c.orthogonal_gain,
        )
        p.update(blocks)
        if self.spec.bias and c.bias_init == "torch":
            p["b_in"] = nn.torch_bias(d, self.d_in, generator, dt)
            for ell in range(1, self.depth + 1):
                p[f"b{ell}"] = nn.torch_bias(d, d, generator, dt)
            p["b_head"] = nn.torch_bias(self.n_classes, d, generator, dt)
        return p

    def _add(self, x: Tensor, f: Tensor) -> Tensor:
        c = self.scale
        return x + f if c == 1 else x + c * f

    def forward(
        self, p: Params, s: State, x: Tensor, mode: Mode, *, taps: bool = False
    ) -> tuple[Tensor, Taps | None]:
        spec, sigma = self.spec, self.spec.sigma
        h = F.linear(x, p["W_in"], p.get("b_in"))
        layers: dict[str, list[Tensor]] = {k: [] for k in ("linear", "norm", "act", "residual")}
        for ell in range(1, spec.depth + 1):
            z, nrm, a = nn.block(spec, p, s, ell, h, mode, sigma)
            h = self._add(h, a if spec.order == "norm_act" else nrm)
            if taps:
                for k, t in zip(layers, (z, nrm, a, h), strict=True):
                    layers[k].append(t)
        logits = nn.linear(p, "_head", h)
        if not taps:
            return logits, None
        return logits, Taps({k: layers[k] for k in self.kinds}, layers["residual"])

    def branch_is_linear(self) -> bool:
        """Whether x_ℓ = x_{ℓ−1}·(I + c·M) + c·1vᵀ for some M and v: σ = identity (any gain)
        and no norm or a per-feature one (batch, batch_scale: x ↦ (x − 1μᵀ)·D·diag(γ) + 1βᵀ), or
        c = 0 (0·f added)."""
        spec = self.spec
        return self.scale == 0 or (spec.activation == "identity" and spec.norm in COLUMN_NORMS)

    def structures(self, p: Params, x: Tensor, taps: Taps, fit: Fit) -> dict:
        """Per kind and block, an upper bound on each tap's rank (workers.structure.Structure),
        followed in forward order and refined by `fit` at every tap before it is carried on.

        The input Linear follows the linear rule; the branch the MLP's rules from the stream's
        structure. The add x_ℓ = x_{ℓ−1} + c·f: 1 stays in the null space only if it is in both
        summands'. Where the branch is linear in its input up to a row-constant
        (`branch_is_linear`), the stream's columns stay in span(x_{ℓ−1}) + span(1), hence in
        span(x_m) + span(1) for every earlier m, x_0 included: rank(x_ℓ) ≤ min(rank(x_{ℓ−1}) +
        1, min over m < ℓ of rank(x_m) + 1) — the same 1 counted once, however deep — and the + 1
        only where a block has a non-zero b_ℓ or a BatchNorm (its −μ and β); x_ℓ = x_{ℓ−1}
        (a finite f) for c = 0. Otherwise rank(x_ℓ) ≤ min(n, d, rank(x_{ℓ−1}) + rank(f))
        (rank(A + B) ≤ rank A + rank B)."""
        from workers.structure import (
            Structure,
            _after_act,
            _after_linear,
            _after_norm,
            input_structure,
        )

        spec, n, d = self.spec, x.shape[0], self.spec.width
        with torch.no_grad():
            x0 = F.linear(x, p["W_in"], p.get("b_in"))  # not a tap: refined here, not recorded
        s = fit(_after_linear(input_structure(x), n, d, p.get("b_in")), x0)
        linear = self.branch_is_linear()
        lowest = s.rank  # the lowest bound on the stream so far, x_0's included
        out: dict[str, list] = {k: [] for k in ("linear", "norm", "act", "residual")}
        for i in range(spec.depth):
            ell = i + 1
            z = fit(_after_linear(s, n, d, p.get(f"b{ell}")), taps.layers["linear"][i])
            hn = taps.layers["norm"][i] if "norm" in taps.layers else None
            ha = taps.layers["act"][i]
            if spec.order == "norm_act":
                nrm = z if hn is None else fit(_after_norm(spec, p, ell, z, n, d), hn)
                a = fit(_after_act(spec, nrm, n, d), ha)
                f = a
            else:
                a = fit(_after_act(spec, z, n, d), ha)
                nrm = a if hn is None else fit(_after_norm(spec, p, ell, a, n, d), hn)
                f = nrm
            if self.scale == 0:
                r = s
            else:
                ones = s.ones_in_null and f.ones_in_null
                affine = spec.norm == "batch" or _nonzero(p.get(f"b{ell}"))
                rank = min(s.rank + int(affine), lowest + 1) if linear else s.rank + f.rank
                r = Structure(ones, min(n, d, rank))
            s = fit(r, taps.outputs[i])
            lowest = min(lowest, s.rank)
            for k, v in zip(out, (z, nrm, a, s), strict=True):
                out[k].append(v)
        return {k: out[k] for k in self.kinds}
