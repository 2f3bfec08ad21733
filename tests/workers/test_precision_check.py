"""The precision check (workers/precision.py; docs/science.md, "Precision"): a float32 trial's
epoch-0 probe re-run in float64. The stored differences are those from a float64 trial of the
same weights (computed independently through `fit`'s own float64 path); large on a deep float32
BatchNorm network (leaky_relu, batch_scale, depth 40, d = n = 16: rounding-chaotic, measured
0.6e-3 … 2.7e-2 on the gaps over seeds 0..5), tiny on a shallow well-conditioned one (≤ 7e-7
measured; < 1e-5 asserted); non-finite values by the documented rule; only at epoch 0; and the
record goes into the store as it is."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from service.config import TrialConfig, config_hash
from service.models import layer_metrics
from workers.precision import relative_difference
from workers.train import Trial, fit

DEEP = dict(activation="leaky_relu", norm="batch_scale", depth=40, width=16, batch_size=16,
            epochs=0, seed=0)  # fmt: skip
SHALLOW = dict(activation="tanh", norm="layer", depth=3, width=16, batch_size=16, epochs=0)


def _records(**fields) -> tuple[dict, dict]:
    """Epoch 0 of a float32 trial with the check, and of a float64 trial of the same weights
    (its parameters replaced by the float32 trial's, cast: float64 draws differ by a rounding)."""
    t32 = Trial(TrialConfig(**fields, precision_check=True))
    rec32 = t32.record(0, t32.initial_stats())
    t64 = Trial(TrialConfig(**fields, dtype="float64"))
    t64.params = {k: v.detach().to(torch.float64) for k, v in t32.params.items()}
    assert torch.equal(t64.probe[0], t32.probe[0].to(torch.float64))  # the same probe batch
    rec64 = t64.record(0, t64.initial_stats())
    return rec32, rec64


def _diffs(rec: dict) -> dict:
    return {k.removeprefix("precision_diff/"): v for k, v in rec.items()
            if k.startswith("precision_diff/")}  # fmt: skip


@pytest.mark.parametrize("fields", [DEEP, SHALLOW], ids=["deep", "shallow"])
def test_the_differences_are_those_from_a_float64_trial_of_the_same_weights(fields):
    rec32, rec64 = _records(**fields)
    diffs = _diffs(rec32)
    assert set(diffs) == {
        "grad_norm", "rms", "mean_cosine",
        *(f"{m}/{k}" for m in ("isometry_gap", "range_isometry_gap")
          for k in ("linear", "norm", "act")),
    }  # fmt: skip
    for m, d in diffs.items():
        assert np.shape(d) == np.shape(rec32[m])  # the metric's own layout
        want = relative_difference(rec32[m], rec64[m])
        np.testing.assert_array_equal(d, want)  # the float64 values are the float64 trial's
        a, b = np.atleast_1d(rec32[m]), np.atleast_1d(rec64[m])
        finite = np.isfinite(a) & np.isfinite(b) & (b != 0)
        expect = np.abs(a[finite] - b[finite]) / np.abs(b[finite])
        np.testing.assert_allclose(np.atleast_1d(d)[finite], expect, rtol=1e-12)
    gaps = [diffs[f"isometry_gap/{k}"] for k in ("linear", "norm", "act")]
    if fields is DEEP:  # rounding-chaotic: float32 decides the gaps to the percent
        assert max(float(np.max(g)) for g in gaps) > 1e-3
        assert float(np.max(diffs["grad_norm"])) > 1e-4
    else:  # well-conditioned: float32 is as good as float64 to 1e-5
        assert all(float(np.max(v)) < 1e-5 for v in diffs.values())


def test_relative_differences_of_non_finite_values():
    inf, nan = math.inf, math.nan
    x32 = [1.0, 0.0, 2.0, inf, inf, 3.0, nan, nan, inf, 0.0, -2.0]
    x64 = [2.0, 0.0, 0.0, inf, 3.0, inf, nan, 1.0, -inf, 1e-300, -1.0]
    want = [0.5, 0.0, inf, 0.0, inf, inf, 0.0, inf, inf, 1.0, 1.0]
    np.testing.assert_array_equal(relative_difference(x32, x64), want)
    assert relative_difference(2.0, 4.0).ndim == 0


def test_only_epoch_0_and_only_where_asked():
    base = dict(SHALLOW, epochs=2, max_train_samples=64)
    records = list(fit(TrialConfig(**base, precision_check=True), threads=1))
    checked = [any(k.startswith("precision_diff/") for k in r) for r in records]
    assert checked == [True, False, False]
    plain = list(fit(TrialConfig(**base), threads=1))
    assert not any(k.startswith("precision_diff/") for r in plain for k in r)
    # the check changes no other number (its own float64 pass reads, never writes)
    for r, q in zip(records, plain, strict=True):
        for k, v in q.items():
            if k != "epoch_time_s":
                np.testing.assert_array_equal(np.asarray(r[k]), np.asarray(v), err_msg=k)
    # under float64 there is nothing to check: the field is reset, the configs hash equal
    f64 = TrialConfig(**SHALLOW, dtype="float64", precision_check=True)
    assert f64.precision_check is False
    assert config_hash(f64) == config_hash(TrialConfig(**SHALLOW, dtype="float64"))


def test_the_names_are_known_and_the_store_takes_the_record(tmp_path):
    from service.spec import SweepSpec
    from service.store import Store

    config = TrialConfig(**SHALLOW, precision_check=True)
    assert "precision_diff/isometry_gap/act" in layer_metrics(config)
    assert "precision_diff/isometry_gap/act" not in layer_metrics(TrialConfig(**SHALLOW))
    (record,) = fit(config, threads=1)
    with Store(f"sqlite:///{tmp_path}/s.db") as store:
        spec = SweepSpec.model_validate(
            {"name": "p", "parameters": {**SHALLOW, "precision_check": True}}
        )
        sweep = store.create_sweep(spec)
        (trial,) = store.list_trials(sweep.id)[0]
        store.write_records([(trial.id, record)])
        frame = store.read_metrics(sweep.id, metrics=["precision_diff/grad_norm"])
        np.testing.assert_array_equal(
            frame.sort_values("layer")["value"].to_numpy(), record["precision_diff/grad_norm"]
        )
