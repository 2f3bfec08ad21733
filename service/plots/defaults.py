"""The metric each plot kind draws when none is asked for: one default for the REST route
(api/routes/plots.py) and the dashboard's default plots (api/dashboard/views.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_METRIC: dict[str, str | list[str]] = {
    "layer_profile": "isometry_gap/act",  # Joudaki et al. 2023: the gap over layers
    "depth_scaling": "grad_norm",  # Meterez et al. 2024: ‖∂L/∂W_ℓ‖ against depth
    "training_curves": ["train_loss", "test_acc"],
    "heatmap": "isometry_gap/act",
    "theory_overlay": "isometry_gap/norm",  # the mean-field theorem's Gram: after the norm
}


def default_metric(kind: str, spec: Mapping[str, Any] | None = None) -> str | list[str]:
    """DEFAULT_METRIC[kind] for a sweep (its stored spec, or None). A sweep whose norm is
    `none` records no `isometry_gap/norm`, so its theory overlay draws `isometry_gap/act`.
    [] for an unknown kind (make_plot names the kinds)."""
    parameters = (spec or {}).get("parameters") or {}
    if kind == "theory_overlay" and parameters.get("norm") in ("none", ["none"]):
        return "isometry_gap/act"
    return DEFAULT_METRIC.get(kind, [])
