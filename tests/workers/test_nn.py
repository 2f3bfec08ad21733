"""The MLP: shapes, block order, each norm's defining property, the gain schedule, inits."""

import math

import pytest
import torch

from service.config import TrialConfig
from workers import metrics, nn

F64 = torch.float64


def build(
    depth=3,
    width=16,
    d_in=12,
    norm="batch",
    order="norm_act",
    act="identity",
    bias=False,
    alphas=None,
    init="gaussian",
    seed=0,
):
    spec = nn.Spec(depth, d_in, width, 5, norm, order, bias, act, alphas or (1.0,) * depth)
    params = nn.init_params(spec, init, 1.0, torch.Generator().manual_seed(seed))
    return spec, params, nn.init_state(spec)


def x_batch(n=10, d=12, seed=1):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed)) * 3 + 1


# --- structure ---------------------------------------------------------------------------------


def test_shapes_and_parameter_names():
    spec = nn.make_spec(TrialConfig(depth=4, width=32, dataset="mnist", bias=True, norm="layer"))
    assert (spec.d_in, spec.n_classes) == (784, 10)
    p = nn.init_params(spec, "gaussian", 1.0, torch.Generator().manual_seed(0))
    assert (
        p["W1"].shape == (32, 784) and p["W4"].shape == (32, 32) and p["W_head"].shape == (10, 32)
    )
    assert {"b1", "b4", "b_head", "gamma4", "beta4"} <= p.keys() and "W5" not in p
    logits, taps = nn.forward(spec, p, nn.init_state(spec), torch.randn(7, 784), "batch", taps=True)
    assert logits.shape == (7, 10) and len(taps) == 4
    assert all(t.shape == (7, 32) for tap in taps for t in tap)
    assert all(v.dtype == torch.float32 for v in p.values())


def test_no_bias_no_affine_for_scale_norms_and_none():
    for norm in ("batch_scale", "layer_scale", "none"):
        _, p, _ = build(norm=norm)
        assert set(p) == {"W1", "W2", "W3", "W_head"}
    assert set(build(norm="batch_scale")[2]) == {"sq1", "sq2", "sq3"}
    assert set(build(norm="batch")[2]) == {f"{k}{i}" for k in ("mean", "var") for i in (1, 2, 3)}


def test_bias_is_applied():
    spec, p, s = build(bias=True, norm="none")
    p["b1"] += 2.0
    x = x_batch()
    z, _, _ = nn.block(spec, p, s, 1, x, "batch", spec.sigma)
    torch.testing.assert_close(z, x @ p["W1"].T + 2.0)


@pytest.mark.parametrize("norm", ["batch", "layer", "batch_scale", "layer_scale"])
def test_order_is_observable(norm):
    """norm_act: a = σ(α·norm(z)); act_norm: n = norm(σ(α·z)). Same weights, different taps."""
    alphas = (0.7, 1.3)
    outs = {}
    for order in ("norm_act", "act_norm"):
        spec, p, s = build(depth=2, norm=norm, order=order, act="tanh", alphas=alphas)
        _, taps = nn.forward(spec, p, s, x_batch(), "batch", taps=True)
        outs[order] = taps
        z, n, a = taps[1]
        if order == "norm_act":
            torch.testing.assert_close(n, nn.normalize(spec, p, {}, 2, z, "batch"))
            torch.testing.assert_close(a, torch.tanh(1.3 * n))
        else:
            torch.testing.assert_close(a, torch.tanh(1.3 * z))
            torch.testing.assert_close(n, nn.normalize(spec, p, {}, 2, a, "batch"))
    # block 1's Linear sees the same input; its later outputs differ
    torch.testing.assert_close(outs["norm_act"][0][0], outs["act_norm"][0][0])
    assert not torch.allclose(outs["norm_act"][0][2], outs["act_norm"][0][1])


# --- each norm's defining property -------------------------------------------------------------


def test_batch_norm_centers_and_scales_features_and_updates_running_stats():
    _, p, s = build(norm="batch")
    z = x_batch(n=50, d=16, seed=3) * 4 - 2
    before = {k: v.clone() for k, v in s.items()}
    y = nn.batch_norm(p, s, 1, z, "batch")
    torch.testing.assert_close(y.mean(0), torch.zeros(16), atol=1e-5, rtol=0)
    var = z.var(0, correction=0)
    torch.testing.assert_close(y.var(0, correction=0), var / (var + nn.EPS))
    assert all(torch.equal(s[k], before[k]) for k in s)  # "batch": running stats untouched
    nn.batch_norm(p, s, 1, z, "train")
    m = nn.MOMENTUM
    torch.testing.assert_close(s["mean1"], (1 - m) * before["mean1"] + m * z.mean(0))
    torch.testing.assert_close(s["var1"], (1 - m) * before["var1"] + m * z.var(0))  # unbiased
    y_eval = nn.batch_norm(p, s, 1, z, "running")
    torch.testing.assert_close(y_eval, (z - s["mean1"]) / torch.sqrt(s["var1"] + nn.EPS))


