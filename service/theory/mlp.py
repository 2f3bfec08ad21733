"""The mean-field prediction of an `mlp` or `resmlp` trial's epoch-0 record, for
`service.theory.predict` (docs/science.md, "Predictions for a trial").

Every norm (none, layer, layer_scale,
batch, batch_scale), both orders, every registered activation, every init (orthogonal as its
Gaussian equivalent: the mean field does not tell them apart, which is Meterez et al.'s point at
n = d). The state of a layer is its per-unit kernel K and mean μ (service.theory.kernels). Forward:

    MLP block ℓ:   K_z = s·g²·K_{ℓ−1} + v_b  →  σ / norm in `order`      (h_ℓ = the block output)
    resmlp:        x_0 = W_in x;  x_ℓ = x_{ℓ−1} + c·f_ℓ(x_{ℓ−1}):
                   K_ℓ = K_{ℓ−1} + c²K_f + c(μμ_fᵀ + μ_fμᵀ)   (W_ℓ independent of x: no cross term
                   beyond the means; De & Smith 2020: +c² per block with BatchNorm at the end)

A block without BatchNorm is exact (quadrature); a BatchNorm block is exact when its input is
Gaussian (Linear → BN, or σ = identity), else a Monte Carlo average over `samples` per-unit draws
(seed `seed`, standard error about 1/√samples of the kernel's scale per entry).

Backward (`grad_norm`): with the gradient-independence assumption of Yang et al. (2019) — the
backward weights independent of the forward ones, exact for Gaussian weights at infinite width —
the per-unit backward kernel D at the block output goes down as D_z = E[J D_out Jᵀ] through the
block's per-unit Jacobian J (σ′ entrywise, LayerNorm a per-sample scale, BatchNorm the n × n
Jacobian of the batch statistics: exact in a linear block, kernels.bn_backward_gaussian, else
Monte Carlo) and D_{ℓ−1} = s·g²·D_z through W_ℓ (plus D_ℓ itself in a residual stream).
‖∂ℒ/∂W_ℓ‖²_F = d·fan_in·tr(D_z K_{ℓ−1}); `grad_norm` is reported relative to the last block's
(the loss's own scale cancels). The head's kernel D_L is E[(p − y)(p − y)ᵀ] over the Gaussian
logits when labels are given, else the identity (uncorrelated, equal output gradients).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.activations import Activation, get_activation
from service.config import DATASET_SHAPES, TrialConfig
from service.errors import InvalidInput
from service.isometry import centred_basis, gap_from_eigenvalues, isometry_gap
from service.theory import kernels as kn
from service.theory.firstlayer import weight_variance_scale
from service.theory.meanfield import layer_gains


@dataclass
class _Block:
    """What the backward pass needs of block ℓ: its Gaussian input kernel and gain."""

    Kz: np.ndarray  # kernel of z_ℓ = W_ℓ x_{ℓ−1}
    K_in: np.ndarray  # kernel of x_{ℓ−1}, the Linear's input
    alpha: float
    fan_in: int
    scale_in: np.ndarray | None = None  # LayerNorm: 1/√(v_i + ε) per sample
    norm_in: str = ""  # the Gaussian at the norm's input (norm_act LayerNorm)


class Net:
    def __init__(self, c: TrialConfig, samples: int, seed: int, exact: bool) -> None:
        self.c = c
        self.act: Activation = get_activation(c.activation)
        self.samples, self.exact = samples, exact
        self.rng = np.random.default_rng(seed)
        self.mc_used = False
        self.eps = c.norm_eps
        g = c.init_gain if (c.init != "orthogonal" or c.orthogonal_gain) else 1.0
        self.g2 = g * g
        self.alphas = layer_gains(c.activation_gain, c.gain_exponent, c.depth)

    def weight_var(self, fan_in: int, fan_out: int) -> float:
        """s·g²: the factor a Linear multiplies its input's kernel by."""
        return weight_variance_scale(self.c.init, fan_in, fan_out) * self.g2

    def bias_var(self, fan_in: int) -> float:
        return 1.0 / (3.0 * fan_in) if (self.c.bias and self.c.bias_init == "torch") else 0.0

    # ------------------------------------------------------------------- forward, one block

    def block(self, Kz: np.ndarray, alpha: float) -> dict[str, Any]:
        """Taps of one Linear → (norm, σ) branch from the kernel of z: kernels and means of
        "norm" and "act", the output ("out": its kernel, mean) and LayerNorm scales."""
        c, act, eps, n = self.c, self.act, self.eps, Kz.shape[0]
        taps: dict[str, Any] = {"linear": (Kz, np.zeros(n))}
        norm = c.norm
        if norm in ("batch", "batch_scale"):
            taps.update(self._bn_block(Kz, alpha))
        elif c.order == "norm_act":
            if norm == "none":
                Kn = Kz
                taps["scale"] = None
            else:  # z has mean 0 over units: centring removes nothing; a Gaussian stays one
                s = 1.0 / np.sqrt(np.diag(Kz) + eps)
                Kn = Kz * np.outer(s, s)
                taps["scale"] = s
                taps["norm"] = (Kn, np.zeros(n))
            taps["act"] = kn.gaussian_act(act, alpha, Kn)
        else:
            Ka, mu = kn.gaussian_act(act, alpha, Kz)
            taps["act"] = (Ka, mu)
            if norm != "none":
                centred = norm == "layer"
                v = np.diag(Ka) - (mu**2 if centred else 0.0)
                s = 1.0 / np.sqrt(v + eps)
                K0 = Ka - np.outer(mu, mu) if centred else Ka
                taps["norm"] = (K0 * np.outer(s, s), np.zeros(n) if centred else mu * s)
                taps["scale"] = s
        last = "act" if (c.order == "norm_act" or norm == "none") else "norm"
        taps["out"] = taps[last]
        return taps

    def _bn_block(self, Kz: np.ndarray, alpha: float) -> dict[str, Any]:
        c, act, eps = self.c, self.act, self.eps
        centred = c.norm == "batch"
        n = Kz.shape[0]
        linear = act.name == "identity"
        if c.order == "norm_act":
            if self.exact or linear:
                Kn = kn.bn_gaussian(Kz, eps, centred)
                if linear:
                    return {"norm": (Kn, np.zeros(n)), "act": (alpha**2 * Kn, np.zeros(n))}
            Y = kn.bn_samples(kn.gaussian_draws(Kz, self.samples, self.rng), eps, centred)
            self.mc_used = True
            A = act.numpy(alpha * Y)
            Kn_mc = Y.T @ Y / len(Y)
            return {
                "norm": (Kn if (self.exact or linear) else Kn_mc, np.zeros(n)),
                "act": (A.T @ A / len(A), A.mean(axis=0)),
            }
        if linear:
            Ka = alpha**2 * Kz
            return {
                "act": (Ka, np.zeros(n)),
                "norm": (kn.bn_gaussian(Ka, eps, centred), np.zeros(n)),
            }
        Ka, mu = kn.gaussian_act(act, alpha, Kz)
        A = act.numpy(alpha * kn.gaussian_draws(Kz, self.samples, self.rng))
        self.mc_used = True
        Y = kn.bn_samples(A, eps, centred)
        return {"act": (Ka, mu), "norm": (Y.T @ Y / len(Y), Y.mean(axis=0))}

    # ------------------------------------------------------------------ backward, one block

    def block_backward(self, b: _Block, D_out: np.ndarray) -> np.ndarray:
        """D_z (n, n) at z_ℓ from the backward kernel D_out at the block's output."""
        c, act = self.c, self.act
        norm, a = c.norm, b.alpha
        if norm in ("batch", "batch_scale"):
            return self._bn_backward(b, D_out)
        if c.order == "norm_act":
            Kn = b.Kz if b.scale_in is None else b.Kz * np.outer(b.scale_in, b.scale_in)
            S = kn.gaussian_act_derivative(act, a, Kn, self.samples, self.rng)
            D = S * D_out
            return D if b.scale_in is None else D * np.outer(b.scale_in, b.scale_in)
        D = D_out if b.scale_in is None else D_out * np.outer(b.scale_in, b.scale_in)
        return kn.gaussian_act_derivative(act, a, b.Kz, self.samples, self.rng) * D

    def _bn_backward(self, b: _Block, D_out: np.ndarray) -> np.ndarray:
        c, act, eps, a = self.c, self.act, self.eps, b.alpha
        centred = c.norm == "batch"
        linear = act.name == "identity"
        if linear:  # BN's input is Gaussian: z (norm_act) or αz (act_norm): exact
            Sigma = b.Kz if c.order == "norm_act" else a * a * b.Kz
            return a * a * kn.bn_backward_gaussian(Sigma, D_out, eps, centred)
        M, rng = self.samples, self.rng
        self.mc_used = True
        Z = kn.gaussian_draws(b.Kz, M, rng)
        G = kn.gaussian_draws(D_out, M, rng)
        if c.order == "norm_act":
            Y = kn.bn_samples(Z, eps, centred)
            Gy = a * kn.derivative(act, a * Y) * G
            Gz = kn.bn_backward_samples(Z, Gy, eps, centred)
        else:
            A = act.numpy(a * Z)
            Ga = kn.bn_backward_samples(A, G, eps, centred)
            Gz = a * kn.derivative(act, a * Z) * Ga
        return Gz.T @ Gz / M


