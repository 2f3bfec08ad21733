"""The JSON form (service.plots.charts) of the search kinds (service.plots.search) and of a
trial's spectra (service.plots.spectra): the numbers and texts their figures draw, from the same
series functions, as `format=json` answers them (make_search_chart, make_spectrum_chart: the
checks of make_search_plot and make_spectrum_plot, then these builders).

- search_history: per study its trials' objective (points) and the best so far (a step line);
- search_slice: a panel per parameter, the objective against it (points; a choice's values at
  0, 1, … with their labels as ticks; a log axis for a loguniform parameter);
- parallel_coordinates: a line per trial over the parameter axes and the objective, each axis
  scaled to [0, 1] (search.parallel_axes), its shade the objective's (best on top);
- param_importances: bars, most important first;
- halving_rungs: a line per trial at the rungs (stopped ones red), the stops and the top-1/R
  boundary as points;
- spectrum: λ_k / mean λ against rank k per layer, the isometric λ = mean λ as a rule;
- jacobian_spectrum: F(σ) per trial as a step line, σ = 1 as a rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.plots.charts import axis, chart, chart_bytes, no_data, panel, rule, series
from service.plots.search import (
    Rungs,
    SearchTrials,
    _notes,
    _positions,
    _ylog,
    build_search_with,
    check_params,
    history_series,
    is_log,
    parallel_axes,
    param_importances,
)
from service.plots.spectra import (
    _gram_text,
    build_spectrum_with,
    normalized_spectra,
    singular_value_cdf,
)

STOPPED, WENT_ON, BOUNDARY = "#d62728", "#1f77b4", "#000000"  # the halving figure's colours


def _scale(log: bool) -> str:
    return "log" if log else "linear"


def history_chart(s: SearchTrials, yscale: str | None) -> dict[str, Any]:
    title = f"search history: {s.objective.metric}"
    lines = history_series(s)
    if not lines:
        return no_data(title, s.left_out() or "no trials yet")
    items = []
    for key, (label, part) in enumerate(lines.items()):
        items.append(series(label, part["number"], part["best"], style="step", key=key))
        items.append(series(f"{label}: each trial", part["number"], part["value"],
                            style="points", key=key))  # fmt: skip
    allv = np.concatenate([p["value"].to_numpy(float) for p in lines.values()])
    pooled = list(lines) == ["all studies"]
    xlabel = "trial index in the sweep" if pooled else "trial number in its study"
    best = "minimum" if s.objective.mode == "min" else "maximum"
    caption = _notes(s, f"dots: each trial; lines: the {best} so far")
    one = panel(caption, axis(xlabel, integer=True),
                axis(s.objective.metric, _scale(_ylog(allv, yscale))), items,
                legend="study (cell, seed): best so far")  # fmt: skip
    return chart(title, [one], keys=len(lines))


def slice_chart(s: SearchTrials, yscale: str | None) -> dict[str, Any]:
    title = f"{s.objective.metric} against each parameter"
    done = check_params(s, "search_slice", least=0)
    if done.empty:
        return no_data(title, s.left_out() or "no trials yet")
    y = done["value"].to_numpy(float)
    ylog = _scale(_ylog(y, yscale))
    panels = []
    for i, name in enumerate(s.params):
        d = s.params[name]
        x, ticks = _positions(d, done[name])
        caption = _notes(s, "log axis for loguniform parameters") if i == 0 else ""
        trials = series("trials", x, y, style="points")
        panels.append(panel(caption, axis(name, _scale(is_log(d)), ticks=ticks),
                            axis(s.objective.metric, ylog), [trials]))  # fmt: skip
    return chart(title, panels, keys=1)


def parallel_chart(s: SearchTrials, _: str | None = None) -> dict[str, Any]:
    title = f"parallel coordinates: parameters and {s.objective.metric}"
    done = check_params(s, "parallel_coordinates", least=0)
    if done.empty:
        return no_data(title, s.left_out() or "no trials yet")
    cols, labels = parallel_axes(s, done)
    y = done["value"].to_numpy(float)
    lo, hi = y.min(), y.max()
    shade = (y - lo) / (hi - lo) if hi > lo else np.full_like(y, 0.5)
    if s.objective.mode == "min":
        shade = 1.0 - shade  # the best trials bright, as viridis_r draws them
    Y = np.column_stack(cols)  # (trials, axes)
    order = np.argsort(-y if s.objective.mode == "min" else y, kind="stable")  # best last: on top
    pos = np.arange(len(cols))
    ids = done["trial_id"].to_numpy(int)
    items = [series(f"trial {ids[i]}: {y[i]:.4g}", pos, Y[i], shade=float(shade[i]))
             for i in order]  # fmt: skip
    caption = _notes(s, "each axis scaled to its own range; the best trials on top")
    one = panel(caption, axis(None, ticks=labels, limits=(-0.05, len(cols) - 0.95)),
                axis(None, ticks=["min", "max"], limits=(0.0, 1.0)), items,
                legend=f"trial: {s.objective.metric}")  # fmt: skip
    return chart(title, [one], ordered=True, keys=len(items))


def importance_chart(s: SearchTrials, _: str | None = None) -> dict[str, Any]:
    imp = param_importances(s)
    names = list(imp)  # the most important first
    vals = np.array([imp[n] for n in names])
    n = len(s.done)
    caption = _notes(s, f"optuna.importance over {n} completed trials, one pooled study")
    bars = series("importance", np.arange(len(names)), vals, style="bars")
    top = max(1.0, float(vals.max()) * 1.15)
    one = panel(caption, axis(None, ticks=names, limits=(-0.5, len(names) - 0.5)),
                axis("importance (fANOVA; sums to 1)", limits=(0.0, top)), [bars])  # fmt: skip
    return chart(f"parameter importances for {s.objective.metric}", [one], keys=1)


def halving_chart(r: Rungs, yscale: str | None) -> dict[str, Any]:
    title = f"successive halving: {r.metric} at the rungs"
    if not r.values:
        return no_data(title, "no records yet")
    items = []
    for tid, (xs, ys) in r.values.items():
        stop = tid in r.stopped
        label = f"trial {tid}" + (f": stopped at {r.stopped[tid]}" if stop else "")
        items.append(series(label, xs, ys, color=STOPPED if stop else WENT_ON))
    ends = [(r.values[t][0][-1], r.values[t][1][-1]) for t in r.stopped]
    items.append(series("stopped at this rung", [e[0] for e in ends], [e[1] for e in ends],
                        style="points", color=STOPPED))  # fmt: skip
    if r.boundary:
        items.append(series(f"top-1/{r.reduction} boundary of all values", list(r.boundary),
                            list(r.boundary.values()), style="points", color=BOUNDARY))  # fmt: skip
    allv = np.concatenate([v for _, v in r.values.values()] or [np.array([])])
    caption = (f"mode {r.mode} · {len(r.values)} trials, {len(r.stopped)} stopped · the boundary: "
               "the rule's cutoff once every trial has reached the rung")  # fmt: skip
    x = axis("rung epoch", "log", base=r.reduction, ticks=None)
    one = panel(caption, x, axis(r.metric, _scale(_ylog(allv, yscale))), items)
    return chart(title, [one], keys=len(items))


SEARCH_CHARTS: dict[str, Any] = {  # kind → its chart of (the kind's data, yscale)
    "search_history": history_chart,
    "search_slice": slice_chart,
    "parallel_coordinates": parallel_chart,
    "param_importances": importance_chart,
    "halving_rungs": halving_chart,
}


def make_search_chart(store: Any, sweep_id: int, kind: str, **args: Any) -> bytes:
    """A search kind's chart as JSON bytes: make_search_plot's arguments but the format, its
    checks (service.plots.search.build_search_with) and 422s."""
    return chart_bytes(kind, build_search_with(SEARCH_CHARTS, store, sweep_id, kind, **args))


# --- spectra ------------------------------------------------------------------------------------


def spectrum_chart(
    values: np.ndarray, *, name: str, epoch: int, layers: list[int], title: str,
    note: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """service.plots.spectra.spectrum_figure's numbers: λ_k / mean λ > 0 per layer."""
    curves = normalized_spectra(values, layers)
    items, hidden = [], {}
    for key, (ell, ratio) in enumerate(curves.items()):
        k = np.arange(1, ratio.size + 1)
        positive = ratio > 0
        hidden[ell] = int((~positive).sum())
        items.append(series(f"ℓ = {ell}", k[positive], ratio[positive], key=key))
    log = any(r.size and (r > 0).any() for r in curves.values())
    notes = [*filter(None, [note]), f"epoch {epoch}", f"{values.shape[1]} eigenvalues per layer"]
    if any(hidden.values()):
        text = ", ".join(f"ℓ = {ell}: {n}" for ell, n in hidden.items() if n)
        notes.append(f"λ ≤ 0 not drawn on the log axis ({text})")
    one = panel(" · ".join(notes), axis("rank k (eigenvalues in descending order)", integer=True),
                axis(f"λ_k / mean λ of the {_gram_text(name)}", _scale(log)), items,
                legend="layer", rules=[rule("y", 1.0, "isometry: λ = mean λ")])  # fmt: skip
    return chart(title, [one], ordered=True, keys=len(items))


