"""The metric each plot kind draws when none is asked for: one default for the REST route
(api/routes/plots.py) and the dashboard's default plots (api/dashboard/views.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_METRIC: dict[str, str | list[str]] = {
    "layer_profile": "isometry_gap/act",  # Joudaki et al. 2023: the gap over layers
    "depth_scaling": "grad_norm",  # Meterez et al. 2024: ‖∂L/∂W_ℓ‖ against depth
    "training_curves": ["train_loss", "test_acc"],
    "heatmap": "isometry_gap/act",
    "theory_overlay": "isometry_gap/norm",  # the mean-field theorem's Gram: after the norm
}


def default_metric(kind: str, spec: Mapping[str, Any] | None = None) -> str | list[str]:
    """The metric `kind` draws for a sweep (its stored spec, or None) when none is asked for:
    DEFAULT_METRIC[kind] where the sweep's family records it, else one it does (family_gap).
    A sweep whose norm is `none` records no `isometry_gap/norm`, so its theory overlay draws the
    same gap as its layer profile. [] for an unknown kind (make_plot names the kinds)."""
    return default_metric_of(kind, [spec])


def default_metric_of(kind: str, specs: Iterable[Mapping[str, Any] | None]) -> str | list[str]:
    """default_metric for several sweeps drawn together (a comparison): their shapes pooled."""
    if kind not in DEFAULT_METRIC:
        return []
    configs = [c for spec in specs for c in sweep_configs(spec)]
    if kind in ("layer_profile", "heatmap"):
        return family_gap(configs)
    if kind == "theory_overlay":
        from service.models import layer_metrics

        metric = DEFAULT_METRIC[kind]
        return metric if all(metric in layer_metrics(c) for c in configs) else family_gap(configs)
    return DEFAULT_METRIC[kind]


# The gap a figure draws first, by family: the activation's (mlp, cnn), else the residual
# stream's (resmlp has both; a transformer only the stream and its sublayers), else a registered
# model's tapped output; then any other recorded gap.
GAP_PREFERENCE: tuple[str, ...] = (
    "isometry_gap/act",
    "isometry_gap/residual",
    "isometry_gap/output",
    "isometry_gap/norm",
    "isometry_gap/linear",
    "isometry_gap/attn",
    "isometry_gap/mlp",
)
SHAPE_FIELDS = ("model", "norm", "mlp_ratio", "batch_size", "width", "dataset")
MAX_SHAPES = 256  # configurations weighed by sweep_recorded (the first ones, in spec order)


def preferred_gaps(recorded: Iterable[str]) -> list[str]:
    """The isometry gaps (then range gaps) among `recorded`, in the order a page tries them:
    GAP_PREFERENCE's, each kind's gap before its range gap."""
    have = set(recorded)
    gaps = [m for m in GAP_PREFERENCE if m in have]
    gaps += sorted(m for m in have if m.startswith("isometry_gap/") and m not in gaps)
    return gaps + [f"range_{m}" for m in gaps if f"range_{m}" in have]


def singular_by_shape(config: Any) -> bool:
    """Whether every tap's sample Gram of a trial is singular by its shape alone: more probe
    samples than a tap has features (n > d: rank ≤ d < n), so each of its isometry gaps is +∞
    at every layer and epoch, and the range gap carries the finite value (docs/models.md). A
    registered model's tap width is its own: never assumed."""
    from service.config import DATASET_IMAGES

    if config.model == "cnn":
        _, _, h, w = DATASET_IMAGES[config.dataset]
        features = config.width * h * w
    elif config.model in ("mlp", "resmlp", "transformer"):
        features = config.width
    else:
        return False
    return bool(config.batch_size > features)


def sweep_configs(spec: Mapping[str, Any] | None) -> list[Any]:
    """TrialConfigs (unvalidated, model_construct) of the sweep's shapes: each combination of
    the values SHAPE_FIELDS take in the spec (a grid axis' values, a sampled choice's values, a
    sampled range's ends), the others at their defaults; at most MAX_SHAPES of them."""
    import itertools

    from service.config import TrialConfig

    parameters = (spec or {}).get("parameters") or {}
    options: dict[str, list[Any]] = {}
    for name in SHAPE_FIELDS:
        if name in parameters:
            options[name] = _values_of(parameters[name])
    combos = itertools.islice(itertools.product(*options.values()), MAX_SHAPES)
    return [TrialConfig.model_construct(**dict(zip(options, c, strict=True))) for c in combos]


def _values_of(value: Any) -> list[Any]:
    if isinstance(value, list):
        return list(value) or [None]
    if isinstance(value, dict):
        from service import sampling

        try:
            d = sampling.distribution_of(value)
        except (KeyError, TypeError, ValueError):
            return [value]
        if isinstance(d, sampling.Choice):
            return list(d.values)
        return [d.value(0.0), d.top]
    return [value]


def family_gap(configs: list[Any]) -> str:
    """The gap a layer profile and heatmap draw by default for trials of these shapes
    (sweep_configs): of preferred_gaps, the first that every shape records (else the one most
    record), and its range gap where every shape is singular by its shape (n > d: each gap +∞
    everywhere)."""
    from service.models import layer_metrics

    recorded = [frozenset(layer_metrics(c)) for c in configs]
    gaps = [m for m in preferred_gaps(frozenset().union(*recorded)) if not m.startswith("range_")]
    if not gaps:
        return str(DEFAULT_METRIC["layer_profile"])
    gap = max(gaps, key=lambda m: (sum(m in r for r in recorded), -gaps.index(m)))
    if all(singular_by_shape(c) for c in configs) and all(f"range_{gap}" in r for r in recorded):
        return f"range_{gap}"
    return gap


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
    from service.param_columns import FIELD as PARAMS
    from service.param_columns import spec_param_axes
    from service.spec import swept_values_of

    items: list[tuple[str, list[Any] | None]] = []
    for name, values in swept_values_of(spec or {}).items():
        if name == "seed":
            continue
        if name == PARAMS:  # an axis per model parameter its entries vary (model_params.<name>)
            items += [(k, v) for k, v in spec_param_axes(spec or {}).items() if len(v) > 1]
            continue
        items.append((name, values))
    out: dict[str, list[Any] | None] = {}
    for name, values in items:
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
