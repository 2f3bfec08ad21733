"""The isometry gap and its companions, against the mathematics (docs/science.md; Joudaki et al.
2023)."""

import math

import numpy as np
import pytest
import torch
from scipy.special import digamma

from service.errors import InvalidInput
from service.isometry import cosine_gram
from workers import gaps as gap_core
from workers import metrics, nn

F64 = torch.float64


def np_gap(H: np.ndarray) -> float:
    """Reference: the definition, from float64 numpy singular values of H (λ = σ², no Gram)."""
    lam = np.linalg.svd(np.asarray(H, dtype=np.float64), compute_uv=False) ** 2
    return float(np.log(lam.mean()) - np.log(lam).mean())


def log_am_over_gm(v: np.ndarray) -> float:
    return float(np.log(v.mean()) - np.log(v).mean())


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- the definition ----------------------------------------------------------------------------


@pytest.mark.parametrize("c", [1e-3, 1.0, 7.5, 1e4])
@pytest.mark.parametrize("n", [1, 2, 10, 100])
def test_gap_of_scaled_identity_is_zero(n, c):
    H = c * torch.eye(n, dtype=F64)
    assert metrics.isometry_gap(H) == pytest.approx(0.0, abs=1e-12)
    assert metrics.isometry_gap(H.float()) == pytest.approx(0.0, abs=1e-12)


def test_gap_of_diag_3_1_is_log_5_over_3():
    """H = diag(3, 1): G = diag(9, 1), AM = 5, GM = 3."""
    assert metrics.isometry_gap(torch.tensor([[3.0, 0.0], [0.0, 1.0]])) == pytest.approx(
        math.log(5 / 3), rel=1e-14
    )
    lam = torch.tensor([[9.0, 1.0]], dtype=F64)
    assert float(metrics.gaps_from_eigenvalues(lam)[0]) == pytest.approx(math.log(5 / 3), rel=1e-14)


def test_gap_is_rotation_and_scale_invariant():
    H = randn(20, 50, dtype=F64)
    g = metrics.isometry_gap(H)
    Q, _ = torch.linalg.qr(randn(50, 50, seed=1, dtype=F64))
    for c in (1e-6, 0.3, 1e6):
        assert metrics.isometry_gap(c * H) == pytest.approx(g, rel=1e-10)
    assert metrics.isometry_gap(H @ Q) == pytest.approx(g, rel=1e-10)  # features rotated


def test_gap_between_zero_and_infinity_and_zero_only_for_isometry():
    gaps = metrics.isometry_gaps(randn(50, 10, 30, dtype=F64))
    assert bool((gaps > 0).all()) and bool(torch.isfinite(gaps).all())
    Q, _ = torch.linalg.qr(randn(50, 30, 10, dtype=F64))  # orthonormal columns
    H = 3.0 * Q.mT  # orthonormal rows, scaled: G = H Hᵀ = 9 I, an isometry
    zeros = torch.zeros(50, dtype=F64)
    torch.testing.assert_close(metrics.isometry_gaps(H), zeros, rtol=0, atol=1e-12)
    torch.testing.assert_close(metrics.isometry_gaps(H.float()), zeros, rtol=0, atol=1e-12)


def test_gaussian_matches_float64_numpy_reference():
    """Well-conditioned n < d float32 H: the same finite value as numpy on the same numbers."""
    for n, d, seed in [(10, 100, 0), (50, 100, 1), (90, 100, 2), (64, 256, 3)]:
        H = randn(n, d, seed=seed)
        got = metrics.isometry_gap(H)
        assert math.isfinite(got)
        assert got == pytest.approx(np_gap(H.numpy()), rel=1e-9)


