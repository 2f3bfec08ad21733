"""The cnn family (workers/models/cnn.py, docs/models.md), held to mathematics and to torch.

- Delta-orthogonal kernels (Xiao et al. 2018) with identity σ and no norm map every pixel's
  channel vector by one orthogonal matrix (the centre tap; the zero taps make padding
  irrelevant), and block 1 lifts C → width with orthonormal columns: every sample's flattened
  feature map keeps its inner products with every other, so the sample Gram — and its isometry
  gap — is the input's at every depth (measured at depth 64: 1.3e-15 in float64, 6.9e-8 in
  float32; the gaps themselves are computed in float64 either way).
  With Gaussian kernels the gap grows with depth.
- The convolutional norms against torch's modules (BatchNorm2d, GroupNorm(1)), on the same
  input, in every statistics mode.
- The structural rank bounds hold (never below the numerical rank), and the BatchNorm2d rule
  (rank + 1, 1 not in the null space) is what the numbers do.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from service.config import TrialConfig
from workers.data import load_dataset
from workers.metrics import Structure, isometry_gaps, refine
from workers.models import build
from workers.models.base import as_images
from workers.models.cnn import CNNNet, init_kernel


def cnn(**kw) -> CNNNet:
    base = dict(model="cnn", depth=3, width=8, dataset="digits", batch_size=32, epochs=0)
    return CNNNet(TrialConfig(**{**base, **kw}))


@pytest.fixture(scope="module")
def digits() -> torch.Tensor:
    return load_dataset("digits", None).X_train


def probe(X: torch.Tensor, n: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    rows = torch.randperm(len(X), generator=torch.Generator().manual_seed(1000 + seed))[:n]
    return X[rows].to(dtype)


def tap_gaps(net: CNNNet, x: torch.Tensor, seed: int, kind: str = "act") -> torch.Tensor:
    """Gap of the flattened sample Gram of every block's `kind` tap, (L,) float64."""
    p = net.init_params(torch.Generator().manual_seed(seed))
    _, taps = net.forward(p, net.init_state(), x, "batch", taps=True)
    assert taps is not None
    n = len(x)
    H = torch.stack([t.reshape(n, -1) for t in taps.layers[kind]]).double()
    return isometry_gaps(H, Structure(False, n))


def input_gap(x: torch.Tensor) -> float:
    return float(isometry_gaps(x.double().unsqueeze(0))[0])


def fit(s: Structure, h: torch.Tensor) -> Structure:
    return refine(s, h.reshape(len(h), -1))


def numerical_rank(h: torch.Tensor) -> int:
    return int(torch.linalg.matrix_rank(h.reshape(len(h), -1).double()))


# ---------------------------------------------------------------------------------------------
# Delta-orthogonal: dynamical isometry of the sample Gram


@pytest.mark.parametrize(("dtype", "tol"), [("float64", 1e-12), ("float32", 1e-6)])
def test_delta_orthogonal_identity_cnn_preserves_the_input_gap_at_every_depth(digits, dtype, tol):
    # n = 32 ≤ rank of the 8×8 digits inputs (d_in = 64): every gap finite
    for seed in range(2):
        net = cnn(
            init="delta_orthogonal",
            activation="identity",
            norm="none",
            depth=24,
            width=16,
            dtype=dtype,
        )
        x = probe(digits, 32, seed, net.dtype)
        g0 = input_gap(x)
        assert math.isfinite(g0) and g0 > 0.5  # a non-trivial gap to preserve
        for kind in ("linear", "act"):
            gaps = tap_gaps(net, x, seed, kind)
            assert torch.all(torch.abs(gaps - g0) < tol), (kind, gaps - g0)


def test_delta_orthogonal_preserves_the_sample_gram_itself(digits):
    net = cnn(
        init="delta_orthogonal",
        activation="identity",
        norm="none",
        depth=8,
        width=16,
        dtype="float64",
        kernel_size=5,
    )
    x = probe(digits, 32, 0, net.dtype)
    p = net.init_params(torch.Generator().manual_seed(0))
    _, taps = net.forward(p, net.init_state(), x, "batch", taps=True)
    G0 = x @ x.T
    for h in taps.outputs:
        f = h.reshape(len(x), -1)
        assert torch.allclose(f @ f.T, G0, rtol=0, atol=1e-10 * G0.abs().max())


