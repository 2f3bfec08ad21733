"""Axis labels: every metric with its definition (docs/science.md), and the config fields'
symbols."""

from __future__ import annotations

from service.config import METRICS
from service.metric_names import PRECISION_CHECKED_LAYERS, PRECISION_PREFIX, is_loop_scalar

_GAP = "log(mean λ) − mean(log λ)"

METRIC_LABELS: dict[str, str] = {
    "train_loss": "train loss: mean cross-entropy on the training set",
    "train_acc": "train accuracy: fraction of training samples classified correctly",
    "test_loss": "test loss: mean cross-entropy on the test set",
    "test_acc": "test accuracy: fraction of test samples classified correctly",
    "epoch_time_s": "epoch time [s]: wall time of one training epoch (measuring excluded)",
    "head_grad_norm": "gradient norm of the classifier head: Frobenius ‖∂L/∂W‖ on the probe batch",
    "head_weight_isometry_gap": f"weight isometry gap of the classifier head, {_GAP} of W Wᵀ",
    "isometry_gap/linear": f"isometry gap of the Linear output, {_GAP} of G = HHᵀ",
    "isometry_gap/norm": f"isometry gap of the normalization output, {_GAP} of G = HHᵀ",
    "isometry_gap/act": f"isometry gap of the activation output, {_GAP} of G = HHᵀ",
    "range_isometry_gap/linear": f"range isometry gap of the Linear output, {_GAP} of G = HHᵀ "
    "on the complement of its structural null space",
    "range_isometry_gap/norm": f"range isometry gap of the normalization output, {_GAP} of "
    "G = HHᵀ on the complement of its structural null space",
    "range_isometry_gap/act": f"range isometry gap of the activation output, {_GAP} of G = HHᵀ "
    "on the complement of its structural null space",
    "weight_isometry_gap": f"weight isometry gap of layer ℓ, {_GAP} of Wℓ Wℓᵀ",
    "grad_norm": "gradient norm of layer ℓ: Frobenius ‖∂L/∂Wℓ‖ on the probe batch",
    "rms": "RMS of block ℓ's output (the residual stream where there is one)",
    "mean_cosine": "mean off-diagonal cosine similarity between the probe samples' outputs",
    "token_isometry_gap": f"token isometry gap: {_GAP} of each sample's token Gram, batch mean",
    "token_cosine": "mean off-diagonal cosine similarity between a sample's tokens",
    # docs/science.md, "Per-layer measures"
    "effective_rank": "effective rank of block ℓ's output: exp of the entropy of its normalized "
    "singular values",
    "stable_rank": "stable rank of block ℓ's output: ‖H‖²_F / ‖H‖²₂",
    "update_ratio": "update ratio of layer ℓ since the previous record: ‖ΔWℓ‖_F / ‖Wℓ‖_F",
    "head_update_ratio": "update ratio of the classifier head since the previous record: "
    "‖ΔW‖_F / ‖W‖_F",
    "attention_entropy": "attention entropy of layer ℓ: a query's −Σ a log a, mean over queries "
    "and heads",
}
# The other models' taps (docs/models.md): a residual stream, a transformer's sublayer outputs
# (token-mean-pooled), a registered model's tapped submodules.
_TAPS = {
    "residual": "residual stream",
    "attn": "attention sublayer output",
    "mlp": "MLP sublayer output",
    "output": "tapped submodule's output",
}
for _kind, _what in _TAPS.items():
    METRIC_LABELS[f"isometry_gap/{_kind}"] = f"isometry gap of the {_what}, {_GAP} of G = HHᵀ"
    METRIC_LABELS[f"range_isometry_gap/{_kind}"] = (
        f"range isometry gap of the {_what}, {_GAP} of G = HHᵀ on the complement of its "
        "structural null space"
    )
_BASE_TAPS = {"linear": "Linear output", "norm": "normalization output", "act": "activation output"}
for _kind, _what in {**_BASE_TAPS, **_TAPS}.items():  # docs/science.md, "Error bars"
    METRIC_LABELS[f"isometry_gap_error/{_kind}"] = (
        f"error bar of the {_what}'s isometry gap: a bound on its relative error"
    )
for _metric, _text in list(METRIC_LABELS.items()):  # docs/science.md, "Precision"
    if _metric in PRECISION_CHECKED_LAYERS:
        _what = _text.split(":")[0].split(", log")[0]
        METRIC_LABELS[PRECISION_PREFIX + _metric] = (
            f"float32 vs float64: relative difference of {_what}"
        )


class _Labels(dict[str, str]):
    """The labels; a lab's registered per-tap metric (docs/probe.md) and a user's loop/ scalar
    (docs/own-loop.md) are labelled by their names."""

    def __missing__(self, metric: str) -> str:
        if is_loop_scalar(metric):
            return f"{metric} (recorded by your training loop)"
        return f"{metric} (a per-tap metric the server registered)"


METRIC_LABELS = _Labels({m: text for m, text in METRIC_LABELS.items() if m in METRICS})

# Axis names of the non-metric dimensions (TrialConfig fields, epoch, layer).
FIELD_LABELS: dict[str, str] = {
    "epoch": "epoch",
    "layer": "layer ℓ",
    "depth": "depth L (hidden blocks)",
    "width": "width d",
    "activation_gain": "activation gain α",
    "gain_exponent": "gain exponent p (α_ℓ = α·ℓ^(−p))",
    "init_gain": "init gain g",
    "batch_size": "batch size n",
    "lr": "learning rate",
    "momentum": "momentum",
    "weight_decay": "weight decay",
    "epochs": "epochs",
    "seed": "seed",
}


def field_label(name: str) -> str:
    """The axis label of a dimension: a known symbol, or the column name itself."""
    return FIELD_LABELS.get(name, name)


def layer_text(layer: int | None) -> str:
    """A layer choice as a title reads it: None = each trial's last, −k = k-th from the end."""
    if layer is None or layer == -1:
        return "last layer ℓ = L"
    if layer < 0:
        return f"layer ℓ = L − {-layer - 1}"
    return f"layer ℓ = {layer}"