def test_ill_conditioned_but_resolvable_reads_finite():
    """λ_min/λ_max = 1e-10: far above float32's resolution at n = 10 (≈ 3e-13), so finite and
    equal to the float64 SVD reference; a float32 eigen-solver would not get a digit of it."""
    U, _ = torch.linalg.qr(randn(10, 10, seed=4, dtype=F64))
    V, _ = torch.linalg.qr(randn(40, 10, seed=5, dtype=F64))
    s = torch.logspace(0, -5, 10, dtype=F64)  # σ from 1 to 1e-5 → λ ratio 1e-10
    H = (U * s) @ V.T
    Hf = H.float()
    got = metrics.isometry_gap(Hf)
    assert got == pytest.approx(np_gap(Hf.numpy()), rel=1e-10)
    lam = s**2  # the exact H's Gram spectrum; float32 rounding moves σ_min by ~1e-7 ≪ 1e-5
    exact = float(torch.log(lam.mean()) - torch.log(lam).mean())
    assert got == pytest.approx(exact, rel=1e-3)


def test_wide_gram_over_samples_n_greater_than_d_is_infinite():
    assert metrics.isometry_gap(randn(20, 10)) == math.inf
    assert metrics.isometry_gap(randn(11, 10, dtype=F64)) == math.inf


def test_rank_deficient_by_structure_reads_inf_not_nan_or_finite():
    """+inf is decided by what forces rank < n (here: told), never by the size of λ_min."""
    H = randn(10, 30, dtype=F64)
    H[3] = 2 * H[1] - H[7]  # a dependent row
    assert metrics.isometry_gap(H, metrics.Structure(False, 9)) == math.inf
    assert metrics.isometry_gap(H.float(), metrics.Structure(False, 9)) == math.inf
    assert metrics.isometry_gap(torch.zeros(5, 8)) == math.inf  # the zero Gram: zero rows


def test_non_finite_representation_gives_nan():
    H = randn(3, 5, 8)
    H[1, 2, 3] = math.nan
    H[2, 0, 0] = math.inf
    gaps = metrics.isometry_gaps(H)
    assert math.isfinite(gaps[0]) and math.isnan(gaps[1]) and math.isnan(gaps[2])
    assert math.isnan(float(metrics.isometry_gaps(torch.full((1, 9, 4), math.nan))[0]))


# --- singular Grams in networks: centering normalization ----------------------------------------


def _network_taps(n, order, norm="batch", act="identity", init="gaussian", depth=3, seed=0):
    """Per block (H, structure) of its Linear, norm and activation outputs."""
    spec = nn.Spec(depth, n, n, 10, norm, order, False, act, (1.0,) * depth)
    params = nn.init_params(spec, init, 1.0, torch.Generator().manual_seed(seed))
    x = randn(n, n, seed=seed + 1000)
    _, taps = nn.forward(spec, params, nn.init_state(spec), x, "batch", taps=True)
    forced = metrics.structures(spec, params, x, taps)
    return [tuple(zip(t, s, strict=True)) for t, s in zip(taps, forced, strict=True)]


@pytest.mark.parametrize("n", [2, 4, 8, 32, 100, 256])
@pytest.mark.parametrize("init", ["gaussian", "orthogonal"])
def test_centering_batchnorm_output_is_singular(n, init):
    """BN centers each feature over the batch: 1ᵀH = 0, so G = H Hᵀ has G·1 = 0 — singular, at
    every n = d. So is an identity activation after it (norm_act), and the next Linear's output
    (act_norm: 1ᵀ H Wᵀ = 0). float32 rounding leaves λ_min ~ 1e-15 λ_max, yet the structure,
    not that number, makes it read +inf."""
    taps = _network_taps(n, "norm_act", init=init)
    for _, bn, a in taps:
        assert metrics.isometry_gap(*bn) == math.inf
        assert metrics.isometry_gap(*a) == math.inf  # σ = identity after BN
    taps = _network_taps(n, "act_norm", act="relu", init=init)
    for z, _, _ in taps[1:]:
        assert metrics.isometry_gap(*z) == math.inf  # Linear of a centered input
    assert math.isfinite(metrics.isometry_gap(*taps[0][0]))  # Linear of the raw input: full rank