def test_layer_norm_centers_and_scales_samples():
    _, p, _ = build(norm="layer")
    z = x_batch(n=6, d=16) * 5
    y = nn.layer_norm(p, 1, z)
    torch.testing.assert_close(y.mean(1), torch.zeros(6), atol=1e-5, rtol=0)
    var = z.var(1, correction=0)
    torch.testing.assert_close(y.var(1, correction=0), var / (var + nn.EPS))


def test_batch_scale_norm_scales_features_without_centering():
    _, _, s = build(norm="batch_scale")
    z = x_batch(n=40, d=16) + 3.0  # far from centered
    y = nn.batch_scale_norm(s, 1, z, "batch")
    ms = z.pow(2).mean(0)
    torch.testing.assert_close(y.pow(2).mean(0), ms / (ms + nn.EPS))  # unit mean square
    torch.testing.assert_close(y * torch.sqrt(ms + nn.EPS), z)  # a per-feature rescaling
    assert (y.mean(0) > 0.5).all()  # no centering
    assert torch.equal(s["sq1"], torch.ones(16))
    nn.batch_scale_norm(s, 1, z, "train")
    torch.testing.assert_close(s["sq1"], 0.9 * torch.ones(16) + 0.1 * ms)
    torch.testing.assert_close(
        nn.batch_scale_norm(s, 1, z, "running"), z / torch.sqrt(s["sq1"] + nn.EPS)
    )


def test_layer_scale_norm_puts_samples_on_the_sphere_without_centering():
    z = x_batch(n=6, d=16) + 3.0
    y = nn.layer_scale_norm(z)
    norms = z.pow(2).mean(1)
    torch.testing.assert_close(y.pow(2).sum(1), 16 * norms / (norms + nn.EPS))  # ‖y_i‖ = √d
    torch.testing.assert_close(y * torch.sqrt(norms + nn.EPS)[:, None], z)  # per-sample rescale
    assert (y.mean(1) > 0.5).all()


def test_norm_none_is_identity():
    spec, p, s = build(norm="none", act="identity")
    x = x_batch()
    z, n, a = nn.block(spec, p, s, 1, x, "batch", spec.sigma)
    assert n is z and a is z


def test_batch_mode_uses_batch_statistics_and_writes_nothing():
    spec, p, s = build(norm="batch", depth=3)
    before = {k: v.clone() for k, v in s.items()}
    a, _ = nn.forward(spec, p, s, x_batch(), "batch")
    assert s.keys() == before.keys()
    for k, v in before.items():  # "batch" neither wrote nor replaced any running statistic
        assert torch.equal(s[k], v), k
    b, _ = nn.forward(spec, p, s, x_batch(), "train")
    torch.testing.assert_close(a, b)  # same statistics: the batch's own
    assert not torch.equal(s["mean1"], before["mean1"])  # but only "train" updated them


# --- gains -------------------------------------------------------------------------------------


def test_gain_schedule():
    assert nn.gains(2.0, 0.0, 3) == (2.0, 2.0, 2.0)
    al = nn.gains(1.5, 0.4, 1000)
    assert al[0] == 1.5 and al[999] == pytest.approx(1.5 * 1000**-0.4, rel=1e-15)
    assert all(al[i] == pytest.approx(1.5 * (i + 1) ** -0.4, rel=1e-15) for i in (1, 9, 99))
    spec = nn.make_spec(TrialConfig(depth=5, activation_gain=3.0, gain_exponent=1.0))
    assert spec.alphas == pytest.approx((3.0, 1.5, 1.0, 0.75, 0.6))


