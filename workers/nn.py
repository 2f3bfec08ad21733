"""The MLP as pure functions over explicit tensors: model mlp (workers/models/mlp.py) and the
branch of resmlp's blocks; the inits, norms and gain schedule the other families reuse.

A network is a `Spec` (shapes and choices, no tensors), a `Params` dict of trainable tensors and a
`State` dict of normalization running statistics. Every piece is a function of
(spec, params, state, x): nothing hides per-instance state, so workers/packed.py stacks the
tensors of several trials along a leading axis and runs them as one batched model
(docs/architecture.md, "Packed trials").

    block ℓ, order norm_act:  z = W_ℓ x (+ b_ℓ) → n = norm(z) → a = σ(α_ℓ · n)
    block ℓ, order act_norm:  z = W_ℓ x (+ b_ℓ) → a = σ(α_ℓ · z) → n = norm(a)
    head:                     logits = W_head h (+ b_head)

with α_ℓ = activation_gain · ℓ^(−gain_exponent), ℓ = 1..L (Meterez et al. 2024, activation
shaping). Parameter names: "W1".."WL", "W_head"; with bias "b1".."bL", "b_head"; with torch's
affine norms ("batch", "layer") "gamma1".., "beta1"... State names: "mean{ℓ}", "var{ℓ}" (batch),
"sq{ℓ}" (batch_scale: running mean of z²). Every norm adds `Spec.eps` (TrialConfig.norm_eps) to
the variance / mean square it divides by; params, state and inputs are in `Spec.dtype`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from service.activations import gain_schedule, get_activation
from service.config import DATASET_SHAPES, TrialConfig
from service.errors import InvalidInput

Params = dict[str, Tensor]
State = dict[str, Tensor]
# How a normalization layer gets its statistics:
#   "train"   — the batch's own, and running statistics are updated (a training step);
#   "batch"   — the batch's own, running statistics untouched (measuring; eval_norm = "batch");
#   "running" — the running statistics (torch's eval mode).
Mode = Literal["train", "batch", "running"]

EPS = 1e-5  # torch's default ε in BatchNorm / LayerNorm, the default of every norm here
MOMENTUM = 0.1  # torch's default running-statistics momentum
NORMS = ("batch", "layer", "none", "batch_scale", "layer_scale")
INITS = ("gaussian", "xavier", "kaiming", "orthogonal")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


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
    eps: float = EPS  # ε of every normalization
    dtype: torch.dtype = torch.float32

    @property
    def affine(self) -> bool:
        """torch's BatchNorm / LayerNorm carry a learnable gain γ and shift β; the scale-only
        variants of the theory carry none."""
        return self.norm in ("batch", "layer")

    @property
    def sigma(self) -> Callable[[Tensor], Tensor]:
        return get_activation(self.activation).torch(torch)


def gains(activation_gain: float, gain_exponent: float, depth: int) -> tuple[float, ...]:
    """α_ℓ = α · ℓ^(−p) for ℓ = 1..L (Meterez et al. 2024, Sec. 5: p = 0.4 shapes tanh/sin), as
    Python floats: the one schedule, service.activations.gain_schedule, that the theory uses too."""
    return tuple(gain_schedule(activation_gain, gain_exponent, depth).tolist())


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
        eps=config.norm_eps,
        dtype=DTYPES[config.dtype],
    )


# ---------------------------------------------------------------------------------------------
# Initialization


def haar_orthogonal(
    out: int, inp: int, generator: torch.Generator, dtype: torch.dtype = torch.float32
) -> Tensor:
    """A Haar-distributed (semi-)orthogonal out × inp matrix: W Wᵀ = I if out ≤ inp, else WᵀW = I.

    QR of a Gaussian matrix with the signs of R's diagonal moved into Q (Mezzadri 2007, "How to
    generate random matrices from the classical compact groups"); without the sign fix Q is not
    Haar. Done in float64 so the float32 result is orthogonal to rounding.
    """
    tall = out >= inp
    A = torch.randn(max(out, inp), min(out, inp), generator=generator, dtype=torch.float64)
    Q, R = torch.linalg.qr(A)  # Q: (max, min), orthonormal columns
    Q = Q * torch.sign(torch.diagonal(R)).unsqueeze(0)
    return (Q if tall else Q.T).to(dtype)


def init_weight(
    out: int,
    inp: int,
    init: str,
    g: float,
    generator: torch.Generator,
    *,
    dtype: torch.dtype = torch.float32,
    orthogonal_gain: bool = True,
) -> Tensor:
    """One out × inp weight in `dtype`.

    gaussian: N(0, g²/fan_in); xavier (Glorot normal): N(0, 2g²/(fan_in + fan_out));
    kaiming (He normal, ReLU): N(0, 2g²/fan_in); orthogonal: g · Haar (semi-)orthogonal, or Haar
    alone with orthogonal_gain=False (torch.nn.init.orthogonal_ with its default gain, as the
    authors' code uses it). The draws do not depend on dtype: Gaussian entries are drawn in
    float32 (the same generator steps and values at either dtype), Haar matrices in float64, then
    rounded to dtype — so a float64 network starts from its float32 twin's weights (within one
    float32 rounding), and a float32 one is unchanged by the option.
    """
    if init == "orthogonal":
        Q = haar_orthogonal(out, inp, generator, dtype)
        return g * Q if orthogonal_gain else Q
    var = {
        "gaussian": g**2 / inp,
        "xavier": 2 * g**2 / (inp + out),
        "kaiming": 2 * g**2 / inp,
    }.get(init)
    if var is None:
        raise InvalidInput(f"unknown init {init!r}", field="init", allowed=INITS)
    return torch.randn(out, inp, generator=generator).to(dtype) * math.sqrt(var)


def torch_bias(out: int, fan_in: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    """nn.Linear's default bias: U(−1/√fan_in, 1/√fan_in), drawn in float64."""
    bound = 1 / math.sqrt(fan_in)
    u = torch.rand(out, generator=generator, dtype=torch.float64)
    return ((2 * u - 1) * bound).to(dtype)