@pytest.mark.parametrize("n", [4, 32, 100])
def test_centering_layernorm_at_n_equals_d_is_singular(n):
    """LayerNorm centers each sample: H·1 = 0, rank ≤ d − 1 < n = d."""
    for _, ln, _ in _network_taps(n, "norm_act", norm="layer"):
        assert metrics.isometry_gap(*ln) == math.inf


@pytest.mark.parametrize("norm", ["batch_scale", "layer_scale"])
@pytest.mark.parametrize("n", [8, 100])
def test_scale_only_norms_keep_rank(n, norm):
    """Without centering nothing forces singularity: in every block of either scale-only
    variant the Linear, norm and activation outputs keep full rank n = d and read finite. Rank
    above float32 rounding: a centered H (1 in a null space) has σ_min/σ_max ≲ 1e-8 here, the
    uncentered ones ≳ 1e-5."""
    rtol = 10 * torch.finfo(torch.float32).eps
    taps = _network_taps(n, "norm_act", norm=norm, act="tanh")
    assert len(taps) == 3
    for ell, block in enumerate(taps, 1):
        for stage, (H, forced) in zip(("linear", "norm", "act"), block, strict=True):
            where = f"{norm} block {ell} {stage}"
            assert not forced.ones_in_null and forced.rank == n, where
            assert torch.linalg.matrix_rank(H.double(), rtol=rtol).item() == n, where
            assert math.isfinite(metrics.isometry_gap(H, forced)), where


# --- normalization raises isometry (Joudaki et al. 2023, Theorem 4.1) ---------------------------


@pytest.mark.parametrize("seed", range(4))
def test_layer_scale_matches_am_gm_identity(seed):
    """Scaling sample i by c_i: G̃ = C G C, det picks up Π c_i², so exactly
    gap(G) − gap(G̃) = log AM(a²)/GM(a²) − log AM(ã²)/GM(ã²), a = row norms before, ã after.
    With ε the output norms are equal up to 1e-5, so the gain is ≈ log AM(a²)/GM(a²) ≥
    log(1 + Var(a)/ā²) ≥ 0: scale normalization never lowers isometry."""
    g = torch.Generator().manual_seed(seed)
    H = torch.randn(30, 60, generator=g, dtype=F64) * torch.rand(30, 1, generator=g, dtype=F64) * 5
    Ht = nn.layer_scale_norm(H)
    a2 = (H**2).sum(1).numpy()
    at2 = (Ht**2).sum(1).numpy()
    drop = metrics.isometry_gap(H) - metrics.isometry_gap(Ht)
    assert drop == pytest.approx(log_am_over_gm(a2) - log_am_over_gm(at2), rel=1e-9)
    a = np.sqrt(a2)
    assert drop >= math.log(1 + a.var() / a.mean() ** 2) - 1e-6
    assert drop == pytest.approx(log_am_over_gm(a2), abs=1e-6)
    assert drop > 0


@pytest.mark.parametrize("seed", range(4))
def test_batch_scale_at_n_equals_d_matches_am_gm_identity(seed):
    """For square H, G = H Hᵀ and Hᵀ H share their spectrum, and scale-only BatchNorm scales
    the columns — Theorem 4.1 applied to Hᵀ H, with the feature norms as a."""
    g = torch.Generator().manual_seed(seed)
    H = torch.randn(40, 40, generator=g, dtype=F64) * torch.rand(1, 40, generator=g, dtype=F64) * 3
    s = {"sq1": torch.ones(40, dtype=F64)}
    Ht = nn.batch_scale_norm(s, 1, H, "batch")
    c2, ct2 = (H**2).sum(0).numpy(), (Ht**2).sum(0).numpy()
    drop = metrics.isometry_gap(H) - metrics.isometry_gap(Ht)
    assert drop == pytest.approx(log_am_over_gm(c2) - log_am_over_gm(ct2), rel=1e-8)
    c = np.sqrt(c2)
    assert drop >= math.log(1 + c.var() / c.mean() ** 2) - 1e-6 > 0


