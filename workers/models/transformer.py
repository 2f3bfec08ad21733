"""The transformer encoder (model: transformer) as a `Net` (docs/models.md).

Tokens come from the dataset's images (`as_images`, (n, C, H, W)): with `patch_size` k the
(H/k)(W/k) non-overlapping k × k patches in row-major order, each C·k·k values (channel, row,
column); with patch_size None the H rows of the image, each C·W values (channel, column). Then

    x₀ = tokens W_embedᵀ (+ b_embed) + pos                        (n, T, d), d = width
    pre:   h = x + c·Attn_ℓ(N(x));    x' = h + c·MLP_ℓ(N(h))
    post:  h = N(x + c·Attn_ℓ(x));    x' = N(h + c·MLP_ℓ(h))
    logits = mean_t(x_L) W_headᵀ (+ b_head)

with c = residual_scale; without `skip` the "x +" and "h +" terms are dropped (then c only
scales the branch). There is no final norm before the head.

- Attn_ℓ: multi-head scaled dot-product attention, no mask, softmax over keys:
  Q = X Wqᵀ, K = X Wkᵀ, V = X Wvᵀ split into `heads` heads of d/heads features,
  A = softmax(Q Kᵀ/√(d/heads)) (rows sum to 1), out = concat_heads(A V) Woᵀ.
- MLP_ℓ: W2 σ(α_ℓ · W1 h), W1 (mlp_ratio·d × d), σ = `activation`, α_ℓ the gain schedule
  (nn.gains); mlp_ratio = 0 leaves the block attention only.
- N: `norm` per token over its d features — layer (torch's LayerNorm, γ/β per block and
  sublayer), layer_scale (each token to unit RMS), none — or per feature over all n·T tokens of
  the batch — batch (torch's BatchNorm, in nn.batch_norm's train/batch/running modes),
  batch_scale. ε = norm_eps.

Parameters: "W_embed" (d × token_dim), "pos" (T × d), per block ℓ = 1..L "Wq{ℓ}", "Wk{ℓ}",
"Wv{ℓ}", "Wo{ℓ}" (d × d), "W1{ℓ}", "W2{ℓ}", then "W_head" (C × d); with bias "b_embed",
"bq{ℓ}" .. "b2{ℓ}", "b_head"; with norm layer/batch "gamma_attn{ℓ}", "beta_attn{ℓ}",
"gamma_mlp{ℓ}", "beta_mlp{ℓ}". State (batch): "mean_attn{ℓ}", "var_attn{ℓ}", … ; (batch_scale)
"sq_attn{ℓ}", "sq_mlp{ℓ}".

Initialization, drawn from the generator in this order: W_embed, pos, then per block Wq, Wk, Wv,
Wo, W1, W2, then W_head — every Linear by the `init` rule with fan_in = its input features
(nn.init_weight, gain init_gain), the head by `head_init`; with bias_init "torch" the biases
after all weights, in the same order. The positional embedding is drawn N(0, 1/d) per entry
(‖pos_t‖² ≈ 1, while an embedded unit-RMS token has ‖x_t‖² ≈ d·init_gain²): small beside the
tokens, it still breaks the exact permutation symmetry between tokens and keeps a constant
(zero) token from giving the token Gram a zero row. γ = 1, β = b = 0.

Taps (`forward(..., taps=True)`), per block: "attn" and "mlp" are the sublayer outputs
c·Attn(·), c·MLP(·) (before the add, after the scale), "residual" the stream x' after the
block; Taps.layers hold each MEAN-POOLED over tokens, (n, d) — the sample Gram is of the pooled
representation. Taps.outputs = the pooled stream, Taps.tokens = the stream (n, T, d) itself
(workers/token_metrics.py), Taps.attention = each block's A (n, heads, T, T) (the attention
entropy, workers/custom_metrics.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from service.activations import get_activation
from service.config import DATASET_IMAGES, DATASET_SHAPES, TrialConfig
from service.errors import InvalidInput
from workers import nn
from workers.models.base import Fit, Mode, Params, State, Taps, as_images


def token_shape(dataset: str, patch_size: int | None) -> tuple[int, int]:
    """(T, token_dim): the number of tokens and the values per token of a dataset's images."""
    _, c, h, w = DATASET_IMAGES[dataset]
    if patch_size is None:
        return h, c * w
    k = patch_size
    if h % k or w % k:
        raise InvalidInput(
            f"patch_size={k} does not tile {dataset!r}'s {h}×{w} images", field="patch_size"
        )
    return (h // k) * (w // k), c * k * k


def to_tokens(x: Tensor, dataset: str, patch_size: int | None) -> Tensor:
    """Flattened inputs (n, d_in) → tokens (n, T, token_dim) (see the module docstring)."""
    img = as_images(x, dataset)  # (n, C, H, W)
    n, c, h, w = img.shape
    if patch_size is None:
        return img.permute(0, 2, 1, 3).reshape(n, h, c * w)
    k = patch_size
    patches = img.unfold(2, k, k).unfold(3, k, k)  # (n, C, H/k, W/k, k, k)
    return patches.permute(0, 2, 3, 1, 4, 5).reshape(n, (h // k) * (w // k), c * k * k)


def _linear(p: Params, w: str, b: str, x: Tensor) -> Tensor:
    return F.linear(x, p[w], p.get(b))


def attention_weights(q: Tensor, k: Tensor) -> Tensor:
    """softmax(Q Kᵀ/√d_h) over keys: q, k (n, heads, T, d_h) → (n, heads, T, T), rows sum to 1."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1)


def attention(p: Params, ell: int, x: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """Multi-head attention of block ℓ: x (n, T, d) → (output (n, T, d), A (n, heads, T, T))."""
    n, t, d = x.shape

    def split(w: str, b: str) -> Tensor:
        return (
            _linear(p, f"{w}{ell}", f"{b}{ell}", x).reshape(n, t, heads, d // heads).transpose(1, 2)
        )

    q, k, v = split("Wq", "bq"), split("Wk", "bk"), split("Wv", "bv")
    a = attention_weights(q, k)
    o = (a @ v).transpose(1, 2).reshape(n, t, d)
    return _linear(p, f"Wo{ell}", f"bo{ell}", o), a


def token_norm(
    norm: str, p: Params, s: State, name: str, x: Tensor, mode: Mode, eps: float
) -> Tensor:
    """Norm `name` ("attn{ℓ}" / "mlp{ℓ}") of x (n, T, d): per token (layer, layer_scale) or per
    feature over all n·T tokens (batch, batch_scale), with workers/nn.py's functions."""
    if norm == "none":
        return x
    if norm == "layer":
        return F.layer_norm(x, x.shape[-1:], p[f"gamma_{name}"], p[f"beta_{name}"], eps=eps)
    if norm == "layer_scale":
        return nn.layer_scale_norm(x, eps)
    flat = x.reshape(-1, x.shape[-1])
    if norm == "batch":
        pp = {"gamma0": p[f"gamma_{name}"], "beta0": p[f"beta_{name}"]}
        ss = {"mean0": s[f"mean_{name}"], "var0": s[f"var_{name}"]}  # updated in place
        out = nn.batch_norm(pp, ss, 0, flat, mode, eps)
    elif norm == "batch_scale":
        out = nn.batch_scale_norm({"sq0": s[f"sq_{name}"]}, 0, flat, mode, eps)
    else:
        raise InvalidInput(f"unknown norm {norm!r}", field="norm", allowed=nn.NORMS)
    return out.reshape(x.shape)


@dataclass(frozen=True)
class TransformerNet:
    """An encoder over image patches or rows (module docstring)."""

    config: TrialConfig
    # positional embedding present (always for a trial; tests switch it off to check the
    # blocks' permutation equivariance)
    use_pos: bool = True
    d_in: int = field(init=False)
    n_classes: int = field(init=False)
    tokens: int = field(init=False)  # T
    token_dim: int = field(init=False)
    alphas: tuple[float, ...] = field(init=False)

    head_weight = "W_head"

    def __post_init__(self) -> None:
        c = self.config
        if c.norm not in nn.NORMS:
            raise InvalidInput(f"unknown norm {c.norm!r}", field="norm", allowed=nn.NORMS)
        if c.width % c.heads:
            raise InvalidInput(f"heads={c.heads} must divide width={c.width}", field="heads")
        d_in, n_classes = DATASET_SHAPES[c.dataset]
        t, td = token_shape(c.dataset, c.patch_size)
        set_ = object.__setattr__
        set_(self, "d_in", d_in)
        set_(self, "n_classes", n_classes)
        set_(self, "tokens", t)
        set_(self, "token_dim", td)
        set_(self, "alphas", nn.gains(c.activation_gain, c.gain_exponent, c.depth))

    @property
    def depth(self) -> int:
        return self.config.depth

    @property
    def width(self) -> int:
        return self.config.width

    @property
    def norm(self) -> str:
        return self.config.norm

    @property
    def dtype(self) -> torch.dtype:
        return nn.DTYPES[self.config.dtype]

    @property
    def has_mlp(self) -> bool:
        return self.config.mlp_ratio > 0

    @property
    def kinds(self) -> tuple[str, ...]:
        return ("attn", "mlp", "residual") if self.has_mlp else ("attn", "residual")

    @property
    def sublayers(self) -> tuple[str, ...]:
        return ("attn", "mlp") if self.has_mlp else ("attn",)

    @property
    def affine(self) -> bool:
        return self.config.norm in ("batch", "layer")

    def _linears(self) -> list[tuple[str, str, int, int]]:
        """(weight, bias, out, in) of every Linear in draw order, the head last."""
        d, r = self.width, self.config.mlp_ratio * self.width
        out = [("W_embed", "b_embed", d, self.token_dim)]
        for ell in range(1, self.depth + 1):
            out += [(f"W{q}{ell}", f"b{q}{ell}", d, d) for q in ("q", "k", "v", "o")]
            if self.has_mlp:
                out += [(f"W1{ell}", f"b1{ell}", r, d), (f"W2{ell}", f"b2{ell}", d, r)]
        out.append(("W_head", "b_head", self.n_classes, d))
        return out

    def init_params(self, generator: torch.Generator) -> Params:
        c, dt = self.config, self.dtype
        p: Params = {}
        for w, _, out, inp in self._linears():
            init = (c.head_init or c.init) if w == "W_head" else c.init
            p[w] = nn.init_weight(
                out, inp, init, c.init_gain, generator, dtype=dt, orthogonal_gain=c.orthogonal_gain
            )
            if w == "W_embed":
                pos = torch.randn(self.tokens, self.width, generator=generator) / math.sqrt(
                    self.width
                )
                p["pos"] = pos.to(dt)
        if c.bias:
            for _, b, out, inp in self._linears():
                p[b] = (
                    nn.torch_bias(out, inp, generator, dt)
                    if c.bias_init == "torch"
                    else torch.zeros(out, dtype=dt)
                )
        if self.affine:
            for ell in range(1, self.depth + 1):
                for sub in self.sublayers:
                    p[f"gamma_{sub}{ell}"] = torch.ones(self.width, dtype=dt)
                    p[f"beta_{sub}{ell}"] = torch.zeros(self.width, dtype=dt)
        return p

    def init_state(self) -> State:
        s: State = {}
        d, dt = self.width, self.dtype
        for ell in range(1, self.depth + 1):
            for sub in self.sublayers:
                if self.config.norm == "batch":
                    s[f"mean_{sub}{ell}"] = torch.zeros(d, dtype=dt)
                    s[f"var_{sub}{ell}"] = torch.ones(d, dtype=dt)
                elif self.config.norm == "batch_scale":
                    s[f"sq_{sub}{ell}"] = torch.ones(d, dtype=dt)
        return s

    def embed(self, p: Params, x: Tensor) -> Tensor:
        """x₀ = tokens W_embedᵀ (+ b) (+ pos): (n, d_in) → (n, T, d)."""
        tok = to_tokens(x, self.config.dataset, self.config.patch_size)
        h = _linear(p, "W_embed", "b_embed", tok)
        return h + p["pos"] if self.use_pos else h

    def block(
        self,
        p: Params,
        s: State,
        ell: int,
        x: Tensor,
        mode: Mode,
        sigma: Callable,
        weights: list[Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """Block ℓ (1-based) on the stream x (n, T, d): (c·Attn, c·MLP or None, x'); the
        attention weights A (n, heads, T, T) appended to `weights` if given."""
        c = self.config
        scale = c.residual_scale

        def norm(name: str, h: Tensor) -> Tensor:
            return token_norm(c.norm, p, s, f"{name}{ell}", h, mode, c.norm_eps)

        def mlp(h: Tensor) -> Tensor:
            z = nn.activate(sigma, self.alphas[ell - 1], _linear(p, f"W1{ell}", f"b1{ell}", h))
            return _linear(p, f"W2{ell}", f"b2{ell}", z)

        pre = c.norm_position == "pre"
        out_a, A = attention(p, ell, norm("attn", x) if pre else x, c.heads)
        if weights is not None:
            weights.append(A)
        a = scale * out_a
        h = a if not c.skip else x + a
        if not pre:
            h = norm("attn", h)
        if not self.has_mlp:
            return a, None, h
        m = scale * mlp(norm("mlp", h) if pre else h)
        out = m if not c.skip else h + m
        if not pre:
            out = norm("mlp", out)
        return a, m, out

    def forward(
        self, p: Params, s: State, x: Tensor, mode: Mode, *, taps: bool = False
    ) -> tuple[Tensor, Taps | None]:
        sigma = get_activation(self.config.activation).torch(torch)
        h = self.embed(p, x)
        attn, mlp, stream, weights = [], [], [], []
        for ell in range(1, self.depth + 1):
            a, m, h = self.block(p, s, ell, h, mode, sigma, weights if taps else None)
            if taps:
                attn.append(a.mean(dim=1))
                if m is not None:
                    mlp.append(m.mean(dim=1))
                stream.append(h)
        logits = _linear(p, "W_head", "b_head", h.mean(dim=1))
        if not taps:
            return logits, None
        pooled = [t.mean(dim=1) for t in stream]
        layers = {"attn": attn, "residual": pooled}
        if self.has_mlp:
            layers["mlp"] = mlp
        return logits, Taps({k: layers[k] for k in self.kinds}, pooled, stream, weights)

    def structures(self, p: Params, x: Tensor, taps: Taps, fit: Fit) -> dict:
        """Structural rank bounds of the pooled taps (n, d), in forward order, each refined by
        `fit`. Softmax attention is non-linear in the stream, so a sublayer output is bounded by
        min(n, d) only (reset); a skip add by the sum of the ranks; a post-norm by its own
        rule: batch (with the probe's batch statistics) centres every feature over all n·T
        tokens, hence over the n pooled samples — 1 in the null space, rank ≤ n − 1, if β = 0,
        else + 1 —; layer puts every token, hence the pooled vector, in γ·1⊥ (rank ≤ d − 1,
        + 1 for β ≠ 0) but scales tokens differently (a reset otherwise); layer_scale is a
        reset; batch_scale and none keep the bound. Only bounds that hold whatever the numbers
        are: too high costs a finite, large gap, never a wrong +∞."""
        from workers.structure import Structure, input_structure

        c = self.config
        n, d = x.shape[0], self.width
        full = Structure(False, min(n, d))
        s_in = input_structure(x)
        const = any(not _zero(p.get(k)) for k in ("pos", "b_embed"))
        # pooled x₀ = (pooled tokens, a linear map of x) W_embedᵀ + a constant row
        s = Structure(False, min(n, d, min(s_in.rank, self.token_dim) + int(const)))

        def add(u: Structure, v: Structure) -> Structure:
            return Structure(False, min(n, d, u.rank + v.rank))

        def post(u: Structure, sub: str, ell: int) -> Structure:
            if c.norm_position == "pre" or c.norm in ("none", "batch_scale"):
                return u
            beta0 = _zero(p.get(f"beta_{sub}{ell}"))
            if c.norm == "batch":
                r = min(u.rank, n - 1)
                return Structure(True, r) if beta0 else Structure(False, min(r + 1, n))
            if c.norm == "layer":
                return Structure(False, min(n, d - 1 + int(not beta0)))
            return full  # layer_scale

        out: dict[str, list] = {k: [] for k in self.kinds}
        mlp_taps = taps.layers.get("mlp")
        for i in range(self.depth):
            ell = i + 1
            a = fit(full, taps.layers["attn"][i])
            h = post(add(s, a) if c.skip else a, "attn", ell)
            out["attn"].append(a)
            if mlp_taps is not None:
                m = fit(full, mlp_taps[i])
                h = post(add(h, m) if c.skip else m, "mlp", ell)
                out["mlp"].append(m)
            s = fit(h, taps.layers["residual"][i])
            out["residual"].append(s)
        return out

    def layer_weights(self) -> list[list[str]]:
        """Per block [Wv, Wq, Wk, Wo, W1, W2] (no W1/W2 without an MLP): Wv's weight gap is the
        one recorded (weight_isometry_gap); grad_norm is over all of them."""
        names = ["Wv", "Wq", "Wk", "Wo"] + (["W1", "W2"] if self.has_mlp else [])
        return [[f"{w}{ell}" for w in names] for ell in range(1, self.depth + 1)]


def _zero(t: Tensor | None) -> bool:
    return t is None or bool(torch.all(t == 0))
