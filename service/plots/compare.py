"""Comparing sweeps: one tidy frame, one table and one figure over several stored sweeps.

    compare_frame(store, [3, 4], metrics="grad_norm", epoch="last")   # a `sweep` column added
    make_compare_plot(store, [3, 4], "depth_scaling", metric="grad_norm", fmt="svg")

Each sweep's rows are read as Store.read_metrics reads them (the same bounds and errors: a
metric, layer or epoch the sweep does not have names the sweep), then stacked with two columns
in front: `sweep_id` and `sweep`, its label. The label is "sweep 3 (norm=batch)": the parts are
the spec parameters fixed in every compared sweep whose values differ between them (a parameter
a spec leaves out counts at TrialConfig's default). A parameter swept (a list or a distribution)
in any of the sweeps is a column instead, each trial holding its own config's value, so the
lines of one sweep stay apart as they do in its own plots (docs/api.md, "Comparing sweeps"); a
registered model's `model_params` becomes its JSON text and `model_params.<name>` columns, as the
store's reads make them (service.param_columns.config_columns).

The figures are the line kinds of service.plots (layer_profile, depth_scaling,
training_curves) drawn from that frame with one line per sweep (`group_by` defaults to
`sweep`; another group_by keeps the sweep in every line's label). Seeds are pooled and axes
scaled by the same options (`stat`, `band`, `nonfinite`, `xscale`, `yscale`;
service.plots.PLOT_OPTIONS) with the same field defaults. A layer profile's default epoch (and
`last`) is each sweep's own last recorded epoch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

import pandas as pd

from service.config import CONFIG_FIELDS, TrialConfig
from service.errors import InvalidInput
from service.param_columns import FIELD as PARAMS
from service.param_columns import config_columns, param_of
from service.plots import FORMATS, PoolingArgs, render
from service.plots.defaults import default_metric_of
from service.plots.select import check_choice, fmt_value
from service.plots.stored import EpochArg, epochs_to_read, layers_to_read
from service.spec import swept_fields_of
from service.tidy import aggregate_over_seeds, check_stat

if TYPE_CHECKING:  # the store imports SQLAlchemy; this module's plots are drawn without it
    from service.store import Store

COMPARE_KINDS: tuple[str, ...] = ("layer_profile", "depth_scaling", "training_curves")
MAX_COMPARED = 8  # sweeps in one comparison: more lines than a legend can tell apart
SWEEP_COLUMNS = ("sweep_id", "sweep")  # what the comparison adds in front of the tidy columns


def check_sweep_ids(sweep_ids: Iterable[int]) -> list[int]:
    """The sweeps to compare, each once, in the order given.

    Raises:
        InvalidInput: none, or more than MAX_COMPARED (field `sweep`).
    """
    ids = list(dict.fromkeys(int(s) for s in sweep_ids))
    if not ids:
        raise InvalidInput("name the sweeps to compare (sweep=1&sweep=2)", field="sweep")
    if len(ids) > MAX_COMPARED:
        raise InvalidInput(
            f"{len(ids)} sweeps; a comparison takes at most {MAX_COMPARED}", field="sweep"
        )
    return ids


def _spec_value(parameters: Mapping[str, Any], name: str) -> Any:
    if name in parameters:
        return parameters[name]
    info = TrialConfig.model_fields[name]
    return None if info.is_required() else info.get_default(call_default_factory=True)


def _same(values: list[Any]) -> bool:
    texts = {json.dumps(v, sort_keys=True, default=str) for v in values}
    return len(texts) == 1


def differing_fields(specs: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """The spec parameters fixed in every sweep whose values differ between them, in
    TrialConfig's field order (`specs`: sweep id → its stored spec)."""
    params = {sid: dict(spec.get("parameters") or {}) for sid, spec in specs.items()}
    swept = {f for spec in specs.values() for f in swept_fields_of(spec)}
    named = {k for p in params.values() for k in p}
    out = []
    for f in CONFIG_FIELDS:
        if f not in named or f in swept:
            continue
        if not _same([_spec_value(p, f) for p in params.values()]):
            out.append(f)
    return out


def sweep_labels(specs: Mapping[int, Mapping[str, Any]]) -> dict[int, str]:
    """Sweep id → "sweep 3 (norm=batch, lr=0.1)" (differing_fields; "sweep 3" when none)."""
    fields = differing_fields(specs)
    labels = {}
    for sid, spec in specs.items():
        p = dict(spec.get("parameters") or {})
        parts = ", ".join(f"{f}={fmt_value(_spec_value(p, f))}" for f in fields)
        labels[sid] = f"sweep {sid}" + (f" ({parts})" if parts else "")
    return labels


