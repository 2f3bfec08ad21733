"""Plots that read a search (docs/plots.md, "Searches you can read"): what Optuna's dashboard and
`optuna.visualization` draw, from the stored trials of any sampled or swept sweep.

    make_search_plot(store, 3, "search_history", fmt="svg")

Kinds (SEARCH_PLOT_KINDS):
- `search_history`: each completed trial's objective in trial order, and the best so far, one
  line per study (grid cell × seed: the unit a TPE search asks in, service/search/tpe.py; a
  sweep with one cell and one seed has one line, Optuna's plot_optimization_history).
- `search_slice`: the objective against each parameter, one panel each (plot_slice); a
  loguniform (or int log) parameter on a log axis.
- `parallel_coordinates`: the parameters and the objective as parallel axes, one line per trial
  coloured by its objective (plot_parallel_coordinate).
- `param_importances`: optuna.importance.get_param_importances (fANOVA, seeded) of one study
  built from every completed trial (plot_param_importances).
- `halving_rungs`: a successive-halving sweep's metric at each rung per trial, the trials
  stopped there marked, and each rung's top-1/R boundary over every value recorded there.

The objective: the query's `metric` (`mode`, `epoch`, `layer`) when given, else the search's
(service.search.best.objective_of: a TPE search's objective, else the early_stop metric at the
last epoch), else train_loss, min, last epoch. Only completed trials with a finite objective are
drawn (as Optuna draws COMPLETE trials); the caption counts the others. The parameters: the
spec's sampled distributions, then the grid fields whose values differ between trials.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from service import sampling
from service.config import LAYER_METRICS, METRICS
from service.errors import InvalidInput
from service.plots.select import check_choice, fmt_value
from service.search.best import objective_of
from service.status import TrialStatus

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from service.store import Store

SEARCH_PLOT_KINDS: tuple[str, ...] = (
    "search_history",
    "search_slice",
    "parallel_coordinates",
    "param_importances",
    "halving_rungs",
)
_OBJECTIVE = frozenset({"metric", "mode", "epoch", "layer"})
# The optional parameters each search kind reads; another one is a 422 naming it.
SEARCH_PARAMETERS: dict[str, frozenset[str]] = {
    "search_history": _OBJECTIVE | {"yscale"},
    "search_slice": _OBJECTIVE | {"yscale"},
    "parallel_coordinates": _OBJECTIVE,
    "param_importances": _OBJECTIVE,
    "halving_rungs": frozenset({"yscale"}),
}
MODES = ("min", "max")
SCALES = ("auto", "log", "linear")
MAX_STUDY_LINES = 12  # more studies than this: one pooled best-so-far line instead


@dataclass(frozen=True)
class Objective:
    metric: str
    mode: str = "min"
    epoch: int | str = "last"
    layer: int | None = None

    def text(self) -> str:
        at = f" at ℓ = {self.layer}" if self.layer is not None else ""
        ep = "last epoch" if self.epoch == "last" else f"epoch ≤ {self.epoch}"
        return f"{self.metric}{at} ({self.mode}, {ep})"


def resolve_objective(
    spec: Mapping[str, Any],
    metric: str | None = None,
    mode: str | None = None,
    epoch: int | str | None = None,
    layer: int | None = None,
) -> Objective:
    """The objective a search plot draws: the asked fields over the spec's (objective_of), over
    train_loss / min / last.

    Raises:
        InvalidInput: an unknown metric or mode, a per-layer metric without a layer (or a scalar
            one with), a negative epoch.
    """
    own = objective_of(dict(spec)) or {"metric": "train_loss", "mode": "min", "epoch": "last"}
    m = metric or own["metric"]
    check_choice(m, METRICS, "metric")
    if mode is not None:
        check_choice(mode, MODES, "mode")
    ell = layer if layer is not None else (own.get("layer") if metric is None else None)
    if m in LAYER_METRICS and ell is None:
        raise InvalidInput(f"{m!r} is per-layer: say which layer (layer=ℓ)", field="layer")
    if m not in LAYER_METRICS and ell is not None:
        raise InvalidInput(f"{m!r} is a scalar: drop layer", field="layer")
    if ell is not None and ell < 1:
        raise InvalidInput("a search objective's layer is ℓ ≥ 1", field="layer")
    ep = epoch if epoch is not None else own.get("epoch", "last")
    if ep != "last" and (not isinstance(ep, int) or ep < 0):
        raise InvalidInput("last, or an epoch ≥ 0", field="epoch")
    return Objective(m, mode or (own.get("mode") if metric is None else None) or "min", ep, ell)


# --- the stored search as a frame -------------------------------------------------------------


@dataclass
class SearchTrials:
    """A sweep's trials for the search plots.

    frame: one row per trial in index order: trial_id, index, status, study (its label),
        number (its position in its study, from 0, every status counted), value (the objective,
        NaN when it has none), and a column per parameter.
    params: parameter → its distribution (service.sampling; a varying grid field as a Choice).
    """

    frame: pd.DataFrame
    params: dict[str, sampling.Distribution]
    objective: Objective
    studies: list[str]

    @property
    def done(self) -> pd.DataFrame:
        """The completed trials with a finite objective: what the figures draw."""
        f = self.frame
        ok = (f["status"] == TrialStatus.COMPLETED) & np.isfinite(f["value"].to_numpy(float))
        return f[ok]

    def left_out(self) -> str | None:
        """What the figures do not draw, counted by status (None when nothing)."""
        f = self.frame
        rest = f[~f.index.isin(self.done.index)]
        if rest.empty:
            return None
        nonfinite = rest["status"] == TrialStatus.COMPLETED
        counts = rest[~nonfinite]["status"].value_counts()
        parts = [f"{n} {s}" for s, n in counts.items()]
        if nonfinite.any():
            parts.append(f"{int(nonfinite.sum())} completed without a finite value")
        return "not drawn: " + ", ".join(parts)


def load_search(
    store: Store,
    sweep_id: int,
    objective: Objective | None = None,
    *,
    where: dict[str, Any] | None = None,
) -> SearchTrials:
    """The sweep's trials, their studies, parameters and objective values (from the store)."""
    from service.spec import SweepSpec

    info = store.get_sweep(sweep_id)
    obj = objective or resolve_objective(info.spec)
    spec = SweepSpec.model_validate(info.spec)  # as the driver reads it: stored, so valid
    trials = _all_trials(store, sweep_id, where)
    axes = list(spec.grid_fields)
    rows = []
    for t in trials:
        c = t.config
        cell = [c.get(a) for a in axes] + [c.get("seed")]
        rows.append({"trial_id": t.id, "index": t.index, "status": t.status,
                     "study": json.dumps(cell, sort_keys=True, default=str)})  # fmt: skip
    frame = pd.DataFrame(rows, columns=["trial_id", "index", "status", "study"])
    labels: dict[str, str] = {}
    for t in trials:
        c = t.config
        key = json.dumps([c.get(a) for a in axes] + [c.get("seed")], sort_keys=True, default=str)
        labels.setdefault(key, ", ".join([*(f"{a}={fmt_value(c.get(a))}" for a in axes),
                                           f"seed={c.get('seed')}"]))  # fmt: skip
    frame["number"] = frame.groupby("study").cumcount() if len(frame) else []
    frame["study"] = frame["study"].map(labels)
    frame["value"] = _objective_values(store, sweep_id, obj, frame["trial_id"].tolist(), where)
    params: dict[str, sampling.Distribution] = dict(spec.sampled)
    for a in axes:
        values = [t.config.get(a) for t in trials]
        plain = [v for v in values if v is None or isinstance(v, bool | int | float | str)]
        if a not in params and len(plain) == len(values) and len(set(plain)) > 1:
            params[a] = sampling.Choice(tuple(sorted(set(plain), key=_sort_key)))
    for name in params:
        frame[name] = [t.config.get(name) for t in trials]
    return SearchTrials(frame, params, obj, list(dict.fromkeys(frame["study"])))


