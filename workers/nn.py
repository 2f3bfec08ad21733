"""The MLP as pure functions over explicit tensors.

A network is a `Spec` (shapes and choices, no tensors), a `Params` dict of trainable tensors and a
`State` dict of normalization running statistics. Every piece is a function of
(spec, params, state, x): nothing hides per-instance state, so a later step can stack the tensors
of several seeds along a leading axis and run them as one batched model.

    block ℓ, order norm_act:  z = W_ℓ x (+ b_ℓ) → n = norm(z) → a = σ(α_ℓ · n)
    block ℓ, order act_norm:  z = W_ℓ x (+ b_ℓ) → a = σ(α_ℓ · z) → n = norm(a)
    head:                     logits = W_head h (+ b_head)

with α_ℓ = activation_gain · ℓ^(−gain_exponent), ℓ = 1..L (Meterez et al. 2024, activation
shaping). Parameter names: "W1".."WL", "W_head"; with bias "b1".."bL", "b_head"; with torch's
affine norms ("batch", "layer") "gamma1".., "beta1"... State names: "mean{ℓ}", "var{ℓ}" (batch),
"sq{ℓ}" (batch_scale: running mean of z²).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from service.activations import get_activation
from service.config import DATASET_SHAPES, TrialConfig
from service.errors import InvalidInput

Params = dict[str, Tensor]
State = dict[str, Tensor]
# How a normalization layer gets its statistics:
#   "train"   — the batch's own, and running statistics are updated (a training step);
#   "batch"   — the batch's own, running statistics untouched (measuring; eval_norm = "batch");
#   "running" — the running statistics (torch's eval mode).
Mode = Literal["train", "batch", "running"]

EPS = 1e-5  # torch's default ε in BatchNorm / LayerNorm, used by every norm here
MOMENTUM = 0.1  # torch's default running-statistics momentum
NORMS = ("batch", "layer", "none", "batch_scale", "layer_scale")
INITS = ("gaussian", "xavier", "kaiming", "orthogonal")


@dataclass(frozen=True)
class Spec:
    """Everything about a network except its tensors."""

    depth: int  # L
    d_in: int
    width: int  # d
    n_classes: int
    norm: str
    order: str
    bias: bool
    activation: str
    alphas: tuple[float, ...]  # α_ℓ for ℓ = 1..L

    @property
    def affine(self) -> bool:
        """torch's BatchNorm / LayerNorm carry a learnable gain γ and shift β; the scale-only
        variants of the theory carry none."""
        return self.norm in ("batch", "layer")

    @property
    def sigma(self) -> Callable[[Tensor], Tensor]:
        return get_activation(self.activation).torch(torch)


def gains(activation_gain: float, gain_exponent: float, depth: int) -> tuple[float, ...]:
    """α_ℓ = α · ℓ^(−p) for ℓ = 1..L (Meterez et al. 2024, Sec. 5: p = 0.4 shapes tanh/sin)."""
    return tuple(activation_gain * ell ** (-gain_exponent) for ell in range(1, depth + 1))


def make_spec(config: TrialConfig) -> Spec:
    """The network of a trial; input size and classes come from its dataset."""
    d_in, n_classes = DATASET_SHAPES[config.dataset]
    if config.norm not in NORMS:
        raise InvalidInput(f"unknown norm {config.norm!r}", field="norm", allowed=NORMS)
    return Spec(
        depth=config.depth,
        d_in=d_in,
        width=config.width,
        n_classes=n_classes,
        norm=config.norm,
        order=config.order,
        bias=config.bias,
        activation=config.activation,
        alphas=gains(config.activation_gain, config.gain_exponent, config.depth),
    )


# ---------------------------------------------------------------------------------------------
# Initialization


def haar_orthogonal(out: int, inp: int, generator: torch.Generator) -> Tensor:
    """A Haar-distributed (semi-)orthogonal out × inp matrix: W Wᵀ = I if out ≤ inp, else WᵀW = I.

    QR of a Gaussian matrix with the signs of R's diagonal moved into Q (Mezzadri 2007, "How to
    generate random matrices from the classical compact groups"); without the sign fix Q is not
    Haar. Done in float64 so the float32 result is orthogonal to rounding.
    """
    tall = out >= inp
    A = torch.randn(max(out, inp), min(out, inp), generator=generator, dtype=torch.float64)
    Q, R = torch.linalg.qr(A)  # Q: (max, min), orthonormal columns
    Q = Q * torch.sign(torch.diagonal(R)).unsqueeze(0)
    return (Q if tall else Q.T).to(torch.float32)


def init_weight(out: int, inp: int, init: str, g: float, generator: torch.Generator) -> Tensor:
    """One out × inp weight.

    gaussian: N(0, g²/fan_in); xavier (Glorot normal): N(0, 2g²/(fan_in + fan_out));
    kaiming (He normal, ReLU): N(0, 2g²/fan_in); orthogonal: g · Haar (semi-)orthogonal.
    """
    if init == "orthogonal":
        return g * haar_orthogonal(out, inp, generator)
    var = {
        "gaussian": g**2 / inp,
        "xavier": 2 * g**2 / (inp + out),
        "kaiming": 2 * g**2 / inp,
    }.get(init)
    if var is None:
        raise InvalidInput(f"unknown init {init!r}", field="init", allowed=INITS)
    return torch.randn(out, inp, generator=generator) * math.sqrt(var)


def init_params(spec: Spec, init: str, init_gain: float, generator: torch.Generator) -> Params:
    """Fresh parameters on the CPU (draws are device-independent; move them with `to_device`).

    Biases start at 0 and norm gains/shifts at 1/0, so the untrained network is the theory's.
    """
    dims = [spec.d_in] + [spec.width] * spec.depth
    p: Params = {}
    for ell in range(1, spec.depth + 1):
        d_out, d_in = dims[ell], dims[ell - 1]
        p[f"W{ell}"] = init_weight(d_out, d_in, init, init_gain, generator)
        if spec.bias:
            p[f"b{ell}"] = torch.zeros(d_out)
        if spec.affine:
            p[f"gamma{ell}"] = torch.ones(d_out)
            p[f"beta{ell}"] = torch.zeros(d_out)
    p["W_head"] = init_weight(spec.n_classes, spec.width, init, init_gain, generator)
    if spec.bias:
        p["b_head"] = torch.zeros(spec.n_classes)
    return p


def init_state(spec: Spec) -> State:
    """Running statistics, as torch initializes them (mean 0, variance 1)."""
    s: State = {}
    for ell in range(1, spec.depth + 1):
        if spec.norm == "batch":
            s[f"mean{ell}"] = torch.zeros(spec.width)
            s[f"var{ell}"] = torch.ones(spec.width)
        elif spec.norm == "batch_scale":
            s[f"sq{ell}"] = torch.ones(spec.width)
    return s


def to_device(tensors: dict[str, Tensor], device: str | torch.device) -> dict[str, Tensor]:
    return {k: v.to(device) for k, v in tensors.items()}


# ---------------------------------------------------------------------------------------------
# The pieces: pure functions of (params, state, x)


def linear(p: Params, name: str, x: Tensor) -> Tensor:
    """x Wᵀ (+ b): x (n, d_in) → (n, d_out)."""
    return F.linear(x, p[f"W{name}"], p.get(f"b{name}"))


def batch_norm(p: Params, s: State, ell: int, x: Tensor, mode: Mode) -> Tensor:
    """torch's BatchNorm1d: per feature, over the batch, centered and scaled, then γ, β."""
    train = mode != "running"
    keep = mode != "batch"  # "batch": statistics of x, running ones neither read nor written
    return F.batch_norm(
        x,
        s[f"mean{ell}"] if keep else None,
        s[f"var{ell}"] if keep else None,
        p[f"gamma{ell}"],
        p[f"beta{ell}"],
        training=train,
        momentum=MOMENTUM,
        eps=EPS,
    )


