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


@pytest.mark.slow  # five small trainings, ~10 s
def test_mlp_records_equal_the_engine_before_the_families():
    """Golden records written by the engine at commit 32ecb9c (before workers/models): same
    torch build and CPU kind → bit for bit (as measured when the families were introduced);
    elsewhere BLAS kernels may round differently, and float32 networks agree to ~1e-5."""
    doc = json.loads(GOLDEN.read_text())
    same_build = (
        doc["torch"] == torch.__version__
        and doc["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    )
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for config, expected in zip(doc["configs"], doc["records"], strict=True):
            got = list(fit(config))
            assert len(got) == len(expected)
            for rec, want in zip(got, expected, strict=True):
                assert set(want) <= set(rec)
                for key, value in want.items():
                    mine = rec[key] if isinstance(value, bool) else np.asarray(rec[key], float)
                    if isinstance(value, bool):
                        assert mine == value, key
                    elif same_build:
                        assert mine.tobytes() == _decode(value).tobytes(), (config, key)
                    else:
                        np.testing.assert_allclose(mine, _decode(value), rtol=1e-4, err_msg=key)
    finally:
        torch.set_num_threads(before)


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
