"""The names of what a trial records: scalar and per-layer metrics, the other keys of an epoch
record, the 2-D arrays stored as spectra (docs/architecture.md, "The epoch record"). A module of
its own so that service.config (TrialConfig) and service.models (which metrics a model records)
both import it and neither imports the other. service.config re-exports every name."""

from __future__ import annotations

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
)
