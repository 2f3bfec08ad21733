"""A registered module's structure (workers/models/module_structure.py, docs/models.md): each
tap's structural rank follows from the module's torch.nn layers, so an exactly singular Gram
reads +∞ — LayerNorm at n ≥ d, BatchNorm1d at init (centred over the batch), a residual add of
two centred branches — while a regular block stays finite; a module tracing cannot see is
followed where it declares its structure, and is marked unknown where it does not.

Each case is checked against the truth by construction (the layers' algebra) and by the float64
singular values of the tap (σ_min/σ_max ≈ 1e-16 for a singular Gram; ≫ 1e-10 for a regular
one). On the code before the structure tracer (every tap treated as a non-linear map's output),
the singular cases read finite gaps (the issue: 3.64–5.87 for LayerNorm, 2.55–4.04 BatchNorm).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn as tnn

from service import models
from service.config import TrialConfig
from service.isometry import gap_from_eigenvalues
from workers.metrics import probe_metrics
from workers.models import build

D_IN, CLASSES = 64, 10  # digits
F64 = torch.float64


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(models, "_REGISTRY", {})
    monkeypatch.setattr(models, "_loaded", True)
    return models


class Blocks(tnn.Module):
    """stem → blocks.{i} → head, the blocks given."""

    def __init__(self, d: int, blocks: list[tnn.Module]) -> None:
        super().__init__()
        self.stem = tnn.Linear(D_IN, d)
        self.blocks = tnn.ModuleList(blocks)
        self.head = tnn.Linear(d, CLASSES)

    def forward(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


class Residual(tnn.Module):
    """x ↦ f(x) + g(x)."""

    def __init__(self, f: tnn.Module, g: tnn.Module) -> None:
        super().__init__()
        self.f, self.g = f, g

    def forward(self, x):
        return self.f(x) + self.g(x)


def measure(registry, make_blocks, *, n: int, d: int, depth: int = 2, seed: int = 0):
    """probe_metrics of Blocks(d, make_blocks(d, depth)) on n float64 samples, and its taps."""
    name = f"m{len(registry._REGISTRY)}"
    registry.register_model(name, lambda params, **kw: Blocks(d, make_blocks(d, depth)))
    cfg = TrialConfig(
        model=name, dataset="digits", depth=depth, width=d, batch_size=n, dtype="float64"
    )
    net = build(cfg)
    p = net.init_params(torch.Generator().manual_seed(seed))
    x = torch.randn(n, D_IN, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    rec = probe_metrics(net, p, net.init_state(), x, torch.arange(n) % CLASSES)
    _, taps = net.forward(p, net.init_state(), x, "batch", taps=True)
    return net, rec, [t.detach().reshape(n, -1) for t in taps.layers["output"]]


def sigma_ratio(H: torch.Tensor) -> float:
    s = torch.linalg.svdvals(H)
    return float(s[-1] / s[0]) if H.shape[0] <= H.shape[1] else 0.0


def ln_block(d: int, depth: int) -> list[tnn.Module]:
    return [tnn.Sequential(tnn.Linear(d, 2 * d), tnn.ReLU(), tnn.Linear(2 * d, d), tnn.LayerNorm(d))
            for _ in range(depth)]  # fmt: skip


def bn_block(d: int, depth: int) -> list[tnn.Module]:
    return [tnn.Sequential(tnn.Linear(d, d), tnn.Tanh(), tnn.Linear(d, d), tnn.BatchNorm1d(d))
            for _ in range(depth)]  # fmt: skip


@pytest.mark.parametrize(("n", "d"), [(24, 24), (40, 24)])
def test_layernorm_at_batch_at_least_width_is_infinite(registry, n, d):
    """LayerNorm centres each sample over its d features: rank ≤ d − 1 < n (β = 0 at init)."""
    _, rec, taps = measure(registry, ln_block, n=n, d=d)
    assert all(sigma_ratio(h) < 1e-12 for h in taps)  # the truth: exactly singular
    assert (rec["isometry_gap/output"] == math.inf).all()
    # the range gap is the gap of the d − 1 non-zero eigenvalues
    for h, r in zip(taps, rec["range_isometry_gap/output"], strict=True):
        lam = torch.linalg.svdvals(h).square()[: d - 1].numpy()
        assert r == pytest.approx(gap_from_eigenvalues(lam), rel=1e-9)


def test_layernorm_below_the_width_is_finite(registry):
    """n = 16 < d − 1 = 31: nothing forces rank < n; the gap is the SVD's."""
    _, rec, taps = measure(registry, ln_block, n=16, d=32)
    assert all(sigma_ratio(h) > 1e-8 for h in taps)
    for h, g in zip(taps, rec["isometry_gap/output"], strict=True):
        want = gap_from_eigenvalues(torch.linalg.svdvals(h).square().numpy())
        assert math.isfinite(g) and g == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(("n", "d"), [(8, 32), (24, 24), (40, 24)])
