"""The precision check (TrialConfig.precision_check; docs/science.md, "Precision"): epoch 0's
probe of a float32 trial run again in float64 — the network's float32 parameters and running
statistics cast to float64 (exactly), the probe batch cast likewise, the forward and backward
passes in float64 through the same family built at dtype float64 — and, for each per-layer
float32 metric the record has (service.metric_names.PRECISION_CHECKED_LAYERS: gaps, range gaps,
grad_norm, rms, mean_cosine, the token metrics), its relative difference from the float64 value,
stored per layer as "precision_diff/<metric>" (weight gaps are float64 from the same weights
either way; scalars such as head_grad_norm are not stored, as every scalar is in every record).

The float64 values are those of a float64 trial of the same weights (tests/workers/
test_precision_check.py): the check tells where float32 rounding, not the network, decides a
number. What it costs, in training steps: bench/precision_check.py.

The relative difference of x₃₂ from x₆₄ (`relative_difference`) is |x₃₂ − x₆₄| / |x₆₄|, with:
- equal values, non-finite ones included (+∞ and +∞, NaN and NaN), give 0;
- x₆₄ = 0 and x₃₂ ≠ 0 give +∞;
- one finite and the other not (a float32 gap +∞ where float64's is finite, or the reverse; a
  NaN beside a number), or opposite infinities, give +∞: the two precisions disagree on what
  the number is, not only on its digits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from service.metric_names import PRECISION_CHECKED_LAYERS, PRECISION_PREFIX
from workers import models, nn
from workers.metrics import probe_metrics

F64 = torch.float64


def relative_difference(x32: Any, x64: Any) -> np.ndarray:
    """|x32 − x64| / |x64| elementwise (float64 arrays of one shape), non-finite and zero
    values as the module docstring says."""
    a = np.asarray(x32, dtype=np.float64)
    b = np.asarray(x64, dtype=np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(a - b) / np.abs(b)
    both_finite = np.isfinite(a) & np.isfinite(b)
    return np.where(same, 0.0, np.where(both_finite, rel, np.inf))


def float64_probe(
    config: Any, params: nn.Params, state: nn.State, x: Tensor, y: Tensor
) -> dict[str, Any]:
    """probe_metrics of the trial's network in float64: `config` (a float32 TrialConfig) built
    at dtype float64, `params`, `state` and the probe batch x cast to float64 (y as it is)."""
    net = models.build(config.model_copy(update={"dtype": "float64", "precision_check": False}))
    p64 = {k: v.detach().to(F64) for k, v in params.items()}
    s64 = {k: v.detach().to(F64) if v.is_floating_point() else v for k, v in state.items()}
    return probe_metrics(net, p64, s64, x.to(F64), y)


def precision_diffs(record32: dict[str, Any], record64: dict[str, Any]) -> dict[str, Any]:
    """ "precision_diff/<metric>" (L,) for each checked metric that both records have."""
    out: dict[str, Any] = {}
    for m in PRECISION_CHECKED_LAYERS:
        if m in record32 and m in record64:
            out[PRECISION_PREFIX + m] = relative_difference(record32[m], record64[m])
    return out


def precision_check(
    config: Any, params: nn.Params, state: nn.State, probe: tuple[Tensor, Tensor], record32: dict
) -> dict[str, Any]:
    """The "precision_diff/*" fields of a float32 trial's epoch-0 record `record32` (its probe
    fields), from the float64 re-run of the same probe."""
    return precision_diffs(record32, float64_probe(config, params, state, *probe))