def test_layer_scale_never_lowers_isometry_in_a_network():
    """Deterministic, not only at initialization: any weights, any input (Corollary 4.2)."""
    for seed in range(3):
        for _, ls, a in _network_taps(
            64, "act_norm", norm="layer_scale", act="relu", seed=seed, init="xavier"
        ):
            assert metrics.isometry_gap(*ls) <= metrics.isometry_gap(*a) + 1e-9


# --- weights -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(100, 100), (100, 64), (10, 100), (100, 3072)])
def test_orthogonal_weight_gap_is_zero_on_the_smaller_side(shape):
    W = nn.init_weight(*shape, "orthogonal", 2.5, torch.Generator().manual_seed(0))
    assert metrics.weight_isometry_gap(W) == pytest.approx(0.0, abs=1e-10)
    assert metrics.weight_isometry_gap(W.T) == pytest.approx(0.0, abs=1e-10)


def test_square_gaussian_weight_gap_is_about_one_at_width_100():
    """d·W Wᵀ ~ Wishart(d, I): E log det = Σ_{i<d} ψ((d − i)/2) + d log 2 (− d log d for the
    1/d scaling), tr/d → 1, so E gap = −E[log det]/d ≈ 1.0244 at d = 100 (→ 1 as d → ∞,
    Marchenko–Pastur with ratio 1)."""
    d = 100
    expected = -(sum(digamma((d - i) / 2) for i in range(d)) + d * math.log(2) - d * math.log(d))
    expected /= d
    g = torch.Generator().manual_seed(0)
    W = torch.stack([nn.init_weight(d, d, "gaussian", 1.0, g) for _ in range(20)])
    gaps = metrics.weight_isometry_gaps(W)
    assert float(gaps.mean()) == pytest.approx(expected, abs=0.04)  # s.e. of the mean ≈ 0.01
    assert float(gaps.mean()) == pytest.approx(1.0, abs=0.1)


def test_weight_gap_equals_gap_of_w_wt():
    W = randn(30, 80, dtype=F64)
    assert metrics.weight_isometry_gap(W) == pytest.approx(np_gap(W.numpy()), rel=1e-10)
    assert metrics.weight_isometry_gap(W.T) == pytest.approx(np_gap(W.numpy()), rel=1e-10)


# --- batching ------------------------------------------------------------------------------------


def test_batched_equals_one_by_one_and_chunking(monkeypatch):
    H = randn(7, 20, 30)
    one = torch.tensor([metrics.isometry_gap(h) for h in H], dtype=F64)
    monkeypatch.setattr(gap_core, "MAX_GRAM_ENTRIES", 2 * 20 * 30)  # force chunks of 2
    torch.testing.assert_close(metrics.isometry_gaps(H), one, rtol=1e-12, atol=0)


def count_factorizations(monkeypatch, calls: list) -> None:
    """Record the shape of every batched LU (square M) and QR (Mᵀ) the metrics run."""
    lu, qr = torch.linalg.lu_factor_ex, torch.geqrf
    monkeypatch.setattr(torch.linalg, "lu_factor_ex", lambda A: calls.append(A.mT.shape) or lu(A))
    monkeypatch.setattr(torch, "geqrf", lambda A: calls.append(A.mT.shape) or qr(A))


def test_one_factorization_call_per_structure_and_shape(monkeypatch):
    """Depth 40, scale-only BN, tanh: 3·40 square representations of one structure → one
    batched LU; the weights in their three equal-shape groups (W_1 32 × 48 on its smaller
    side, W_2..W_40, W_head 32 × 32) → one QR and two LUs."""
    calls = []
    count_factorizations(monkeypatch, calls)
    spec = nn.Spec(40, 48, 32, 32, "batch_scale", "norm_act", False, "tanh", (1.0,) * 40)
    params = nn.init_params(spec, "gaussian", 1.0, torch.Generator().manual_seed(0))
    x, y = randn(32, 48), torch.arange(32) % 32
    metrics.probe_metrics(spec, params, nn.init_state(spec), x, y)
    assert calls == [(3 * 40, 32, 32), (1, 32, 48), (39, 32, 32), (1, 32, 32)]


