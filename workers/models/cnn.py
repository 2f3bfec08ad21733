"""The convolutional family (model: cnn) as a `Net` (docs/models.md).

The flattened inputs (n, d_in) are folded back into the dataset's images (n, C, H, W)
(`as_images`), then L blocks, each keeping the H × W map (stride 1, same padding k//2):

    block ℓ, order norm_act:  z = K_ℓ ⋆ h (+ b_ℓ) → n = norm(z) → a = σ(α_ℓ · n)
    block ℓ, order act_norm:  z = K_ℓ ⋆ h (+ b_ℓ) → a = σ(α_ℓ · z) → n = norm(a)
    head:                     logits = W_head · mean_{H×W}(h_L) (+ b_head)

K_ℓ is width × C_in × k × k (C_in = C for ℓ = 1, else width; k = kernel_size), α_ℓ the gain
schedule of workers/nn.py. The norms in their convolutional form, every one adding norm_eps:

    batch        BatchNorm2d: per channel over batch × H × W, centred and scaled, then γ, β
    batch_scale  per channel, divided by the root mean square over batch × H × W (no centring)
    layer        per sample over C × H × W, centred and scaled (GroupNorm with one group),
                 then a per-channel γ, β
    layer_scale  per sample, divided by the root mean square over C × H × W
    none

Parameter names: "K1".."KL", "W_head"; with bias "b1".."bL", "b_head"; with batch/layer
"gamma{ℓ}", "beta{ℓ}" (width,). State: "mean{ℓ}", "var{ℓ}" (batch), "sq{ℓ}" (batch_scale),
each (width,), with the modes of workers/nn.py ("train", "batch", "running").

Initialization, with fan_in = C_in·k·k, fan_out = width·k·k (torch's convention for
convolutions), g = init_gain:

    gaussian          N(0, g²/fan_in)              xavier   N(0, 2g²/(fan_in + fan_out))
    kaiming           N(0, 2g²/fan_in)             orthogonal  g · the kernel reshaped to
                      (width, C_in·k·k) Haar (semi-)orthogonal (`nn.haar_orthogonal`)
    delta_orthogonal  every tap 0 but the centre, which is g · a Haar (semi-)orthogonal
                      width × C_in matrix (Xiao et al. 2018, "Dynamical isometry and a mean
                      field theory of CNNs", Sec. 2.3): a channel-orthogonal map at every pixel.
                      For block 1 (C_in = C < width) its columns are orthonormal, so it too
                      preserves inner products.

(orthogonal_gain = false drops g from both orthogonal inits, as for the MLP.) The head is a
width → n_classes matrix with head_init (default init; delta_orthogonal is orthogonal there).

Generator draw order (fixed): K1, .., KL, then W_head — each one draw: float32 normals of shape
(width, C_in·k·k) for the Gaussian rules, float64 normals of shape (max, min) of the matrix for
orthogonal (the kernel matrix) and delta_orthogonal (the centre width × C_in only; the other taps
draw nothing) — then, with bias_init "torch", b1..bL and b_head (U(±1/√fan_in), float64, torch's
Conv2d/Linear default), after every weight so that the weights do not depend on bias_init.
Biases otherwise start at 0, γ at 1, β at 0.

Taps (kinds "linear", "norm", "act"; no "norm" for norm none): z, the norm output and a, each
(n, width, H, W); Taps.outputs: the block's output (a for norm_act, n for act_norm). The sample
Gram of a tap is over its flattened feature maps (n, width·H·W).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from service.activations import get_activation
from service.config import DATASET_IMAGES, DATASET_SHAPES, TrialConfig
from service.errors import InvalidInput
from workers import nn
from workers.models.base import Fit, Mode, Params, State, Taps, as_images

INITS = ("gaussian", "xavier", "kaiming", "orthogonal", "delta_orthogonal")
AFFINE = ("batch", "layer")  # norms with a per-channel γ, β


# ---------------------------------------------------------------------------------------------
# Initialization


def init_kernel(
    out: int,
    inp: int,
    k: int,
    init: str,
    g: float,
    generator: torch.Generator,
    *,
    dtype: torch.dtype = torch.float32,
    orthogonal_gain: bool = True,
) -> Tensor:
    """One convolution kernel (out, inp, k, k) in `dtype` (the module docstring's rules)."""
    fan_in, fan_out = inp * k * k, out * k * k
    scale = g if orthogonal_gain else 1.0
    if init == "delta_orthogonal":
        K = torch.zeros(out, inp, k, k, dtype=dtype)
        K[:, :, k // 2, k // 2] = scale * nn.haar_orthogonal(out, inp, generator, dtype)
        return K
    if init == "orthogonal":
        return (scale * nn.haar_orthogonal(out, fan_in, generator, dtype)).reshape(out, inp, k, k)
    var = {
        "gaussian": g**2 / fan_in,
        "xavier": 2 * g**2 / (fan_in + fan_out),
        "kaiming": 2 * g**2 / fan_in,
    }.get(init)
    if var is None:
        raise InvalidInput(f"unknown init {init!r}", field="init", allowed=INITS)
    W = torch.randn(out, fan_in, generator=generator).to(dtype) * math.sqrt(var)
    return W.reshape(out, inp, k, k)


# ---------------------------------------------------------------------------------------------
# The convolutional norms: pure functions of (params, state, x), x (n, c, H, W)


def _per_channel(v: Tensor) -> Tensor:
    return v.reshape(1, -1, 1, 1)


def batch_norm2d(p: Params, s: State, ell: int, x: Tensor, mode: Mode, eps: float) -> Tensor:
    """torch's BatchNorm2d: per channel over batch × H × W, centred and scaled, then γ, β;
    running mean and unbiased variance (count n·H·W) moved by momentum 0.1 in "train" mode.
    F.batch_norm is BatchNorm2d on a 4-D input (nn.batch_norm); torch refuses ε = 0 in
    training, so ε = 0 is computed here."""
    if eps != 0:
        return nn.batch_norm(p, s, ell, x, mode, eps)
    gamma, beta = _per_channel(p[f"gamma{ell}"]), _per_channel(p[f"beta{ell}"])
    if mode == "running":
        mean, var = _per_channel(s[f"mean{ell}"]), _per_channel(s[f"var{ell}"])
        return (x - mean) * torch.rsqrt(var) * gamma + beta
    var, mean = torch.var_mean(x, dim=(0, 2, 3), correction=0)
    if mode == "train":
        m = x.numel() // x.shape[1]
        with torch.no_grad():
            s[f"mean{ell}"].lerp_(mean.detach(), nn.MOMENTUM)
            s[f"var{ell}"].lerp_(var.detach() * (m / max(m - 1, 1)), nn.MOMENTUM)
    return (x - _per_channel(mean)) * torch.rsqrt(_per_channel(var)) * gamma + beta


def batch_scale_norm2d(s: State, ell: int, x: Tensor, mode: Mode, eps: float) -> Tensor:
    """Scale-only BatchNorm2d: each channel divided by its root mean square over batch × H × W
    (no centring, no γ/β); "train" moves the running mean square "sq{ℓ}" by momentum 0.1."""
    if mode == "running":
        return x * torch.rsqrt(_per_channel(s[f"sq{ell}"]) + eps)
    ms = x.pow(2).mean(dim=(0, 2, 3))
    if mode == "train":
        with torch.no_grad():
            s[f"sq{ell}"].lerp_(ms.detach(), nn.MOMENTUM)
    return x * torch.rsqrt(_per_channel(ms) + eps)


def layer_norm2d(p: Params, ell: int, x: Tensor, eps: float) -> Tensor:
    """LayerNorm over the feature map: per sample over C × H × W, centred and scaled, then a
    per-channel γ, β (torch's GroupNorm with one group)."""
    return F.group_norm(x, 1, p[f"gamma{ell}"], p[f"beta{ell}"], eps=eps)


def layer_scale_norm2d(x: Tensor, eps: float) -> Tensor:
    """Scale-only LayerNorm over the feature map: each sample divided by its root mean square
    over C × H × W (no centring, no γ/β)."""
    return x * torch.rsqrt(x.pow(2).mean(dim=(1, 2, 3), keepdim=True) + eps)


# ---------------------------------------------------------------------------------------------
# The network


@dataclass(frozen=True)
class CNNNet:
    config: TrialConfig

    head_weight = "W_head"

    def __post_init__(self) -> None:
        c = self.config
        if c.norm not in nn.NORMS:
            raise InvalidInput(f"unknown norm {c.norm!r}", field="norm", allowed=nn.NORMS)
        for name in ("init", "head_init"):
            value = getattr(c, name)
            if value is not None and value not in INITS:
                raise InvalidInput(f"unknown init {value!r}", field=name, allowed=INITS)
        if c.kernel_size % 2 == 0:
            raise InvalidInput(
                f"kernel_size must be odd for same padding, not {c.kernel_size}",
                field="kernel_size",
            )

    # -- shapes -------------------------------------------------------------------------------

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
    def d_in(self) -> int:
        return DATASET_SHAPES[self.config.dataset][0]

    @property
    def n_classes(self) -> int:
        return DATASET_SHAPES[self.config.dataset][1]

    @property
    def image(self) -> tuple[int, int, int]:
        """(C, H, W) of the dataset's images."""
        _, c, h, w = DATASET_IMAGES[self.config.dataset]
        return c, h, w

    @property
    def dtype(self) -> torch.dtype:
        return nn.DTYPES[self.config.dtype]

    @property
    def kinds(self) -> tuple[str, ...]:
        return ("linear", "act") if self.config.norm == "none" else ("linear", "norm", "act")

    @property
    def alphas(self) -> tuple[float, ...]:
        c = self.config
        return nn.gains(c.activation_gain, c.gain_exponent, c.depth)

    @property
    def sigma(self) -> Callable[[Tensor], Tensor]:
        return get_activation(self.config.activation).torch(torch)

    def channels(self) -> list[int]:
        """C_in of blocks 1..L, then the width they all output."""
        return [self.image[0]] + [self.width] * self.depth

    # -- tensors ------------------------------------------------------------------------------

    def init_params(self, generator: torch.Generator) -> Params:
        """Fresh parameters on the CPU in self.dtype, drawn in the module docstring's order."""
        c, dt, k = self.config, self.dtype, self.config.kernel_size
        ch = self.channels()
        p: Params = {}
        for ell in range(1, self.depth + 1):
            p[f"K{ell}"] = init_kernel(
                ch[ell],
                ch[ell - 1],
                k,
                c.init,
                c.init_gain,
                generator,
                dtype=dt,
                orthogonal_gain=c.orthogonal_gain,
            )
            if c.bias:
                p[f"b{ell}"] = torch.zeros(self.width, dtype=dt)
            if c.norm in AFFINE:
                p[f"gamma{ell}"] = torch.ones(self.width, dtype=dt)
                p[f"beta{ell}"] = torch.zeros(self.width, dtype=dt)
        head = c.head_init or c.init
        p["W_head"] = nn.init_weight(
            self.n_classes,
            self.width,
            "orthogonal" if head == "delta_orthogonal" else head,
            c.init_gain,
            generator,
            dtype=dt,
            orthogonal_gain=c.orthogonal_gain,
        )
        if c.bias:
            p["b_head"] = torch.zeros(self.n_classes, dtype=dt)
        if c.bias and c.bias_init == "torch":  # after every weight: same weights as "zero"
            for ell in range(1, self.depth + 1):
                p[f"b{ell}"] = nn.torch_bias(self.width, ch[ell - 1] * k * k, generator, dt)
            p["b_head"] = nn.torch_bias(self.n_classes, self.width, generator, dt)
        return p

    def init_state(self) -> State:
        """Running statistics as torch starts them (mean 0, variance 1; mean square 1)."""
        s: State = {}
        dt, d = self.dtype, self.width
        for ell in range(1, self.depth + 1):
            if self.config.norm == "batch":
                s[f"mean{ell}"] = torch.zeros(d, dtype=dt)
                s[f"var{ell}"] = torch.ones(d, dtype=dt)
            elif self.config.norm == "batch_scale":
                s[f"sq{ell}"] = torch.ones(d, dtype=dt)
        return s

    # -- forward ------------------------------------------------------------------------------

    def normalize(self, p: Params, s: State, ell: int, x: Tensor, mode: Mode) -> Tensor:
        norm, eps = self.config.norm, self.config.norm_eps
        if norm == "batch":
            return batch_norm2d(p, s, ell, x, mode, eps)
        if norm == "batch_scale":
            return batch_scale_norm2d(s, ell, x, mode, eps)
        if norm == "layer":
            return layer_norm2d(p, ell, x, eps)
        if norm == "layer_scale":
            return layer_scale_norm2d(x, eps)
        return x

    def forward(
        self, p: Params, s: State, x: Tensor, mode: Mode, *, taps: bool = False
    ) -> tuple[Tensor, Taps | None]:
        """x (n, d_in) → logits (n, n_classes); with `taps`, every block's taps."""
        sigma, alphas, pad = self.sigma, self.alphas, self.config.kernel_size // 2
        act_last = self.config.order == "norm_act"
        layers: dict[str, list[Tensor]] = {kind: [] for kind in self.kinds}
        outputs: list[Tensor] = []
        h = as_images(x, self.config.dataset)
        for ell in range(1, self.depth + 1):
            z = F.conv2d(h, p[f"K{ell}"], p.get(f"b{ell}"), padding=pad)
            if act_last:
                n = self.normalize(p, s, ell, z, mode)
                a = nn.activate(sigma, alphas[ell - 1], n)
                h = a
            else:
                a = nn.activate(sigma, alphas[ell - 1], z)
                n = self.normalize(p, s, ell, a, mode)
                h = n
            if taps:
                layers["linear"].append(z)
                if "norm" in layers:
                    layers["norm"].append(n)
                layers["act"].append(a)
                outputs.append(h)
        logits = F.linear(h.mean(dim=(2, 3)), p["W_head"], p.get("b_head"))
        return logits, (Taps(layers, outputs) if taps else None)

    # -- structure ----------------------------------------------------------------------------

    def structures(self, p: Params, x: Tensor, taps: Taps, fit: Fit) -> dict:
        """Per kind, the `Structure` (workers/structure.py) of each block's tap, as flattened
        (n, width·H·W) matrices, followed in forward order and refined by `fit` on every tap.

        Rules, for H the incoming flattened representation (n × F, F = width·H·W):
        - conv K ⋆ h is a linear map of each flattened sample, H ↦ H Aᵀ (padding included):
          rank ≤ min(rank, F), 1ᵀH = 0 kept; a non-zero bias adds 1 bᵀ (b repeated over the
          positions): rank + 1, 1 leaves the null space.
        - batch (BatchNorm2d): Y = H D − 1 (D m − β)ᵀ with D the per-channel 1/σ_c·γ_c and m the
          per-channel batch × space means repeated over the positions. Because m averages over
          positions too, 1ᵀY = 1ᵀH D − n(Dm − β)ᵀ is not 0 in general: unlike BatchNorm1d it
          does not put 1 in the null space. It is a linear map plus a rank-one constant:
          rank ≤ rank + 1, ones_in_null False (β or not).
        - batch_scale: H D, a per-channel diagonal scaling: rank and 1ᵀH = 0 kept.
        - layer (GroupNorm(1)): Y = S H (I − 11ᵀ/F) Γ + 1 βᵀ with S the per-sample 1/σ_i: the
          centring is a right multiplication (rank ≤ min(rank, F − 1)) and the row scaling
          keeps the rank but moves 1 out of the null space; β ≠ 0 adds 1.
        - layer_scale: S H: rank kept, ones_in_null False.
        - σ: identity (any gain) keeps the structure; a non-linear σ resets to
          Structure(False, min(n, F)).
        Parameter values decide (is b or β exactly 0?), not config flags.
        """
        from workers.structure import Structure

        def is_zero(t: Tensor | None) -> bool:
            return t is None or bool(torch.all(t == 0))

        n = x.shape[0]
        _, hh, ww = self.image
        feats = self.width * hh * ww
        norm = self.config.norm

        def after_conv(s: Structure, ell: int) -> Structure:
            if is_zero(p.get(f"b{ell}")):
                return Structure(s.ones_in_null, min(s.rank, feats))
            return Structure(False, min(s.rank + 1, n, feats))

        def after_norm(s: Structure, ell: int) -> Structure:
            if norm == "batch":
                return Structure(False, min(s.rank + 1, n, feats))
            if norm == "layer":
                r = min(s.rank, feats - 1) + (0 if is_zero(p[f"beta{ell}"]) else 1)
                return Structure(False, min(r, n))
            if norm == "layer_scale":
                return Structure(False, s.rank)
            return s  # batch_scale, none

        def after_act(s: Structure) -> Structure:
            if self.config.activation == "identity":
                return s
            return Structure(False, min(n, feats))

        def fit_tap(s: Structure, kind: str, i: int) -> Structure:
            # The tap itself (n, width, H, W), not a reshaped copy: probe_metrics knows the zero
            # rows and columns of its flattened map by the tensor's identity. (metrics.refine on
            # a 4-D tensor without them counts columns exactly and over-counts rows: a looser,
            # never a wrong, bound.)
            return fit(s, taps.layers[kind][i])

        flat = x.reshape(n, -1)
        s = fit(Structure(False, min(flat.shape)), flat)
        out: dict[str, list[Structure]] = {kind: [] for kind in self.kinds}
        has_norm = "norm" in out
        for ell in range(1, self.depth + 1):
            i = ell - 1
            z = fit_tap(after_conv(s, ell), "linear", i)
            if self.config.order == "norm_act":
                nrm = fit_tap(after_norm(z, ell), "norm", i) if has_norm else z
                a = fit_tap(after_act(nrm), "act", i)
                s = a
            else:
                a = fit_tap(after_act(z), "act", i)
                nrm = fit_tap(after_norm(a, ell), "norm", i) if has_norm else a
                s = nrm
            out["linear"].append(z)
            if has_norm:
                out["norm"].append(nrm)
            out["act"].append(a)
        return out

    def layer_weights(self) -> list[list[str]]:
        """Per block its kernel (the metrics reshape it to (width, C_in·k·k))."""
        return [[f"K{ell}"] for ell in range(1, self.depth + 1)]
