"""Singular values of the input–output Jacobian on probe samples (dynamical isometry).

A network is dynamically isometric when every singular value of its input–output Jacobian is
close to 1 (Pennington, Schoenholz & Ganguli 2017, "Resurrecting the sigmoid in deep learning
through dynamical isometry"; Saxe et al. 2014 for deep linear networks). Here the output is
h_L, the last block's output (the head's input), so the head's shape plays no part:

    J_i = ∂[h_L(X)]_i / ∂x_i ∈ ℝ^{d × d_in},   X = (x_1, …, x_n) the probe batch,

with every other probe sample x_j (j ≠ i) held fixed, and x_i the input as the first Linear sees
it (after the trial's `input_norm`). Normalization runs on the probe batch's own
statistics (mode "batch", as every probe measurement does), so for BatchNorm J_i includes how x_i
moves the batch mean and variance that normalize its own output (the −1/n terms of the batch
statistics); for the per-sample norms (layer, layer_scale, none) [h_L(X)]_i depends on x_i alone
and J_i is computed from x_i by itself, which gives the same matrix at 1/n of the cost.

J_i is formed by reverse-mode autodiff (torch.func.jacrev, d vector–Jacobian products in chunks),
in float64 from the network's parameters promoted to float64: the values are those of the
network's function at its stored weights, not of float32 rounding in the product (a depth-50
product of float32 Haar matrices reads 1 to ~3e-7, their own rounding). Singular values come
from float64 `svdvals`, m = min(d, d_in) per sample, descending.

Two closed forms the tests check: a deep linear network with orthogonal square weights has
J = W_L ⋯ W_1 orthogonal, every σ = 1; with Gaussian N(0, 1/d) weights the mean of log σ is
(1/d) Σ_ℓ log |det W_ℓ| exactly (when d = d_in), and the spread of log σ grows with depth.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from service.errors import InvalidInput
from workers import nn
from workers.models.base import Net

F64 = torch.float64
BATCH_NORMS = ("batch", "batch_scale")  # norms whose statistics couple the samples of a batch
MAX_CHUNK_ENTRIES = 1 << 22  # float64 entries per chunk of vector–Jacobian products (≈ 32 MiB)


def as_net(net: Net | nn.Spec) -> Net:
    """A Net of workers/models; an MLP's nn.Spec is wrapped (networks built by hand)."""
    if isinstance(net, nn.Spec):
        from workers.models.mlp import MLPNet

        return MLPNet.of_spec(net)
    return net


def last_block_output(net: Net | nn.Spec, params: nn.Params, state: nn.State, X: Tensor) -> Tensor:
    """h_L(X): the last block's output (n, d) — for the MLP the activation for order norm_act,
    the norm output for act_norm; for resmlp the residual stream — with normalization on X's own
    statistics (mode "batch")."""
    _, taps = as_net(net).forward(params, state, X, "batch", taps=True)
    assert taps is not None
    return taps.outputs[-1]


def _promoted(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().to(F64) for k, v in tensors.items()}


def _chunk(net: Net, n: int) -> int:
    """Vector–Jacobian products per chunk: each carries (n, max(d, d_in)) float64 cotangents."""
    per_product = n * max(net.width, net.d_in)
    return max(1, min(net.width, MAX_CHUNK_ENTRIES // per_product))


def input_output_jacobian(
    net: Net | nn.Spec, params: nn.Params, state: nn.State, X: Tensor, i: int
) -> Tensor:
    """J_i = ∂[h_L(X)]_i / ∂x_i (d, d_in), float64, the other samples of X held fixed.

    Args:
        params, state: the network's tensors (any float dtype; promoted to float64 here, the
            originals untouched; running statistics are not read: mode "batch").
        X: the probe batch (n, d_in).
        i: the sample, 0 ≤ i < n.
    """
    net = as_net(net)
    p, s, X = _promoted(params), _promoted(state), X.detach().to(F64)
    coupled = net.norm in BATCH_NORMS

    def output_of(xi: Tensor) -> Tensor:  # (d_in,) → (d,)
        if not coupled:
            return last_block_output(net, p, s, xi.unsqueeze(0))[0]
        batch = torch.cat([X[:i], xi.unsqueeze(0), X[i + 1 :]])
        return last_block_output(net, p, s, batch)[i]

    n = len(X) if coupled else 1
    with torch.enable_grad():
        return torch.func.jacrev(output_of, chunk_size=_chunk(net, n))(X[i])


def jacobian_singular_values(
    net: Net | nn.Spec, params: nn.Params, state: nn.State, X: Tensor, k: int
) -> np.ndarray:
    """Singular values of J_i for the first k probe samples: float64 (k, m), m = min(d, d_in),
    each row descending. A Jacobian with a non-finite entry (a diverged network) gives a row of
    NaN. k = 0 gives a (0, m) array.

    Raises:
        InvalidInput: k is not an integer in 0..n (field `jacobian_samples`).
    """
    n = len(X)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
        raise InvalidInput(
            f"{k!r} probe samples: an integer from 0 to the probe batch size batch_size = {n}",
            field="jacobian_samples",
        )
    net = as_net(net)
    m = min(net.width, net.d_in)
    out = np.full((k, m), math.nan)
    for i in range(k):
        J = input_output_jacobian(net, params, state, X, i)
        if bool(torch.isfinite(J).all()):
            out[i] = torch.linalg.svdvals(J).cpu().numpy()
    return out
