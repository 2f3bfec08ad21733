"""The gap's error bar (`isometry_gap_error/<kind>`, workers/gaps.py): a bound on the computed
gap's relative error from the factorization that computed it, checked against the true error
on matrices of known spectrum — M = U diag(σ) Vᵀ with Haar U, V and σ prescribed, so the true
gap is gap(σ²) — across λ_min/λ_max = 1e-2 … 1e-40, through every route (LU of a square M, QR
of a wide one, the bordered LU of a centred square one, the SVD beyond KAPPA_MAX and for range
gaps). Below float64's resolution the bound is +∞, never a finite number that the truth
exceeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from service.config import TrialConfig
from service.isometry import centred_basis, gap_from_eigenvalues
from workers import gaps
from workers.metrics import probe_metrics
from workers.models import build
from workers.structure import Structure

F64 = torch.float64
RATIOS = [10.0**-k for k in range(2, 42, 2)]  # λ_min/λ_max


def haar(m: int, k: int, g: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=F64))
    return q * torch.sign(torch.diagonal(r))


def spectrum(m: int, ratio: float, shape: str) -> np.ndarray:
    """σ (m,) descending from 1 to √ratio: log-spaced, or all 1 but the last."""
    lo = math.sqrt(ratio)
    if shape == "geometric":
        return np.logspace(0, math.log10(lo), m)
    s = np.ones(m)
    s[-1] = lo
    return s


def with_spectrum(m: int, c: int, s: np.ndarray, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return haar(m, m, g) @ torch.diag(torch.from_numpy(s)) @ haar(c, m, g).T


def cases():
    """(route, M stack, structure rank, ones_in_null, the true gaps) over every ratio."""
    for ratio in RATIOS:
        for shape in ("geometric", "one_small"):
            for m, c in ((16, 16), (48, 48), (16, 40), (48, 96)):
                s = spectrum(m, ratio, shape)
                M = torch.stack([with_spectrum(m, c, s, seed) for seed in range(3)])
                yield ratio, "square" if m == c else "wide", M, m, False, gap_from_eigenvalues(s**2)
            # centred square: 1ᵀH = 0, QᵀH with the prescribed n − 1 singular values
            n = 24
            s = spectrum(n - 1, ratio, shape)
            Q = torch.from_numpy(centred_basis(n))
            H = torch.stack([Q @ with_spectrum(n - 1, n, s, seed) for seed in range(3)])
            yield ratio, "centred", H, n - 1, True, gap_from_eigenvalues(s**2)
            # a range gap of 12 of 16 (the SVD route): σ of rank 12, four exact zeros
            s = np.concatenate([spectrum(12, ratio, shape), np.zeros(4)])
            M = torch.stack([with_spectrum(16, 32, s, seed) for seed in range(3)])
            yield ratio, "svd", M, 12, False, gap_from_eigenvalues(s[:12] ** 2)


def measured():
    rows = []
    for ratio, route, M, rank, ones, want in cases():
        got, err = gaps.range_gaps_and_errors(M, rank, ones_in_null=ones)
        for g, e in zip(got.tolist(), err.tolist(), strict=True):
            rel = e / g if g > 0 else math.inf
            rows.append((ratio, route, abs(g - want) / want, rel))
    return rows


def test_the_error_bar_bounds_the_true_error_across_conditioning():
    rows = measured()
    covered = [true <= bound for _, _, true, bound in rows]
    assert all(covered), [r for r, c in zip(rows, covered, strict=True) if not c][:5]
    # resolved where float64 resolves λ_min: every case down to 1e-20 has a finite bound,
    # and every one at 1e-36 and below (σ_min/σ_max ≤ 1e-18 < ε₆₄) has +∞
    assert all(math.isfinite(b) for r, _, _, b in rows if r >= 1e-20)
    assert all(b == math.inf for r, _, _, b in rows if r <= 1e-36)
    # and not vacuous: at λ_min/λ_max ≥ 1e-8 the bound is below 1e-6 relative
    assert all(b < 1e-6 for r, _, _, b in rows if r >= 1e-8)


def test_a_structural_infinity_has_no_error_and_nan_stays_nan():
    H = torch.randn(2, 8, 4, dtype=F64)
    gap, _, err = gaps.tap_gaps_and_errors(H, [Structure(False, 4)] * 2)
    assert (gap == math.inf).all() and (err == 0).all()
    H = torch.randn(2, 4, 8, dtype=F64)
    H[1, 0, 0] = math.nan
    gap, _, err = gaps.tap_gaps_and_errors(H, [Structure(False, 4)] * 2)
    assert math.isfinite(float(err[0])) and math.isnan(float(err[1]))


def test_an_unknown_structure_is_judged_at_the_forwards_precision():
    """An exactly singular float32 Gram (rank d − 1 by construction) whose structure is
    unknown reads some finite gap — float32 rounding keeps it regular — and its error bar is
    +∞; the same numbers with the structure known as regular get float64's finite bar."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3, 16, 16, generator=g)
    H = (X - X.mean(dim=2, keepdim=True)).to(torch.float32)  # rows centred: rank ≤ 15
    gap, _, err = gaps.tap_gaps_and_errors(H, [Structure(False, 16, known=False)] * 3)
    assert torch.isfinite(gap).all() and (err == math.inf).all()
    R = torch.randn(3, 16, 16, generator=g)
    gap, _, err = gaps.tap_gaps_and_errors(R, [Structure(False, 16, known=False)] * 3)
    assert torch.isfinite(err).all() and (err < 1e-2).all()  # regular: a float32-sized bar


