"""The route of the rank-deficient taps (workers/factors.py, `gram_eigh_gaps_and_errors`): the
top-r spectrum of a tap whose structural rank r is below its smaller side, from the eigenvalues
of its formed float64 Gram where the tap's own rounding dominates what forming it loses, from
the SVD elsewhere. Checked against the SVD and against the exact spectrum on matrices of exact
rank r — M = U diag(σ) Vᵀ with Haar U, V — rounded to float32 as a tap is, across λ_r/λ_1 =
1e-2 … 1e-24; on float64 taps (the SVD's), on taps whose true rank is below the structure's
bound (exactly singular), and through probe_metrics on a ReLU network with dead units."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from service.config import TrialConfig
from service.isometry import gap_from_eigenvalues
from workers import factors, gaps
from workers.metrics import probe_metrics
from workers.models import build
from workers.structure import Structure

F64 = torch.float64
U32 = 2.0**-24  # float32's unit roundoff: a float32 tap's entries are rounded by it


def haar(m: int, k: int, g: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=F64))
    return q * torch.sign(torch.diagonal(r))


def of_rank(m: int, c: int, s: np.ndarray, seed: int) -> torch.Tensor:
    """m × c with singular values s (len r), exactly rank r up to float64 rounding."""
    g = torch.Generator().manual_seed(seed)
    r = len(s)
    return haar(m, r, g) @ torch.diag(torch.from_numpy(s)) @ haar(c, r, g).T


def spectrum(r: int, ratio: float, shape: str) -> np.ndarray:
    """σ (r,) descending from 1 to √ratio: log-spaced, or all 1 but the last."""
    lo = math.sqrt(ratio)
    if shape == "geometric":
        return np.logspace(0, math.log10(lo), r)
    return np.concatenate([np.ones(r - 1), [lo]])


@pytest.fixture
def svd_calls(monkeypatch):
    """How many matrices reached the SVD, from any route."""
    calls = []
    original = factors._svd_gaps_and_errors

    def spy(M, r, eps=factors.EPS64, rounding=0.0):
        calls.append(len(M))
        return original(M, r, eps, rounding)

    monkeypatch.setattr(factors, "_svd_gaps_and_errors", spy)
    monkeypatch.setattr(gaps, "_svd_gaps_and_errors", spy)
    return calls


@pytest.mark.parametrize("shape", ["geometric", "one_small"])
@pytest.mark.parametrize(("m", "c", "r"), [(16, 16, 12), (24, 24, 20), (12, 30, 9)])
def test_float32_taps_take_the_gram_route_within_the_svds_bar(svd_calls, shape, m, c, r):
    """Exact rank-r taps rounded to float32: wherever float32 resolves λ_r, the route skips the
    SVD, its value is within the SVD's own bar of the SVD's, and its bar bounds the distance
    to the exact spectrum's gap (the one the float32 numbers were rounded from)."""
    for ratio in (1e-2, 1e-4, 1e-6, 1e-8):
        s = spectrum(r, ratio, shape)
        H = torch.stack([of_rank(m, c, s, seed) for seed in range(3)]).to(torch.float32)
        want = gap_from_eigenvalues(s**2)
        got, err = gaps.range_gaps_and_errors(H, r, rounding=U32)
        assert svd_calls == [], (ratio, "the route fell back to the SVD")
        svd, bar = factors._svd_gaps_and_errors(H.to(F64), r, rounding=U32)
        svd_calls.clear()
        assert torch.isfinite(bar).all() and torch.isfinite(err).all()
        assert ((got - svd).abs() <= bar).all(), ratio
        assert ((got - want).abs() <= err).all(), ratio
        if ratio >= 1e-4:  # not vacuous where float32 resolves λ_r comfortably
            assert (err / got < 1e-3).all()


def test_float64_taps_go_to_the_svd(svd_calls):
    """In float64 the tap's rounding no longer hides what forming the Gram loses (~ε·κ(G) in
    λ_r against the SVD's ~ε·√κ(G)): float64 taps, well or ill conditioned, go to the SVD —
    the very numbers the SVD route gives — and the bar bounds the true error."""
    for ratio in (1e-2, 1e-20):
        s = spectrum(12, ratio, "geometric")
        H = torch.stack([of_rank(16, 16, s, seed) for seed in range(3)])
        got, err = gaps.range_gaps_and_errors(H, 12, rounding=factors.EPS64)
        assert sum(svd_calls) == 3
        svd, bar = factors._svd_gaps_and_errors(H, 12, rounding=factors.EPS64)
        svd_calls.clear()
        assert torch.equal(got, svd) and torch.equal(err, bar)
        want = gap_from_eigenvalues(s**2)
        assert torch.isfinite(err).all() and ((got - want).abs() <= err).all()


