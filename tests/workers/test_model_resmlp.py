"""The resmlp family (workers/models/resmlp.py, docs/models.md), held to mathematics.

- De & Smith 2020 ("Batch normalization biases residual blocks towards the identity function in
  deep networks"): with a branch that ends in BatchNorm (order act_norm: Linear → σ → BN, so
  f_ℓ has unit variance per feature over the batch) and residual_scale 1, the stream's mean
  square m_ℓ = ‖x_ℓ‖²/(n·d) grows by one per block at init, m_ℓ ≈ m_0 + ℓ, and the branch's
  share of it, ‖f_ℓ‖²/‖x_ℓ‖², falls as 1/(m_0 + ℓ). Exactly: m_ℓ − m_{ℓ−1} = ‖f_ℓ‖²/(nd) +
  X_ℓ with the cross term X_ℓ = 2⟨x_{ℓ−1}, f_ℓ⟩/(nd). ‖f_ℓ‖²/(nd) is deterministic (the mean of
  v_j/(v_j + ε) over the features' batch variances v_j). For an odd σ (identity, tanh) the
  branch is odd in W_ℓ — BN(σ(−z)) = −BN(σ(z)) with β = 0 — and W_ℓ is symmetric and independent
  of x_{ℓ−1}, so E[X_ℓ | x_{ℓ−1}] = 0: S_ℓ = Σ_{k≤ℓ} X_k is a martingale whose variance the
  quadratic variation Q_ℓ = Σ X_k² estimates without bias. The asserts are |S| ≤ 4√Q (a 4σ
  bound of the martingale CLT; no value tuned). With ReLU (not odd) the symmetry fails: every
  feature's BN(relu(x_{ℓ−1}w)) shares the direction E_w relu(x_{ℓ−1}w) ∝ the samples' norms,
  the branches add coherently, and S is many √Q above 0 (measured).
- residual_scale 0: the network is the input Linear, then the head; every stream tap is x_0.
- Meterez et al. 2024 (their Appendix I): in a residual network with BatchNorm the first block's
  gradient is not bounded in depth, identity σ and orthogonal weights included. The branch
  BN(W x) is scale-invariant, so its Jacobian is ~1/√m_{ℓ−1}, and ‖∂L/∂x_{ℓ−1}‖² ≈
  ‖∂L/∂x_ℓ‖²(1 + 1/m_{ℓ−1}) = ‖∂L/∂x_ℓ‖² m_ℓ/m_{ℓ−1} telescopes to m_L/m_1: the gradient grows
  as the stream's rms, ~√L (measured: ×1.9–2.3 per ×4 in depth).
- The structural rank bounds (workers.metrics.Structure) never fall below the numerical rank.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from service.config import TrialConfig
from workers import nn
from workers.data import load_dataset
from workers.metrics import Structure, input_structure, refine
from workers.models import build
from workers.models.resmlp import ResMLPNet
from workers.train import fit as fit_trial


def resmlp(**kw) -> ResMLPNet:
    base = dict(model="resmlp", depth=3, width=16, dataset="digits", epochs=0)
    net = build(TrialConfig(**{**base, **kw}))
    assert isinstance(net, ResMLPNet)
    return net


def refit(s: Structure, h: torch.Tensor) -> Structure:
    return refine(s, h.reshape(len(h), -1))


@pytest.fixture(scope="module")
def digits() -> torch.Tensor:
    return load_dataset("digits", None).X_train[:100]  # n = 100 > d_in = 64


def init(net: ResMLPNet, seed: int = 0) -> nn.Params:
    return net.init_params(torch.Generator().manual_seed(seed))


# --- parameters, draw order, taps ---------------------------------------------------------


def test_parameters_and_their_shapes():
    net = resmlp(depth=2, width=16, bias=True, norm="batch")
    p = init(net)
    assert net.d_in == 64 and net.n_classes == 10 and net.depth == 2
    shapes = {k: tuple(v.shape) for k, v in p.items()}
    assert shapes == {
        "W_in": (16, 64),
        "b_in": (16,),
        **{f"W{e}": (16, 16) for e in (1, 2)},
        **{f"{k}{e}": (16,) for k in ("b", "gamma", "beta") for e in (1, 2)},
        "W_head": (10, 16),
        "b_head": (10,),
    }
    assert all(v.dtype == torch.float32 for v in p.values())
    assert set(net.init_state()) == {"mean1", "var1", "mean2", "var2"}
    assert net.layer_weights() == [["W1"], ["W2"]] and net.head_weight == "W_head"


def test_draw_order_w_in_then_blocks_then_head_then_torch_biases():
    net = resmlp(
        depth=2,
        width=8,
        init="gaussian",
        head_init="orthogonal",
        bias=True,
        bias_init="torch",
        init_gain=1.5,
    )
    p = init(net, 3)
    g = torch.Generator().manual_seed(3)
    expect = {
        "W_in": nn.init_weight(8, 64, "gaussian", 1.5, g),
        "W1": nn.init_weight(8, 8, "gaussian", 1.5, g),
        "W2": nn.init_weight(8, 8, "gaussian", 1.5, g),
        "W_head": nn.init_weight(10, 8, "orthogonal", 1.5, g),
        "b_in": nn.torch_bias(8, 64, g, torch.float32),
        "b1": nn.torch_bias(8, 8, g, torch.float32),
        "b2": nn.torch_bias(8, 8, g, torch.float32),
        "b_head": nn.torch_bias(10, 8, g, torch.float32),
    }
    for k, v in expect.items():
        assert torch.equal(p[k], v), k
    zero = init(
        resmlp(depth=2, width=8, init="gaussian", head_init="orthogonal", bias=True, init_gain=1.5),
        3,
    )
    for k in ("W_in", "W1", "W2", "W_head"):  # the weights do not depend on bias_init
        assert torch.equal(zero[k], p[k])
    assert all(not zero[k].any() for k in ("b_in", "b1", "b2", "b_head"))


@pytest.mark.parametrize("order", ["norm_act", "act_norm"])
@pytest.mark.parametrize("norm", ["batch", "layer", "none"])
def test_forward_is_input_linear_residual_blocks_and_head(digits, order, norm):
    c = 0.7
    net = resmlp(
        depth=3,
        width=16,
        order=order,
        norm=norm,
        activation="tanh",
        bias=True,
        bias_init="torch",
        residual_scale=c,
    )
    p, s = init(net), net.init_state()
    logits, taps = net.forward(p, s, digits, "batch", taps=True)
    assert net.kinds == (
        ("linear", "act", "residual") if norm == "none" else ("linear", "norm", "act", "residual")
    )
    assert set(taps.layers) == set(net.kinds) and taps.outputs is taps.layers["residual"]
    assert taps.tokens is None
    h = F.linear(digits, p["W_in"], p["b_in"])
    for ell in range(1, 4):  # the MLP's block on the stream, then the scaled add
        z, nrm, a = nn.block(net.spec, p, s, ell, h, "batch", net.spec.sigma)
        h = h + c * (a if net.spec.order == "norm_act" else nrm)  # none: order reset
        assert torch.equal(taps.layers["linear"][ell - 1], z)
        assert torch.equal(taps.layers["act"][ell - 1], a)
        if norm != "none":
            assert torch.equal(taps.layers["norm"][ell - 1], nrm)
        assert torch.equal(taps.outputs[ell - 1], h)
    assert torch.equal(logits, F.linear(h, p["W_head"], p["b_head"]))


def test_residual_scale_zero_is_the_input_linear_then_the_head(digits):
    net = resmlp(depth=4, width=16, residual_scale=0.0, activation="relu", norm="batch")
    p, s = init(net), net.init_state()
    logits, taps = net.forward(p, s, digits, "train", taps=True)
    x0 = F.linear(digits, p["W_in"])
    assert all(torch.equal(t, x0) for t in taps.outputs)
    assert torch.equal(logits, F.linear(x0, p["W_head"]))
    assert not torch.equal(s["mean1"], torch.zeros(16))  # the branch still ran ("train")
    p = {k: v.requires_grad_() for k, v in p.items()}
    logits, _ = net.forward(p, net.init_state(), digits, "batch")
    grads = torch.autograd.grad(
        F.cross_entropy(logits, torch.zeros(100, dtype=torch.long)), [p["W1"], p["W_in"]]
    )
    assert not grads[0].any() and grads[1].any()  # nothing reaches a branch


def test_forward_is_deterministic_and_batch_mode_leaves_running_stats(digits):
    net = resmlp(depth=3, width=16, norm="batch")
    p = init(net, 5)
    assert all(torch.equal(v, init(net, 5)[k]) for k, v in p.items())
    s = net.init_state()
    one, _ = net.forward(p, s, digits, "batch")
    two, _ = net.forward(p, s, digits, "batch")
    assert torch.equal(one, two)
    assert all(torch.equal(v, net.init_state()[k]) for k, v in s.items())  # untouched
    _, taps = net.forward(p, s, digits, "train", taps=True)
    z1 = taps.layers["linear"][0]
    var, mean = torch.var_mean(z1, dim=0, correction=1)  # torch keeps the unbiased variance
    assert torch.allclose(s["mean1"], nn.MOMENTUM * mean, atol=1e-6)
    assert torch.allclose(s["var1"], 1 - nn.MOMENTUM + nn.MOMENTUM * var, atol=1e-6)
    frozen = {k: v.clone() for k, v in s.items()}
    _, taps = net.forward(p, s, digits, "running", taps=True)
    assert all(torch.equal(v, frozen[k]) for k, v in s.items())
    z1 = taps.layers["linear"][0]
    expect = (z1 - s["mean1"]) / torch.sqrt(s["var1"] + net.spec.eps)
    assert torch.allclose(taps.layers["norm"][0], expect, atol=1e-5)


# --- De & Smith 2020 ---------------------------------------------------------------------


def stream_moments(activation: str, seed: int, x: torch.Tensor, depth: int = 50, width: int = 256):
    """m_0..m_L, ‖f_ℓ‖²/(nd) and its exact value mean_j v_j/(v_j + ε), of an act_norm BN resmlp."""
    net = resmlp(depth=depth, width=width, activation=activation, order="act_norm", norm="batch")
    p = init(net, seed)
    _, taps = net.forward(p, net.init_state(), x, "batch", taps=True)
    f = [t.double() for t in taps.layers["norm"]]
    xs = [t.double() for t in taps.outputs]
    x0 = F.linear(x, p["W_in"]).double()
    m = torch.tensor([float(h.square().mean()) for h in [x0, *xs]], dtype=torch.float64)
    ff = torch.tensor([float(t.square().mean()) for t in f], dtype=torch.float64)
    v = [torch.var(a.double(), dim=0, correction=0) for a in taps.layers["act"]]
    exact = torch.tensor([float((u / (u + net.spec.eps)).mean()) for u in v], dtype=torch.float64)
    return m, ff, exact


@pytest.mark.parametrize("activation", ["identity", "tanh"])
def test_bn_branch_stream_mean_square_grows_by_one_per_block(digits, activation):
    L = 50
    S_all, Q_all = 0.0, 0.0
    for seed in range(4):
        m, ff, exact = stream_moments(activation, seed, digits, depth=L)
        # unit variance per feature: ‖f‖²/(nd) is mean_j v_j/(v_j + ε), within 1e-4 of 1
        assert torch.allclose(ff, exact, rtol=1e-5)
        assert bool(((ff <= 1) & (ff > 1 - 1e-4)).all())
        X = torch.diff(m) - ff  # the cross terms 2⟨x_{ℓ−1}, f_ℓ⟩/(nd)
        S, Q = X.cumsum(0), X.square().cumsum(0)
        # E m_L = m_0 + Σ ‖f_ℓ‖²/(nd) ≈ m_0 + L, within 4 standard deviations of the martingale
        assert abs(float(m[L] - m[0] - L)) <= 4 * math.sqrt(Q[-1]) + float((1 - ff).sum())
        # the branch's share at ℓ = 10 and L: 1/share = m_ℓ/‖f_ℓ‖² ≈ m_0 + ℓ
        for ell in (10, L):
            inv_share = float(m[ell] / ff[ell - 1])
            assert abs(inv_share - float(m[0]) - ell) <= (
                4 * math.sqrt(Q[ell - 1]) + float((1 - ff[:ell]).sum()) + ell * 1e-4
            ) / float(ff[ell - 1])
        S_all, Q_all = S_all + float(S[-1]), Q_all + float(Q[-1])
    assert abs(S_all) <= 4 * math.sqrt(Q_all)  # the four seeds pooled: still no drift


def test_relu_breaks_the_symmetry_and_the_branches_add_coherently(digits):
    """ReLU is not odd: E_w BN(relu(x w)) ≠ 0, shared by every feature and block, so the cross
    terms have a positive mean and S is far above its 4√Q bound (measured ≈ 5.6√Q; m_L − m_0 ≈
    4.5 L)."""
    m, ff, _ = stream_moments("relu", 0, digits)
    X = torch.diff(m) - ff
    assert float(X.sum()) > 4 * math.sqrt(float(X.square().sum()))
    assert float(m[-1] - m[0]) > 2 * 50


# --- Meterez et al. 2024, Appendix I -------------------------------------------------------


@pytest.mark.parametrize("init_name", ["gaussian", "orthogonal"])
def test_bn_residual_gradients_grow_with_depth_identity_activation_included(init_name):
    """grad_norm of block 1 at init (fit, epochs 0, the probe batch) at depths 10, 40, 160:
    the mean over 3 seeds grows by the stream's rms ratio √(m_L/m_L'), the telescoped product
    of the backward factors (1 + 1/m_ℓ) — 2.0 per ×4 in depth — within a factor 1.5 (the
    per-seed spread of grad_norm measured up to ±20%, and the head's softmax adds a little)."""
    grad, ms = {}, {}
    for L in (10, 40, 160):
        g, rms = [], []
        for seed in range(3):
            (rec,) = fit_trial(
                TrialConfig(
                    model="resmlp",
                    depth=L,
                    width=100,
                    batch_size=100,
                    activation="identity",
                    norm="batch",
                    order="norm_act",
                    init=init_name,
                    dataset="gaussian",
                    epochs=0,
                    seed=seed,
                    epoch0_train_samples=100,
                )
            )
            assert rec["grad_norm"].shape == (L,) and np.isfinite(rec["grad_norm"]).all()
            g.append(rec["grad_norm"][0])
            rms.append(rec["rms"][-1])
        grad[L], ms[L] = float(np.mean(g)), float(np.mean(np.square(rms)))
    for short, deep in ((10, 40), (40, 160)):
        ratio, predicted = grad[deep] / grad[short], math.sqrt(ms[deep] / ms[short])
        assert ratio > 1.5 and predicted / 1.5 < ratio < predicted * 1.5, (short, deep, ratio)


# --- structures ---------------------------------------------------------------------------


def gaps(net: ResMLPNet, x: torch.Tensor, seed: int = 0) -> dict:
    from workers.metrics import probe_metrics

    p = init(net, seed)
    return probe_metrics(net, p, net.init_state(), x, torch.arange(len(x)) % 10)


def test_linear_resmlp_on_digits_is_singular_everywhere_with_relu_regular(digits):
    """d_in = 64 < n = 100: a linear network (identity σ, no norm — or BatchNorm, a per-feature
    affine map: the stream stays in span(x_0) + span(1), rank ≤ 61) keeps every Gram singular:
    +∞, with finite range gaps. ReLU at width 128 ≥ n: regular, finite."""
    for norm in ("none", "batch", "batch_scale"):
        out = gaps(resmlp(depth=30, width=128, activation="identity", norm=norm), digits)
        for k in resmlp(norm=norm).kinds:
            assert np.isinf(out[f"isometry_gap/{k}"]).all(), (norm, k)
            assert np.isfinite(out[f"range_isometry_gap/{k}"]).all(), (norm, k)
    out = gaps(resmlp(depth=6, width=128, activation="relu", norm="none"), digits)
    for k in ("act", "residual"):
        assert np.isfinite(out[f"isometry_gap/{k}"]).all(), k
    assert np.isfinite(out["isometry_gap/linear"][1:]).all()  # block 1 reads x_0: singular


GRID = list(
    itertools.product(
        ["identity", "relu", "tanh"],
        ["none", "batch", "batch_scale", "layer", "layer_scale"],
        ["norm_act", "act_norm"],
        [False, True],
        [1.0, 0.5, 0.0],
    )
)


@pytest.mark.parametrize(("activation", "norm", "order", "bias", "c"), GRID)
def test_structural_bounds_never_undercut_the_numerical_rank(
    digits, activation, norm, order, bias, c
):
    net = resmlp(
        depth=4,
        width=128,
        activation=activation,
        norm=norm,
        order=order,
        bias=bias,
        bias_init="torch" if bias else "zero",
        residual_scale=c,
        dtype="float64",
    )
    p = init(net, 1)
    x = digits.double()
    _, taps = net.forward(p, net.init_state(), x, "batch", taps=True)
    bounds = net.structures(p, x, taps, refit)
    for k in net.kinds:
        for h, s in zip(taps.layers[k], bounds[k], strict=True):
            sv = torch.linalg.svdvals(h)
            assert s.rank >= int((sv > 1e-9 * sv[0]).sum()), k
            if s.ones_in_null:
                assert float(h.sum(0).abs().max()) <= 1e-9 * float(h.abs().max()), k


def test_linear_bound_counts_the_constant_once_however_deep(digits):
    """BatchNorm with identity σ adds the direction 1 — the same one at every block."""
    net = resmlp(depth=20, width=128, activation="identity", norm="batch", dtype="float64")
    p, x = init(net), digits.double()
    _, taps = net.forward(p, net.init_state(), x, "batch", taps=True)
    ranks = [s.rank for s in net.structures(p, x, taps, refit)["residual"]]
    assert input_structure(x).rank == 60  # the pixels not zero on all 100 samples
    assert ranks == [61] * 20


# --- end to end ---------------------------------------------------------------------------


def test_fit_trains_a_resmlp_and_records_every_kind():
    recs = list(
        fit_trial(
            TrialConfig(
                model="resmlp",
                epochs=1,
                depth=4,
                width=32,
                dataset="digits",
                epoch0_train_samples=200,
            )
        )
    )
    assert [r["epoch"] for r in recs] == [0, 1]
    for r in recs:
        assert math.isfinite(r["train_loss"]) and math.isfinite(r["test_loss"])
        for k in ("linear", "norm", "act", "residual"):
            assert np.isinf(r[f"isometry_gap/{k}"]).all()  # width 32 < n = 100
            assert np.isfinite(r[f"range_isometry_gap/{k}"]).all()
        for k in ("weight_isometry_gap", "grad_norm", "rms", "mean_cosine"):
            assert r[k].shape == (4,) and np.isfinite(r[k]).all(), k
    assert recs[1]["train_loss"] < recs[0]["train_loss"]
