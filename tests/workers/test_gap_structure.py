"""When an isometry gap is +∞ (the network's structure, not rounding), how precise the finite ones
are (against float64 singular values of H, no Gram formed), and the range gap on the complement
of a structural null space. Joudaki et al. 2023, Sec. 3 for the definition; service.isometry is
the reference implementation."""

import math

import numpy as np
import pytest
import torch

from service.config import TrialConfig
from service.isometry import centred_basis, gap_from_eigenvalues, gap_of_features
from workers import gaps as gap_core
from workers import metrics, nn
from workers.metrics import Structure
from workers.train import Trial

F64 = torch.float64
KINDS = ("linear", "norm", "act")


def network(
    act="tanh", norm="batch", depth=50, n=100, *, order="norm_act", seed=0, dtype=torch.float32
):
    """A Gaussian-init network at n = d = d_in with its probe batch, in `dtype`."""
    spec = nn.Spec(depth, n, n, 10, norm, order, False, act, (1.0,) * depth)
    p = nn.init_params(spec, "gaussian", 1.0, torch.Generator().manual_seed(seed))
    p = {k: v.to(dtype) for k, v in p.items()}
    state = {k: v.to(dtype) for k, v in nn.init_state(spec).items()}
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(seed + 100)).to(dtype)
    return spec, p, state, x, torch.arange(n) % 10


def taps_of(spec, p, state, x):
    _, taps = nn.forward(spec, p, state, x, "batch", taps=True)
    return [[t[j].detach() for t in taps] for j in range(3)]  # kind-major


def svd_reference(H: torch.Tensor) -> tuple[float, float]:
    """(gap, λ_min/λ_max) from numpy's float64 singular values of H: λ = σ², no Gram."""
    s = np.linalg.svd(H.double().numpy(), compute_uv=False)
    return float(gap_from_eigenvalues(s**2)), float((s[-1] / s[0]) ** 2)


def assert_finite_gaps_match_svd(module, args, kinds=("linear", "act"), resolvable=1e-24):
    """Every tap of `kinds` is regular: its gap from `module.probe_metrics` must be finite and
    within 1e-6 of the SVD reference wherever λ_min/λ_max ≥ `resolvable`. Returns how many
    were compared and the smallest ratio among them."""
    got = module.probe_metrics(*args)
    taps = taps_of(*args[:4])
    compared, smallest = 0, 1.0
    for kind in kinds:
        for ell, H in enumerate(taps[KINDS.index(kind)], start=1):
            ref, ratio = svd_reference(H)
            if ratio < resolvable:
                continue
            g = got[f"isometry_gap/{kind}"][ell - 1]
            assert math.isfinite(g), f"{kind} layer {ell}: +inf at λ_min/λ_max = {ratio:.1e}"
            assert g == pytest.approx(ref, rel=1e-6), f"{kind} layer {ell}"
            compared, smallest = compared + 1, min(smallest, ratio)
    return compared, smallest


# --- precision on ill-conditioned regular Grams (fail with the old singular_tol rule) ------------


@pytest.mark.parametrize("seed", [0, 3])
def test_tanh_batchnorm_depth_50_is_finite_and_matches_svd(seed):
    """tanh, Gaussian init, BatchNorm, depth 50, n = d = 100, float32: the Linear and activation
    Grams are regular (tanh ends the centring) but many are ill-conditioned; the old rule
    (λ_min/λ_max ≤ k(ε₃₂² + 64ε₆₄)) read some of them +∞."""
    compared, smallest = assert_finite_gaps_match_svd(metrics, network(seed=seed))
    assert compared == 100
    assert smallest < 2.8e-12  # some are below the old tolerance at n = d = 100


def test_scale_only_batchnorm_identity_chain_is_finite_and_matches_svd():
    """batch_scale, σ = identity, Gaussian weights: nothing centres, every Gram is regular, and
    λ_min/λ_max falls ~e² per layer. The old rule called all but the first layers singular."""
    args = network("identity", "batch_scale", depth=20)
    compared, smallest = assert_finite_gaps_match_svd(metrics, args, KINDS)
    assert compared >= 12 and smallest < 1e-20
    got = metrics.probe_metrics(*args)
    for k in KINDS:
        assert np.isfinite(got[f"isometry_gap/{k}"]).all()
        np.testing.assert_array_equal(got[f"range_isometry_gap/{k}"], got[f"isometry_gap/{k}"])