def compare_frame(
    store: Store,
    sweep_ids: Sequence[int],
    *,
    metrics: str | list[str] | None = None,
    epoch: EpochArg | list[int] = None,
    layers: int | list[int] | None = None,
    where: dict[str, Any] | None = None,
    aggregate: bool = False,
    stat: str = "mean",
) -> pd.DataFrame:
    """The tidy frames of the sweeps, stacked: sweep_id, sweep (the label, sweep_labels; an
    ordered categorical in the order given), trial_id, the config fields swept in any of them,
    epoch, metric, layer, value. With `aggregate`, pooled over seeds per sweep as
    Store.read_metrics(aggregate=True, stat=…) pools (mean, std, ci95, count, n_finite, and
    the `stat` column for geomean or median).

    Raises:
        NotFound: a sweep that does not exist.
        InvalidInput: as Store.read_metrics (a metric, layer or epoch a sweep does not have
            names the sweep), or check_sweep_ids.
        LimitExceeded: a sweep's read over Settings.max_points.
    """
    ids = check_sweep_ids(sweep_ids)
    check_stat(stat, aggregate)
    specs = {sid: store.get_sweep(sid).spec for sid in ids}
    labels = sweep_labels(specs)
    fields = list(dict.fromkeys(f for sid in ids for f in swept_fields_of(specs[sid])))
    frames = []
    for sid in ids:
        frame = store.read_metrics(sid, metrics=metrics, epoch=epoch, layers=layers, where=where)
        missing = [f for f in fields if f not in frame.columns]
        if missing:  # fixed in this sweep, swept in another: each trial's own config's value
            frame = _with_config_columns(frame, missing, store, sid, where)
        frame.insert(0, "sweep", labels[sid])
        frame.insert(0, "sweep_id", sid)
        frames.append(frame)
    columns = _config_order(frames, fields)
    order = ["sweep_id", "sweep", "trial_id", *columns, "epoch", "metric", "layer", "value"]
    nonempty = [f.reindex(columns=order) for f in frames if not f.empty]
    out = pd.concat(nonempty, ignore_index=True) if nonempty else frames[0].reindex(columns=order)
    for c in columns:  # a model parameter another sweep's model lacks is empty (None) there
        out[c] = out[c].infer_objects() if out[c].dtype == object else out[c]
    out["sweep"] = pd.Categorical(out["sweep"], categories=[labels[s] for s in ids], ordered=True)
    out["sweep_id"] = out["sweep_id"].astype("int64")
    return aggregate_over_seeds(out, stat) if aggregate else out


def _with_config_columns(
    frame: pd.DataFrame,
    fields: list[str],
    store: Store,
    sweep_id: int,
    where: dict[str, Any] | None,
) -> pd.DataFrame:
    """The frame with the config columns of `fields` added from each trial's config, as the
    store's reads make them (service.param_columns.config_columns: `model_params` as canonical
    JSON text and one `model_params.<name>` column per parameter)."""
    configs = _trial_configs(store, sweep_id, where) if not frame.empty else {}
    trial_ids = list(dict.fromkeys(frame["trial_id"].tolist()))
    per_field = config_columns(fields, [[configs[t].get(f) for f in fields] for t in trial_ids])
    added = {}
    for c, column in per_field.items():
        per_trial = pd.Series(column, index=trial_ids, dtype=object).infer_objects()
        added[c] = per_trial.reindex(frame["trial_id"].to_numpy()).to_numpy()
    return frame.assign(**added) if added else frame


def _config_order(frames: list[pd.DataFrame], fields: list[str]) -> list[str]:
    """Every frame's config columns, once, in the order of the swept `fields` (a model
    parameter's column right after `model_params`, in the order first seen)."""
    position = ("sweep_id", "sweep", "trial_id", "epoch", "metric", "layer", "value")
    seen = dict.fromkeys(c for f in frames for c in f.columns if c not in position)
    rank = {f: i for i, f in enumerate(fields)}
    return sorted(seen, key=lambda c: rank.get(PARAMS if param_of(c) else c, len(rank)))


def _trial_configs(store: Store, sweep_id: int, where: dict[str, Any] | None) -> dict[int, dict]:
    """Trial id → config of the sweep's trials (those matching `where`), page by page."""
    size = store.settings.max_page_size
    out: dict[int, dict] = {}
    offset = 0
    while True:
        page, total = store.list_trials(sweep_id, where=where, offset=offset, limit=size)
        out |= {t.id: t.config for t in page}
        offset += len(page)
        if offset >= total or not page:
            return out