def batch_scale_norm(s: State, ell: int, x: Tensor, mode: Mode) -> Tensor:
    """Scale-only BatchNorm of the theory: each feature divided by its root mean square over the
    batch, no centering, no γ/β (Meterez et al. 2024, Eq. 2; Daneshmand et al. 2021)."""
    if mode == "running":
        return x * torch.rsqrt(s[f"sq{ell}"] + EPS)
    ms = x.pow(2).mean(dim=0)  # (d,)
    if mode == "train":
        with torch.no_grad():
            s[f"sq{ell}"].lerp_(ms.detach(), MOMENTUM)
    return x * torch.rsqrt(ms + EPS)


def layer_norm(p: Params, ell: int, x: Tensor) -> Tensor:
    """torch's LayerNorm: per sample, over features, centered and scaled, then γ, β."""
    return F.layer_norm(x, x.shape[-1:], p[f"gamma{ell}"], p[f"beta{ell}"], eps=EPS)


def layer_scale_norm(x: Tensor) -> Tensor:
    """Scale-only LayerNorm of the theory: each sample divided by its root mean square over
    features, x_i ↦ √d · x_i/‖x_i‖ (Joudaki et al. 2023, Sec. 3), no centering, no γ/β."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)


def normalize(spec: Spec, p: Params, s: State, ell: int, x: Tensor, mode: Mode) -> Tensor:
    if spec.norm == "batch":
        return batch_norm(p, s, ell, x, mode)
    if spec.norm == "batch_scale":
        return batch_scale_norm(s, ell, x, mode)
    if spec.norm == "layer":
        return layer_norm(p, ell, x)
    if spec.norm == "layer_scale":
        return layer_scale_norm(x)
    return x


def activate(sigma: Callable[[Tensor], Tensor], alpha: float, x: Tensor) -> Tensor:
    """σ(α · x); α = 1 skips the product so that σ = identity returns x itself."""
    return sigma(x if alpha == 1.0 else alpha * x)


def block(
    spec: Spec, p: Params, s: State, ell: int, x: Tensor, mode: Mode, sigma: Callable
) -> tuple[Tensor, Tensor, Tensor]:
    """Block ℓ (1-based). Returns its (Linear, norm, activation) outputs, each (n, d).

    With norm = "none" the norm output is the tensor the norm would have taken.
    """
    z = linear(p, str(ell), x)
    alpha = spec.alphas[ell - 1]
    if spec.order == "norm_act":
        n = normalize(spec, p, s, ell, z, mode)
        a = activate(sigma, alpha, n)
    else:
        a = activate(sigma, alpha, z)
        n = normalize(spec, p, s, ell, a, mode)
    return z, n, a


def forward(
    spec: Spec, p: Params, s: State, x: Tensor, mode: Mode, *, taps: bool = False
) -> tuple[Tensor, list[tuple[Tensor, Tensor, Tensor]] | None]:
    """The blocks in series, then the head: x (n, d_in) → logits (n, C).

    With `taps`, also every block's (Linear, norm, activation) outputs, ℓ = 1..L.
    """
    sigma = spec.sigma
    collected = [] if taps else None
    h = x
    for ell in range(1, spec.depth + 1):
        z, n, a = block(spec, p, s, ell, h, mode, sigma)
        h = a if spec.order == "norm_act" else n
        if collected is not None:
            collected.append((z, n, a))
    return linear(p, "_head", h), collected