def test_float64_networks_are_measured_alike():
    args = network("tanh", "batch", depth=20, n=64, dtype=F64)
    compared, _ = assert_finite_gaps_match_svd(metrics, args)
    assert compared == 40
    # the same through a trial with TrialConfig.dtype = "float64" (its taps are float64)
    cfg = TrialConfig(depth=8, width=64, batch_size=64, dataset="gaussian", activation="identity")
    t = Trial(cfg.model_copy(update={"dtype": "float64", "norm": "batch_scale"}))
    assert t.params["W1"].dtype == F64
    compared, smallest = assert_finite_gaps_match_svd(
        metrics, (t.spec, t.params, t.state, *t.probe), KINDS
    )
    assert compared >= 8 and smallest < 1e-12


# --- +inf exactly where the structure forces it --------------------------------------------------


def test_structures_follow_the_network():
    n = 16
    spec, p, state, x, _ = network("identity", "batch", depth=3, n=n)
    s = metrics.structures(spec, p, x, nn.forward(spec, p, state, x, "batch", taps=True)[1])
    full, centred = Structure(False, n), Structure(True, n - 1)
    assert s[0] == (full, centred, centred)  # raw input; BN (β = 0) centres; identity keeps it
    assert s[1] == (centred, centred, centred)  # a bias-free Linear keeps 1 in the null space
    p["beta2"] = torch.full((n,), 0.1)  # a trained shift: 1ᵀH = nβᵀ ≠ 0
    s = metrics.structures(spec, p, x, nn.forward(spec, p, state, x, "batch", taps=True)[1])
    assert s[1][1] == Structure(False, n) and s[2][0] == Structure(False, n)
    # a non-zero bias breaks 1 out of the null space and adds one to the rank bound
    assert metrics._after_linear(centred, n, n, torch.ones(n)) == Structure(False, n)
    assert metrics._after_linear(centred, n, n, torch.zeros(n)) == centred
    # LayerNorm: rank ≤ d − 1 with β = 0 (n = d: singular), ≤ d with β ≠ 0; 1 is not kept
    spec, p, state, x, _ = network("tanh", "layer", depth=2, n=n)
    s = metrics.structures(spec, p, x, nn.forward(spec, p, state, x, "batch", taps=True)[1])
    assert s[0][1] == Structure(False, n - 1) and s[0][2] == full  # tanh ends it
    assert metrics._after_norm(spec, {"beta1": torch.ones(n)}, 1, full, n, n) == full
    # n > d: rank ≤ d whatever follows
    spec, p, state, x, _ = network("relu", "batch_scale", depth=2, n=n)
    wide = metrics.input_structure(torch.randn(2 * n, n))
    assert wide == Structure(False, n)
    assert metrics._after_act(spec, wide, 2 * n, n) == Structure(False, n)


def test_zero_rows_and_columns_are_read_from_the_numbers():
    """A unit that is 0 on the whole batch (a dead ReLU) or a sample mapped to 0: rank < n
    exactly, so +inf — and the range gap is that of the Gram without them."""
    H = torch.randn(8, 8, generator=torch.Generator().manual_seed(0), dtype=F64)
    dead = H.clone()
    dead[:, 3] = 0
    s = metrics.refine(Structure(False, 8), dead)
    assert s == Structure(False, 7)
    gap, rng = metrics._tap_gaps(dead[None], [s])
    assert float(gap[0]) == math.inf
    ref = gap_of_features(dead.numpy(), null_dim=1, rank=True)
    assert float(rng[0]) == pytest.approx(ref, rel=1e-12)
    zero_row = H.clone()
    zero_row[2] = 0
    assert metrics.isometry_gap(zero_row) == math.inf  # even with nothing structural known


