"""The model-family interface (workers/models): `model: mlp` records equal the engine's before the
families existed, the generic measurements (rms, mean_cosine) against their closed forms, and the
per-model metric lists (service.models.layer_metrics) against what fit() records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from service.config import TrialConfig
from service.models import layer_metrics, tap_kinds
from workers import metrics
from workers.train import fit

GOLDEN = Path(__file__).parent / "data" / "mlp_records_v2.json"


def _decode(v):
    if isinstance(v, bool):
        return v
    return np.array([float.fromhex(h) for h in v["hex"]]).reshape(v["shape"])


# Tolerances of the golden comparison. On the machine that wrote the records they agree bit for
# bit; on another CPU of the same kind BLAS kernels may block and round differently, so bits are
# not asserted. Measured here between 1 and 2 torch threads (different kernel splits): float32
# ≤ 2.2e-7 relative over every key and epoch (trained ones included), float64 0. The bounds below
# are ~50× that float32 spread (~100 float32 ulps) and 1e-12 for float64; an engine change that
# alters the mathematics moves these records by far more (a changed init, order or reduction
# shifts them at 1e-3 or more).
GOLDEN_RTOL = {"float32": 1e-5, "float64": 1e-12}
# Eigen- and singular-value arrays are compared norm-wise per row (|a − b| ≤ tol · max|b| of the
# layer): a backward-stable solver's error is relative to the largest value, and the tail of a
# singular Gram sits at rounding level, where elementwise relative differences mean nothing.
SPECTRAL = ("spectrum/", "jacobian_singular_values")
# A gap is computed in float64 as a difference of logs of O(1) size (log of the mean eigenvalue
# minus the mean log): its rounding is absolute, some ε₆₄ whatever the gap, so a gap near 0 (an
# orthogonal init's weight gaps, ~3e-16) has no relative accuracy. Seen on two CPUs: 2.7e-16 vs
# 3.4e-16, 1 ulp of 1.0 apart. The floor, ~1000 ε₆₄, is far below what a change of the
# mathematics moves a gap by (1e-3 relative of gaps ≥ 1e-6).
GAP_ATOL = 1e-13


def assert_matches_golden(got: np.ndarray, want: np.ndarray, rtol: float, key: str) -> None:
    """`key`: the metric's name, or "<config>: <metric>"."""
    metric = key.rsplit(": ", 1)[-1]
    # +∞ and NaN are structural (decided from the network, not from rounding): exactly equal
    assert got.shape == want.shape, key
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want), err_msg=key)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=key)
    np.testing.assert_array_equal(got[np.isinf(got)], want[np.isinf(want)], err_msg=key)
    fin = np.isfinite(want)
    if metric.startswith(SPECTRAL):
        scale = np.nanmax(np.abs(np.where(fin, want, np.nan)), axis=-1, keepdims=True)
        err = np.where(fin, np.abs(got - want), 0.0)
        assert np.all(err <= rtol * np.nan_to_num(scale)), (key, float(np.max(err / scale)))
    else:
        atol = GAP_ATOL if "gap" in metric else 0.0
        np.testing.assert_allclose(got[fin], want[fin], rtol=rtol, atol=atol, err_msg=key)


@pytest.mark.slow  # five small trainings, ~10 s
def test_mlp_records_equal_the_engine_before_the_families():
    """Golden records written by the engine at commit 32ecb9c (before workers/models): `model:
    mlp` still computes the same numbers, to the rounding spread of BLAS kernels (GOLDEN_RTOL)."""
    doc = json.loads(GOLDEN.read_text())
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for config, expected in zip(doc["configs"], doc["records"], strict=True):
            rtol = GOLDEN_RTOL[config.get("dtype", "float32")]
            got = list(fit(config))
            assert len(got) == len(expected)
            for rec, want in zip(got, expected, strict=True):
                assert set(want) <= set(rec)
                for key, value in want.items():
                    if isinstance(value, bool):
                        assert rec[key] == value, key
                    else:
                        mine = np.asarray(rec[key], float)
                        assert_matches_golden(mine, _decode(value), rtol, f"{config}: {key}")
    finally:
        torch.set_num_threads(before)