def test_batchnorm1d_at_init_is_infinite_at_every_batch_size(registry, n, d):
    """β = 0: every feature is centred over the batch, 1ᵀH = 0, so G·1 = 0 — at n < d too;
    the range gap is on 1⊥."""
    _, rec, taps = measure(registry, bn_block, n=n, d=d)
    for h in taps:
        assert float(h.sum(dim=0).abs().max()) < 1e-12 * float(h.abs().max()) * n
    assert (rec["isometry_gap/output"] == math.inf).all()
    assert np.isfinite(rec["range_isometry_gap/output"]).all()


def test_batchnorm_with_a_nonzero_shift_is_regular(registry):
    """β ≠ 0 adds 1βᵀ: 1 leaves the null space (n < d: regular, finite). The values decide."""

    def blocks(d, depth):
        out = bn_block(d, depth)
        for b in out:
            tnn.init.constant_(b[3].bias, 0.5)
        return out

    _, rec, taps = measure(registry, blocks, n=8, d=32)
    assert all(sigma_ratio(h) > 1e-8 for h in taps)
    assert np.isfinite(rec["isometry_gap/output"]).all()


def test_a_residual_add_of_two_centred_branches_is_infinite(registry):
    """BN(Linear x) + BN(Linear x), β = 0: 1 is in both branches' null space, so in the sum's
    (n = 8 < d = 32: nothing else forces it); with one branch shifted (a bias after its BN),
    the sum is regular."""

    def centred(d, depth):
        return [Residual(tnn.Sequential(tnn.Linear(d, d), tnn.BatchNorm1d(d)),
                         tnn.Sequential(tnn.Linear(d, d), tnn.BatchNorm1d(d)))
                for _ in range(depth)]  # fmt: skip

    def shifted(d, depth):
        out = centred(d, depth)
        for r in out:
            tnn.init.constant_(r.g[1].bias, 0.3)
        return out

    _, rec, taps = measure(registry, centred, n=8, d=32)
    assert all(float(h.sum(dim=0).abs().max()) < 1e-10 for h in taps)
    assert (rec["isometry_gap/output"] == math.inf).all()
    _, rec, taps = measure(registry, shifted, n=8, d=32)
    assert all(sigma_ratio(h) > 1e-8 for h in taps)
    assert np.isfinite(rec["isometry_gap/output"]).all()


def test_a_residual_add_of_two_low_rank_branches_adds_their_ranks(registry):
    """f = Linear(d → 3 → d), g = Linear(d → 4 → d), no biases: rank ≤ 3 + 4 = 7 < n = 12
    (+∞); at n = 6 ≤ 7, regular."""

    def low(d, depth):
        def thin(k):
            return tnn.Sequential(tnn.Linear(d, k, bias=False), tnn.Linear(k, d, bias=False))

        return [Residual(thin(3), thin(4)) for _ in range(depth)]

    _, rec, taps = measure(registry, low, n=12, d=32)
    assert all(int(torch.linalg.matrix_rank(h)) == 7 for h in taps)
    assert (rec["isometry_gap/output"] == math.inf).all()
    _, rec, _ = measure(registry, low, n=6, d=32)
    assert np.isfinite(rec["isometry_gap/output"]).all()