def test_gain_is_applied_inside_the_activation():
    """Identity σ, no norm: block ℓ's activation output is α_ℓ × its Linear output."""
    cfg = TrialConfig(
        depth=4,
        width=8,
        norm="none",
        activation="identity",
        activation_gain=2.0,
        gain_exponent=0.5,
        dataset="gaussian",
    )
    spec = nn.make_spec(cfg)
    p = nn.init_params(spec, "gaussian", 1.0, torch.Generator().manual_seed(0))
    _, taps = nn.forward(spec, p, {}, torch.randn(5, 100), "batch", taps=True)
    for ell, (z, _, a) in enumerate(taps, start=1):
        torch.testing.assert_close(a, 2.0 * ell**-0.5 * z)
    # and inside σ: relu(α x) with α < 0 is impossible (α > 0), tanh(α x) ≠ α tanh(x)
    spec2 = nn.Spec(1, 8, 8, 2, "none", "norm_act", False, "tanh", (3.0,))
    z, _, a = nn.block(spec2, {"W1": torch.eye(8)}, {}, 1, torch.ones(2, 8), "batch", spec2.sigma)
    torch.testing.assert_close(a, torch.tanh(3.0 * z))


# --- initialization ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "init, out, inp, var",
    [
        ("gaussian", 300, 200, 1.5**2 / 200),
        ("gaussian", 100, 3072, 1.5**2 / 3072),
        ("xavier", 300, 200, 2 * 1.5**2 / 500),
        ("kaiming", 300, 200, 2 * 1.5**2 / 200),
    ],
)
def test_init_variance(init, out, inp, var):
    W = nn.init_weight(out, inp, init, 1.5, torch.Generator().manual_seed(0)).double()
    k = out * inp  # sample variance of k Gaussians: relative s.e. √(2/k) < 0.6%
    assert float(W.var()) == pytest.approx(var, rel=5 * math.sqrt(2 / k))
    assert abs(float(W.mean())) < 5 * math.sqrt(var / k)


@pytest.mark.parametrize("shape", [(50, 50), (20, 64), (64, 20)])
def test_orthogonal_init_is_gain_times_orthogonal(shape):
    g = 1.7
    W = nn.init_weight(*shape, "orthogonal", g, torch.Generator().manual_seed(0)).double()
    small = W @ W.T if shape[0] <= shape[1] else W.T @ W
    torch.testing.assert_close(small, g**2 * torch.eye(min(shape), dtype=F64), atol=1e-5, rtol=0)


def test_orthogonal_init_is_haar():
    """Haar on O(3): E[tr Q] = 0 and E[Q_ij²] = 1/3. QR without the sign fix is biased (LAPACK's
    R has a sign convention, which leaks into Q's diagonal)."""
    g = torch.Generator().manual_seed(0)
    Qs = torch.stack([nn.haar_orthogonal(3, 3, g).double() for _ in range(4000)])
    tr = torch.diagonal(Qs, dim1=1, dim2=2).sum(1)
    assert abs(float(tr.mean())) < 4 * float(tr.std()) / math.sqrt(4000)
    torch.testing.assert_close(
        Qs.pow(2).mean(0), torch.full((3, 3), 1 / 3, dtype=F64), atol=0.02, rtol=0
    )
    det = torch.linalg.det(Qs)
    assert 0.45 < float((det > 0).double().mean()) < 0.55  # both components of O(3)


@pytest.mark.parametrize("init", ["orthogonal", "gaussian"])
def test_init_follows_its_generator_alone_not_the_global_rng(init):
    spec = nn.make_spec(TrialConfig(depth=3, width=8))

    def draw(seed: int, global_seed: int):
        torch.manual_seed(global_seed)  # the global RNG plays no part
        return nn.init_params(spec, init, 1.0, torch.Generator().manual_seed(seed))

    a, b, other = draw(5, 0), draw(5, 123), draw(6, 0)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["W1"], other["W1"])  # the generator's seed decides the draws
    assert all(p.device.type == "cpu" for p in a.values())  # drawn on the CPU, for any device


def test_unknown_init_names_field():
    from service.errors import InvalidInput

    with pytest.raises(InvalidInput, match=r"init.*allowed: gaussian, xavier, kaiming, orthogonal"):
        nn.init_weight(3, 3, "lecun", 1.0, torch.Generator())


def test_init_weight_gap_contrast_at_width_100():
    g = torch.Generator().manual_seed(0)
    assert metrics.weight_isometry_gap(nn.init_weight(100, 100, "orthogonal", 1.0, g)) < 1e-10
    assert 0.8 < metrics.weight_isometry_gap(nn.init_weight(100, 100, "gaussian", 1.0, g)) < 1.3


