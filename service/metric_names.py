"""The names of what a trial records: scalar and per-layer metrics, the other keys of an epoch
record, the 2-D arrays stored as spectra (docs/architecture.md, "The epoch record"). A module of
its own so that service.config (TrialConfig) and service.models (which metrics a model records)
both import it and neither imports the other. service.config re-exports every name.

Besides the built-in names (tuples, fixed at import), a lab's per-tap metrics
(`isosweep.register_metric`, workers/custom_metrics.py; docs/probe.md "Your own metrics") are
per-layer metrics too, registered here (`register_lab_metric`) once the server's configured
modules are imported (ISOSWEEP_MODEL_MODULES, the `isosweep.models` entry points):
service.models.lab_metrics() imports them first, and service.models.known_metrics() /
is_layer_metric() are what the store and the routes check names against. Their functions are
kept here as opaque objects (a worker calls them; the service never does), so the service knows
the names without importing torch.
"""

from __future__ import annotations

import re
from typing import Any

# The precision check (TrialConfig.precision_check; docs/science.md, "Precision"): at epoch 0 a
# float32 trial's probe re-run in float64, and for each of these per-layer metrics its relative
# difference |x₃₂ − x₆₄|/|x₆₄| stored as PRECISION_PREFIX + the metric, per layer. Weight gaps
# are left out (computed in float64 from the same weights either way: equal by construction),
# error bars (not measurements), and the scalars: every scalar metric is in every record, and
# the head's gradient norm moves with the blocks' (its difference is not stored).
PRECISION_PREFIX = "precision_diff/"
PRECISION_CHECKED_LAYERS: tuple[str, ...] = (
    *(
        f"{m}/{k}"
        for m in ("isometry_gap", "range_isometry_gap")
        for k in ("linear", "norm", "act", "residual", "attn", "mlp", "output")
    ),
    *("grad_norm", "rms", "mean_cosine", "token_isometry_gap", "token_cosine"),
)

_SCALARS: tuple[str, ...] = (
    "train_loss",
    "train_acc",
    "test_loss",
    "test_acc",
    "epoch_time_s",
    "head_grad_norm",  # Frobenius norm of ∂L/∂W of the classifier head, probe batch
    "head_weight_isometry_gap",  # gap(W Wᵀ) of the classifier head
    "head_update_ratio",  # ‖ΔW‖_F/‖W‖_F of the head since the previous recorded epoch
)
_LAYERS: tuple[str, ...] = (
    "isometry_gap/linear",  # gap of the Gram of block ℓ's Linear output, probe batch
    "isometry_gap/norm",  # … of its normalization output (absent when norm = none)
    "isometry_gap/act",  # … of its activation output (+inf where the network forces rank < n)
    "range_isometry_gap/linear",  # … on the complement of the Gram's structural null space
    "range_isometry_gap/norm",  # (= isometry_gap where nothing forces singularity)
    "range_isometry_gap/act",
    "weight_isometry_gap",  # gap(W_ℓ W_ℓᵀ) (of the block's first weight: docs/models.md)
    "grad_norm",  # ‖∂L/∂W_ℓ‖_F on the probe batch (over all of the block's weights)
    "rms",  # root mean square of block ℓ's output (the residual stream where there is one)
    "mean_cosine",  # mean off-diagonal cosine similarity between the probe samples' outputs
    # the other models' taps (docs/models.md): resmlp's residual stream, a transformer's
    # sublayer outputs (token-mean-pooled), a registered model's tapped submodules
    "isometry_gap/residual",
    "isometry_gap/attn",
    "isometry_gap/mlp",
    "isometry_gap/output",
    "range_isometry_gap/residual",
    "range_isometry_gap/attn",
    "range_isometry_gap/mlp",
    "range_isometry_gap/output",
    "token_isometry_gap",  # transformer: gap of each sample's token Gram, mean over the batch
    "token_cosine",  # transformer: mean off-diagonal cosine between a sample's tokens
    # a bound on isometry_gap/<kind>'s relative error from the factorization that computed it:
    # 0 for a structural +inf, +inf where the Gram is beyond float64's resolution (or the
    # structure is unknown and the forward's precision cannot tell it from singular)
    "isometry_gap_error/linear",
    "isometry_gap_error/norm",
    "isometry_gap_error/act",
    "isometry_gap_error/residual",
    "isometry_gap_error/attn",
    "isometry_gap_error/mlp",
    "isometry_gap_error/output",
    # per-tap metrics of each block's output (docs/probe.md; docs/science.md "Per-layer
    # measures"): with TrialConfig.tap_metrics, as the lab's registered ones
    "effective_rank",  # exp of the entropy of the normalized singular values of H (n, −1)
    "stable_rank",  # ‖H‖²_F / ‖H‖²₂
    # ‖W_ℓ(e) − W_ℓ(e_prev)‖_F / ‖W_ℓ(e_prev)‖_F over the block's weights, from the previous
    # recorded epoch e_prev (absent at epoch 0)
    "update_ratio",
    # attention layers: mean over heads of each head's mean entropy of a query's attention
    # distribution (per head: attention_entropy_heads)
    "attention_entropy",
)
SCALAR_METRICS: tuple[str, ...] = _SCALARS
# with precision_check, at epoch 0: |x₃₂ − x₆₄|/|x₆₄| of each checked metric, per layer
LAYER_METRICS: tuple[str, ...] = _LAYERS + tuple(
    PRECISION_PREFIX + m for m in PRECISION_CHECKED_LAYERS
)
METRICS: tuple[str, ...] = SCALAR_METRICS + LAYER_METRICS
# What an epoch record holds besides METRICS (docs/architecture.md, "The epoch record").
# input_gram: the probe inputs' cosine Gram (n, n); input_moments: their ‖x_i‖²/d_in (n,), both at
# epoch 0 and as the first Linear sees them (after input_norm).
RECORD_KEYS: tuple[str, ...] = ("epoch", "diverged", "input_gram", "input_moments")
# Per-epoch 2-D float64 arrays of a record, stored in the `spectra` table, not as metrics:
# eigenvalues (descending) of each measured Gram, (L, n), when `spectra`; singular values of
# ∂h_L(x_i)/∂x_i, (k, min(d, d_in)), when `jacobian_samples` = k > 0.
SPECTRUM_KEYS: tuple[str, ...] = (
    "spectrum/linear",
    "spectrum/norm",
    "spectrum/act",
    "spectrum/weight",
    "spectrum/residual",
    "spectrum/attn",
    "spectrum/mlp",
    "spectrum/output",
    "jacobian_singular_values",
    # per layer and head (L, heads): the mean over the probe batch's queries of the entropy of a
    # query's attention distribution (attention_entropy is its mean over heads)
    "attention_entropy_heads",
)
# The built-in per-tap metrics: functions of one tap's features that `probe`, and a trial with
# TrialConfig.tap_metrics, record per block (workers/custom_metrics.py).
TAP_METRICS: tuple[str, ...] = ("effective_rank", "stable_rank")