def test_gaussian_cnn_gap_grows_with_depth(digits):
    depths = (1, 4, 16, 64)
    mean = []
    for depth in depths:
        net = cnn(
            init="gaussian",
            activation="identity",
            norm="none",
            depth=depth,
            width=16,
            dtype="float64",
        )
        gaps = [float(tap_gaps(net, probe(digits, 32, s, net.dtype), s)[-1]) for s in range(3)]
        mean.append(sum(gaps) / len(gaps))
    # measured: 1.17, 1.25, 1.64, 3.01 (the inputs' gap: 1.20 averaged over these probes)
    assert all(a < b for a, b in itertools.pairwise(mean)), mean
    assert mean[-1] - mean[0] > 1.0, mean


# ---------------------------------------------------------------------------------------------
# Kernels


@pytest.mark.parametrize("k", [1, 3, 5])
def test_delta_orthogonal_kernel_is_an_orthogonal_centre_and_exact_zeros(k):
    g = 1.7
    K = init_kernel(24, 24, k, "delta_orthogonal", g, torch.Generator().manual_seed(3))
    assert K.shape == (24, 24, k, k) and K.dtype == torch.float32
    W = K[:, :, k // 2, k // 2] / g
    assert torch.allclose(W @ W.T, torch.eye(24), atol=1e-6, rtol=0)
    off = K.clone()
    off[:, :, k // 2, k // 2] = 0
    assert torch.count_nonzero(off) == 0


def test_first_block_delta_orthogonal_lifts_channels_with_orthonormal_columns():
    net = cnn(init="delta_orthogonal", width=16, dataset="cifar10")
    p = net.init_params(torch.Generator().manual_seed(0))
    assert p["K1"].shape == (16, 3, 3, 3) and p["K2"].shape == (16, 16, 3, 3)
    W = p["K1"][:, :, 1, 1]
    assert torch.allclose(W.T @ W, torch.eye(3), atol=1e-6, rtol=0)
    # the head: delta_orthogonal means orthogonal there (n_classes × width, orthonormal rows)
    H = p["W_head"]
    assert torch.allclose(H @ H.T, torch.eye(10), atol=1e-6, rtol=0)


def test_orthogonal_kernel_is_semi_orthogonal_as_a_matrix():
    K = init_kernel(8, 4, 3, "orthogonal", 1.0, torch.Generator().manual_seed(0))
    M = K.reshape(8, -1)  # 8 × 36: orthonormal rows
    assert torch.allclose(M @ M.T, torch.eye(8), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("init", "var"), [("gaussian", 1 / 576), ("kaiming", 2 / 576), ("xavier", 2 / (576 + 576))]
)
def test_gaussian_kernel_variances_use_the_convolution_fans(init, var):
    # fan_in = fan_out = 64·3·3 = 576
    K = init_kernel(64, 64, 3, init, 1.0, torch.Generator().manual_seed(0), dtype=torch.float64)
    assert abs(float(K.var()) / var - 1) < 0.03  # 36864 draws: standard error 0.7%


def test_draw_order_kernels_then_head_then_torch_biases():
    a = cnn(bias=True, bias_init="zero", norm="none").init_params(torch.Generator().manual_seed(5))
    b = cnn(bias=True, bias_init="torch", norm="none").init_params(torch.Generator().manual_seed(5))
    for name in ("K1", "K2", "K3", "W_head"):
        assert torch.equal(a[name], b[name])
    assert torch.count_nonzero(a["b1"]) == 0
    bound = 1 / math.sqrt(1 * 3 * 3)  # b1's fan_in: C_in·k·k
    assert 0 < float(b["b1"].abs().max()) <= bound


# ---------------------------------------------------------------------------------------------
# Images


def test_as_images_puts_a_known_cifar_hwc_pixel_in_its_place():
    _, C, H, W = "hwc", 3, 32, 32
    x = torch.zeros(2, H * W * C)
    x[1, (4 * W + 7) * C + 2] = 5.0  # sample 1, row 4, column 7, channel 2, flattened HWC
    img = as_images(x, "cifar10")
    assert img.shape == (2, C, H, W)
    assert img[1, 2, 4, 7] == 5.0 and torch.count_nonzero(img) == 1


def test_as_images_chw_for_digits():
    x = torch.zeros(1, 64)
    x[0, 3 * 8 + 6] = 1.0  # row 3, column 6
    img = as_images(x, "digits")
    assert img.shape == (1, 1, 8, 8) and img[0, 0, 3, 6] == 1.0


def test_forward_shapes_and_taps():
    for norm, kinds in (("batch", ("linear", "norm", "act")), ("none", ("linear", "act"))):
        for order in ("norm_act", "act_norm"):
            net = cnn(norm=norm, order=order, width=6, depth=2, dataset="cifar10")
            assert build(net.config).kinds == kinds == net.kinds
            p = net.init_params(torch.Generator().manual_seed(0))
            x = torch.randn(5, 3072)
            logits, taps = net.forward(p, net.init_state(), x, "batch", taps=True)
            assert logits.shape == (5, 10) and set(taps.layers) == set(kinds)
            for kind in kinds:
                assert [t.shape for t in taps.layers[kind]] == [(5, 6, 32, 32)] * 2
            last = "act" if order == "norm_act" or norm == "none" else "norm"
            assert all(o is t for o, t in zip(taps.outputs, taps.layers[last], strict=True))
            assert net.layer_weights() == [["K1"], ["K2"]] and net.head_weight == "W_head"


def test_global_average_pooling_then_head():
    net = cnn(norm="none", activation="tanh", bias=True, depth=2)
    p = net.init_params(torch.Generator().manual_seed(0))
    p["b_head"] = torch.randn(10)
    x = torch.randn(4, 64)
    logits, taps = net.forward(p, {}, x, "batch", taps=True)
    pooled = taps.outputs[-1].mean(dim=(2, 3))
    assert torch.allclose(logits, pooled @ p["W_head"].T + p["b_head"], atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Norms against torch


def test_batch_norm2d_matches_torch_in_every_mode():
    torch.manual_seed(0)
    net = cnn(norm="batch", activation="identity", depth=1, width=4, dtype="float64")
    p = net.init_params(torch.Generator().manual_seed(0))
    p["gamma1"] = torch.rand(4, dtype=torch.float64) + 0.5
    p["beta1"] = torch.randn(4, dtype=torch.float64)
    s = net.init_state()
    x = torch.randn(6, 64, dtype=torch.float64) * 3 + 1
    ref = torch.nn.BatchNorm2d(4, eps=1e-5, momentum=0.1).double()
    with torch.no_grad():
        ref.weight.copy_(p["gamma1"])
        ref.bias.copy_(p["beta1"])
    import torch.nn.functional as F

    z = F.conv2d(as_images(x, "digits"), p["K1"], padding=1)
    _, taps = net.forward(p, s, x, "train", taps=True)
    ours = taps.layers["norm"][0]
    theirs = ref.train()(z)
    assert torch.allclose(ours, theirs, atol=1e-12, rtol=0)
    assert torch.allclose(s["mean1"], ref.running_mean, atol=1e-14, rtol=0)
    assert torch.allclose(s["var1"], ref.running_var, atol=1e-14, rtol=0)  # unbiased, n·H·W
    before = {k: v.clone() for k, v in s.items()}
    _, taps = net.forward(p, s, x, "batch", taps=True)
    assert torch.allclose(taps.layers["norm"][0], theirs, atol=1e-12, rtol=0)
    assert all(torch.equal(before[k], s[k]) for k in s)  # "batch" leaves the state untouched
    _, taps = net.forward(p, s, x * 0.5, "running", taps=True)
    z2 = F.conv2d(as_images(x * 0.5, "digits"), p["K1"], padding=1)
    assert torch.allclose(taps.layers["norm"][0], ref.eval()(z2), atol=1e-12, rtol=0)


def test_batch_norm2d_with_zero_eps_matches_torch_at_a_negligible_eps():
    net = cnn(norm="batch", activation="identity", depth=1, width=4, dtype="float64", norm_eps=0)
    p = net.init_params(torch.Generator().manual_seed(1))
    s = net.init_state()
    x = torch.randn(6, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ref = torch.nn.BatchNorm2d(4, eps=1e-300).double()  # torch refuses eps = 0 in training
    import torch.nn.functional as F

    z = F.conv2d(as_images(x, "digits"), p["K1"], padding=1)
    _, taps = net.forward(p, s, x, "train", taps=True)
    assert torch.allclose(taps.layers["norm"][0], ref.train()(z), atol=1e-12, rtol=0)
    assert torch.allclose(s["var1"], ref.running_var, atol=1e-14, rtol=0)
    assert torch.allclose(s["mean1"], ref.running_mean, atol=1e-14, rtol=0)


def test_layer_norm2d_is_layer_norm_over_the_feature_map():
    net = cnn(norm="layer", activation="identity", depth=1, width=4, dtype="float64")
    p = net.init_params(torch.Generator().manual_seed(0))
    x = torch.randn(5, 64, dtype=torch.float64)
    _, taps = net.forward(p, {}, x, "batch", taps=True)
    z, y = taps.layers["linear"][0], taps.layers["norm"][0]
    import torch.nn.functional as F

    assert torch.allclose(y, F.layer_norm(z, z.shape[1:], eps=1e-5), atol=1e-12, rtol=0)


def test_scale_norms2d():
    x = torch.randn(5, 64, dtype=torch.float64)
    for norm in ("batch_scale", "layer_scale"):
        net = cnn(norm=norm, activation="identity", depth=1, width=4, dtype="float64", norm_eps=0)
        p = net.init_params(torch.Generator().manual_seed(0))
        s = net.init_state()
        _, taps = net.forward(p, s, x, "train", taps=True)
        y = taps.layers["norm"][0]
        dims = (0, 2, 3) if norm == "batch_scale" else (1, 2, 3)
        ms = y.pow(2).mean(dim=dims)
        assert torch.allclose(ms, torch.ones_like(ms), atol=1e-12)
        if norm == "batch_scale":  # running mean square of z moved by 0.1
            z = taps.layers["linear"][0]
            assert torch.allclose(s["sq1"], 0.9 + 0.1 * z.pow(2).mean(dim=(0, 2, 3)))


# ---------------------------------------------------------------------------------------------
# Structures


def structures_of(net: CNNNet, x: torch.Tensor, seed: int = 0, **params):
    p = net.init_params(torch.Generator().manual_seed(seed))
    p.update(params)
    _, taps = net.forward(p, net.init_state(), x, "batch", taps=True)
    assert taps is not None
    return taps, net.structures(p, x, taps, fit)


def test_batch_norm2d_adds_one_to_the_rank_and_keeps_1_out_of_the_null_space():
    # x (80 × 64) of rank 30 with 1 ∉ its column space; the conv (delta-orthogonal, identity)
    # keeps rank(x); BatchNorm2d subtracts a per-channel constant over batch × space — one
    # rank-one term 1vᵀ — which the numbers show is +1. (Probe batches of standardized digits
    # can hold 1 in their column space — a pixel constant on the batch — so they are not used.)
    net = cnn(
        norm="batch",
        activation="identity",
        init="delta_orthogonal",
        depth=2,
        width=8,
        dtype="float64",
        batch_size=80,
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 30, generator=g, dtype=torch.float64) @ torch.randn(
        30, 64, generator=g, dtype=torch.float64
    )
    r0 = numerical_rank(x)
    taps, st = structures_of(net, x)
    zr, nr = numerical_rank(taps.layers["linear"][0]), numerical_rank(taps.layers["norm"][0])
    assert zr == r0 and nr == r0 + 1
    assert r0 == 30 and st["norm"][0].rank >= nr
    y = taps.layers["norm"][0].reshape(80, -1)
    assert float(y.sum(dim=0).abs().max()) > 1e-3  # 1ᵀY ≠ 0: not batch-centred per feature
    assert st["linear"][0].rank >= zr and st["norm"][0] == Structure(False, st["norm"][0].rank)
    assert st["norm"][0].rank >= nr and st["norm"][1].rank >= numerical_rank(taps.layers["norm"][1])


def test_layer_norm2d_centring_does_not_add_to_the_rank():
    # the per-sample centring over C × H × W is H ↦ H(I − 11ᵀ/F), a right multiplication, and
    # the per-sample scaling a left one: rank(x) = 30 stays 30 (β = 0), unlike BatchNorm2d's +1
    net = cnn(
        norm="layer",
        activation="identity",
        init="delta_orthogonal",
        depth=1,
        width=8,
        dtype="float64",
        batch_size=80,
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 30, generator=g, dtype=torch.float64) @ torch.randn(
        30, 64, generator=g, dtype=torch.float64
    )
    taps, st = structures_of(net, x)
    assert numerical_rank(taps.layers["norm"][0]) == 30
    assert st["norm"][0].rank >= 30 and not st["norm"][0].ones_in_null


@pytest.mark.parametrize("norm", ["batch", "batch_scale", "layer", "layer_scale", "none"])
@pytest.mark.parametrize("activation", ["identity", "relu"])
@pytest.mark.parametrize("bias", [False, True])
def test_structural_bounds_never_undercut_the_numerical_rank(digits, norm, activation, bias):
    net = cnn(
        norm=norm,
        activation=activation,
        bias=bias,
        init="delta_orthogonal",
        depth=3,
        width=4,
        dtype="float64",
        batch_size=80,
    )
    x = probe(digits, 80, 1, torch.float64)
    extra = {}
    if bias:
        extra = {f"b{ell}": torch.randn(4, dtype=torch.float64) for ell in (1, 2, 3)}
    if norm in ("batch", "layer"):
        extra.update({f"beta{ell}": torch.randn(4, dtype=torch.float64) for ell in (1, 2, 3)})
    taps, st = structures_of(net, x, **extra)
    for kind in net.kinds:
        for s, t in zip(st[kind], taps.layers[kind], strict=True):
            assert s.rank >= numerical_rank(t), (kind, s, numerical_rank(t))
            if s.ones_in_null:
                assert float(t.reshape(80, -1).sum(dim=0).abs().max()) < 1e-9


def test_identity_delta_orthogonal_structure_is_the_inputs_rank(digits):
    # n = 80 > d_in = 64: rank-deficient at every tap (+∞ gap); the bound is min(n, support)
    net = cnn(
        norm="none", activation="identity", init="delta_orthogonal", depth=4, width=8, batch_size=80
    )
    x = probe(digits, 80, 0, torch.float32)
    _, st = structures_of(net, x)
    r_in = refine(Structure(False, 64), x).rank
    assert all(s == Structure(False, r_in) for s in st["linear"] + st["act"])
    assert r_in < 80


def test_relu_resets_the_structure_to_full(digits):
    net = cnn(norm="none", activation="relu", depth=2, width=8, batch_size=80)
    x = probe(digits, 80, 0, torch.float32)
    _, st = structures_of(net, x)
    assert st["act"][0].rank == 80 and st["linear"][1].rank == 80


# ---------------------------------------------------------------------------------------------
# End to end: workers.train.fit with model cnn


def test_fit_trains_a_cnn_and_records_every_kind():
    from workers.train import fit as fit_trial

    config = TrialConfig(model="cnn", depth=3, width=8, epochs=1, dataset="digits")
    records = list(fit_trial(config))
    assert [r["epoch"] for r in records] == [0, 1]
    for r in records:
        assert math.isfinite(r["train_loss"]) and math.isfinite(r["test_loss"])
        assert not r["diverged"]
        for kind in ("linear", "norm", "act"):
            assert len(r[f"isometry_gap/{kind}"]) == 3
            assert all(math.isfinite(v) for v in r[f"range_isometry_gap/{kind}"])
        for name in ("weight_isometry_gap", "grad_norm", "rms", "mean_cosine"):
            assert len(r[name]) == 3 and all(math.isfinite(v) for v in r[name])
        # n = 100 > d_in = 64: the conv keeps rank ≤ 64 and BatchNorm2d adds ≤ 1, so block 1's
        # linear and norm Grams are structurally singular; ReLU resets to full rank
        assert r["isometry_gap/linear"][0] == math.inf == r["isometry_gap/norm"][0]
        assert math.isfinite(r["isometry_gap/act"][0])
    assert records[1]["train_loss"] != records[0]["train_loss"]


def test_probe_metrics_of_a_delta_orthogonal_cnn_read_one_gap_at_every_depth():
    from workers.train import fit as fit_trial

    config = TrialConfig(
        model="cnn",
        depth=6,
        width=16,
        epochs=0,
        dataset="digits",
        batch_size=32,
        init="delta_orthogonal",
        activation="identity",
        norm="none",
        dtype="float64",
    )
    (r,) = list(fit_trial(config))
    gaps = list(r["isometry_gap/linear"]) + list(r["isometry_gap/act"])
    assert all(abs(g - gaps[0]) < 1e-12 for g in gaps), gaps
    assert 0.5 < gaps[0] < 3
    # blocks 2..L: the kernel reshaped (16, 16·9) has orthonormal rows → weight gap 0
    assert all(abs(w) < 1e-12 for w in r["weight_isometry_gap"][1:])
    assert all(abs(c - r["mean_cosine"][0]) < 1e-12 for c in r["mean_cosine"])


def test_a_zero_sample_makes_every_gap_infinite_through_probe_metrics(digits):
    # without biases a sample that is 0 stays 0 through conv, ReLU, pooling: its Gram row is 0
    # (`refine` reads it from the tap's flattened zero rows), so every gap is +∞, range gaps not
    from workers.metrics import probe_metrics

    net = cnn(norm="none", activation="relu", depth=3, width=8, batch_size=32)
    p = net.init_params(torch.Generator().manual_seed(0))
    x = probe(digits, 32, 0, torch.float32)
    x[0] = 0
    r = probe_metrics(net, p, {}, x, torch.zeros(32, dtype=torch.long))
    for kind in net.kinds:
        assert all(g == math.inf for g in r[f"isometry_gap/{kind}"])
        assert all(math.isfinite(g) for g in r[f"range_isometry_gap/{kind}"])
