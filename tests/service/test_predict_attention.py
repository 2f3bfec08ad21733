"""service.theory.attention (predict for a transformer's attention-only stack, uniform attention)
against closed forms: the exact rank-one collapse without skips, K_ℓ = K₀ + ((1 + c²g⁴)^ℓ − 1)·𝒜K₀𝒜
for a pre-norm stack without a norm, the sequence-centred part kept through pre-LayerNorm
blocks, a batch-centred attention input's null space; and what it refuses, with the reason."""

import math

import numpy as np
import pytest

from service.config import parse_trial_config
from service.isometry import isometry_gap
from service.theory import attention
from service.theory.predict import predict

# gaussian: 1 × 10 × 10 images, rows as tokens: T = 10 tokens of 10 values
BASE = {"model": "transformer", "mlp_ratio": 0, "dataset": "gaussian", "epochs": 0,
        "norm_eps": 0.0, "batch_size": 5, "width": 64, "depth": 4, "norm": "layer"}  # fmt: skip
T = 10


def _inputs(n=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 100)) * rng.uniform(0.5, 2.0, (n, 1))


def _embedded(X, g=1.0, d=64):
    """K₀ over the n·T tokens: g²·tokens·tokensᵀ/token_dim + the positional term I_T/d."""
    tok = attention.image_tokens(X, "gaussian", None).reshape(-1, 10)
    n = X.shape[0]
    return g * g * tok @ tok.T / 10 + np.kron(np.ones((n, n)), np.eye(T)) / d


def _mix(K, n):
    """𝒜K𝒜: block means, spread back over each block."""
    M = K.reshape(n, T, n, T).mean(axis=(1, 3))
    return np.kron(M, np.ones((T, T)))


def _token_cosine(K, n):
    out = []
    for a in range(n):
        B = K[a * T : (a + 1) * T, a * T : (a + 1) * T]
        s = np.sqrt(np.diag(B))
        C = B / np.outer(s, s)
        out.append((C.sum() - T) / (T * (T - 1)))
    return float(np.mean(out))