def init_params(
    spec: Spec,
    init: str,
    init_gain: float,
    generator: torch.Generator,
    *,
    head_init: str | None = None,
    orthogonal_gain: bool = True,
    bias_init: str = "zero",
) -> Params:
    """Fresh parameters on the CPU in spec.dtype (draws are device-independent; move them with
    `to_device`). The keywords are TrialConfig's fields of the same names (`init_params_of`).

    Weights W1..WL then W_head (init `head_init`, default `init`) are drawn first, in that order;
    with bias_init "torch" the biases b1..bL, b_head are drawn after all of them (nn.Linear's
    default, U(−1/√fan_in, 1/√fan_in)), so the weights do not depend on bias_init. Biases
    otherwise start at 0 and norm gains/shifts at 1/0, so the untrained network is the theory's.
    """
    dims = [spec.d_in] + [spec.width] * spec.depth
    dt = spec.dtype

    def weight(out: int, inp: int, name: str) -> Tensor:
        return init_weight(
            out, inp, name, init_gain, generator, dtype=dt, orthogonal_gain=orthogonal_gain
        )

    p: Params = {}
    for ell in range(1, spec.depth + 1):
        d_out, d_in = dims[ell], dims[ell - 1]
        p[f"W{ell}"] = weight(d_out, d_in, init)
        if spec.bias:
            p[f"b{ell}"] = torch.zeros(d_out, dtype=dt)
        if spec.affine:
            p[f"gamma{ell}"] = torch.ones(d_out, dtype=dt)
            p[f"beta{ell}"] = torch.zeros(d_out, dtype=dt)
    p["W_head"] = weight(spec.n_classes, spec.width, head_init or init)
    if spec.bias:
        p["b_head"] = torch.zeros(spec.n_classes, dtype=dt)
    if spec.bias and bias_init == "torch":  # after every weight: same weights as bias_init zero
        for ell in range(1, spec.depth + 1):
            p[f"b{ell}"] = torch_bias(dims[ell], dims[ell - 1], generator, dt)
        p["b_head"] = torch_bias(spec.n_classes, spec.width, generator, dt)
    return p


def init_params_of(spec: Spec, config: TrialConfig, generator: torch.Generator) -> Params:
    """init_params with a trial's init, init_gain, head_init, orthogonal_gain and bias_init."""
    return init_params(
        spec,
        config.init,
        config.init_gain,
        generator,
        head_init=config.head_init,
        orthogonal_gain=config.orthogonal_gain,
        bias_init=config.bias_init,
    )