def _sort_key(v: Any) -> tuple:
    return (0, v, "") if isinstance(v, int | float) and not isinstance(v, bool) else (1, 0, str(v))


def _all_trials(store: Store, sweep_id: int, where: dict[str, Any] | None) -> list[Any]:
    out, offset, size = [], 0, store.settings.max_page_size
    while True:
        page, total = store.list_trials(sweep_id, where=where, offset=offset, limit=size)
        out += page
        offset += len(page)
        if not page or offset >= total:
            return sorted(out, key=lambda t: t.index)


def _objective_values(
    store: Store, sweep_id: int, obj: Objective, ids: list[int], where: dict[str, Any] | None
) -> np.ndarray:
    """Each trial's objective: its record at obj.epoch (the last, or the last at or before K)."""
    if not ids:
        return np.array([], dtype=float)
    frame = store.read_metrics(
        sweep_id,
        metrics=[obj.metric],
        epoch="last" if obj.epoch == "last" else list(range(int(obj.epoch) + 1)),
        layers=None if obj.layer is None else [obj.layer],
        where=where,
    )
    if obj.layer is not None and not frame.empty:
        frame = frame[frame["layer"] == obj.layer]
    last = frame.sort_values(["trial_id", "epoch"]).groupby("trial_id")["value"].last()
    return np.array([float(last.get(t, math.nan)) for t in ids], dtype=float)