def compare_depths(store: Store, sweep_ids: Sequence[int]) -> list[int]:
    """Every depth of the compared sweeps, from their stored specs (an axis or a fixed value)."""
    depths: set[int] = set()
    for sid in sweep_ids:
        parameters = store.get_sweep(sid).spec.get("parameters") or {}
        depth = parameters.get("depth", TrialConfig.model_fields["depth"].default)
        depths |= {int(d) for d in depth} if isinstance(depth, list) else {int(depth)}
    return sorted(depths)


def check_compare_kind(kind: str) -> None:
    """A kind that draws lines: a comparison gives each sweep its own line."""
    check_choice(kind, COMPARE_KINDS, "kind")


def compare_metric(store: Store, sweep_ids: Sequence[int], kind: str) -> str | list[str]:
    """The kind's default metric (service.plots.defaults) for the compared sweeps together: one
    their families record."""
    specs = [store.get_sweep(i).spec for i in check_sweep_ids(sweep_ids)]
    return default_metric_of(kind, specs)


TITLES = {
    "layer_profile": "{metric}: profile over layers",
    "depth_scaling": "{metric} against {x}",
    "training_curves": "{metric} during training",
}


def make_compare_plot(
    store: Store,
    sweep_ids: Sequence[int],
    kind: str,
    *,
    metric: str | list[str] | None = None,
    fmt: str = "png",
    x: str | None = None,
    group_by: str | None = None,
    epoch: EpochArg = None,
    layer: int | None = None,
    where: dict[str, Any] | None = None,
    **options: Unpack[PoolingArgs],
) -> bytes:
    """One figure of several sweeps as PNG or SVG bytes: `kind` one of COMPARE_KINDS, one line
    per sweep (group_by default `sweep`) and per value of what varies within it.

    Args:
        metric: None = the kind's default (compare_metric); several for training_curves.
        epoch: a recorded epoch, "last" (the latest recorded) or None (the kind's default);
            a layer_profile's default and "last" are each sweep's own last recorded epoch.
        where: config filters, applied to every sweep.
        options: stat, band, nonfinite, xscale, yscale, as service.plots.render.

    Raises:
        InvalidInput: a kind that is not a line kind (field `kind`), as compare_frame and as
            service.plots.render, naming the field.
        NotFound: a sweep that does not exist.
        LimitExceeded: a sweep's read over Settings.max_points.
    """
    check_compare_kind(kind)
    check_choice(fmt, FORMATS, "format")
    ids = check_sweep_ids(sweep_ids)
    metric = metric or compare_metric(store, ids, kind)
    metrics = [metric] if isinstance(metric, str) else list(metric)
    group_by = group_by or "sweep"
    depths = compare_depths(store, ids)
    # A layer profile's default (and `last`) is each sweep's own last recorded epoch: sweeps
    # trained for different numbers of epochs are each drawn where they end.
    own_last = kind == "layer_profile" and epoch in (None, "last") and group_by != "epoch"
    frame = compare_frame(
        store,
        ids,
        metrics=metrics,
        epoch="last" if own_last else epochs_to_read(kind, epoch, x, group_by),
        layers=layers_to_read(kind, layer, x, group_by, depths),
        where=where,
    )
    at = epoch
    ends = ""
    if own_last and not frame.empty:
        last = frame.groupby("sweep_id", observed=True)["epoch"].transform("max")
        if last.nunique() > 1:  # a line per (epoch, sweep, what varies within it)
            frame = frame[frame["epoch"] == last]
            group_by, at, ends = "epoch", None, ", each at its last epoch"
        else:  # one last epoch: trials that ended earlier are noted, as in a sweep's own plot
            at = int(last.iloc[0])
    elif epoch == "last":
        at = int(frame["epoch"].max()) if not frame.empty else None
    frame = frame.drop(columns="sweep_id")
    shown = metrics if len(metrics) > 1 else metrics[0]
    title = TITLES[kind].format(metric=", ".join(metrics), x=x or "depth")
    title += ": sweeps " + ", ".join(str(s) for s in ids) + ends
    return render(
        kind, frame, metric=shown, fmt=fmt, x=x, group_by=group_by, epoch=at,  # type: ignore[arg-type]
        layer=layer, title=title, **options,
    )  # fmt: skip
