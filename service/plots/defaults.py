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


def log_pooled(metric: str) -> bool:
    """Gaps and gradient norms: positive, spread over decades, compared by ratios. Every
    isometry gap (of a sub-layer's Gram, its range, a weight, the head, the tokens) and every
    gradient norm."""
    return "isometry_gap" in metric or metric.endswith("grad_norm")


def field_default(
    kind: str, metric: str, x: str | None = None, group_by: str | None = None
) -> bool:
    """Whether a figure follows the papers by default: a gap or gradient norm against depth
    or layer is pooled by its geometric mean and drawn on a log y axis (Meterez et al. 2024
    plot ‖∂L/∂Wℓ‖ against depth log-log; Joudaki et al. 2023 plot gaps on log axes). `x` as the
    kind takes it (None: its default axis); a heatmap with a depth or layer axis pools its
    cells the same way."""
    if not log_pooled(metric):
        return False
    if kind in ("layer_profile", "theory_overlay"):
        return True  # x is the layer or the depth
    if kind == "depth_scaling":
        return x in (None, "depth")
    if kind == "heatmap":
        from service.plots.series import heatmap_axes

        return bool({"depth", "layer"} & set(heatmap_axes(x, group_by)))
    return False


def default_pooling(
    kind: str, metric: str, x: str | None = None, group_by: str | None = None
) -> dict[str, str]:
    """The `stat` and `yscale` a figure gets when none is asked for: geomean and log where
    field_default, else mean and auto. `band` follows the statistic (its CI) and `nonfinite`
    is propagate everywhere: a diverged seed shows, pinned and counted."""
    if field_default(kind, metric, x, group_by):
        return {"stat": "geomean", "yscale": "log"}
    return {"stat": "mean", "yscale": "auto"}


# --- axes decided from the spec --------------------------------------------------------------
# A default drawn from the sweep's spec, never from which of its trials have finished, so that a
# plot keeps its meaning while the sweep fills in (docs/dashboard.md, "Default plots").


def swept_axes(
    spec: Mapping[str, Any] | None, where: Mapping[str, Any] | None = None
) -> dict[str, list[Any] | None]:
    """The fields a sweep varies, in the spec's order (seed left out): a grid axis → its values,
    a sampled parameter → None (its values are drawn). Fields `where` holds to one value are
    left out; a list in `where` narrows an axis to the values it names."""
    parameters = (spec or {}).get("parameters") or {}
    from service.spec import swept_fields_of

    out: dict[str, list[Any] | None] = {}
    for name in swept_fields_of(spec or {}):
        if name == "seed":
            continue
        value = parameters.get(name)
        values = list(value) if isinstance(value, list) else None
        held = (where or {}).get(name)
        if held is not None:
            held = held if isinstance(held, list | tuple) else [held]
            if len(held) <= 1:
                continue
            values = [v for v in (values or held) if v in held or str(v) in map(str, held)]
        out[name] = values
    return out


def default_axes(
    kind: str,
    spec: Mapping[str, Any] | None,
    metric: str,
    *,
    where: Mapping[str, Any] | None = None,
) -> tuple[dict[str, str], dict[str, Any]]:
    """(x and group_by, config filters to add) for a plot given neither x nor group_by, from the
    sweep's spec and the caller's filters (`where`):

    - heatmap: its two axes are the sweep's first two swept fields (one swept field: it × layer
      for a per-layer metric, × epoch for a scalar one; none: epoch × layer), and any further
      grid axis is held at its first value (the figure's note names it), so that every cell
      holds one configuration on every sweep shape;
    - theory_overlay: x is depth where depth is swept, else the layer;
    - other kinds: nothing (their defaults do not depend on the rows).
    """
    from service.config import LAYER_METRICS

    axes = swept_axes(spec, where)
    names = list(axes)
    if kind == "heatmap":
        per_layer = metric in LAYER_METRICS
        if not names:
            return ({"x": "epoch", "group_by": "layer"} if per_layer else {"x": "epoch"}), {}
        if len(names) == 1:
            return {"x": names[0], "group_by": "layer" if per_layer else "epoch"}, {}
        held = {n: v[0] for n, v in axes.items() if n not in names[:2] and v}
        return {"x": names[0], "group_by": names[1]}, held
    if kind == "theory_overlay":
        return {"x": "depth" if "depth" in names else "layer"}, {}
    return {}, {}