# --- the numbers each kind draws --------------------------------------------------------------


def best_so_far(values: np.ndarray, mode: str) -> np.ndarray:
    """The running best of finite values in order: minimum (mode min) or maximum accumulated."""
    v = np.asarray(values, dtype=float)
    return np.minimum.accumulate(v) if mode == "min" else np.maximum.accumulate(v)


def history_series(s: SearchTrials) -> dict[str, pd.DataFrame]:
    """study label → its drawn trials (number, trial_id, value, best): the best so far in the
    study's order. More than MAX_STUDY_LINES studies: one pooled line ("all studies") in trial
    index order (number = the trial's index)."""
    done = s.done
    if len(s.studies) > MAX_STUDY_LINES:
        part = done.assign(number=done["index"]).sort_values("index")
        groups = [("all studies", part)]
    else:
        groups = [(k, done[done["study"] == k].sort_values("number")) for k in s.studies]
    out = {}
    for label, part in groups:
        if part.empty:
            continue
        v = part["value"].to_numpy(float)
        out[label] = pd.DataFrame({"number": part["number"].to_numpy(int),
                                   "trial_id": part["trial_id"].to_numpy(int), "value": v,
                                   "best": best_so_far(v, s.objective.mode)})  # fmt: skip
    return out


def is_log(d: sampling.Distribution) -> bool:
    return isinstance(d, sampling.LogUniform) or (isinstance(d, sampling.IntRange) and d.log)


def _positions(d: sampling.Distribution, values: pd.Series) -> tuple[np.ndarray, list[str] | None]:
    """x positions of a parameter's values, and tick labels for a choice (None: numeric)."""
    if isinstance(d, sampling.Choice):
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in d.values):
            return values.to_numpy(float), None
        keys = [json.dumps(v, default=str) for v in d.values]
        where = {k: i for i, k in enumerate(keys)}
        pos = np.array([where.get(json.dumps(v, default=str), np.nan) for v in values], float)
        return pos, [fmt_value(v) for v in d.values]
    return values.to_numpy(float), None


def check_params(s: SearchTrials, kind: str, least: int = 1) -> pd.DataFrame:
    """The drawn trials, refusing (422) a sweep the kind cannot read: no parameter, or fewer
    than `least` completed trials with a finite objective."""
    if not s.params:
        raise InvalidInput(
            f"{kind}: the sweep has no sampled or varying swept parameter to draw against",
            field="kind",
        )
    done = s.done
    if len(done) < least:
        raise InvalidInput(
            f"{kind} needs at least {least} completed trial{'s' if least > 1 else ''} with a "
            f"finite {s.objective.metric}; the sweep has {len(done)}",
            field="kind",
        )
    return done