# ---------------------------------------------------------------------------------- metrics


def _cosine_mean(K: np.ndarray) -> float:
    d = np.sqrt(np.diag(K))
    if not (d > 0).all():
        return math.nan
    C = K / np.outer(d, d)
    n = K.shape[0]
    return float((C.sum() - np.trace(C)) / (n * (n - 1))) if n > 1 else math.nan


def _gaps(K: np.ndarray, ones_null: bool, forced: bool) -> tuple[float, float]:
    """(isometry_gap, range_isometry_gap) of a predicted kernel: +inf where the structure forces
    a null space (1 for batch-centred taps; n > width), the range gap on 1⊥."""
    if ones_null:
        Q = centred_basis(K.shape[0])
        r = float(gap_from_eigenvalues(np.linalg.eigvalsh(Q.T @ K @ Q)))
        return math.inf, r
    g = float(isometry_gap(K))
    return (math.inf if forced else g), g


def _head_kernel(K: np.ndarray, var: float, labels: np.ndarray, classes: int, net: Net):
    """E[(p − y)(p − y)ᵀ] (n, n), logits ~ N(0, var·K) per class, Monte Carlo."""
    n = K.shape[0]
    R = kn.psd_sqrt(var * K)
    Y = np.eye(classes)[labels]  # (n, C)
    M = max(64, net.samples // classes)
    D = np.zeros((n, n))
    for _ in range(4):
        logits = R @ net.rng.standard_normal((n, classes, M // 4)).reshape(n, -1)
        logits = logits.reshape(n, classes, -1)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        E = p - Y[:, :, None]  # (n, C, m)
        D += np.einsum("icm,jcm->ij", E, E)
    return D / M


# ------------------------------------------------------------------------------ public API


def predict_mlp(
    net: Net, K_in: np.ndarray, d_in: int, labels: np.ndarray | None, gradients: bool
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The forward metrics and grad_norm of an mlp or resmlp, and {metric: why} for failures."""
    from service.models import tap_kinds

    c, n = net.c, K_in.shape[0]
    out: dict[str, np.ndarray] = {}
    unpredicted: dict[str, str] = {}
    forced = n > c.width
    forward = _forward(net, K_in, d_in)
    for kind in tap_kinds(c):
        g = [_gaps(K, null, forced) for K, null in forward["taps"][kind]]
        out[f"isometry_gap/{kind}"] = np.array([x[0] for x in g])
        out[f"range_isometry_gap/{kind}"] = np.array([x[1] for x in g])
    outs = forward["outputs"]
    out["rms"] = np.array([math.sqrt(max(np.trace(K), 0.0) / n) for K in outs])
    out["mean_cosine"] = np.array([_cosine_mean(K) for K in outs])
    if not gradients:
        unpredicted["grad_norm"] = "not asked for (gradients=False)"
        return out, unpredicted
    try:
        out["grad_norm"] = _grad_norms(net, forward, labels)
    except InvalidInput as exc:
        unpredicted["grad_norm"] = f"the backward recursion failed: {exc.message}"
    return out, unpredicted


def _forward(net: Net, K_in: np.ndarray, d_in: int) -> dict[str, Any]:
    c = net.c
    n, d = K_in.shape[0], c.width
    taps: dict[str, list] = {k: [] for k in ("linear", "norm", "act", "residual")}
    outputs, blocks = [], []
    bias = c.bias and c.bias_init == "torch"
    if c.model == "resmlp":
        K = net.weight_var(d_in, d) * K_in + net.bias_var(d_in)
        mu = np.zeros(n)
        fan = d
    else:
        K, mu, fan = K_in, np.zeros(n), d_in
    stream_null = False  # 1 in the stream's null space (never for data)
    for ell in range(1, c.depth + 1):
        alpha = float(net.alphas[ell - 1])
        Kz = net.weight_var(fan, d) * K + net.bias_var(fan)
        t = net.block(Kz, alpha)
        z_null = stream_null and not bias
        ident = net.act.name == "identity"
        if c.order == "norm_act":  # a per-unit scale (batch_scale) keeps 1 in the null space
            n_null = c.norm == "batch" or (z_null and c.norm in ("none", "batch_scale"))
            a_null = ident and n_null
        else:
            a_null = ident and z_null
            n_null = c.norm == "batch" or (a_null and c.norm == "batch_scale")
        null = {"linear": z_null, "norm": n_null, "act": a_null}
        for k in ("linear", "norm", "act"):
            if k in t:
                taps[k].append((t[k][0], null[k]))
        out_null = null["act"] if (c.order == "norm_act" or c.norm == "none") else null["norm"]
        blocks.append(_Block(Kz, K, alpha, fan, t.get("scale")))
        Kf, mf = t["out"]
        if c.model == "resmlp":
            r = c.residual_scale
            K = K + r * r * Kf + r * (np.outer(mu, mf) + np.outer(mf, mu))
            mu = mu + r * mf
            stream_null = stream_null and out_null
            taps["residual"].append((K, stream_null))
        else:
            K, mu, stream_null = Kf, mf, out_null
        outputs.append(K)
        fan = d
    return {"taps": taps, "outputs": outputs, "blocks": blocks, "K_last": K}


def _grad_norms(net: Net, forward: dict[str, Any], labels: np.ndarray | None) -> np.ndarray:
    c = net.c
    K_L = forward["K_last"]
    n = K_L.shape[0]
    if labels is None:
        D = np.eye(n)
    else:
        head = c.head_init or c.init
        s = weight_variance_scale(head, c.width, DATASET_SHAPES[c.dataset][1]) * net.g2
        D = _head_kernel(K_L, s, labels, DATASET_SHAPES[c.dataset][1], net)
    blocks = forward["blocks"]
    sq = np.empty(len(blocks))
    for i in range(len(blocks) - 1, -1, -1):
        b = blocks[i]
        Dz = net.block_backward(b, D)
        sq[i] = b.fan_in * float(np.sum(Dz * b.K_in))
        back = net.weight_var(c.width, c.width) * Dz
        D = D + c.residual_scale**2 * back if c.model == "resmlp" else back
        D = (D + D.T) / 2
    if not (np.isfinite(sq).all() and sq[-1] > 0):
        raise InvalidInput("the gradient kernel is not finite", field="depth")
    return np.sqrt(np.maximum(sq, 0.0) / sq[-1])
