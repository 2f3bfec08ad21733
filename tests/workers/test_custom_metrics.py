"""Per-tap metrics (workers/custom_metrics.py, docs/probe.md "Your own metrics"): the built-in
effective and stable ranks against their closed forms on matrices of known singular values
(degenerate and ill-conditioned ones included), a lab's metric recorded per tap by probe, loaded
from ISOSWEEP_MODEL_MODULES, and the errors."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn as tnn

from service.errors import InvalidInput
from workers import custom_metrics
from workers.custom_metrics import effective_rank, register_metric, stable_rank
from workers.probe import probe

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh(monkeypatch):
    from service import metric_names

    monkeypatch.setattr(metric_names, "_LAB", {})


def _with_singular_values(sigma: list[float], n: int, d: int, seed: int = 0) -> torch.Tensor:
    """U diag(σ) Vᵀ (n × d) with Haar-random orthonormal U, V: singular values σ (padded 0)."""
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    S = torch.zeros(n, d, dtype=torch.float64)
    S[range(len(sigma)), range(len(sigma))] = torch.tensor(sigma, dtype=torch.float64)
    return U @ S @ V.T


def _entropy_rank(sigma: list[float]) -> float:
    p = np.array(sigma) / sum(sigma)
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


@pytest.mark.parametrize(
    "sigma",
    [[3.0, 2.0, 1.0], [1.0] * 6, [5.0], [1.0, 1e-20], [1e12, 1.0, 1e-12], [2.0, 2.0, 0.5, 0.5]],
)
def test_effective_and_stable_rank_closed_forms(sigma):
    H = _with_singular_values(sigma, 8, 6)
    assert effective_rank(H) == pytest.approx(_entropy_rank(sigma), rel=1e-9)
    s2 = np.square(sigma)
    assert stable_rank(H) == pytest.approx(s2.sum() / s2.max(), rel=1e-9)


def test_ranks_of_exact_cases_and_zero():
    eye = torch.eye(5, dtype=torch.float64)
    assert effective_rank(eye) == pytest.approx(5, rel=1e-12)  # equal σ: p = 1/5, e^{log 5}
    assert stable_rank(eye) == pytest.approx(5, rel=1e-12)
    u = torch.arange(1.0, 7.0, dtype=torch.float64)
    rank_one = torch.outer(u, u.flip(0))
    assert effective_rank(rank_one) == pytest.approx(1, rel=1e-9)
    assert stable_rank(rank_one) == pytest.approx(1, rel=1e-12)
    zero = torch.zeros(4, 3, dtype=torch.float64)
    assert math.isnan(effective_rank(zero)) and math.isnan(stable_rank(zero))
    # a token tap (n, T, d) is the matrix (n, T·d): the identity's rows spread over tokens
    assert stable_rank(torch.eye(6, dtype=torch.float64).reshape(6, 2, 3)) == pytest.approx(6)


def test_probe_records_the_built_in_ranks_per_tap(fresh):
    torch.manual_seed(0)
    module = tnn.Sequential(tnn.Linear(6, 10), tnn.ReLU(), tnn.Linear(10, 4)).double()
    x = torch.randn(12, 6, dtype=torch.float64)
    record = probe(module, x, taps=["0", "1", "2"])
    with torch.no_grad():
        feats = [module[0](x), module[1](module[0](x)), module(x)]
    for name, fn in (("effective_rank", effective_rank), ("stable_rank", stable_rank)):
        s = [np.linalg.svd(f.numpy(), compute_uv=False) for f in feats]
        want = [_entropy_rank(list(v)) for v in s] if name == "effective_rank" else None
        want = want or [float((v**2).sum() / v[0] ** 2) for v in s]
        np.testing.assert_allclose(record[name], want, rtol=1e-9)
        np.testing.assert_allclose(record[name], [fn(f) for f in feats], rtol=1e-12)
    # rank ≤ 7 after Linear(6, 10) with a bias: both ranks stay ≤ 7
    assert record["effective_rank"][0] <= 7 and record["stable_rank"][0] <= 7
    assert "effective_rank" not in probe(module, x, taps=["0"], metrics=False)


def test_a_registered_metric_gets_each_taps_features(fresh):
    seen = []

    def width(H):
        seen.append((tuple(H.shape), H.dtype))
        return H.shape[-1]

    register_metric("last_axis", width)
    layer = tnn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    module = tnn.Sequential(tnn.Linear(4, 8), layer, tnn.Flatten(), tnn.Linear(40, 3))
    record = probe(module, torch.randn(6, 5, 4), taps=["0", "1", "2"])
    np.testing.assert_array_equal(record["last_axis"], [8, 8, 40])
    assert seen == [
        ((6, 5, 8), torch.float64),
        ((6, 5, 8), torch.float64),
        ((6, 40), torch.float64),
    ]
    assert custom_metrics.metric_names() == ("effective_rank", "stable_rank", "last_axis")


def test_bad_metrics_are_named(fresh):
    with pytest.raises(ValueError, match="identifier"):
        register_metric("my metric", lambda H: 0.0)
    with pytest.raises(ValueError, match="built-in"):
        register_metric("rms", lambda H: 0.0)
    with pytest.raises(ValueError, match="built-in"):
        register_metric("stable_rank", lambda H: 0.0)
    with pytest.raises(ValueError, match="callable"):
        register_metric("x", 3)
    register_metric("x", lambda H: 0.0)
    with pytest.raises(ValueError, match="registered already"):
        register_metric("x", lambda H: 1.0)
    register_metric("x", lambda H: "a word", replace=True)
    module = tnn.Sequential(tnn.Linear(3, 3))
    with pytest.raises(InvalidInput, match="metric 'x' returned str at tap 0"):
        probe(module, torch.randn(4, 3), taps=["0"])
    register_metric("x", lambda H: 1 / 0, replace=True)
    with pytest.raises(InvalidInput, match="metric 'x' raised ZeroDivisionError at tap 0"):
        probe(module, torch.randn(4, 3), taps=["0"])


def test_metrics_load_from_the_configured_module(tmp_path):
    """A lab's module named by ISOSWEEP_MODEL_MODULES registers its metric with
    isosweep.register_metric, and a fresh process's probe records it."""
    (tmp_path / "lab_metrics.py").write_text(
        textwrap.dedent(
            """
            import isosweep
            isosweep.register_metric("frobenius", lambda H: float(H.square().sum().sqrt()))
            """
        )
    )
    code = textwrap.dedent(
        """
        import torch
        import isosweep
        m = torch.nn.Sequential(torch.nn.Linear(3, 2, bias=False))
        torch.nn.init.eye_(m[0].weight)
        r = isosweep.probe(m, torch.tensor([[3.0, 4.0, 1.0], [0.0, 0.0, 2.0]]), taps=["0"])
        print(r["frobenius"][0])
        """
    )
    env = {**os.environ, "ISOSWEEP_MODEL_MODULES": "lab_metrics"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert float(out.stdout.split()[-1]) == pytest.approx(5.0, rel=1e-12)  # ‖[[3,4],[0,0]]‖_F


def test_the_batched_ranks_equal_each_taps_own_and_zero_taps_are_nan(fresh):
    """tap_metrics stacks equal-shaped taps into one SVD: each value is the single-tap one
    (closed forms included: a zero tap NaN, an ill-conditioned one as its singular values say)."""
    taps = [
        _with_singular_values([3.0, 2.0, 1.0], 8, 6, seed=1),
        torch.zeros(8, 6, dtype=torch.float64),
        _with_singular_values([1e12, 1.0, 1e-12], 8, 6, seed=2),
        _with_singular_values([1.0] * 4, 5, 4, seed=3),  # another shape: its own group
    ]
    got = custom_metrics.tap_metrics(taps)
    assert np.isnan(got["effective_rank"][1]) and np.isnan(got["stable_rank"][1])
    for i in (0, 2, 3):
        assert got["effective_rank"][i] == pytest.approx(effective_rank(taps[i]), rel=1e-12)
        assert got["stable_rank"][i] == pytest.approx(stable_rank(taps[i]), rel=1e-12)
    assert got["effective_rank"][3] == pytest.approx(4, rel=1e-12)
    assert got["stable_rank"][2] == pytest.approx(1 + 1e-24, rel=1e-12)


def test_attention_record_pads_heads_and_skips_taps_without_weights():
    uniform = torch.full((2, 3, 4, 4), 0.25, dtype=torch.float64)  # 3 heads, 4 keys
    one_hot = torch.eye(5, dtype=torch.float64).expand(1, 2, 5, 5)  # 2 heads, entropy 0
    out = custom_metrics.attention_record([uniform, None, one_hot])
    heads = out["attention_entropy_heads"]
    assert heads.shape == (3, 3)
    np.testing.assert_allclose(heads[0], math.log(4), rtol=1e-15)
    assert np.isnan(heads[1]).all() and (heads[2, :2] == 0).all() and np.isnan(heads[2, 2])
    np.testing.assert_allclose(out["attention_entropy"], [math.log(4), math.nan, 0.0])
    assert custom_metrics.attention_record([None, None]) == {}


def test_update_ratios_of_degenerate_weights():
    """0/0 (a zero weight unchanged) is NaN, a zero weight that moved +∞, a layer without a
    weight NaN; float32 weights: the difference in float32, the sums in float64."""
    zero = torch.zeros(2, 2)
    prev = {"a": zero, "b": zero, "c": torch.ones(2, 2), "h": torch.ones(3, 2)}
    now = {"a": zero, "b": torch.ones(2, 2), "c": torch.full((2, 2), 1.5), "h": 2 * prev["h"]}
    out = custom_metrics.update_ratios([["a"], ["b"], [], ["c", "a"]], "h", now, prev)
    r = out["update_ratio"]
    assert math.isnan(r[0]) and r[1] == math.inf and math.isnan(r[2])
    assert r[3] == pytest.approx(0.5, rel=1e-15) and out["head_update_ratio"] == 1.0
    assert "head_update_ratio" not in custom_metrics.update_ratios([["c"]], None, now, prev)