@pytest.mark.parametrize("order", ["norm_act", "act_norm"])
def test_centring_batchnorm_is_infinite_and_its_range_gap_is_the_centred_one(order):
    """BN (β = 0) centres: G·1 = 0, +inf at every n = d — and so is every map that carries 1
    forward (σ = identity, a bias-free Linear). The range gap is that of G on 1⊥: the gap of
    Qᵀ H Hᵀ Q, Q an orthonormal basis of 1⊥ (numpy reference, SVD)."""
    args = network("identity", "batch", depth=6, n=32, order=order)
    got = metrics.probe_metrics(*args)
    taps = taps_of(*args[:4])
    for j, kind in enumerate(KINDS):
        raw = kind == "linear" or (kind == "act" and order == "act_norm")  # block 1: raw input
        blocks = range(1, 6) if raw else range(6)
        for ell in blocks:
            assert got[f"isometry_gap/{kind}"][ell] == math.inf
            ref = gap_of_features(taps[j][ell].numpy(), ones_in_null=True, rank=True)
            assert got[f"range_isometry_gap/{kind}"][ell] == pytest.approx(ref, rel=1e-9)
    assert math.isfinite(got["isometry_gap/linear"][0])


def test_tanh_after_batchnorm_ends_the_singularity():
    got = metrics.probe_metrics(*network("tanh", "batch", depth=4, n=32))
    assert (got["isometry_gap/norm"] == math.inf).all()
    assert np.isfinite(got["range_isometry_gap/norm"]).all()
    assert (
        np.isfinite(got["isometry_gap/act"]).all() and np.isfinite(got["isometry_gap/linear"]).all()
    )


def test_trained_shift_and_bias_make_the_grams_regular():
    """Values, not flags: β ≠ 0 (as after training) or a non-zero bias: finite."""
    spec, p, state, x, y = network("identity", "batch", depth=3, n=32)
    p = {**p, **{f"beta{ell}": torch.full((32,), 0.05) for ell in (1, 2, 3)}}
    got = metrics.probe_metrics(spec, p, state, x, y)
    for k in KINDS:
        assert np.isfinite(got[f"isometry_gap/{k}"]).all(), k
    spec, p, state, x, y = network("identity", "batch", depth=3, n=32, order="act_norm")
    spec = nn.Spec(3, 32, 32, 10, "batch", "act_norm", True, "identity", (1.0,) * 3)
    p.update({f"b{ell}": torch.full((32,), 0.1) for ell in (1, 2, 3)} | {"b_head": torch.zeros(10)})
    got = metrics.probe_metrics(spec, p, state, x, y)
    assert np.isfinite(got["isometry_gap/linear"]).all()  # bias after the centred input
    assert (got["isometry_gap/norm"] == math.inf).all()


def test_layernorm_at_n_equals_d_is_infinite():
    got = metrics.probe_metrics(*network("identity", "layer", depth=3, n=16))
    assert (got["isometry_gap/norm"] == math.inf).all()
    assert np.isfinite(got["range_isometry_gap/norm"]).all()


# --- one definition: torch and numpy on the same inputs ------------------------------------------