# --- scale ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_depth_1000_width_100_builds_and_measures():
    cfg = TrialConfig(
        depth=1000,
        width=100,
        batch_size=100,
        dataset="gaussian",
        activation="tanh",
        gain_exponent=0.4,
        init="orthogonal",
    )
    spec = nn.make_spec(cfg)
    p = nn.init_params(spec, cfg.init, 1.0, torch.Generator().manual_seed(0))
    x = torch.randn(100, 100, generator=torch.Generator().manual_seed(1))
    y = torch.arange(100) % 10
    m = metrics.probe_metrics(spec, p, nn.init_state(spec), x, y)
    for k in (
        "isometry_gap/linear",
        "isometry_gap/norm",
        "isometry_gap/act",
        "grad_norm",
        "weight_isometry_gap",
    ):
        assert m[k].shape == (1000,)
    assert (m["weight_isometry_gap"] < 1e-9).all()
    assert (m["isometry_gap/norm"] == math.inf).all()  # centering BN at n = d
    assert torch.isfinite(torch.from_numpy(m["grad_norm"])).all()
    assert math.isfinite(m["head_grad_norm"])
    # orthogonal weights with shaped tanh: gradients bounded at any depth (Meterez et al. 2024)
    assert m["grad_norm"].max() < 100 * m["grad_norm"].min()


# --- the options of issue 9: norm_eps, bias_init, head_init, orthogonal_gain, dtype ---------------


@pytest.mark.parametrize("norm", ["batch", "layer", "batch_scale", "layer_scale"])
@pytest.mark.parametrize("mode", ["train", "batch"])
def test_norm_eps_is_the_epsilon_of_every_norm(norm, mode):
    """Inputs of scale 1e-3 (variance v ~ 1e-5, comparable to ε): the norm's output has root
    mean square √(v/(v + ε)) along the normalized axis — exactly 1 with ε = 0."""
    for eps in (0.0, 1e-5):
        spec = nn.make_spec(TrialConfig(depth=1, width=16, norm=norm, norm_eps=eps))
        assert spec.eps == eps
        p = nn.init_params(spec, "gaussian", 1.0, torch.Generator().manual_seed(0))
        p = {k: v.double() for k, v in p.items()}
        s = {k: v.double() for k, v in nn.init_state(spec).items()}
        z = (x_batch(n=20, d=16) * 1e-3).double()
        dim = 0 if norm.startswith("batch") else 1
        centre = norm in ("batch", "layer")
        zc = z - z.mean(dim=dim, keepdim=True) if centre else z
        v = zc.pow(2).mean(dim=dim)
        out = nn.normalize(spec, p, s, 1, z, mode)
        oc = out - out.mean(dim=dim, keepdim=True) if centre else out
        rms = oc.pow(2).mean(dim=dim).sqrt()
        torch.testing.assert_close(rms, (v / (v + eps)).sqrt(), rtol=1e-10, atol=0)


def test_batch_norm_with_zero_eps_keeps_torchs_running_statistics():
    """torch's batch_norm refuses ε = 0 in training; ε = 0 computes the same statistics itself:
    running mean/var updated as torch does (unbiased variance, momentum 0.1), and the running
    mode divides by √var exactly."""
    x = x_batch(n=20, d=16).double()
    spec0 = nn.make_spec(TrialConfig(depth=1, width=16, norm="batch", norm_eps=0.0))
    spec_t = nn.make_spec(TrialConfig(depth=1, width=16, norm="batch", norm_eps=1e-300))
    p = {
        k: v.double() for k, v in nn.init_params(spec0, "gaussian", 1.0, torch.Generator()).items()
    }
    s0 = {k: v.double() for k, v in nn.init_state(spec0).items()}
    st = {k: v.double() for k, v in nn.init_state(spec0).items()}
    out0 = nn.normalize(spec0, p, s0, 1, x, "train")
    out_t = nn.normalize(spec_t, p, st, 1, x, "train")  # torch's own, ε negligible
    torch.testing.assert_close(out0, out_t, rtol=1e-12, atol=1e-12)
    for k in s0:
        torch.testing.assert_close(s0[k], st[k], rtol=1e-12, atol=1e-15)
    run = nn.normalize(spec0, p, s0, 1, x, "running")
    expect = (x - s0["mean1"]) / s0["var1"].sqrt() * p["gamma1"] + p["beta1"]
    torch.testing.assert_close(run, expect, rtol=1e-12, atol=1e-12)