def test_cpu_batches_are_cache_sized_and_give_the_same_gaps(monkeypatch):
    """On the CPU one batched call takes CPU_CHUNK_ENTRIES entries (16 matrices of 128 × 128):
    the gaps are those of one unchunked call, to rounding."""
    calls = []
    count_factorizations(monkeypatch, calls)
    H = randn(40, 128, 128)
    chunked = metrics.isometry_gaps(H)
    assert [c[0] for c in calls] == [16, 16, 8]
    monkeypatch.setattr(gap_core, "CPU_CHUNK_ENTRIES", metrics.MAX_GRAM_ENTRIES)
    torch.testing.assert_close(metrics.isometry_gaps(H), chunked, rtol=1e-13, atol=0)


@pytest.mark.parametrize(
    ("norm", "order"), [("batch", "norm_act"), ("batch", "act_norm"), ("batch_scale", "norm_act")]
)
def test_identical_taps_share_one_gram(monkeypatch, norm, order):
    """σ = identity with α = 1 returns its input itself: per block the activation output is the
    norm output (norm_act) or the Linear output (act_norm). Of the 3L representation Grams, L are
    duplicates, so LU gets 2L of them, plus the L + 1 weights (all 32 × 32): 3L + 1 rather than
    4L + 1; and the gaps are the ones measured without the deduplication."""
    L = 6
    spec = nn.Spec(L, 32, 32, 32, norm, order, False, "identity", (1.0,) * L)
    params = nn.init_params(spec, "orthogonal", 1.0, torch.Generator().manual_seed(0))
    x, y = randn(32, 32), torch.arange(32) % 32
    calls = []
    count_factorizations(monkeypatch, calls)
    deduped = metrics.probe_metrics(spec, params, nn.init_state(spec), x, y)
    assert sum(c[0] for c in calls) == 3 * L + 1
    calls.clear()
    monkeypatch.setattr(metrics, "_unique", lambda ts: (ts, list(range(len(ts)))))
    full = metrics.probe_metrics(spec, params, nn.init_state(spec), x, y)
    assert sum(c[0] for c in calls) == 4 * L + 1
    assert deduped.keys() == full.keys()
    for k, v in full.items():
        np.testing.assert_allclose(deduped[k], v, rtol=1e-12, atol=0, err_msg=k)
    if norm == "batch_scale":  # no centering: the gaps are finite, so the comparison has teeth
        assert np.isfinite(full["isometry_gap/act"]).all()


def test_frobenius_norms():
    ts = [torch.ones(2, 3), 2 * torch.ones(2, 3)]
    np.testing.assert_allclose(
        metrics.frobenius_norms(ts).numpy(), [math.sqrt(6), 2 * math.sqrt(6)]
    )
    vectors = [torch.ones(4), torch.full((4,), 1.5)]
    np.testing.assert_allclose(metrics.frobenius_norms(vectors).numpy(), [2.0, 3.0])


def test_cosine_gram_has_unit_diagonal_and_cosines():
    x = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, -2.0]])
    C = cosine_gram(x)
    r = 1 / math.sqrt(2)
    np.testing.assert_allclose(C, [[1, r, 0], [r, 1, -r], [0, -r, 1]], atol=1e-15)
    with pytest.raises(InvalidInput):
        cosine_gram(np.vstack([x, np.zeros(2)]))
    with_zero = cosine_gram(np.vstack([x, np.zeros(2)]), zero="nan")  # what the engine records
    assert np.isnan(with_zero[3]).all() and np.isnan(with_zero[:, 3]).all()
    np.testing.assert_array_equal(with_zero[:3, :3], C)