def param_importances(s: SearchTrials, seed: int = 0) -> dict[str, float]:
    """parameter → importance (sums to 1, largest first) by optuna.importance's default
    evaluator (fANOVA, `seed`), over one study of every drawn trial, its parameters' Optuna
    distributions (service.search.tpe.optuna_distribution; a varying grid field categorical).

    Raises:
        InvalidInput: fewer than 2 drawn trials, no parameter that varies among them, or an
            objective that does not vary (fANOVA has no variance to apportion).
    """
    done = check_params(s, "param_importances", least=2)
    varying = [p for p in s.params if done[p].map(_key).nunique() > 1]
    if not varying:
        raise InvalidInput(
            "param_importances: no parameter varies among the completed trials", field="kind"
        )
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances
    from optuna.trial import create_trial

    from service.search.tpe import _choice_key, optuna_distribution

    if done["value"].nunique() < 2:
        raise InvalidInput(
            f"param_importances: {s.objective.metric} is the same in every completed trial: "
            "there is no variance to apportion",
            field="kind",
        )
    dists = {p: optuna_distribution(s.params[p]) for p in varying}
    study = optuna.create_study(direction="minimize" if s.objective.mode == "min" else "maximize")
    for _, row in done.iterrows():
        params = {p: _choice_key(row[p]) for p in varying}
        study.add_trial(create_trial(value=float(row["value"]), params=params,
                                     distributions=dists))  # fmt: skip
    try:
        out = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=seed))
    except (RuntimeError, ValueError) as exc:  # what fANOVA cannot fit is the data's, not ours
        raise InvalidInput(f"param_importances: {exc}", field="kind") from None
    return {k: float(v) for k, v in out.items()}