def test_unresolved_float32_taps_keep_the_route_and_an_infinite_bar(svd_calls):
    """λ_r/λ_1 = 1e-24 in a float32 tap is below what its rounding resolves: no route can
    measure it, the bar is +∞, the value is the formed Gram's — finite, not a structural
    +∞ — and no SVD is spent on it."""
    s = spectrum(12, 1e-24, "geometric")
    H = torch.stack([of_rank(16, 16, s, seed) for seed in range(3)]).to(torch.float32)
    got, err = gaps.range_gaps_and_errors(H, 12, rounding=U32)
    assert torch.isfinite(got).all() and (err == math.inf).all()
    assert svd_calls == []


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_a_tap_of_lower_rank_than_its_structure_is_never_resolved(dtype):
    """The structure bounds the rank by r, but the tap's true rank is r − 1 (a dependence the
    tracker cannot see): λ_r is 0 up to rounding. The range gap stays finite (only the
    structure says +∞), and its bar is +∞ — never a confident number."""
    s = np.concatenate([spectrum(11, 1e-2, "geometric")])
    H = torch.stack([of_rank(16, 16, s, seed) for seed in range(3)]).to(dtype)
    u = torch.finfo(dtype).eps / 2
    got, err = gaps.range_gaps_and_errors(H, 12, rounding=u)
    assert torch.isfinite(got).all() and (err == math.inf).all()


def test_taps_of_one_shape_share_the_route_whatever_their_ranks(monkeypatch):
    """Rank-deficient taps of one shape and different structural ranks go through one Gram
    eigendecomposition call, each with its own rank; the gaps are those of one tap at a
    time."""
    calls = []
    original = torch.linalg.eigvalsh
    monkeypatch.setattr(torch.linalg, "eigvalsh", lambda G: calls.append(len(G)) or original(G))
    ranks = [9, 12, 14, 5]
    H = [of_rank(16, 16, spectrum(r, 1e-3, "geometric"), r) for r in ranks]
    kinds = [Structure(False, r) for r in ranks]
    gap, rng, err = gaps.tap_gaps_and_errors(H, kinds)
    assert calls == [4]
    assert (gap == math.inf).all() and (err == 0).all()  # structurally singular: exact
    calls.clear()
    alone = torch.cat([gaps.range_gaps(h[None], r) for h, r in zip(H, ranks, strict=True)])
    torch.testing.assert_close(rng, alone, rtol=1e-13, atol=0)
    want = [gap_from_eigenvalues(spectrum(r, 1e-3, "geometric") ** 2) for r in ranks]
    np.testing.assert_allclose(rng.numpy(), want, rtol=1e-9)


def test_the_route_can_fail():
    """The comparison with the SVD is not vacuous: a gap off by 1e-3 relative is outside the
    SVD's bar on a float32 tap of λ_r/λ_1 = 1e-4."""
    s = spectrum(12, 1e-4, "geometric")
    H = torch.stack([of_rank(16, 16, s, seed) for seed in range(3)]).to(torch.float32)
    svd, bar = factors._svd_gaps_and_errors(H.to(F64), 12, rounding=U32)
    assert not ((svd * (1 + 1e-3) - svd).abs() <= bar).any()


def test_a_relu_networks_rank_deficient_taps_match_the_svd(monkeypatch):
    """probe_metrics of a deep ReLU network without normalization, whose dead units make the
    following Linear outputs rank-deficient: every such tap goes through the route, and its
    range gap is within the SVD's bar of the SVD's (on the very matrix the route was given)."""
    calls = []
    route = factors.gram_eigh_gaps_and_errors

    def spy(M, ranks, eps, rounding):
        calls.append((M.clone(), ranks.clone(), eps, rounding))
        return route(M, ranks, eps, rounding)

    monkeypatch.setattr(gaps, "gram_eigh_gaps_and_errors", spy)
    cfg = TrialConfig(depth=30, width=16, batch_size=16, norm="none", activation="relu", epochs=0)
    net = build(cfg)
    p = net.init_params(torch.Generator().manual_seed(0))
    x = torch.randn(16, net.d_in, generator=torch.Generator().manual_seed(1))
    rec = probe_metrics(net, p, net.init_state(), x, torch.arange(16) % 10)
    assert calls and np.isinf(rec["isometry_gap/linear"]).any()
    compared = 0
    for M, ranks, eps, rounding in calls:
        got, _ = route(M, ranks, eps, rounding)
        for i, r in enumerate(ranks.tolist()):
            want, bar = factors._svd_gaps_and_errors(M[i : i + 1], r, eps, rounding)
            if math.isfinite(float(bar[0])):
                assert abs(float(got[i] - want[0])) <= float(bar[0])
                compared += 1
    assert compared > 0