def test_torch_gaps_match_the_numpy_definition():
    g = torch.Generator().manual_seed(3)
    lam = torch.rand(5, 12, generator=g, dtype=F64) ** 6  # spread over 6 decades
    want = gap_from_eigenvalues(lam.numpy())
    np.testing.assert_allclose(metrics.gaps_from_eigenvalues(lam).numpy(), want, rtol=1e-14)
    H = torch.randn(4, 10, 16, generator=g, dtype=F64)
    H = H - H.mean(dim=1, keepdim=True)  # batch-centred: G·1 = 0
    Q = torch.from_numpy(centred_basis(10))
    torch.testing.assert_close(metrics.project_out_ones(H), Q.T @ H, rtol=0, atol=1e-14)
    got = metrics.range_gaps(H, 9, ones_in_null=True)
    want = [gap_of_features(h.numpy(), ones_in_null=True, rank=True) for h in H]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    W = torch.randn(3, 7, 20, generator=g, dtype=F64)
    want = [gap_of_features(w.numpy()) for w in W]
    np.testing.assert_allclose(metrics.isometry_gaps(W).numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(metrics.weight_isometry_gaps(W.mT).numpy(), want, rtol=1e-12)


# --- float32 against float64 networks: the scale-only chain --------------------------------------


def chain_truth(spec, p, x) -> list[float]:
    """The true gaps of the batch_scale / identity / Gaussian chain at n = d, from its factors:
    N_ℓ = N_{ℓ−1} W_ℓᵀ D_ℓ, so log|det N_ℓ| = log|det x| + Σ (log|det W_ℓ| + Σ log D_ℓ) — each a
    well-conditioned float64 determinant — and gap = log(‖N_ℓ‖²_F/n) − (2/n)·log|det N_ℓ|."""
    n = x.shape[0]
    h, logdet, truth = x.double(), torch.linalg.slogdet(x.double())[1], []
    for ell in range(1, spec.depth + 1):
        W = p[f"W{ell}"].double()
        z = h @ W.T
        D = torch.rsqrt(z.square().mean(dim=0) + nn.EPS)
        logdet = logdet + torch.linalg.slogdet(W)[1] + torch.log(D).sum()
        h = z * D
        truth.append(float(torch.log(h.square().sum() / n) - 2 * logdet / n))
    return truth


def test_float64_network_follows_the_true_gap_where_float32_saturates():
    """Square Wishart factors: each layer adds ≈ 1 to the gap (mean log eigenvalue of a square
    Wishart is −1). float32 H resolves λ_min/λ_max only to ~ε₃₂²: it follows the truth to 1% for
    the first ~6 layers, then saturates; float64 follows it ~twice as deep."""
    n, depth = 64, 20
    spec, p32, state32, x32, y = network("identity", "batch_scale", depth=depth, n=n)
    truth = chain_truth(spec, p32, x32)
    p64 = {k: v.double() for k, v in p32.items()}
    s64 = {k: v.double() for k, v in state32.items()}
    g32 = metrics.probe_metrics(spec, p32, state32, x32, y)["isometry_gap/norm"]
    g64 = metrics.probe_metrics(spec, p64, s64, x32.double(), y)["isometry_gap/norm"]
    rel32 = np.abs(g32 - truth) / truth
    rel64 = np.abs(g64 - truth) / truth
    assert truth[-1] == pytest.approx(depth, rel=0.15)  # ≈ one unit per layer
    assert (rel32[:4] < 0.01).all() and (rel64[:8] < 1e-3).all()
    assert rel32[-1] > 0.15  # float32 saturated
    assert rel64[-1] < rel32[-1] / 3


# --- spectra -------------------------------------------------------------------------------------


def test_spectra_are_the_descending_eigenvalues_of_every_gram():
    """spectrum/* (probe_metrics(..., spectra=True)): squared float64 singular values, descending,
    unnormalized; they match eigvalsh of H Hᵀ and sum to its trace. The first
    layer's weight (d × d_in, d_in < d) has d_in eigenvalues on its smaller side: NaN-padded."""
    spec = nn.Spec(3, 12, 16, 10, "batch", "norm_act", False, "tanh", (1.0,) * 3)
    p = nn.init_params(spec, "gaussian", 1.0, torch.Generator().manual_seed(0))
    x = torch.randn(16, 12, generator=torch.Generator().manual_seed(1))
    y = torch.arange(16) % 10
    got = metrics.probe_metrics(spec, p, nn.init_state(spec), x, y, spectra=True)
    plain = metrics.probe_metrics(spec, p, nn.init_state(spec), x, y)
    assert set(got) - set(plain) == {f"spectrum/{k}" for k in (*KINDS, "weight")}
    taps = taps_of(spec, p, nn.init_state(spec), x)
    for j, kind in enumerate(KINDS):
        lam = got[f"spectrum/{kind}"]
        assert lam.shape == (3, 16) and lam.dtype == np.float64
        assert (np.diff(lam, axis=1) <= 0).all()
        for ell in range(3):
            H = taps[j][ell].double().numpy()
            np.testing.assert_allclose(lam[ell].sum(), np.square(H).sum(), rtol=1e-12)
            want = np.linalg.eigvalsh(H @ H.T)[::-1]  # structural zeros: rounding-sized
            np.testing.assert_allclose(lam[ell], want, rtol=1e-8, atol=1e-12 * want[0])
    w = got["spectrum/weight"]
    assert w.shape == (3, 16)
    assert np.isnan(w[0, 12:]).all() and np.isfinite(w[0, :12]).all() and np.isfinite(w[1:]).all()
    W1 = p["W1"].double().numpy()
    np.testing.assert_allclose(w[0, :12], np.linalg.eigvalsh(W1.T @ W1)[::-1], rtol=1e-10)
    # a wide Gram (n > d) has n − d exact zero eigenvalues
    lam = metrics.spectra(torch.randn(1, 9, 4, dtype=F64), 9)[0]
    assert (lam[4:] == 0).all() and (lam[:4] > 0).all()


# --- the factorizations: LU for square M, a bordered LU for centred square H -----------------


def centred_with_spectrum(n: int, s: np.ndarray, seed: int = 0) -> torch.Tensor:
    """A square H (n, n) with 1ᵀH = 0 whose QᵀH (Q the basis of 1⊥) has singular values s."""
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(n - 1, n - 1, generator=g, dtype=F64))
    V, _ = torch.linalg.qr(torch.randn(n, n - 1, generator=g, dtype=F64))
    Q = torch.from_numpy(centred_basis(n))
    return Q @ (U * torch.from_numpy(s)) @ V.T