def _key(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


@dataclass
class Rungs:
    """halving_rungs' numbers: rungs (epochs), per trial its values at the rungs it reached
    (trial_id → (rung epochs, values)), the stopped trials' last rung, each rung's boundary."""

    metric: str
    mode: str
    reduction: int
    rungs: list[int]
    values: dict[int, tuple[np.ndarray, np.ndarray]]
    stopped: dict[int, int]
    boundary: dict[int, float]


def halving_series(store: Store, sweep_id: int, *, where: dict[str, Any] | None = None) -> Rungs:
    """Each trial's early_stop metric at the rungs (the first record at or past the rung's
    epoch, before the next rung: where the rule judged it), its stop, and each rung's top-1/R
    boundary over every value recorded there (service.search.halving.cutoff: what the rule's
    cutoff is once every trial has reached the rung).

    Raises:
        InvalidInput: a sweep without early_stop.
    """
    from service.search.halving import cutoff, oriented, rungs

    info = store.get_sweep(sweep_id)
    stop = info.spec.get("early_stop")
    if not stop:
        raise InvalidInput("halving_rungs: the sweep has no early_stop", field="kind")
    metric, layer, mode = stop["metric"], stop.get("layer"), stop.get("mode", "min")
    G, R = int(stop.get("grace_epochs", 1)), int(stop.get("reduction", 2))
    trials = _all_trials(store, sweep_id, where)
    top = max([int(t.config.get("epochs", 0)) for t in trials] + [0])
    ladder = rungs(G, R, top)
    frame = store.read_metrics(
        sweep_id, metrics=[metric], layers=None if layer is None else [layer], where=where
    )
    if layer is not None and not frame.empty:
        frame = frame[frame["layer"] == layer]
    values: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    stopped: dict[int, int] = {}
    at_rung: dict[int, list[float]] = {r: [] for r in ladder}
    status = {t.id: t.status for t in trials}
    for tid, part in frame.groupby("trial_id"):
        ep = part["epoch"].to_numpy(int)
        v = part["value"].to_numpy(float)
        xs, ys = [], []
        for i, r in enumerate(ladder):
            nxt = ladder[i + 1] if i + 1 < len(ladder) else math.inf
            hit = np.flatnonzero((ep >= r) & (ep < nxt))
            if hit.size:
                xs.append(r)
                ys.append(v[hit[np.argmin(ep[hit])]])
                at_rung[r].append(ys[-1])
        values[int(tid)] = (np.array(xs, int), np.array(ys, float))
        if status.get(int(tid)) == TrialStatus.STOPPED and xs:
            stopped[int(tid)] = xs[-1]
    boundary = {}
    for r, vals in at_rung.items():
        c = cutoff([oriented(x, mode) for x in vals], R)
        if c is not None and math.isfinite(c):
            boundary[r] = oriented(c, mode)
    return Rungs(metric, mode, R, ladder, values, stopped, boundary)


# --- figures ----------------------------------------------------------------------------------


def make_search_plot(
    store: Store,
    sweep_id: int,
    kind: str,
    *,
    fmt: str = "png",
    metric: str | None = None,
    mode: str | None = None,
    epoch: int | str | None = None,
    layer: int | None = None,
    yscale: str | None = None,
    where: dict[str, Any] | None = None,
) -> bytes:
    """One search plot of a stored sweep as PNG or SVG bytes; its chart as JSON is
    service.plots.charts_search.make_search_chart (the same checks and numbers).

    Raises:
        NotFound: no such sweep.
        InvalidInput: an unknown kind, format, metric, mode or scale; a parameter the kind does
            not take; a sweep the kind cannot read (no parameter, too few completed trials, no
            early_stop for halving_rungs), naming why.
    """
    check_choice(fmt, ("png", "svg"), "format")  # before the figure is drawn, not after
    args: dict[str, Any] = dict(
        metric=metric, mode=mode, epoch=epoch, layer=layer, yscale=yscale, where=where
    )
    from service.plots.draw import to_bytes

    return to_bytes(build_search_figure(store, sweep_id, kind, **args), fmt)


def build_search_figure(
    store: Store,
    sweep_id: int,
    kind: str,
    *,
    metric: str | None = None,
    mode: str | None = None,
    epoch: int | str | None = None,
    layer: int | None = None,
    yscale: str | None = None,
    where: dict[str, Any] | None = None,
) -> Figure:
    """The matplotlib Figure that make_search_plot saves."""
    return build_search_with(
        _FIGURES, store, sweep_id, kind, metric=metric, mode=mode, epoch=epoch, layer=layer,
        yscale=yscale, where=where,
    )  # fmt: skip


def build_search_with(
    builders: dict[str, Any],
    store: Store,
    sweep_id: int,
    kind: str,
    *,
    metric: str | None = None,
    mode: str | None = None,
    epoch: int | str | None = None,
    layer: int | None = None,
    yscale: str | None = None,
    where: dict[str, Any] | None = None,
) -> Any:
    """The checks of every search kind, then `builders[kind](data, yscale)` with data the Rungs
    (halving_rungs) or the SearchTrials: a figure's builders or a chart's
    (service.plots.charts_search), so both refuse the same requests."""
    check_choice(kind, SEARCH_PLOT_KINDS, "kind")
    given = {"metric": metric, "mode": mode, "epoch": epoch, "layer": layer, "yscale": yscale}
    for name, value in given.items():
        if value is not None and name not in SEARCH_PARAMETERS[kind]:
            msg = f"{kind} does not take this parameter"
            raise InvalidInput(msg, field=name, allowed=sorted(SEARCH_PARAMETERS[kind]))
    if yscale is not None:
        check_choice(yscale, SCALES, "yscale")
    if kind == "halving_rungs":
        return builders[kind](halving_series(store, sweep_id, where=where), yscale)
    spec = store.get_sweep(sweep_id).spec
    obj = resolve_objective(spec, metric, mode, epoch, layer)
    return builders[kind](load_search(store, sweep_id, obj, where=where), yscale)


def _ylog(values: np.ndarray, yscale: str | None) -> bool:
    from service.plots.select import resolve_scale

    return resolve_scale(yscale or "auto", values, 100.0, False) == "log"


def _notes(s: SearchTrials, *extra: str) -> str:
    return " · ".join([f"objective {s.objective.text()}", *extra, *filter(None, [s.left_out()])])


def _history_figure(s: SearchTrials, yscale: str | None) -> Figure:
    from matplotlib.ticker import MaxNLocator

    from service.plots import draw

    title = f"search history: {s.objective.metric}"
    lines = history_series(s)
    if not lines:
        return draw.no_data(title, s.left_out() or "no trials yet")
    fig, (ax,) = draw.new_figure()
    colors = draw.palette(list(lines), False)
    handles = []
    for label, part in lines.items():
        c = colors[label]
        ax.scatter(part["number"], part["value"], s=14, color=c, alpha=0.55, linewidths=0)
        (h,) = ax.step(part["number"], part["best"], where="post", color=c, lw=1.6, label=label)
        handles.append(h)
    allv = np.concatenate([p["value"].to_numpy(float) for p in lines.values()])
    if _ylog(allv, yscale):
        ax.set_yscale("log")
    pooled = list(lines) == ["all studies"]
    xlabel = "trial index in the sweep" if pooled else "trial number in its study"
    draw.label_axes(ax, xlabel, s.objective.metric)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(lines) > 1 or not pooled:
        draw.legend(ax, handles, title="study (cell, seed): best so far")
    best = "minimum" if s.objective.mode == "min" else "maximum"
    draw.title(fig, title)
    draw.caption(ax, _notes(s, f"dots: each trial; lines: the {best} so far"))
    return fig


def _slice_figure(s: SearchTrials, yscale: str | None) -> Figure:
    from service.plots import draw

    title = f"{s.objective.metric} against each parameter"
    done = check_params(s, "search_slice", least=0)
    if done.empty:
        return draw.no_data(title, s.left_out() or "no trials yet")
    names = list(s.params)
    fig = draw.FittedFigure(figsize=(draw.WIDTH, 3.2 * math.ceil(len(names) / 2) + 0.8),
                            layout="constrained")  # fmt: skip
    draw.Canvas(fig)
    ncols = 1 if len(names) == 1 else 2
    axes = fig.subplots(math.ceil(len(names) / ncols), ncols, squeeze=False).ravel()
    y = done["value"].to_numpy(float)
    ylog = _ylog(y, yscale)
    order = done["index"].to_numpy(float)
    for ax, name in zip(axes, names, strict=False):
        d = s.params[name]
        x, ticks = _positions(d, done[name])
        sc = ax.scatter(x, y, c=order, cmap="Blues", s=18, edgecolors="0.3", linewidths=0.3)
        if is_log(d):
            ax.set_xscale("log")
        if ticks is not None:
            ax.set_xticks(range(len(ticks)), ticks)
        if ylog:
            ax.set_yscale("log")
        draw.label_axes(ax, name, s.objective.metric)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    fig.colorbar(sc, ax=list(axes[: len(names)]), label="trial index", shrink=0.8)
    draw.title(fig, title)
    draw.caption(axes[0], _notes(s, "log axis for loguniform parameters"))
    return fig


def _parallel_figure(s: SearchTrials) -> Figure:
    from matplotlib import colormaps
    from matplotlib import colors as mcolors
    from matplotlib.cm import ScalarMappable

    from service.plots import draw

    title = f"parallel coordinates: parameters and {s.objective.metric}"
    done = check_params(s, "parallel_coordinates", least=0)
    if done.empty:
        return draw.no_data(title, s.left_out() or "no trials yet")
    cols, labels = parallel_axes(s, done)
    y = done["value"].to_numpy(float)
    lo, hi = y.min(), y.max()
    fig, (ax,) = draw.new_figure(height=4.8)
    norm = mcolors.Normalize(lo, hi if hi > lo else lo + 1)
    cmap = colormaps["viridis_r" if s.objective.mode == "min" else "viridis"]
    pos = np.arange(len(cols))
    Y = np.column_stack(cols)  # (trials, axes)
    for row, v in sorted(zip(Y, y, strict=True), key=lambda t: -t[1] if s.objective.mode ==
                         "min" else t[1]):  # fmt: skip
        ax.plot(pos, row, color=cmap(norm(v)), lw=1.1, alpha=0.8)
    for p in pos:
        ax.axvline(float(p), color="0.3", lw=0.8)
    ax.set_xticks(pos, labels)
    ax.set_yticks([0, 1], ["min", "max"])
    ax.set_xlim(-0.05, len(cols) - 0.95)
    fig.colorbar(ScalarMappable(norm, cmap), ax=ax, label=s.objective.metric)
    draw.title(fig, title)
    draw.caption(ax, _notes(s, "each axis scaled to its own range; the best trials on top"))
    return fig


def parallel_axes(s: SearchTrials, done: pd.DataFrame) -> tuple[list[np.ndarray], list[str]]:
    """parallel_coordinates' axes: each parameter's values of the drawn trials and then their
    objective, each scaled to [0, 1] over its own range (a log parameter in log10; 0.5 when it
    does not vary), and each axis's label with its range."""
    cols, labels = [], []
    for name in s.params:
        d = s.params[name]
        x, ticks = _positions(d, done[name])
        if is_log(d):
            x = np.log10(x)
        lo, hi = np.nanmin(x), np.nanmax(x)
        cols.append((x - lo) / (hi - lo) if hi > lo else np.full_like(x, 0.5))
        if ticks is not None:
            labels.append(f"{name}\n{ticks[0]} … {ticks[-1]}")
        else:
            a, b = (10**lo, 10**hi) if is_log(d) else (lo, hi)
            labels.append(f"{name}{' (log)' if is_log(d) else ''}\n{a:.3g} … {b:.3g}")
    y = done["value"].to_numpy(float)
    lo, hi = y.min(), y.max()
    cols.append((y - lo) / (hi - lo) if hi > lo else np.full_like(y, 0.5))
    labels.append(f"{s.objective.metric}\n{lo:.3g} … {hi:.3g}")
    return cols, labels


def _importance_figure(s: SearchTrials) -> Figure:
    from service.plots import draw

    imp = param_importances(s)
    fig, (ax,) = draw.new_figure(height=max(2.4, 0.5 * len(imp) + 1.6))
    names = list(imp)[::-1]  # the most important on top
    vals = [imp[n] for n in names]
    ax.barh(names, vals, color="#1f77b4")
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.3f}", va="center", fontsize=8)
    ax.set_xlim(0, max(1.0, max(vals) * 1.15))
    draw.label_axes(ax, "importance (fANOVA; sums to 1)", None)
    draw.title(fig, f"parameter importances for {s.objective.metric}")
    n = len(s.done)
    draw.caption(ax, _notes(s, f"optuna.importance over {n} completed trials, one pooled study"))
    return fig