def init_state(spec: Spec) -> State:
    """Running statistics, as torch initializes them (mean 0, variance 1), in spec.dtype."""
    s: State = {}
    dt = spec.dtype
    for ell in range(1, spec.depth + 1):
        if spec.norm == "batch":
            s[f"mean{ell}"] = torch.zeros(spec.width, dtype=dt)
            s[f"var{ell}"] = torch.ones(spec.width, dtype=dt)
        elif spec.norm == "batch_scale":
            s[f"sq{ell}"] = torch.ones(spec.width, dtype=dt)
    return s


def to_device(tensors: dict[str, Tensor], device: str | torch.device) -> dict[str, Tensor]:
    return {k: v.to(device) for k, v in tensors.items()}


# ---------------------------------------------------------------------------------------------
# The pieces: pure functions of (params, state, x)


def linear(p: Params, name: str, x: Tensor) -> Tensor:
    """x Wᵀ (+ b): x (n, d_in) → (n, d_out)."""
    return F.linear(x, p[f"W{name}"], p.get(f"b{name}"))


def batch_norm(p: Params, s: State, ell: int, x: Tensor, mode: Mode, eps: float = EPS) -> Tensor:
    """torch's BatchNorm1d: per feature, over the batch, centered and scaled, then γ, β.

    torch refuses ε = 0 in training; then `batch_norm_exact` computes the same thing itself."""
    if eps == 0:
        return batch_norm_exact(p, s, ell, x, mode)
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
        eps=eps,
    )


def batch_norm_exact(p: Params, s: State, ell: int, x: Tensor, mode: Mode) -> Tensor:
    """BatchNorm with ε = 0: (x − μ)/σ per feature (biased σ over the batch), then γ, β; in
    "train" mode the running mean and (unbiased) variance move as torch moves them."""
    gamma, beta = p[f"gamma{ell}"], p[f"beta{ell}"]
    if mode == "running":
        return (x - s[f"mean{ell}"]) * torch.rsqrt(s[f"var{ell}"]) * gamma + beta
    var, mean = torch.var_mean(x, dim=0, correction=0)
    if mode == "train":
        with torch.no_grad():
            n = x.shape[0]
            s[f"mean{ell}"].lerp_(mean.detach(), MOMENTUM)
            s[f"var{ell}"].lerp_(var.detach() * (n / max(n - 1, 1)), MOMENTUM)
    return (x - mean) * torch.rsqrt(var) * gamma + beta


def batch_scale_norm(s: State, ell: int, x: Tensor, mode: Mode, eps: float = EPS) -> Tensor:
    """Scale-only BatchNorm of the theory: each feature divided by its root mean square over the
    batch, no centering, no γ/β (Meterez et al. 2024, Eq. 2; Daneshmand et al. 2021)."""
    if mode == "running":
        return x * torch.rsqrt(s[f"sq{ell}"] + eps)
    ms = x.pow(2).mean(dim=0)  # (d,)
    if mode == "train":
        with torch.no_grad():
            s[f"sq{ell}"].lerp_(ms.detach(), MOMENTUM)
    return x * torch.rsqrt(ms + eps)


def layer_norm(p: Params, ell: int, x: Tensor, eps: float = EPS) -> Tensor:
    """torch's LayerNorm: per sample, over features, centered and scaled, then γ, β."""
    return F.layer_norm(x, x.shape[-1:], p[f"gamma{ell}"], p[f"beta{ell}"], eps=eps)


def layer_scale_norm(x: Tensor, eps: float = EPS) -> Tensor:
    """Scale-only LayerNorm of the theory: each sample divided by its root mean square over
    features, x_i ↦ √d · x_i/‖x_i‖ (Joudaki et al. 2023, Sec. 3), no centering, no γ/β."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def normalize(spec: Spec, p: Params, s: State, ell: int, x: Tensor, mode: Mode) -> Tensor:
    eps = spec.eps
    if spec.norm == "batch":
        return batch_norm(p, s, ell, x, mode, eps)
    if spec.norm == "batch_scale":
        return batch_scale_norm(s, ell, x, mode, eps)
    if spec.norm == "layer":
        return layer_norm(p, ell, x, eps)
    if spec.norm == "layer_scale":
        return layer_scale_norm(x, eps)
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