def wide_spec(bias=True, width=1000, d_in=50, depth=2, n_classes=10, dtype=torch.float32):
    return nn.Spec(
        depth, d_in, width, n_classes, "none", "norm_act", bias, "identity", (1.0,) * depth,
        dtype=dtype,
    )  # fmt: skip


def ks_uniform(u: torch.Tensor, lo: float, hi: float) -> float:
    """Kolmogorov–Smirnov distance of the sample u from U(lo, hi)."""
    x = ((u.double().sort().values - lo) / (hi - lo)).clamp(0, 1)
    k = len(x)
    i = torch.arange(1, k + 1, dtype=F64)
    return float(torch.maximum(i / k - x, x - (i - 1) / k).max())


def test_bias_init_torch_is_uniform_within_one_over_root_fan_in_and_leaves_weights_alone():
    spec = wide_spec()
    zero = nn.init_params(spec, "gaussian", 1.0, torch.Generator().manual_seed(3))
    torchb = nn.init_params(
        spec, "gaussian", 1.0, torch.Generator().manual_seed(3), bias_init="torch"
    )
    assert list(zero) == list(torchb)  # same names, same order
    for k in zero:
        if k.startswith("W"):
            assert torch.equal(zero[k], torchb[k]), k  # drawn before any bias
        else:
            assert zero[k].abs().max() == 0
    for name, fan_in in (("b1", 50), ("b2", 1000), ("b_head", 1000)):
        b, bound = torchb[name], 1 / math.sqrt(fan_in)
        assert b.dtype == torch.float32 and float(b.abs().max()) <= bound
        if len(b) >= 1000:  # KS at 1% significance: 1.63/√k
            assert ks_uniform(b, -bound, bound) < 1.63 / math.sqrt(len(b)), name
            assert float(b.abs().max()) > 0.99 * bound  # fills the interval


def test_head_init_is_the_heads_and_the_body_is_untouched():
    spec = wide_spec(bias=False, width=2000, n_classes=10)
    body = nn.init_params(spec, "gaussian", 1.0, torch.Generator().manual_seed(4))
    kai = nn.init_params(
        spec, "gaussian", 1.0, torch.Generator().manual_seed(4), head_init="kaiming"
    )
    orth = nn.init_params(
        spec, "gaussian", 1.0, torch.Generator().manual_seed(4), head_init="orthogonal"
    )
    for k in ("W1", "W2"):
        assert torch.equal(body[k], kai[k]) and torch.equal(body[k], orth[k])
    k = 10 * 2000  # sample variance of k Gaussians: relative s.e. √(2/k) = 1%
    assert float(body["W_head"].double().var()) == pytest.approx(1 / 2000, rel=0.05)
    assert float(kai["W_head"].double().var()) == pytest.approx(2 / 2000, rel=5 * math.sqrt(2 / k))
    W = orth["W_head"].double()
    torch.testing.assert_close(W @ W.T, torch.eye(10, dtype=F64), atol=1e-6, rtol=0)


def test_orthogonal_gain_false_ignores_init_gain():
    g = 1.7
    with_gain = nn.init_weight(30, 20, "orthogonal", g, torch.Generator().manual_seed(0))
    without = nn.init_weight(
        30, 20, "orthogonal", g, torch.Generator().manual_seed(0), orthogonal_gain=False
    )
    unit = nn.init_weight(30, 20, "orthogonal", 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(without, unit)
    torch.testing.assert_close(with_gain, g * unit)
    gauss = nn.init_weight(30, 20, "gaussian", g, torch.Generator().manual_seed(0))
    assert torch.equal(
        gauss,
        nn.init_weight(
            30, 20, "gaussian", g, torch.Generator().manual_seed(0), orthogonal_gain=False
        ),
    )  # only orthogonal init is affected


def test_float64_params_and_state_and_the_same_draws():
    s64, s32 = wide_spec(width=64, dtype=torch.float64), wide_spec(width=64)
    for init in ("gaussian", "orthogonal"):
        p64 = nn.init_params(s64, init, 1.3, torch.Generator().manual_seed(1), bias_init="torch")
        p32 = nn.init_params(s32, init, 1.3, torch.Generator().manual_seed(1), bias_init="torch")
        for k in p32:
            assert p64[k].dtype == torch.float64
            torch.testing.assert_close(p64[k].float(), p32[k], rtol=2**-22, atol=0)  # ≤ 2 ulp
    spec = nn.make_spec(TrialConfig(depth=2, width=8, dtype="float64"))
    assert spec.dtype == torch.float64
    assert all(v.dtype == torch.float64 for v in nn.init_state(spec).values())