def test_a_regular_block_stays_finite(registry):
    """Linear → GELU → Linear (biases) at n < d, and a zero bias counts as none: finite, equal
    to the SVD's gap."""

    def plain(d, depth):
        return [tnn.Sequential(tnn.Linear(d, d), tnn.GELU(), tnn.Linear(d, d))
                for _ in range(depth)]  # fmt: skip

    net, rec, taps = measure(registry, plain, n=16, d=32)
    assert all(net.structure_known())
    for h, g in zip(taps, rec["isometry_gap/output"], strict=True):
        want = gap_from_eigenvalues(torch.linalg.svdvals(h).square().numpy())
        assert g == pytest.approx(want, rel=1e-9)


class Opaque(tnn.Module):
    """A block fx cannot trace (Python control flow on a value): LayerNorm's output, scaled."""

    def __init__(self, d: int, declare: bool) -> None:
        super().__init__()
        self.norm = tnn.LayerNorm(d)
        if declare:  # LayerNorm's own rule: rank ≤ d − 1, 1 not in the null space
            self.isosweep_structure = lambda n, f: (False, f - 1)

    def forward(self, x):
        h = self.norm(x)
        if float(h.abs().max()) > 0:  # data-dependent: symbolic tracing fails here
            h = 2.0 * h
        return h


@pytest.mark.parametrize("declare", [True, False])
def test_a_declared_structure_where_tracing_cannot_see(registry, declare):
    """Declared: +∞ at n = d as LayerNorm forces. Undeclared: the tap is traced on its own
    (fails too), so its structure is unknown — the record says so and the gap, if finite, is
    never given as resolved (its error bar: test_gap_error.py)."""
    net, rec, taps = measure(registry, lambda d, depth: [Opaque(d, declare) for _ in range(depth)],
                             n=16, d=16)  # fmt: skip
    assert all(sigma_ratio(h) < 1e-12 for h in taps)
    assert net.structure_known() == [declare] * 2
    if declare:
        assert (rec["isometry_gap/output"] == math.inf).all()
    else:  # a finite number, but not given as resolved
        assert (rec["isometry_gap_error/output"] == math.inf).all()