def jacobian_chart(
    lines: dict[str, np.ndarray], *, epoch: int | str, title: str, ordered: bool
) -> dict[str, Any]:
    """service.plots.spectra.jacobian_figure's numbers: F(σ) at σ > 0 per trial."""
    items, zeros, dropped = [], {}, {}
    for key, (label, values) in enumerate(lines.items()):
        sigma, F, dropped[label] = singular_value_cdf(values)
        positive = sigma > 0
        zeros[label] = int((~positive).sum())
        items.append(series(label, sigma[positive], F[positive], style="step", key=key))
    log = any((v[np.isfinite(v)] > 0).any() for v in lines.values())
    notes = [f"epoch {epoch}"]
    shapes = {f"{v.shape[0]} × {v.shape[1]}" for v in lines.values()}
    notes.append(f"samples × values: {', '.join(sorted(shapes))}")
    if any(zeros.values()):
        notes.append("σ = 0 not drawn: " + ", ".join(f"{k}: {n}" for k, n in zeros.items() if n))
    if any(dropped.values()):
        text = ", ".join(f"{k}: {n}" for k, n in dropped.items() if n)
        notes.append(f"samples with NaN (diverged) left out: {text}")
    one = panel(" · ".join(notes), axis("singular value σ of ∂h_L(x_i)/∂x_i", _scale(log)),
                axis("fraction of singular values ≤ σ (pooled over probe samples)",
                     limits=(0.0, 1.02)), items,
                rules=[rule("x", 1.0, "σ = 1 (dynamical isometry)")])  # fmt: skip
    return chart(title, [one], ordered=ordered, keys=len(items))


SPECTRUM_CHARTS: dict[str, Any] = {"spectrum": spectrum_chart, "jacobian_spectrum": jacobian_chart}


def make_spectrum_chart(store: Any, trial_id: int, kind: str, **args: Any) -> bytes:
    """A spectrum kind's chart as JSON bytes: make_spectrum_plot's arguments but the format, its
    checks (service.plots.spectra.build_spectrum_with) and 422s."""
    body = build_spectrum_with(SPECTRUM_CHARTS, no_data, store, trial_id, kind, **args)
    return chart_bytes(kind, body)