@pytest.mark.parametrize("norm", ["none", "layer", "layer_scale", "batch", "batch_scale"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_without_skips_every_sequence_collapses_to_one_token_at_once(norm, position):
    p = predict({**BASE, "skip": False, "norm": norm, "norm_position": position}, _inputs())
    np.testing.assert_array_equal(p["token_cosine"], 1.0)
    assert np.isinf(p["token_isometry_gap"]).all()
    assert set(p["notes"]["input_free"]) == {"token_cosine", "token_isometry_gap"}
    assert "grad_norm" in p["unpredicted"] and "softmax" in p["unpredicted"]["grad_norm"]


@pytest.mark.parametrize(("g", "c"), [(1.0, 1.0), (0.5, 2.0), (1.3, 0.4)])
def test_a_pre_norm_stack_without_a_norm_grows_only_the_sequence_mean(g, c):
    """K_ℓ = K₀ + ((1 + β)^ℓ − 1)·𝒜K₀𝒜, β = c²g⁴ (𝒜 is a projection): the pooled kernel scales
    by (1 + β)^ℓ (gap unchanged), each sequence's centred part stays."""
    X = _inputs()
    cfg = {**BASE, "norm": "none", "skip": True, "init_gain": g, "residual_scale": c}
    p = predict(cfg, X)
    K0, n, beta = _embedded(X, g), 5, c * c * g**4
    pooled0 = K0.reshape(n, T, n, T).mean(axis=(1, 3))
    for ell in range(1, 5):
        K = K0 + ((1 + beta) ** ell - 1) * _mix(K0, n)
        assert p["token_cosine"][ell - 1] == pytest.approx(_token_cosine(K, n), rel=1e-12)
        q = (1 + beta) ** ell * np.trace(pooled0) / n
        assert p["rms"][ell - 1] == pytest.approx(math.sqrt(q), rel=1e-12)
    np.testing.assert_allclose(p["isometry_gap/residual"], isometry_gap(pooled0), rtol=1e-9)
    np.testing.assert_allclose(p["isometry_gap/attn"], isometry_gap(pooled0), rtol=1e-9)
    assert np.all(np.diff(p["token_cosine"]) > 0) and p["token_cosine"][-1] < 1


def test_pre_layernorm_keeps_each_sequences_centred_part():
    """x' = x + c·Attn(LN(x)) adds one vector to every token of a sequence: each sequence's
    centred part P_T K_aa P_T stays the embedding's at every depth while the common part grows,
    so the tokens' cosine and gap rise block by block."""
    X = _inputs(seed=3)
    cfg = parse_trial_config({**BASE, "norm": "layer", "skip": True, "depth": 6})
    p = predict(cfg, X)
    assert np.all(np.diff(p["token_cosine"]) > 0) and np.all(np.diff(p["token_isometry_gap"]) > 0)
    K = K0 = _embedded(X)
    P = np.eye(T) - 1 / T
    stack = attention._Stack(cfg, 5, 256, 0)
    for _ in range(6):
        _, K, _ = stack.block(K, None)
        for a in range(5):
            blk = slice(a * T, (a + 1) * T)
            np.testing.assert_allclose(P @ K[blk, blk] @ P, P @ K0[blk, blk] @ P, atol=1e-12)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_a_batch_centred_attention_input_puts_1_in_the_pooled_null_space(position):
    """BatchNorm centres every feature over all n·T tokens, uniform attention averages within a
    sequence: the pooled attention outputs sum to 0 over the batch (pre: every block; post:
    from block 2 on, whose input is the previous BatchNorm's output)."""
    p = predict({**BASE, "norm": "batch", "norm_position": position, "depth": 3}, _inputs())
    null = [True, True, True] if position == "pre" else [False, True, True]
    assert list(np.isinf(p["isometry_gap/attn"])) == null
    assert np.isfinite(p["range_isometry_gap/attn"]).all()
    if position == "post":  # the stream itself is batch-centred after every block
        assert np.isinf(p["isometry_gap/residual"]).all()
    with_bias = predict(
        {**BASE, "norm": "batch", "norm_position": position, "depth": 3, "bias": True,
         "bias_init": "torch"}, _inputs(),
    )  # fmt: skip
    assert np.isfinite(with_bias["isometry_gap/attn"]).all()  # a bias moves it off 0


def test_post_batchnorm_with_skips_is_monte_carlo_and_agrees_with_more_draws():
    cfg = {**BASE, "norm": "batch", "norm_position": "post", "depth": 3, "batch_size": 4}
    X = _inputs(4)
    a, b = predict(cfg, X, samples=1 << 14, seed=0), predict(cfg, X, samples=1 << 16, seed=1)
    assert "Monte Carlo" in a["notes"]["method"]
    for k in ("token_cosine", "range_isometry_gap/residual", "mean_cosine", "rms"):
        np.testing.assert_allclose(a[k], b[k], atol=0.02)


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"mlp_ratio": 4}, "mlp_ratio 0"),
        ({"batch_size": 300}, "3000 tokens"),
        ({"batch_size": 100, "depth": 500}, "depth·(n·T)²"),
        ({"batch_size": 100, "depth": 300, "norm": "batch"}, "BatchNorm over n·T = 1000"),
        ({"batch_size": 60, "norm": "batch", "norm_position": "post"}, "Monte Carlo draws"),
    ],
)
def test_what_is_not_covered_is_unpredicted_with_the_reason(config, why):
    p = predict({**BASE, **config})
    keys = [k for k in p if k not in ("unpredicted", "notes")]
    assert not keys and all(why in v for v in p["unpredicted"].values()), p["unpredicted"]


def test_the_tokens_are_the_engines_rows_and_patches():
    """workers/models/transformer.py: rows (channel, column) or k × k patches (channel, row,
    column) in row-major order; CIFAR is flattened height, width, channel."""
    X = np.arange(200.0).reshape(2, 100)
    rows = attention.image_tokens(X, "gaussian", None)
    np.testing.assert_array_equal(rows[1, 3], np.arange(130.0, 140.0))  # sample 1, row 3
    patches = attention.image_tokens(X, "gaussian", 5)
    np.testing.assert_array_equal(patches[0, 1, :5], [5, 6, 7, 8, 9])  # patch (0, 1), its row 0
    np.testing.assert_array_equal(patches[0, 1, 5:10], [15, 16, 17, 18, 19])
    hwc = attention.image_tokens(np.arange(3072.0)[None], "cifar10", None)  # (1, 32, 96)
    h, ch, w = 2, 1, 5
    assert hwc[0, h, ch * 32 + w] == (h * 32 + w) * 3 + ch


def test_inputs_that_are_not_the_datasets_images_are_refused():
    from service.errors import InvalidInput

    with pytest.raises(InvalidInput) as exc:
        predict({**BASE}, np.ones((5, 64)))
    assert exc.value.field == "inputs"
    with pytest.raises(InvalidInput) as exc:
        predict({**BASE}, input_kernel=np.eye(5))
    assert exc.value.field == "input_kernel"