# --- the user's own scalars (isosweep.Monitor.record; docs/own-loop.md) ------------------------
# Any scalar a user's loop records besides the five it shares with isosweep's trials (a learning
# rate, a clip fraction, tokens seen) is the per-step scalar metric LOOP_PREFIX + its name —
# `lr=3e-4` → `loop/lr` — one value per record (n = 1) in the metrics table, read as the
# scalar metrics are. Its name is identifier-like and fits the table's String(64) metric column.
LOOP_PREFIX = "loop/"
LOOP_NAME_MAX = 64 - len(LOOP_PREFIX)
_LOOP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def is_loop_name(name: object) -> bool:
    """A name a user's scalar may have: [A-Za-z_][A-Za-z0-9_.]*, at most LOOP_NAME_MAX long."""
    return (
        isinstance(name, str)
        and len(name) <= LOOP_NAME_MAX
        and _LOOP_NAME.fullmatch(name) is not None
    )


def is_loop_scalar(name: object) -> bool:
    """A user's scalar metric: LOOP_PREFIX + a loop name (`loop/lr`)."""
    return (
        isinstance(name, str)
        and name.startswith(LOOP_PREFIX)
        and is_loop_name(name[len(LOOP_PREFIX) :])
    )


def is_scalar_metric(name: object) -> bool:
    """One value per record: one of SCALAR_METRICS, or a user's `loop/` scalar."""
    return name in SCALAR_METRICS or is_loop_scalar(name)


# --- the lab's per-tap metrics (isosweep.register_metric) --------------------------------------

_LAB: dict[str, Any] = {}  # name → fn(features) -> float, in registration order


def register_lab_metric(name: str, fn: Any, *, replace: bool = False) -> None:
    """Record `fn` under `name` (workers.custom_metrics.register_metric checks fn and calls
    this). Raises ValueError for a name that is not an identifier, is a built-in metric or
    record key, or is registered already with another fn (unless `replace`)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a metric name is an identifier, not {name!r}")
    if name in (*METRICS, *RECORD_KEYS, *SPECTRUM_KEYS):
        raise ValueError(f"{name!r} is a built-in metric or record key; choose another name")
    if name in _LAB and not replace and _LAB[name] is not fn:
        raise ValueError(f"metric {name!r} is registered already (replace=True replaces it)")
    _LAB[name] = fn


def registered_lab_metrics() -> dict[str, Any]:
    """The lab's per-tap metrics registered so far (name → fn): service.models.lab_metrics()
    imports the configured modules first."""
    return dict(_LAB)
