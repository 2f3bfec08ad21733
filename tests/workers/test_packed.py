"""Packed trials (workers/packed.py): a member's numbers do not depend on its pack.

Epoch 0 is measured for the whole pack at once (one vmap'd forward and backward, shared
factorizations): within `epoch0_rtol` of fit() — 1e-6 relative, and for an isometry gap more as
its Gram's conditioning amplifies the batched kernels' float32 rounding (bench/
pack_conditioning.py). Trained epochs go through vmap'd batched
kernels and the stacked optimizers, which round differently from single-trial kernels: held to
fit() within measured tolerances (float32: losses within 1e-4 relative after two epochs on
digits — SGD 8e-6, Adam 1.7e-5 measured; every recorded metric within 1e-3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from service.config import TrialConfig
from service.errors import InvalidInput
from service.isometry import gap_from_eigenvalues
from service.packs import auto_pack_size, pack_key
from workers.packed import Pack, StackedAdam, StackedSGD, fit_packed
from workers.train import fit

FAMILIES = {
    "mlp": dict(depth=4, width=32, norm="batch", activation="tanh"),
    "resmlp": dict(model="resmlp", depth=3, width=16, momentum=0.9),
    "cnn": dict(model="cnn", depth=2, width=8),
    "transformer": dict(model="transformer", depth=2, width=16, heads=2, norm="layer"),
}
LOSS_RTOL = 1e-4  # train/test loss of a trained member against fit(), float32 (Adam: 1.7e-5 seen)
METRIC_RTOL = 1e-3  # any finite recorded value (gaps near singular amplify rounding)
# epoch 0: every value from one vmap'd forward/backward of the pack (probe measurements, losses,
# accuracies) within EPOCH0_RTOL of fit()'s (measured ≤ 3.8e-7: a cnn's grad_norm; losses
# ≤ 1.9e-7) — but an isometry gap amplifies the forward's rounding by its Gram's conditioning,
# so a gap of λ_min/λ_max = r is held to `epoch0_rtol(r)` (below)
EPOCH0_RTOL = 1e-6
U32 = 2.0**-24  # float32's unit roundoff
ACC_ATOL = 0.01  # accuracies: a flip of one test sample in 360 is 0.0028


def epoch0_rtol(r: np.ndarray | float, n: int = 1) -> np.ndarray:
    """The epoch-0 tolerance of a gap whose Gram has λ_min/λ_max = r: max(EPOCH0_RTOL,
    0.05·u₃₂/√r). A rounding δH ~ u₃₂‖H‖ of the forward moves σ_min by ~u₃₂σ_max, log σ_min
    by ~u₃₂/√r, and the gap (a mean over the n log-eigenvalues) by less. Measured: the largest
    |Δ|·√r/u₃₂ of pack against alone was 0.019 over the audit's pack below (168 finite gaps, r down
    to 1.5e-14, where |Δ| = 4.9e-4); bench/pack_conditioning.py's largest differences per bin of
    r — 1.1e-7 (r ≥ 1e-4), 5.3e-7 (1e-6..1e-4), 2.8e-6 (1e-8..1e-6), 1.6e-5 (1e-12..1e-8) —
    are within it too. An error bar goes as 1/σ_min itself, not averaged: n times as much
    (`n`, the Gram's size)."""
    r = np.asarray(r, dtype=float)
    with np.errstate(divide="ignore"):
        return np.maximum(EPOCH0_RTOL, n * 0.05 * U32 / np.sqrt(np.maximum(r, 0.0)))


def _conditioning(rec: dict, key: str) -> np.ndarray | None:
    """Per layer, λ_min/λ_max of the eigenvalues behind `key` (from the record's spectrum, with
    `spectra`): all of them for an isometry gap; for a range gap the top k, k being where the
    recorded range gap is that of the k largest (the structure's rank); None without a
    spectrum."""
    kind = key.split("/", 1)[1]
    lam = rec.get(f"spectrum/{kind}")
    if lam is None:
        return None
    out = []
    for ell, row in enumerate(np.asarray(lam, float)):
        row = row[np.isfinite(row)]  # descending
        k = len(row)
        if key.startswith("range_"):
            want = float(np.asarray(rec[key], float)[ell])
            ks = [j for j in range(1, len(row) + 1) if row[j - 1] > 0]
            k = min(ks, key=lambda j: abs(gap_from_eigenvalues(row[:j]) - want))
        out.append(row[k - 1] / row[0])
    return np.array(out)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def members(base: dict, k: int) -> list[TrialConfig]:
    """k configs differing in what a pack allows: seed, init, learning rate."""
    inits = ["gaussian", "orthogonal"]
    return [
        TrialConfig(**base, seed=s, init=inits[s % 2], lr=[0.01, 0.05, 0.02][s % 3])
        for s in range(k)
    ]


def _epoch0_rtols(rec: dict, key: str) -> np.ndarray:
    """The epoch-0 tolerance of each of `key`'s values in the record `rec` (fit()'s): by the
    conditioning of its Gram for a gap, a range gap or an error bar where the record has the
    spectra (`epoch0_rtol`), else EPOCH0_RTOL."""
    y = np.asarray(rec[key], float)
    flat = np.full(y.shape, EPOCH0_RTOL)
    bar = key.startswith("isometry_gap_error/")
    gap = key.replace("range_", "", 1).replace("isometry_gap_error/", "isometry_gap/")
    if not gap.startswith("isometry_gap/"):
        return flat
    r = _conditioning(rec, gap if bar else key)
    if r is None:
        return flat
    n = len(np.asarray(rec[f"spectrum/{gap.split('/')[1]}"])[0]) if bar else 1
    return np.where(np.isfinite(y), epoch0_rtol(r, n), EPOCH0_RTOL)


def by_member(pairs):
    out: dict[int, list] = {}
    for i, rec in pairs:
        out.setdefault(i, []).append(rec)
    return out


def assert_close_records(mine, want, *, exact_epoch0=True):
    assert [r["epoch"] for r in mine] == [r["epoch"] for r in want]
    for a, b in zip(mine, want, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key == "epoch_time_s":
                continue
            if isinstance(a[key], bool):
                assert a[key] == b[key], key
                continue
            x, y = np.asarray(a[key], float), np.asarray(b[key], float)
            if a["epoch"] == 0 and exact_epoch0:  # measured for the whole pack at once
                np.testing.assert_array_equal(np.isfinite(x), np.isfinite(y), err_msg=key)
                fin = np.isfinite(x)
                if key.startswith("spectrum/"):  # eigenvalues: to 1e-6 of each Gram's largest
                    scale = np.nanmax(np.abs(y), axis=-1, keepdims=True) * np.ones_like(y)
                    assert (np.abs(x - y)[fin] <= EPOCH0_RTOL * scale[fin]).all(), key
                    continue
                rtol = _epoch0_rtols(b, key)
                with np.errstate(invalid="ignore"):  # x − y of two +∞: outside `fin`
                    ok = np.abs(x - y)[fin] <= (rtol * np.abs(y))[fin]
                assert ok.all(), (key, x[fin][~ok], y[fin][~ok], rtol[fin][~ok])
                continue
            np.testing.assert_array_equal(np.isfinite(x), np.isfinite(y), err_msg=key)
            fin = np.isfinite(x)
            if key.startswith("range_isometry_gap/"):
                # where the Gram is structurally singular (isometry_gap +inf) a conservative rank
                # bound can count an eigenvalue at rounding level: its range gap is rounding
                fin &= np.isfinite(np.asarray(a[key.replace("range_", "", 1)], float))
            rtol = LOSS_RTOL if key.endswith("_loss") else METRIC_RTOL
            # an accuracy is a count: a near-tie can flip a sample or two
            atol = ACC_ATOL if key.endswith("_acc") else 1e-9
            np.testing.assert_allclose(x[fin], y[fin], rtol=rtol, atol=atol, err_msg=key)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_member_of_a_pack_records_what_it_records_alone(family):
    configs = members({**FAMILIES[family], "epochs": 2 if family == "mlp" else 1}, 4)
    got = by_member(fit_packed(configs))
    for i, config in enumerate(configs):
        assert_close_records(got[i], list(fit(config)))


def test_an_ill_conditioned_pack_stays_within_its_conditioning_tolerance():
    """The audit's pack (resmlp, gelu, BatchNorm, Adam, depth 14, width = batch = 32, 256
    digits samples, seed 132, with three other members): its Grams reach λ_min/λ_max ≈ 1e-14,
    where a flat 1e-6 is not what packing promises; every value is within `epoch0_rtol` of its
    Gram's conditioning (spectra recorded to know it)."""
    base = dict(model="resmlp", depth=14, width=32, batch_size=32, norm="batch",
                activation="gelu", optimizer="adam", max_train_samples=256, epochs=0,
                spectra=True)  # fmt: skip
    configs = [TrialConfig(**base, seed=s) for s in (132, 133, 134, 135)]
    got = by_member(fit_packed(configs))
    worst = 1.0
    for i, config in enumerate(configs):
        alone = list(fit(config))
        assert_close_records(got[i], alone)
        for kind in ("linear", "norm", "act", "residual"):
            r = _conditioning(alone[0], f"range_isometry_gap/{kind}")
            worst = min(worst, float(r.min()))
    assert worst < 1e-10  # the ill-conditioned regime is exercised


def test_epoch0_tolerance_by_conditioning():
    assert epoch0_rtol(1.0) == EPOCH0_RTOL and epoch0_rtol(1e-4) == EPOCH0_RTOL
    assert epoch0_rtol(1e-12) == pytest.approx(0.05 * U32 * 1e6)
    assert epoch0_rtol(1e-12, 32) == pytest.approx(32 * 0.05 * U32 * 1e6)
    assert epoch0_rtol(0.0) == math.inf


def test_results_do_not_depend_on_the_pack_size_or_the_other_members():
    base = dict(depth=3, width=24, epochs=2, norm="batch")
    eight = members(base, 8)
    in_eight = by_member(fit_packed(eight))
    with_others = by_member(fit_packed([eight[5], eight[2], eight[7]]))
    for mine, i in ((with_others[0], 5), (with_others[1], 2), (with_others[2], 7)):
        assert_close_records(mine, in_eight[i])


def test_members_with_their_own_training_subsets_and_adam():
    """Adam at its usual learning rates (at 0.05 a member's loss moved by 1.7e-4 relative after
    two epochs: Adam's g/√v magnifies the batched kernels' rounding of small gradients)."""
    base = dict(depth=3, width=16, epochs=2, max_train_samples=300, optimizer="adam")
    configs = [TrialConfig(**base, seed=s, lr=lr) for s, lr in enumerate((1e-3, 3e-3, 5e-4))]
    got = by_member(fit_packed(configs))
    for i, c in enumerate(configs):
        assert_close_records(got[i], list(fit(c)))


def test_a_diverging_member_stops_alone_and_the_others_go_on():
    base = dict(depth=4, width=32, epochs=3, norm="none", activation="relu", init_gain=2.0)
    calm = [TrialConfig(**base, seed=s, lr=0.01) for s in (0, 1)]
    wild = TrialConfig(**base, seed=2, lr=1e6)
    alone = list(fit(wild))
    assert alone[-1]["diverged"] and alone[-1]["epoch"] < 3  # the setting diverges
    got = by_member(fit_packed([calm[0], wild, calm[1]]))
    assert [r["epoch"] for r in got[1]] == [r["epoch"] for r in alone]
    assert got[1][-1]["diverged"]
    assert got[1][-1]["train_loss"] == alone[-1]["train_loss"] or not math.isfinite(
        got[1][-1]["train_loss"]
    )
    for i, c in ((0, calm[0]), (2, calm[1])):
        assert_close_records(got[i], list(fit(c)))


def test_a_stopped_member_yields_nothing_more_and_the_others_go_on():
    configs = members(dict(depth=2, width=16, epochs=3), 3)
    pack = Pack(configs)
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for i, rec in pack.epochs():
        seen[i].append(rec["epoch"])
        if i == 1 and rec["epoch"] == 1:
            pack.stop(1)
    assert seen == {0: [0, 1, 2, 3], 1: [0, 1], 2: [0, 1, 2, 3]}


def test_pack_keys_group_what_can_share_a_batched_model():
    a = TrialConfig(depth=3, seed=1, lr=0.1, init="orthogonal")
    b = TrialConfig(depth=3, seed=2, lr=0.01, momentum=0.5)
    assert pack_key(a) == pack_key(b)
    for other in (
        TrialConfig(depth=4),
        TrialConfig(depth=3, activation_gain=2.0),  # a constant of the forward pass
        TrialConfig(depth=3, optimizer="adam"),
        TrialConfig(depth=3, model="resmlp"),
    ):
        assert pack_key(other) != pack_key(a)
    with pytest.raises(InvalidInput):
        Pack([a, TrialConfig(depth=4)])


def _torch_steps(opt_cls, kw, p0, grads):
    p = p0.clone().requires_grad_()
    opt = opt_cls([p], **kw)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


@pytest.mark.parametrize(
    ("optimizer", "kw"),
    [
        ("sgd", dict(lr=0.1)),
        ("sgd", dict(lr=0.05, momentum=0.9, weight_decay=1e-3)),
        ("adam", dict(lr=1e-3)),
        ("adam", dict(lr=3e-2, weight_decay=1e-2)),
    ],
)
def test_the_stacked_optimizers_are_torchs_update_rules(optimizer, kw):
    """Five steps of random gradients: each stacked member equals torch.optim on its own slice
    (float64, to rounding)."""
    g = torch.Generator().manual_seed(0)
    K = 3
    p0 = torch.randn(K, 5, 4, generator=g, dtype=torch.float64)
    grads = [torch.randn(K, 5, 4, generator=g, dtype=torch.float64) for _ in range(5)]
    lrs = [kw["lr"] * f for f in (1.0, 0.5, 2.0)]
    configs = [
        TrialConfig(optimizer=optimizer, lr=lr, **{k: v for k, v in kw.items() if k != "lr"})
        for lr in lrs
    ]
    params = {"W": p0.clone()}
    opt = (StackedAdam if optimizer == "adam" else StackedSGD)(params, configs)
    mask = torch.ones(K, dtype=torch.bool)
    for gr in grads:
        opt.step({"W": gr}, mask)
    cls = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
    for j in range(K):
        want = _torch_steps(cls, {**kw, "lr": lrs[j]}, p0[j], [gr[j] for gr in grads])
        np.testing.assert_allclose(params["W"][j].numpy(), want.numpy(), rtol=1e-13, atol=1e-15)
    # a masked member is left exactly as it was
    frozen = params["W"][1].clone()
    opt.step({"W": grads[0]}, torch.tensor([True, False, True]))
    assert torch.equal(params["W"][1], frozen)


def test_the_automatic_pack_size_keeps_every_slot_busy_and_memory_bounded():
    small = TrialConfig(depth=20, width=64, epochs=0)
    assert auto_pack_size(small, trials_left=256, slots=2) == 64  # the ceiling
    assert auto_pack_size(small, trials_left=16, slots=2) == 8  # two packs for two slots
    assert auto_pack_size(small, trials_left=1, slots=4) == 1
    huge = TrialConfig(depth=1000, width=4096, batch_size=1000, epochs=0)
    assert auto_pack_size(huge, trials_left=256, slots=1) == 1  # over the memory budget alone
