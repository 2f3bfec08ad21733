"""The transformer family (workers/models/transformer.py) and the token metrics
(workers/token_metrics.py), held to closed forms and published facts (docs/models.md):

- token metrics of token sets whose Gram is known in closed form;
- Theorem 1 of Joudaki et al. 2023 (deterministic): scaling each token to unit norm never
  increases the token isometry gap; centring (LayerNorm) can, in a constructed case;
- Dong, Cordonnier & Loukas 2021: pure attention without skips loses rank (token cosine → 1)
  within a few layers; with skips it stays clearly below at the same depth;
- attention rows sum to 1; the blocks are permutation equivariant over tokens (no positional
  embedding); the structural rank bounds are never below the numerical rank.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from service.config import TrialConfig
from workers import nn
from workers.data import load_dataset
from workers.gaps import range_gaps_and_errors
from workers.metrics import isometry_gaps, refine
from workers.models import build
from workers.models.transformer import TransformerNet, attention, to_tokens
from workers.token_metrics import repeated_tokens, token_cosines, token_gaps, token_metrics

F64 = torch.float64


def tcfg(**kw) -> TrialConfig:
    base = dict(model="transformer", depth=3, width=16, heads=2, dataset="digits", epochs=0)
    return TrialConfig(**{**base, **kw})


def digits(n: int = 64) -> torch.Tensor:
    return load_dataset("digits").X_train[:n]


def run(cfg: TrialConfig, x: torch.Tensor, *, seed: int | None = None, **net_kw):
    net = TransformerNet(cfg, **net_kw)
    p = net.init_params(torch.Generator().manual_seed(cfg.seed if seed is None else seed))
    logits, taps = net.forward(p, net.init_state(), x.to(net.dtype), "batch", taps=True)
    return net, p, logits, taps


# ---------------------------------------------------------------------------------------------
# Token metrics against closed forms


def test_orthogonal_tokens_of_equal_norm_have_gap_0_and_cosine_0():
    Q = nn.haar_orthogonal(8, 5, torch.Generator().manual_seed(0), F64).T  # (5, 8), rows ⟂
    X = torch.stack([3.0 * Q, 0.5 * Q])  # two samples, T = 5 tokens of d = 8
    assert token_gaps(X).tolist() == pytest.approx([0.0, 0.0], abs=1e-12)
    assert token_cosines(X).tolist() == pytest.approx([0.0, 0.0], abs=1e-12)
    m = token_metrics([X, 2 * X])
    assert m["token_isometry_gap"].shape == m["token_cosine"].shape == (2,)
    assert m["token_isometry_gap"].dtype == np.float64


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_identical_tokens_have_cosine_1_and_infinite_gap(dtype):
    g = torch.Generator().manual_seed(1)
    v = torch.randn(3, 1, 6, generator=g).to(dtype)
    X = v.expand(3, 4, 6).clone()  # every sample: 4 copies of one token
    assert token_cosines(X).tolist() == pytest.approx([1.0] * 3, abs=1e-6)
    assert token_gaps(X).tolist() == [math.inf] * 3
    # one repeat among distinct tokens is enough; −0 equals +0; one ulp apart is no repeat
    Y = torch.randn(4, 5, 6, generator=g).to(dtype)
    Y[0, 3] = Y[0, 1]
    Y[1, 0, 0], Y[1, 2] = 0.0, Y[1, 0]
    Y[1, 2, 0] = -0.0
    Y[2, 4] = torch.nextafter(Y[2, 0], torch.tensor(math.inf, dtype=dtype))
    assert repeated_tokens(Y).tolist() == [True, True, False, False]
    gaps = token_gaps(Y)
    assert gaps[0] == gaps[1] == math.inf and math.isfinite(gaps[2]) and math.isfinite(gaps[3])
    assert gaps[2] > 5  # nearly repeated: finite, large (15.4 float32)


@pytest.mark.parametrize("c", [-0.9, -0.3, 0.0, 0.5, 0.99, 0.999999])
def test_two_tokens_with_cosine_c_have_gap_minus_half_log_1_minus_c2(c):
    # equal norms r: G = r²[[1, c], [c, 1]], eigenvalues r²(1 ± c): gap = −½ log(1 − c²)
    r = 7.0
    x1 = torch.tensor([r, 0.0, 0.0], dtype=F64)
    x2 = torch.tensor([r * c, r * math.sqrt(1 - c * c), 0.0], dtype=F64)
    X = torch.stack([x1, x2]).unsqueeze(0)
    assert float(token_gaps(X)[0]) == pytest.approx(-0.5 * math.log(1 - c * c), rel=1e-9, abs=1e-12)
    assert float(token_cosines(X)[0]) == pytest.approx(c, abs=1e-12)


def test_structural_infinities_and_undefined_cosines():
    g = torch.Generator().manual_seed(2)
    more_tokens = torch.randn(3, 9, 4, dtype=F64, generator=g)  # T = 9 > d = 4: rank ≤ 4
    assert token_gaps(more_tokens).tolist() == [math.inf] * 3
    X = torch.randn(2, 3, 5, dtype=F64, generator=g)
    X[1, 2] = 0.0  # a zero token in sample 1: its Gram has a zero row
    gaps, cos = token_gaps(X), token_cosines(X)
    assert math.isfinite(gaps[0]) and gaps[1] == math.inf
    assert math.isfinite(cos[0]) and math.isnan(cos[1])
    m = token_metrics([X])
    assert m["token_isometry_gap"][0] == math.inf and math.isnan(m["token_cosine"][0])
    X[0, 0, 0] = math.nan
    assert math.isnan(token_gaps(X)[0])


def test_token_gaps_equal_the_sample_gap_of_each_token_set():
    # the T × T token Gram of a sample is the "sample Gram" of its T tokens
    X = torch.randn(5, 6, 10, dtype=F64, generator=torch.Generator().manual_seed(3))
    X[:, 0] *= 1e3  # one token of a very different norm
    want = torch.tensor([float(isometry_gaps(X[i : i + 1])[0]) for i in range(5)], dtype=F64)
    G = X @ X.mT
    lam = torch.linalg.eigvalsh(G)
    closed = torch.log(lam.mean(dim=1)) - torch.log(lam).mean(dim=1)
    assert torch.allclose(token_gaps(X), want, rtol=1e-12)
    assert torch.allclose(token_gaps(X), closed, rtol=1e-8)


# ---------------------------------------------------------------------------------------------
# Joudaki et al. 2023, Theorem 1: scaling to unit norm never increases the isometry gap


def _hard_token_sets() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    out = []
    for t, d in [(2, 3), (5, 8), (8, 8), (16, 32)]:
        X = torch.randn(20, t, d, dtype=F64, generator=g)
        out.append(X)
        scales = torch.logspace(-6, 6, t, dtype=F64)[torch.randperm(t, generator=g)]
        out.append(X * scales[None, :, None])  # wildly different token norms
        base = torch.randn(20, 1, d, dtype=F64, generator=g)
        out.append(base + 1e-4 * X)  # nearly collinear tokens
        out.append((base + 1e-3 * X) * scales[None, :, None])  # both
    return out


@pytest.mark.parametrize("eps", [0.0, 1e-5])
def test_scaling_tokens_to_unit_norm_never_increases_the_token_gap(eps):
    for X in _hard_token_sets():
        before = token_gaps(X)
        after = token_gaps(nn.layer_scale_norm(X, eps))  # x_t ↦ √d x_t/‖x_t‖ (ε: +ε in ms)
        assert torch.isfinite(before).all()
        assert (after <= before + 1e-9 * (1 + before)).all(), (before - after).min()
        # the gain is exactly the AM–GM gap of the token norms when ε = 0:
        # gap(G) − gap(DGD) = log mean g − mean log g, g_t = ‖x_t‖². Measured within 1e-11
        # except with token norms 1e±6 (κ(G) ~ 1e24, decided by the float64 SVD, which is not
        # invariant to row scaling): 2.1e-4 at T = d = 8, 9.2e-6 at T = 16, d = 32.
        if eps == 0.0:
            sq = X.square().sum(dim=2)
            amgm = torch.log(sq.mean(dim=1)) - torch.log(sq).mean(dim=1)
            assert torch.allclose(before - after, amgm, rtol=0, atol=1e-3)


def test_centring_tokens_can_increase_the_token_gap():
    # two orthogonal tokens of equal norm (gap 0); LayerNorm subtracts each token's mean over
    # its d = 6 features: the centred tokens have cosine −1/2, gap −½ log(1 − 1/4)
    X = torch.tensor([[[1.0, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]]], dtype=F64)
    Y = F.layer_norm(X, (6,), eps=0.0)
    assert float(token_gaps(X)[0]) == pytest.approx(0.0, abs=1e-12)
    assert float(token_cosines(Y)[0]) == pytest.approx(-0.5, abs=1e-12)
    assert float(token_gaps(Y)[0]) == pytest.approx(-0.5 * math.log(0.75), rel=1e-12)
    # at d = 4 the centred tokens are exactly opposite: from gap 0 to +∞. Centred and scaled by
    # hand the tokens are ±(1, 1, −1, −1) exactly (means 1/2, deviations ±1/2, σ = 1/2: every step
    # exact in binary), so their Gram is singular by construction; a kernel's F.layer_norm may
    # round the two tokens differently in the last bit (then the Gram is regular at rounding
    # level), so it is compared to the exact tokens
    X4 = X[..., :4]
    C = X4 - X4.mean(dim=-1, keepdim=True)
    Z = C / C.square().mean(dim=-1, keepdim=True).sqrt()
    assert torch.equal(Z[0, 0], -Z[0, 1]) and torch.equal(Z[0, 0].abs(), torch.ones(4, dtype=F64))
    # the gap goes through the Householder QR of Zᵀ, R = [[−2, 2], [0, δ]], gap = log(2/|δ|):
    # the last pivot δ is exactly 0 (+∞) on some CPUs' kernels and ~ε₆₄ on others (9.6e-17,
    # gap 37.6, seen). Backward stability bounds |δ| by a small multiple of ε₆₄‖Z‖_F, so the gap
    # is +∞ or above 25 (|δ| < 3e-11), and then its error bound says float64 cannot resolve it
    gap = float(token_gaps(Z)[0])
    _, err = range_gaps_and_errors(Z, 2)
    assert gap == math.inf or (gap > 25 and float(err[0]) == math.inf), (gap, float(err[0]))
    torch.testing.assert_close(F.layer_norm(X4, (4,), eps=0.0), Z, rtol=0, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# Dong, Cordonnier & Loukas 2021: pure attention loses rank


def _cosine_curve(skip: bool, seeds: int = 3, depth: int = 6) -> np.ndarray:
    x = digits(100)
    curves = []
    for seed in range(seeds):
        cfg = tcfg(depth=depth, width=32, heads=4, mlp_ratio=0, skip=skip, norm="none", seed=seed)
        _, _, _, taps = run(cfg, x)
        curves.append(token_metrics(taps.tokens)["token_cosine"])
    return np.mean(curves, axis=0)


def test_pure_attention_without_skips_collapses_and_skips_prevent_it():
    # measured (5 seeds, digits rows, d = 32, 4 heads, Gaussian init): without skips
    # 0.643, 0.976, 0.9987, 1.0000 (layers 1..4); with skips 0.258, 0.410, 0.546, 0.650, 0.722,
    # 0.791 (layers 1..6)
    no_skip, skip = _cosine_curve(False), _cosine_curve(True)
    assert no_skip[5] > 0.99 and no_skip[2] > 0.99
    assert np.all(np.diff(no_skip) > -1e-6)  # rises
    assert skip[5] < 0.9
    assert np.all(skip < no_skip)


def test_pure_attention_loses_rank_doubly_exponentially():
    # Dong et al. 2021, Thm 2.2: ‖res(SA(X))‖ ≤ C‖res(X)‖³, res(X) = X − 1x̄ᵀ: log res grows by a
    # factor → 3 per layer. Measured (float64, median over 100 samples, seeds 0..4), layer 1→2:
    # 5.1–7.3, layer 2→3: 3.57–3.68 (res 0.50–0.57 → 1.4e-2–4.6e-2 → 1.6e-7–1.4e-5 → 2e-16, the
    # float64 floor, at layer 4)
    x = digits(100).double()
    for seed in range(3):
        cfg = tcfg(
            depth=3,
            width=32,
            heads=4,
            mlp_ratio=0,
            skip=False,
            norm="none",
            seed=seed,
            dtype="float64",
        )
        _, _, _, taps = run(cfg, x)
        res = []
        for X in taps.tokens:
            Xc = X - X.mean(dim=1, keepdim=True)
            res.append(float((Xc.flatten(1).norm(dim=1) / X.flatten(1).norm(dim=1)).median()))
        logs = np.log(res)
        assert np.all(logs[1:] / logs[:-1] > 2.5), res


# ---------------------------------------------------------------------------------------------
# The network


def test_attention_rows_sum_to_one():
    cfg = tcfg(dtype="float64")
    _, p, _, taps = run(cfg, digits(10).double())
    _, A = attention(p, 2, taps.tokens[0], cfg.heads)
    assert A.shape == (10, cfg.heads, 8, 8)
    assert (A >= 0).all()
    assert torch.allclose(A.sum(dim=-1), torch.ones(10, cfg.heads, 8, dtype=F64), atol=1e-14)


def test_tokens_are_rows_or_patches():
    x = torch.arange(2 * 64, dtype=torch.float32).reshape(2, 64)
    rows = to_tokens(x, "digits", None)
    assert rows.shape == (2, 8, 8) and torch.equal(rows[1, 3], x[1, 24:32])
    patches = to_tokens(x, "digits", 4)
    assert patches.shape == (2, 4, 16)
    assert patches[0, 1].tolist() == [r * 8 + c for r in range(4) for c in range(4, 8)]
    cifar = torch.randn(1, 32 * 32 * 3)
    t = to_tokens(cifar, "cifar10", 8)  # HWC layout: channel-major tokens
    img = cifar.reshape(1, 32, 32, 3)
    assert t.shape == (1, 16, 3 * 64)
    assert torch.equal(t[0, 0, :64], img[0, :8, :8, 0].reshape(-1))
    net = build(tcfg(patch_size=4))
    assert (net.tokens, net.token_dim) == (4, 16)


@pytest.mark.parametrize("norm", ["none", "layer", "layer_scale", "batch", "batch_scale"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_blocks_are_permutation_equivariant_without_positional_embedding(norm, position):
    cfg = tcfg(norm=norm, norm_position=position, dtype="float64", activation="tanh")
    x = digits(12).double()
    perm = torch.tensor([3, 0, 7, 5, 1, 2, 6, 4])  # rows of the image = tokens
    xp = x.reshape(12, 8, 8)[:, perm].reshape(12, 64)
    _, _, logits, taps = run(cfg, x, use_pos=False)
    _, _, logits_p, taps_p = run(cfg, xp, use_pos=False)
    for t, tp in zip(taps.tokens, taps_p.tokens, strict=True):
        assert torch.allclose(t[:, perm], tp, atol=1e-12)
    assert torch.allclose(logits, logits_p, atol=1e-12)
    _, _, logits_pos, _ = run(cfg, xp)  # the positional embedding breaks the symmetry
    assert not torch.allclose(logits_pos, logits, atol=1e-6)


@pytest.mark.parametrize("mlp_ratio", [0, 2])
def test_shapes_names_and_determinism(mlp_ratio):
    cfg = tcfg(mlp_ratio=mlp_ratio, bias=True, bias_init="torch", norm="layer")
    net = build(cfg)
    assert isinstance(net, TransformerNet)
    assert net.kinds == (("attn", "mlp", "residual") if mlp_ratio else ("attn", "residual"))
    x = digits(20)
    _, p, logits, taps = run(cfg, x)
    _, p2, logits2, _ = run(cfg, x)
    assert all(torch.equal(p[k], p2[k]) for k in p) and torch.equal(logits, logits2)
    assert logits.shape == (20, 10) and p["pos"].shape == (8, 16)
    assert p["W_embed"].shape == (16, 8)
    for k in net.kinds:
        assert len(taps.layers[k]) == 3 and taps.layers[k][0].shape == (20, 16)
    assert [t.shape for t in taps.tokens] == [(20, 8, 16)] * 3
    assert torch.equal(taps.outputs[1], taps.tokens[1].mean(dim=1))
    assert torch.equal(taps.layers["residual"][2], taps.outputs[2])
    names = net.layer_weights()
    assert names[0][0] == "Wv1" and len(names) == 3
    assert all(k in p for block in names for k in block) and net.head_weight in p
    if mlp_ratio:
        assert p["W12"].shape == (32, 16) and p["W22"].shape == (16, 32)  # W1, W2 of block 2
        assert names[1] == ["Wv2", "Wq2", "Wk2", "Wo2", "W12", "W22"]


def test_training_mode_updates_running_statistics_and_batch_mode_does_not():
    cfg = tcfg(norm="batch")
    net = build(cfg)
    p = net.init_params(torch.Generator().manual_seed(0))
    s = net.init_state()
    before = {k: v.clone() for k, v in s.items()}
    net.forward(p, s, digits(16), "batch")
    assert all(torch.equal(s[k], before[k]) for k in s)
    net.forward(p, s, digits(16), "train")
    assert not torch.equal(s["mean_attn1"], before["mean_attn1"])
    assert not torch.equal(s["var_mlp3"], before["var_mlp3"])


def _numerical_rank(H: torch.Tensor) -> int:
    sv = torch.linalg.svdvals(H.double())
    return int((sv > sv[0] * 1e-10).sum()) if sv.numel() and sv[0] > 0 else 0


@pytest.mark.parametrize(
    "kw",
    [
        dict(norm="batch", norm_position="post"),
        dict(norm="batch", norm_position="post", mlp_ratio=0, skip=False),
        dict(norm="layer", norm_position="post"),
        dict(norm="layer", norm_position="pre", width=8, heads=2),
        dict(norm="none", skip=False, mlp_ratio=0),
        dict(norm="batch_scale", norm_position="post", activation="identity"),
        dict(norm="none", residual_scale=0.0),
    ],
)
def test_structures_never_below_the_numerical_rank(kw):
    cfg = tcfg(dtype="float64", **kw)
    x = digits(40).double()
    net, p, _, taps = run(cfg, x)
    forced = net.structures(p, x, taps, lambda s, h: refine(s, h))
    assert set(forced) == set(net.kinds)
    for k in net.kinds:
        for s, H in zip(forced[k], taps.layers[k], strict=True):
            assert _numerical_rank(H) <= s.rank
            if s.ones_in_null:
                assert torch.allclose(H.sum(dim=0), torch.zeros(H.shape[1], dtype=F64), atol=1e-9)
    if kw.get("norm") == "batch":  # post BatchNorm with β = 0 centres the pooled stream
        assert forced["residual"][-1].ones_in_null
    if kw.get("residual_scale") == 0.0:  # a zero branch is exactly rank 0
        assert forced["attn"][0].rank == 0


# ---------------------------------------------------------------------------------------------
# End to end: workers.train.fit records the token metrics


def test_fit_records_token_metrics_and_finite_losses():
    from workers.train import fit

    cfg = TrialConfig(model="transformer", depth=2, width=16, heads=2, epochs=1, dataset="digits")
    recs = list(fit(cfg))
    assert [r["epoch"] for r in recs] == [0, 1]
    for r in recs:
        assert not r["diverged"]
        for k in ("train_loss", "test_loss"):
            assert math.isfinite(r[k])
        for k in ("token_isometry_gap", "token_cosine"):
            assert r[k].shape == (2,) and np.isfinite(r[k]).all()
        for kind in ("attn", "mlp", "residual"):
            assert r[f"isometry_gap/{kind}"].shape == (2,)
            assert np.isfinite(r[f"range_isometry_gap/{kind}"]).all()
        assert (r["isometry_gap/residual"] == math.inf).all()  # n = 100 > d = 16
        assert r["grad_norm"].shape == r["weight_isometry_gap"].shape == (2,)


def test_fit_reproduces_rank_collapse_at_initialization():
    # the example examples/dong-rank-collapse.yaml, one cell: no skips, depth 6
    from workers.train import fit

    cfg = tcfg(depth=6, width=32, heads=4, mlp_ratio=0, skip=False, norm="none")
    (rec,) = list(fit(cfg))
    assert rec["token_cosine"][-1] > 0.99
    assert np.all(np.diff(rec["token_cosine"]) > -1e-6)
