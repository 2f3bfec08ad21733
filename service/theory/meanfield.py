"""The mean-field Gram recursion of a LayerNorm MLP (Joudaki et al. 2023, Theorem 5.1)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from service.activations import Activation, gain_schedule
from service.errors import InvalidInput, LimitExceeded
from service.isometry import isometry_gap, unit_gram
from service.theory.firstlayer import EQUAL_RTOL, check_variances, first_block
from service.theory.kappa import _kappa_maps
from service.theory.quadrature import (
    DEPTH_MAX,
    GRAM_CELLS_MAX,
    STAGES,
    _check_dual_gain,
    _check_gain,
    _check_int,
    _resolve,
)

# ----------------------------------------------------------------------- mean-field Gram recursion


def layer_gains(gain: float, gain_exponent: float, depth: int) -> np.ndarray:
    """`gain_schedule` with the theory's checks: gain in (0, GAIN_MAX], p finite ≥ 0, depth in
    1..DEPTH_MAX."""
    a, L = _check_gain(gain), _check_int(depth, "depth", 1, DEPTH_MAX)
    try:
        p = float(gain_exponent)
    except (TypeError, ValueError):
        p = math.nan
    if not (math.isfinite(p) and p >= 0):
        raise InvalidInput(f"must be finite and ≥ 0, got {gain_exponent!r}", field="gain_exponent")
    return gain_schedule(a, p, L)


def _iterate_grams(
    activation: str | Activation,
    depth: int,
    input_gram: np.ndarray,
    gain: float,
    gain_exponent: float,
    stage: str,
    centered: bool,
    input_variances: np.ndarray | None = None,
) -> Iterator[np.ndarray]:
    """Yield the predicted (n, n) Gram of `stage` in block ℓ = 1..depth.

    Mean field (Joudaki et al. 2023, Eq. 10 and App. A.2): with weights N(0, 1/fan_in), block ℓ's
    pre-activations are Gaussian with covariance G_{ℓ−1} (a cosine Gram), so its centered and
    normalized output has Gram G_ℓ = κ_{α_ℓ}(G_{ℓ−1}) entrywise. "linear" is G_{ℓ−1}, "norm" is
    G_ℓ, "act" is the uncentered (c₀² + σ̄(G_{ℓ−1}))/(c₀² + σ̄(1)) — which is also G_ℓ when the
    norm only scales (centered=False: the `layer_scale` variant). With input_variances the first
    block starts from the real input instead (service.theory.firstlayer.first_block).
    """
    act = _resolve(activation)
    L = _check_int(depth, "depth", 1, DEPTH_MAX)
    a = _check_dual_gain(gain)
    if stage not in STAGES:
        raise InvalidInput(f"unknown stage {stage!r}", field="stage", allowed=STAGES)
    G = unit_gram(input_gram)
    gains = layer_gains(a, gain_exponent, L)
    if input_variances is not None:
        v = check_variances(input_variances, G.shape[0])
        if v.max() > v.min() * (1 + EQUAL_RTOL):  # else: equal variances, scale the gain
            first = first_block(act, G, float(gains[0]), v)
            yield first[stage if stage != "norm" else ("norm" if centered else "scaled")]
            G = first["norm" if centered else "scaled"]
            gains = gains[1:]
        else:
            gains[0] = _check_dual_gain(gains[0] * np.sqrt(v.mean()))
    kappa_at = _kappa_maps(act, gains)  # for no gains (depth 1 after the first block): unused
    for a_l in gains:
        f = kappa_at(a_l)
        K = f(G)  # (n, n) κ(G)
        U = (f.offset + K) / (f.offset + 1.0)  # uncentered: E[σσ]/E[σ²]
        if stage == "linear":
            yield G
        elif stage == "act":
            yield U
        G = K if centered else U
        np.fill_diagonal(G, 1.0)  # κ(1) = 1 exactly
        if stage == "norm":
            yield G


def mean_field_grams(
    activation: str | Activation,
    depth: int,
    input_gram: np.ndarray,
    *,
    gain: float = 1.0,
    gain_exponent: float = 0.0,
    stage: str = "norm",
    centered: bool = True,
    input_variances: np.ndarray | None = None,
) -> np.ndarray:
    """Predicted Grams (depth, n, n) of a LayerNorm MLP (Linear → σ(α_ℓ·) → center → normalize)
    in the infinite-width limit, index 0 ↔ block ℓ = 1, from the probe batch's input Gram
    (rescaled to unit diagonal, as the engine records it). `stage` picks the sub-layer ("linear",
    "act", "norm"); centered=False drops the centering (scale-only norm). See `_iterate_grams`.

    `gain` is α·g·√s, the hidden layers' pre-activation scale (init N(0, s·g²/fan_in), s of
    `weight_variance_scale`; s = 1 for gaussian). Without `input_variances` the first block's
    inputs are taken to have unit pre-activation variance (only their directions enter: exact for
    homogeneous σ up to the first block's "linear" and "act" Grams). With input_variances vᵢ
    (n,) — the first pre-activations' variances in units of gain², e.g. (s₁/s)·‖xᵢ‖²/d_in — the
    first block meets each sample at its own gain α₁·√vᵢ (service.theory.firstlayer); its
    "linear" and "act" Grams then keep their per-sample scales (up to one factor).

    Raises:
        InvalidInput: bad activation, depth, gain (≤ DUAL_GAIN_MAX), gain_exponent, stage, an
            input Gram that is not a finite symmetric PSD matrix with positive diagonal, or
            input_variances not (n,) finite and > 0, or too large a first-layer gain.
        LimitExceeded: depth·n² over GRAM_CELLS_MAX (use mean_field_gaps).
    """
    n = np.shape(input_gram)[0] if np.ndim(input_gram) == 2 else 0
    if isinstance(depth, int) and depth * n * n > GRAM_CELLS_MAX:
        raise LimitExceeded(
            f"depth·n² = {depth * n * n} exceeds {GRAM_CELLS_MAX}; mean_field_gaps needs no stack",
            field="depth",
        )
    grams = _iterate_grams(
        activation, depth, input_gram, gain, gain_exponent, stage, centered, input_variances
    )
    return np.stack(list(grams))


def mean_field_gaps(
    activation: str | Activation,
    depth: int,
    input_gram: np.ndarray,
    *,
    gain: float = 1.0,
    gain_exponent: float = 0.0,
    stage: str = "norm",
    centered: bool = True,
    input_variances: np.ndarray | None = None,
) -> np.ndarray:
    """Predicted isometry gaps (depth,) of `mean_field_grams`, without holding the stack.

    Near isometry the per-block gap ratio tends to κ′(0)² = (2 − β)² (Joudaki et al. 2023,
    Theorem 5.1); a singular Gram reads +inf.
    """
    grams = _iterate_grams(
        activation, depth, input_gram, gain, gain_exponent, stage, centered, input_variances
    )
    return np.array([isometry_gap(G) for G in grams])
