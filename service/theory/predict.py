"""`predict(config, inputs)`: what the infinite-width (mean-field) theory says a trial records at
initialization, layer by layer, with the keys and layout of a trial's record (docs/science.md,
"Predictions for a trial").

Families: `mlp` and `resmlp` (service.theory.mlp: every norm and order, every activation, the
forward kernels and the backward recursion for grad_norm), and `transformer` attention-only
stacks in the uniform-attention limit (service.theory.attention). Here: the inputs, the checks,
what is never predicted and why, and the record-shaped answer.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from service.config import DATASET_SHAPES, TrialConfig, parse_trial_config
from service.errors import InvalidInput
from service.theory import attention, mlp

SAMPLES = 1 << 14  # Monte Carlo draws per BatchNorm block (per-unit vectors)
SEED = 0
FAMILIES = ("mlp", "resmlp", "transformer")


def _inputs(c: TrialConfig, inputs: np.ndarray | None) -> tuple[np.ndarray | None, str]:
    """(the probe batch (n, d_in) as the first Linear sees it (input_norm applied), where from),
    or (None, …) for the default inputs."""
    if inputs is None:
        what = "tokens" if c.model == "transformer" else "inputs"
        return None, f"orthonormal unit-RMS {what} (input kernel I)"
    X = np.asarray(inputs, dtype=np.float64)
    d_in = DATASET_SHAPES[c.dataset][0]
    if X.ndim != 2 or X.shape[0] < 2 or X.shape[1] < 1:
        raise InvalidInput(
            f"must be an (n, d_in) array with n ≥ 2, got shape {X.shape}", field="inputs"
        )
    if c.model == "transformer" and X.shape[1] != d_in:
        raise InvalidInput(
            f"a transformer's inputs are the dataset's flattened images, (n, {d_in}); got "
            f"shape {X.shape}",
            field="inputs",
        )
    if not np.isfinite(X).all():
        raise InvalidInput("must be finite", field="inputs")
    if c.input_norm == "unit_rms":
        rms = np.sqrt((X**2).mean(axis=1, keepdims=True))
        if not (rms > 0).all():
            raise InvalidInput("an all-zero input cannot be scaled to unit RMS", field="inputs")
        X = X / rms
    with np.errstate(over="ignore", invalid="ignore"):
        K = X @ X.T / X.shape[1]
    if not np.isfinite(K).all():  # |x| near 1e154 or more: x·x overflows float64
        raise InvalidInput(
            "values this large overflow their float64 Gram; rescale them (the prediction is "
            "scale-free for a normalized network)",
            field="inputs",
        )
    return X, f"the given inputs ({X.shape[0]} × {X.shape[1]})"


def _input_kernel(c: TrialConfig, X: np.ndarray | None) -> tuple[np.ndarray, int]:
    if X is None:
        return np.eye(c.batch_size), DATASET_SHAPES[c.dataset][0]
    return X @ X.T / X.shape[1], X.shape[1]


ATTENTION_NOTE = (
    "uniform: softmax(QKᵀ/√d_h) = 11ᵀ/T, the limit of a vanishing query/key scale (Noci et al. "
    "2022); the engine's scores have variance ≈ (s·g²)² at any width (docs/science.md)"
)
WEIGHT_WHY = (
    "a finite-width property of one weight draw (square Gaussian W → 1, Haar orthogonal 0 as "
    "d → ∞), not of the mean field"
)


def unpredictable(c: TrialConfig) -> dict[str, str]:
    """{metric: why} for the per-layer metrics a trial of this config records that `predict`
    never gives for it, whatever the inputs (the family, the metric, the size)."""
    from service.models import layer_metrics

    wanted = layer_metrics(c)
    if c.model not in FAMILIES:
        why = f"no mean-field theory for model {c.model!r} here (covered: {', '.join(FAMILIES)})"
        return dict.fromkeys(wanted, why)
    out = {k: "an error bound of a finite measurement" for k in wanted if "_error/" in k}
    if c.batch_size > c.width:
        out |= {k: _range_why(c.batch_size, c.width) for k in wanted if k.startswith("range_")}
    out["weight_isometry_gap"] = WEIGHT_WHY
    if c.model == "transformer":
        uncovered = attention.coverage(c, c.batch_size)
        if uncovered is not None:
            return dict.fromkeys(wanted, uncovered)
        out["grad_norm"] = attention.GRAD_WHY
    return {k: v for k, v in out.items() if k in wanted}


def _range_why(n: int, width: int) -> str:
    return (
        f"batch_size {n} > width {width}: the measured range gap is over the {width} non-zero "
        "eigenvalues of a rank-width Gram, a finite-width quantity the mean field does not "
        "describe (the gap itself is +inf)"
    )


def predict(
    config: TrialConfig | dict[str, Any],
    inputs: np.ndarray | None = None,
    *,
    labels: np.ndarray | None = None,
    input_kernel: np.ndarray | None = None,
    gradients: bool = True,
    samples: int = SAMPLES,
    seed: int = SEED,
    exact: bool = True,
) -> dict[str, Any]:
    """The mean-field prediction of a trial's epoch-0 record (module docstring; a transformer's
    in the uniform-attention limit, service.theory.attention).

    Args:
        config: a TrialConfig or a dict of its fields.
        inputs: the probe batch (n, d_in) as the dataset gives it (`input_norm` is applied
            here); None: orthonormal unit-RMS inputs (a transformer's: tokens), input kernel I
            (n = batch_size).
        labels: the probe batch's classes (n,), for the head's backward kernel; None: identity.
        input_kernel: instead of inputs, their kernel XXᵀ/d_in (n, n) as the first Linear sees
            it (mlp and resmlp; a trial's stored input Gram and moments give it).
        gradients: False skips the backward pass (no grad_norm).
        samples, seed: Monte Carlo draws and seed where a BatchNorm block needs them.
        exact: False forces Monte Carlo in every BatchNorm block (tests).

    Returns:
        {metric: float64 array (depth,), index ℓ − 1} for rms, mean_cosine,
        isometry_gap/<kind> and range_isometry_gap/<kind> for the family's kinds
        (service.models.tap_kinds), grad_norm (relative to the last block's) and a
        transformer's token_isometry_gap and token_cosine; "unpredicted": {metric: why} for the
        family's other per-layer metrics (and every metric whose recursion failed); "notes":
        {"inputs", "method", "grad_norm", "samples", "seed", "input_free"} — input_free: the
        predicted metrics that do not depend on the inputs.

    Raises:
        InvalidInput: an invalid config (naming the field), or bad inputs/labels/input_kernel.
    """
    from service.models import layer_metrics

    c = config if isinstance(config, TrialConfig) else parse_trial_config(dict(config))
    if not (isinstance(samples, int) and 256 <= samples <= 1 << 20):
        raise InvalidInput(
            f"must be an integer in 256..{1 << 20}, got {samples!r}", field="samples"
        )
    wanted = layer_metrics(c)
    never = unpredictable(c)
    if c.model not in FAMILIES or all(k in never for k in wanted):
        return {"unpredicted": never, "notes": {}}
    if input_kernel is not None:
        if inputs is not None or c.model == "transformer":
            raise InvalidInput(
                "give inputs or input_kernel, not both; a transformer needs its inputs (tokens)",
                field="input_kernel",
            )
        K_in = _checked_kernel(input_kernel)
        X, where = None, f"the given input kernel ({K_in.shape[0]} × {K_in.shape[0]})"
    else:
        X, where = _inputs(c, inputs)
        K_in = None
    if c.model == "transformer":
        n = c.batch_size if X is None else X.shape[0]
        why = attention.coverage(c, n)
        if why is not None:
            return {"unpredicted": dict.fromkeys(wanted, why), "notes": {"inputs": where}}
        got = attention.predict_attention(c, X, n, samples, seed)
        out = {k: v for k, v in got.items() if k in wanted}
        mc, input_free = got["mc_used"], list(got["input_free"])
        unpredicted = dict(never)
        notes: dict[str, Any] = {"grad_norm": never["grad_norm"], "attention": ATTENTION_NOTE}
    else:
        if K_in is None:
            K_in, d_in = _input_kernel(c, X)
        else:
            d_in = DATASET_SHAPES[c.dataset][0]
        labels = _checked_labels(c, labels, K_in.shape[0])
        net = mlp.Net(c, samples, seed, exact)
        try:
            out, unpredicted = mlp.predict_mlp(net, K_in, d_in, labels, gradients)
        except InvalidInput as exc:
            why = f"the recursion leaves the theory's range: {exc.message}"
            return {"unpredicted": dict.fromkeys(wanted, why), "notes": {"inputs": where}}
        unpredicted = {**never, **unpredicted}
        mc, input_free = net.mc_used, []
        head = "E[(p − y)(p − y)ᵀ] from the labels" if labels is not None else "I (no labels)"
        notes = {"grad_norm": f"relative to the last block's ‖∂ℒ/∂W_L‖_F; head kernel {head}"}
    n = K_in.shape[0] if K_in is not None else (c.batch_size if X is None else X.shape[0])
    if n > c.width:  # the engine's range gap is then over a rank-d Gram's d eigenvalues
        for k in [k for k in out if k.startswith("range_")]:
            unpredicted[k] = _range_why(n, c.width)
            del out[k]
    result: dict[str, Any] = {k: v for k, v in out.items() if k in wanted}
    for k in wanted:
        if k not in result:
            unpredicted.setdefault(k, "not predicted")
    result["unpredicted"] = {k: v for k, v in unpredicted.items() if k in wanted}
    result["notes"] = {
        "inputs": where,
        "method": _method(c, mc, samples, seed),
        **notes,
        "samples": samples,
        "seed": seed,
        "input_free": [k for k in input_free if k in result],
    }
    return result


def _method(c: TrialConfig, mc: bool, samples: int, seed: int) -> str:
    exact = "exact (linear algebra)" if c.model == "transformer" else "exact (quadrature)"
    if not mc:
        return exact
    where = (
        "for the stream after a post-norm BatchNorm"
        if c.model == "transformer"
        else "where a BatchNorm meets a non-Gaussian input or in the backward pass"
    )
    return (
        f"Monte Carlo {where} ({samples} draws, seed {seed}; standard error ≈ "
        f"{1 / math.sqrt(samples):.1e} of the scale per kernel entry), exact elsewhere"
    )


def _checked_kernel(K: np.ndarray) -> np.ndarray:
    K = np.asarray(K, dtype=np.float64)
    if K.ndim != 2 or K.shape[0] != K.shape[1] or K.shape[0] < 2:
        raise InvalidInput(f"must be an (n, n) matrix, n ≥ 2, got {K.shape}", field="input_kernel")
    if not (np.isfinite(K).all() and np.allclose(K, K.T) and (np.diag(K) > 0).all()):
        raise InvalidInput(
            "must be finite and symmetric with a positive diagonal", field="input_kernel"
        )
    return (K + K.T) / 2


def _checked_labels(c: TrialConfig, labels: Any, n: int) -> np.ndarray | None:
    if labels is None:
        return None
    labels = np.asarray(labels)
    classes = DATASET_SHAPES[c.dataset][1]
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
        raise InvalidInput(f"must be {n} integer classes", field="labels")
    if labels.min() < 0 or labels.max() >= classes:
        raise InvalidInput(f"must be classes in 0..{classes - 1}", field="labels")
    return labels