def test_the_shipped_example_at_its_default_is_infinite(registry, monkeypatch):
    """The issue's reproduction: wide_mlp, width = batch = 24 (LayerNorm closes each block)."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(
        str(Path(__file__).resolve().parents[2] / "examples/registered_model")
    )
    monkeypatch.delitem(sys.modules, "wide_mlp", raising=False)
    import wide_mlp  # noqa: F401  (registers "wide_mlp")

    cfg = TrialConfig(model="wide_mlp", dataset="digits", width=24, batch_size=24, depth=2)
    net = build(cfg)
    p = net.init_params(torch.Generator().manual_seed(0))
    x = torch.randn(24, D_IN, generator=torch.Generator().manual_seed(1))
    rec = probe_metrics(net, p, net.init_state(), x, torch.arange(24) % CLASSES)
    assert (rec["isometry_gap/output"] == math.inf).all()
    sys.modules.pop("wide_mlp", None)


def test_an_affine_branch_added_to_its_own_input_counts_the_constant_once(registry):
    """x (rank 4 through a bottleneck) + Linear(Linear(x) + b₁) + b₂: an affine map of x, so
    rank ≤ rank(x) + 1 = 5 < n = 8 (+∞) although the branches' ranks sum past n (4 + 6); a
    LayerNorm with β ≠ 0 then a Linear with a bias likewise add one constant row, not two."""

    def blocks(d, depth):
        return [
            tnn.Sequential(tnn.Linear(d, 4, bias=False), tnn.Linear(4, d, bias=False)),
            Residual(tnn.Identity(), tnn.Sequential(tnn.Linear(d, 2 * d), tnn.Linear(2 * d, d))),
        ]

    _, rec, taps = measure(registry, blocks, n=8, d=16)
    assert [int(torch.linalg.matrix_rank(h)) for h in taps] == [4, 5]
    assert (rec["isometry_gap/output"] == math.inf).all()

    def shifted(d, depth):
        ln = tnn.LayerNorm(d)
        tnn.init.constant_(ln.bias, 0.7)
        return [tnn.Sequential(tnn.Linear(d, 4, bias=False), tnn.Linear(4, d, bias=False)),
                tnn.Sequential(ln, tnn.Linear(d, d))]  # fmt: skip

    _, rec, taps = measure(registry, shifted, n=6, d=16)
    assert [int(torch.linalg.matrix_rank(h)) for h in taps] == [4, 5]
    assert (rec["isometry_gap/output"] == math.inf).all()


def test_equal_rows_stay_equal_through_an_activation(registry):
    """GroupNorm with one channel per group outputs exactly β (each value minus its own mean):
    every row the same, and σ(1βᵀ) = 1σ(β)ᵀ — one row however many activations follow (the
    rule that a non-linearity ends every forced dependence does not hold for equal rows)."""

    def blocks(d, depth):
        gn = tnn.GroupNorm(d, d)
        tnn.init.constant_(gn.bias, 0.4)
        return [gn, tnn.Sequential(tnn.Tanh(), tnn.Linear(d, d), tnn.GELU())]

    _, rec, taps = measure(registry, blocks, n=8, d=16)
    for h in taps:  # by construction (torch's kernel leaves ~1e-14 of rounding in the first)
        assert float((h - h[0]).abs().max()) < 1e-10 * float(h.abs().max())
    assert (rec["isometry_gap/output"] == math.inf).all()


def test_a_groupnorm_of_a_low_rank_input_has_at_most_groups_times_its_rank(registry):
    """Each of G groups is centred and scaled on its own: rank ≤ G·rank(H) — here a rank-1
    input (a width-1 bottleneck) and G = 2: rank 2 < n = 6, though d − G = 14 ≥ n."""

    def blocks(d, depth):
        return [tnn.Sequential(tnn.Linear(d, 1, bias=False), tnn.Linear(1, d, bias=False),
                               tnn.GroupNorm(2, d))]  # fmt: skip

    _, rec, taps = measure(registry, blocks, n=6, d=16, depth=1)
    assert int(torch.linalg.matrix_rank(taps[0])) == 2
    assert rec["isometry_gap/output"][0] == math.inf


def test_the_shipped_example_range_gap_is_that_of_the_non_zero_eigenvalues(registry, monkeypatch):
    """wide_mlp at width = batch = 24: LayerNorm leaves rank d − 1 = 23, and the range gap is
    the gap of G's 23 non-zero eigenvalues — the float64 SVD's, seed by seed. G's null vector
    is H's left null vector, not 1 (LayerNorm centres features, not samples): the gap of 1⊥
    (QᵀH, what a batch-centring rule would measure — the issue's "true" 1.48–1.74) differs by
    0.1–0.6 on these seeds, so a wrong null space fails here."""
    import sys
    from pathlib import Path

    from service.isometry import centred_basis

    monkeypatch.syspath_prepend(
        str(Path(__file__).resolve().parents[2] / "examples/registered_model")
    )
    monkeypatch.delitem(sys.modules, "wide_mlp", raising=False)
    import wide_mlp  # noqa: F401  (registers "wide_mlp")

    n = d = 24
    Q = torch.from_numpy(centred_basis(n))
    for seed in range(3):
        cfg = TrialConfig(model="wide_mlp", dataset="digits", width=d, batch_size=n, depth=2,
                          dtype="float64", seed=seed)  # fmt: skip
        net = build(cfg)
        p = net.init_params(torch.Generator().manual_seed(seed))
        x = torch.randn(n, D_IN, generator=torch.Generator().manual_seed(seed + 1), dtype=F64)
        rec = probe_metrics(net, p, net.init_state(), x, torch.arange(n) % CLASSES)
        _, taps = net.forward(p, net.init_state(), x, "batch", taps=True)
        for i, t in enumerate(taps.layers["output"]):
            h = t.detach().reshape(n, -1)
            s = torch.linalg.svdvals(h)
            assert float(s[d - 1] / s[0]) < 1e-14  # rank d − 1 (the truth)
            want = gap_from_eigenvalues(s[: d - 1].square().numpy())
            got = rec["range_isometry_gap/output"][i]
            assert got == pytest.approx(want, rel=1e-9)
            sp = torch.linalg.svdvals(Q.T @ h)[: d - 1]
            projected = gap_from_eigenvalues(sp.square().numpy())
            assert abs(got - projected) > 0.05
    sys.modules.pop("wide_mlp", None)


class _Eval(tnn.Module):
    """Linear → BatchNorm1d (taps "0", "1") → a head: what `isosweep.probe` measures."""

    def __init__(self, d: int, mean: float, shift: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.body = tnn.Sequential(tnn.Linear(d, d, bias=False), tnn.BatchNorm1d(d))
        self.head = tnn.Linear(d, CLASSES)
        bn = self.body[1]
        with torch.no_grad():  # every value from g: the module is the same in any test order
            self.body[0].weight.copy_(torch.randn(d, d, generator=g) / d**0.5)
            self.head.weight.copy_(torch.randn(CLASSES, d, generator=g) / d**0.5)
            self.head.bias.zero_()
            bn.running_mean.copy_(mean * torch.randn(d, generator=g))
            bn.running_var.copy_(torch.rand(d, generator=g) + 0.5)
            if shift:
                bn.bias.copy_(torch.randn(d, generator=g))

    def forward(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_probe_in_eval_mode_follows_the_running_statistics(dtype):
    """In eval mode BatchNorm is H·D + 1cᵀ per feature (running statistics, c = β − μ·D): the
    rank is kept. With non-trivial running statistics a regular Linear output stays regular —
    the gap is the SVD's, finite (the batch-centring rule read +∞ with error 0 here); with
    μ = β = 0 (c = 0) a batch-centred input would stay centred, and in batch mode the same
    module reads +∞ (centred over the batch, β = 0)."""
    from workers.probe import probe

    n = d = 8
    m = _Eval(d, mean=1.0, shift=False).to(dtype)
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(5), dtype=dtype)
    rec = probe(m, x, taps=["body.0", "body.1"], mode="eval", metrics=False)
    with torch.no_grad():
        h = m.body.eval()(x).double()  # the tap as the forward computed it
    s = torch.linalg.svdvals(h)
    assert float(s[-1] / s[0]) > 1e-3  # the truth: regular
    gap, err = rec["isometry_gap/output"][1], rec["isometry_gap_error/output"][1]
    want = gap_from_eigenvalues(s.square().numpy())
    assert math.isfinite(gap) and 0 < err < 1e-3
    assert abs(gap - want) <= err * want
    m.train()
    batch = probe(m, x, taps=["body.0", "body.1"], mode="batch", metrics=False)
    assert batch["isometry_gap/output"][1] == math.inf


def test_probe_in_eval_mode_keeps_a_rank_deficit():
    """Linear(d → 3 → d) → BatchNorm1d in eval mode: rank 3 (+1 for a non-zero shift c) < n:
    +∞ either way — the running-statistics rule keeps the rank, it does not reset it."""
    from workers.probe import probe

    n, d = 8, 16
    for mean in (0.0, 1.0):
        m = tnn.Sequential(tnn.Linear(d, 3, bias=False), tnn.Linear(3, d, bias=False),
                           tnn.BatchNorm1d(d), tnn.Linear(d, CLASSES))  # fmt: skip
        with torch.no_grad():
            m[2].running_mean.fill_(mean)
        x = torch.randn(n, d, generator=torch.Generator().manual_seed(2))
        rec = probe(m, x, taps=["2"], mode="eval", metrics=False)
        assert rec["isometry_gap/output"][0] == math.inf