def _family_record(model: str, n: int, *, norm: str, zero_sample: bool = False) -> tuple:
    cfg = TrialConfig(
        model=model, dataset="digits", depth=3, width=16, batch_size=n, norm=norm,
        activation="tanh", epochs=0,
    )  # fmt: skip
    net = build(cfg)
    p = net.init_params(torch.Generator().manual_seed(0))
    x = torch.randn(n, net.d_in, generator=torch.Generator().manual_seed(1))
    if zero_sample:
        x[0] = 0  # no bias, no norm: a zero row at every tap of the conv net
    return net, probe_metrics(net, p, net.init_state(), x, torch.arange(n) % 10)


def test_a_float32_tap_is_judged_with_its_own_rounding():
    """A tap stored in float32 has each entry rounded once (‖δH‖_F ≤ 2⁻²⁴‖H‖_F): where σ_min
    is below that, no float64 factorization after can resolve it — +∞ — though the very same
    numbers held as float64 get float64's finite bar. A well-conditioned float32 tap keeps a
    finite bar of float32's size, which bounds the distance to the gap of the exact spectrum
    the float32 numbers were rounded from."""
    m = 16
    for ratio, resolved in ((1e-24, False), (1e-4, True)):
        s = spectrum(m, ratio, "geometric")
        exact = torch.stack([with_spectrum(m, m, s, seed) for seed in range(3)])
        H32 = exact.to(torch.float32)
        gap, _, err = gaps.tap_gaps_and_errors(H32, [Structure(False, m)] * 3)
        _, _, err64 = gaps.tap_gaps_and_errors(H32.to(F64), [Structure(False, m)] * 3)
        assert torch.isfinite(gap).all() and torch.isfinite(err64).all()
        if not resolved:
            assert (err == math.inf).all()
            continue
        want = gap_from_eigenvalues(s**2)
        assert (err < 1e-4).all() and (err > 10 * err64).all()
        assert ((gap - want).abs() / want <= err).all()


@pytest.mark.parametrize(
    "model", ["mlp", "resmlp", "cnn", "transformer"]
)  # every family's record carries it, with isometry_gap's layout
def test_every_family_records_the_error_bar(model):
    net, rec = _family_record(model, 16, norm="batch")
    for kind in net.kinds:
        gap, err = rec[f"isometry_gap/{kind}"], rec[f"isometry_gap_error/{kind}"]
        assert err.shape == gap.shape == (3,)
        assert (err[gap == math.inf] == 0).all()  # structural: exact
        assert (err[np.isfinite(gap)] > 0).all()
    # a structural +∞ in every family: n = 24 > width 16 (the mlp's, resmlp's and the
    # transformer's token-pooled taps have 16 features), or for the CNN, whose taps have
    # 16·8·8 features, an exactly zero sample through a bias-free, norm-free net
    net, rec = _family_record(model, 24, norm="none", zero_sample=model == "cnn")
    infinite = 0
    for kind in net.kinds:
        gap, err = rec[f"isometry_gap/{kind}"], rec[f"isometry_gap_error/{kind}"]
        infinite += int((gap == math.inf).sum())
        assert (err[gap == math.inf] == 0).all()
    assert infinite > 0


def test_the_gram_route_of_rank_deficient_float32_taps_is_bounded_too():
    """The route of rank-deficient taps (workers/factors.py, `gram_eigh_gaps_and_errors`: the
    top-r eigenvalues of the formed Gram where a float32 tap's rounding dominates what forming
    it loses) across every ratio: a range gap of 12 of 16 of an exactly rank-12 matrix held in
    float32. Its bar bounds the distance to the exact spectrum's gap wherever it is finite,
    is finite down to λ_r/λ_1 = 1e-8, and +∞ below what float32 resolves (1e-16 and less)."""
    rows = []
    for ratio in RATIOS:
        for shape in ("geometric", "one_small"):
            s = np.concatenate([spectrum(12, ratio, shape), np.zeros(4)])
            M = torch.stack([with_spectrum(16, 32, s, seed) for seed in range(3)])
            got, err = gaps.range_gaps_and_errors(M.to(torch.float32), 12, rounding=2.0**-24)
            want = gap_from_eigenvalues(s[:12] ** 2)
            pairs = zip(got.tolist(), err.tolist(), strict=True)
            rows += [(ratio, abs(g - want), e) for g, e in pairs]
    assert all(true <= bound for _, true, bound in rows)
    assert all(math.isfinite(b) for r, _, b in rows if r >= 1e-8)
    assert all(b == math.inf for r, _, b in rows if r <= 1e-16)