@pytest.mark.parametrize(("n", "decades"), [(8, 2), (64, 6), (128, 9)])
def test_bordered_lu_range_gap_of_a_centred_square_matrix(monkeypatch, n, decades):
    """Structure (True, n − 1) at n = d goes through one LU of H + 1wᵀ: its range gap is the
    gap of the prescribed σ² on 1⊥ (λ_min/λ_max down to 1e-18), and the same as the route it
    falls back to (projection onto 1⊥, then QR) when every Gram is routed there."""
    s = np.logspace(0, -decades, n - 1)
    H = torch.stack([centred_with_spectrum(n, s, seed) for seed in range(3)])
    want = gap_from_eigenvalues(s**2)
    got = metrics.range_gaps(H, n - 1, ones_in_null=True)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9)
    calls = []
    real = torch.geqrf
    monkeypatch.setattr(torch, "geqrf", lambda A: calls.append(len(A)) or real(A))
    monkeypatch.setattr(gap_core, "KAPPA_MAX", 0.0)  # everything falls back
    fallback = metrics.range_gaps(H, n - 1, ones_in_null=True)
    assert calls == [3]
    np.testing.assert_allclose(fallback.numpy(), want, rtol=1e-9)


def test_lambda_min_estimates_bound_lambda_min():
    """λ̂_min ≥ λ_min from either route (one inverse-iteration step: ‖G⁻¹v‖ ≤ 1/λ_min; QR also
    min R_ii² ≥ σ_min(R)²), so κ̂ ≤ κ and a Gram is never kept on the factor's route because
    κ was overestimated; and κ̂ ≥ κ/1e5 here (the undershoot KAPPA_MAX allows for)."""
    g = torch.Generator().manual_seed(0)
    m = 64
    U, _ = torch.linalg.qr(torch.randn(20, m, m, generator=g, dtype=F64))
    V, _ = torch.linalg.qr(torch.randn(20, m, m, generator=g, dtype=F64))
    s = torch.logspace(0, -7, m, dtype=F64)
    M = (U * s) @ V.mT
    lam = s[-1] ** 2
    for est in (metrics._qr_log_det(M)[1], metrics._lu_log_det(M)[1]):
        assert bool((est >= lam * (1 - 1e-9)).all())
        assert bool((est <= lam * 1e5).all())


def test_non_finite_rows_are_not_read_as_zero_rows():
    """A NaN row of H is not a zero row (max |h| is NaN, not 0): it is kept, and the gaps are
    NaN — not the finite gap of H without it, nor a crash on an empty trimmed matrix (a
    diverged network's taps are NaN throughout)."""
    H = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(0), dtype=F64)
    H[0, 2] = math.nan
    H[1] = math.nan
    gap, rng = metrics._tap_gaps(H, [Structure(False, 6)] * 2)
    assert torch.isnan(gap).all() and torch.isnan(rng).all()
    rows, cols = metrics._supports(H)
    assert bool(rows.all()) and bool(cols.all())
    # the singular-value route (rank below the smaller side) reads NaN, +∞ and −∞ alike
    M = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(1), dtype=F64)
    M[1, 0, 0], M[2, 1, 1], M[3, 2, 2] = math.nan, math.inf, -math.inf
    r = metrics.range_gaps(M, 4)
    assert math.isfinite(r[0]) and torch.isnan(r[1:]).all()