def _halving_figure(r: Rungs, yscale: str | None) -> Figure:
    from service.plots import draw

    title = f"successive halving: {r.metric} at the rungs"
    if not r.values:
        return draw.no_data(title, "no records yet")
    fig, (ax,) = draw.new_figure()
    for tid, (xs, ys) in r.values.items():
        stop = tid in r.stopped
        ax.plot(xs, ys, color="#d62728" if stop else "#1f77b4", lw=0.9, alpha=0.55, marker="o",
                ms=2.5)  # fmt: skip
        if stop:
            ax.plot([xs[-1]], [ys[-1]], "x", color="#d62728", ms=7, mew=1.6)
    if r.boundary:
        for rung, b in r.boundary.items():
            ax.plot([rung / 1.15, rung * 1.15], [b, b], color="k", lw=2.2)
    ax.set_xscale("log", base=r.reduction)
    ax.set_xticks(r.rungs, [str(x) for x in r.rungs])
    ax.minorticks_off()
    allv = np.concatenate([v for _, v in r.values.values()] or [np.array([])])
    if _ylog(allv, yscale):
        ax.set_yscale("log")
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color="#1f77b4", marker="o", ms=3, label="went on / completed"),
        Line2D([], [], color="#d62728", marker="x", ms=7, ls="", label="stopped at this rung"),
        Line2D([], [], color="k", lw=2.2, label=f"top-1/{r.reduction} boundary of all values"),
    ]
    draw.legend(ax, handles)
    draw.label_axes(ax, "rung epoch", r.metric)
    draw.title(fig, title)
    n_stop = len(r.stopped)
    draw.caption(ax, f"mode {r.mode} · {len(r.values)} trials, {n_stop} stopped · the boundary: "
                 "the rule's cutoff once every trial has reached the rung")  # fmt: skip
    return fig


_FIGURES: dict[str, Any] = {  # kind → its figure of (the kind's data, yscale)
    "search_history": _history_figure,
    "search_slice": _slice_figure,
    "parallel_coordinates": lambda s, _: _parallel_figure(s),
    "param_importances": lambda s, _: _importance_figure(s),
    "halving_rungs": _halving_figure,
}