def test_the_golden_comparison_can_fail():
    """A relative change of 1e-4 (far below what a change of the mathematics gives) is caught in
    every form the comparison takes; a structural +∞ turned finite is caught too."""
    want = np.array([[1.0, 2.0, np.inf], [3.0, 1e-9, 4.0]])
    assert_matches_golden(want.copy(), want, 1e-5, "isometry_gap/act")
    with pytest.raises(AssertionError):
        assert_matches_golden(want * (1 + 1e-4), want, 1e-5, "isometry_gap/act")
    with pytest.raises(AssertionError):
        assert_matches_golden(np.where(np.isinf(want), 50.0, want), want, 1e-5, "isometry_gap/act")
    spec = np.array([[4.0, 1.0, 1e-12]])
    assert_matches_golden(
        spec + np.array([[0, 0, 1e-7]]), spec, 1e-5, "{'depth': 5}: spectrum/act"
    )  # tail at rounding, with the config in the key as the golden test gives it
    with pytest.raises(AssertionError):
        assert_matches_golden(spec * [[1, 1 + 1e-4, 1]], spec, 1e-5, "spectrum/act")
    # a gap at rounding level: 1 ulp of 1.0 apart passes, a gap of 1e-6 moved by 1e-3 does not
    tiny = np.array([3.4e-16, 1e-6])
    assert_matches_golden(tiny - [1.1e-16, 0], tiny, 1e-5, "c: weight_isometry_gap")
    with pytest.raises(AssertionError):
        assert_matches_golden(tiny * [1, 1 + 1e-3], tiny, 1e-5, "c: weight_isometry_gap")


def test_rms_and_mean_cosine_closed_forms():
    # orthogonal samples of norms 1 and 2 in d = 4: rms² = (1 + 4)/(2·4); cosine 0
    H = torch.tensor([[1.0, 0, 0, 0], [0, 2.0, 0, 0]])
    rms, cos = metrics.rms_and_mean_cosine(H)
    assert rms == pytest.approx(math.sqrt(5 / 8), rel=1e-15) and cos == 0.0
    # n copies of one direction (any positive scales): every cosine is 1
    v = torch.randn(16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    H = torch.stack([v * s for s in (0.1, 1.0, 7.0, 1e6)])
    assert metrics.rms_and_mean_cosine(H)[1] == pytest.approx(1.0, abs=1e-14)
    # a regular simplex of n points centred at 0: every cosine is −1/(n − 1)
    n = 5
    E = torch.eye(n, dtype=torch.float64) - 1.0 / n
    assert metrics.rms_and_mean_cosine(E)[1] == pytest.approx(-1 / (n - 1), abs=1e-14)
    # a zero sample has no direction: left out; fewer than two left → NaN
    Z = torch.cat([torch.zeros(1, 4), torch.tensor([[1.0, 1, 0, 0], [1.0, 0, 0, 0]])])
    assert metrics.rms_and_mean_cosine(Z)[1] == pytest.approx(1 / math.sqrt(2), rel=1e-15)
    assert math.isnan(metrics.rms_and_mean_cosine(torch.zeros(3, 4))[1])
    # feature maps count as their flattened samples
    X = torch.randn(6, 2, 3, 3, generator=torch.Generator().manual_seed(1))
    assert metrics.rms_and_mean_cosine(X) == metrics.rms_and_mean_cosine(X.reshape(6, -1))


def test_mean_cosine_against_the_cosine_gram():
    """The O(nd) identity against the n × n cosine Gram, on nearly collinear samples too."""
    from service.isometry import cosine_gram

    g = torch.Generator().manual_seed(2)
    base = torch.randn(1, 50, generator=g, dtype=torch.float64)
    for spread in (1.0, 1e-3, 1e-7):
        H = base + spread * torch.randn(30, 50, generator=g, dtype=torch.float64)
        C = cosine_gram(H.numpy())
        want = (C.sum() - np.trace(C)) / (30 * 29)
        assert metrics.rms_and_mean_cosine(H)[1] == pytest.approx(want, abs=1e-13)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"norm": "none"},
        {"norm": "layer", "order": "act_norm"},
    ],
)
def test_mlp_records_what_layer_metrics_names(kw):
    config = TrialConfig(depth=3, width=16, batch_size=20, epochs=0, **kw)
    (rec,) = fit(config)
    recorded = {k for k in rec if isinstance(rec[k], np.ndarray) and rec[k].shape == (3,)}
    assert recorded == set(layer_metrics(config)) - set() and set(tap_kinds(config)) <= {
        "linear",
        "norm",
        "act",
    }
    # mean-field "length": the MLP's block output is the activation (norm_act) or norm (act_norm)
    out = rec["rms"]
    assert np.all(np.isfinite(out)) and np.all(out > 0)
