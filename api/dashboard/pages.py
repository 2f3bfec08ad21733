"""The dashboard's pages, rendered on the server from the store (Jinja2, autoescaped), with a
small script (static/dashboard.js) that draws the plots as interactive charts from their JSON
(static/charts.js, the vendored uPlot), polls the JSON API while something runs and swaps the
changed parts of the page in place. Nothing is loaded from another host (see CSP below).

    /                 sweeps: status, trial counts, progress, ETA
    /sweeps/{id}      one sweep: header, plots, downloads, trials table (filter, sort, pages)
    /trials/{id}      one trial: config, last epoch's metrics, its plots
    /compare?sweep=3&sweep=4   several sweeps: their labels, one figure, the CSV
    /static/…         dashboard.css, dashboard.js, charts.js, uPlot (uPlot.VERSION)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from api.dashboard import views as v
from api.errors import printable, status_of
from api.routes.deps import INT32_MAX
from service import __version__
from service.config import SCALAR_METRICS, TrialConfig
from service.errors import InvalidInput, IsosweepError, NotFound
from service.models import known_metrics, layer_metrics
from service.plots import METRIC_LABELS
from service.plots.defaults import family_gap, preferred_gaps
from service.search.best import best_trial
from service.store import Store, TrialInfo
from service.store.models import SWEEP_STATUSES

HERE = Path(__file__).resolve().parent

router = APIRouter(include_in_schema=False)
router.mount("/static", StaticFiles(directory=HERE / "static"), name="dashboard-static")

env = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=True,  # every value is escaped unless it is Markup built by views.number
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
env.filters |= {
    "num": v.number, "duration": v.duration, "when": v.when, "percent": v.percent, "cfg": v.shown,
}  # fmt: skip
env.globals |= {"url": v.url, "API": v.API, "version": __version__, "STATUSES": v.TRIAL_STATUSES}

# Only this origin; blob: for plots re-fetched by the script; data: for the empty favicon.
CSP = (
    "default-src 'self'; img-src 'self' blob: data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-store",  # the back button shows the current state, not a stale one
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def render(template: str, http_status: int = 200, **context: Any) -> HTMLResponse:
    html = env.get_template(template).render(**context)
    return HTMLResponse(html, status_code=http_status, headers=HEADERS)


def shown(page: Callable[..., Response]) -> Callable[..., Response]:
    """A domain error on a page becomes an HTML page with the API's status for it and the
    message (a 404 for a missing sweep, a 422 naming a bad parameter, …)."""

    @wraps(page)
    def wrapper(*args: Any, **kwargs: Any) -> Response:
        try:
            return page(*args, **kwargs)
        except IsosweepError as exc:
            code = status_of(exc)
            message = printable(exc.message)
            return render("error.html", code, code=code, message=message, title=str(code))

    return wrapper


def query_of(request: Request) -> dict[str, list[str]]:
    query: dict[str, list[str]] = {}
    for k, value in request.query_params.multi_items():
        query.setdefault(k, []).append(value)
    return query


def parse_id(text: str, what: str) -> int:
    if (
        not text.isascii()
        or not text.isdigit()
        or len(text) > 10
        or not 1 <= int(text) <= INT32_MAX
    ):
        raise NotFound(f"no {what} with id {text[:20]!r}")
    return int(text)


# --- pages ------------------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
@shown
def index(request: Request) -> HTMLResponse:
    """Every sweep, newest first: status, trial counts, progress and ETA."""
    store = request.app.state.store
    query = query_of(request)
    status = v.param(query, "status") or None
    if status is not None and status not in SWEEP_STATUSES:
        raise InvalidInput(f"unknown value {status!r}", field="status", allowed=SWEEP_STATUSES)
    page = v.page_number(query)
    size = min(v.PAGE_SIZE, store.settings.max_page_size)
    sweeps, total = store.list_sweeps(status=status, offset=(page - 1) * size, limit=size)
    return render(
        "index.html",
        title="sweeps",
        page_link=lambda n: v.url("/", {"status": status, "page": n}),
        sweeps=sweeps,
        total=total,
        status=status,
        statuses=SWEEP_STATUSES,
        pages=v.pages(total, page, size),
        active=any(s.status in v.ACTIVE for s in sweeps),
        poll=v.url(
            f"{v.API}/sweeps",
            {"status": status, "offset": (page - 1) * size or None, "limit": size},
        ),
        counts=v.counts_text,
        done=v.trials_done,
    )


@router.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
@shown
def sweep_page(request: Request, sweep_id: str) -> HTMLResponse:
    """One sweep: its state, plots, downloads and trials."""
    store = request.app.state.store
    sweep = store.get_sweep(parse_id(sweep_id, "sweep"))
    query = query_of(request)
    swept = v.filter_axes(sweep.spec)  # a model_params axis as model_params.<name> ones
    fields = v.trial_fields(sweep.spec)  # the table's columns: the axes and sampled parameters
    table = v.table_query(query, fields)
    plot = v.plot_choice(query, swept, sweep.spec)
    rows, total, size = table_rows(store, sweep.id, table)
    path = f"/sweeps/{sweep.id}"
    return render(
        "sweep.html",
        title=f"sweep {sweep.id}: {sweep.name}",
        sweep=sweep,
        path=path,
        swept=swept,
        fields=fields,
        sampled=v.sampled(sweep.spec),
        best=best_trial(store, sweep.id, sweep.spec),
        fixed=v.fixed(sweep.spec),
        table=table,
        rows=rows,
        total=total,
        pages=v.pages(total, table.page, size),
        page_link=lambda n: v.url(path, table.params(page=n) | plot),
        header=sort_header(path, table, fields, plot),
        columns=v.SUMMARY_COLUMNS,
        plot=plot,
        plot_src=v.plot_url(sweep.id, plot, table.where),
        plot_png=v.plot_url(sweep.id, plot, table.where, fmt="png"),
        plot_chart=v.chart_url(v.plot_url, plot["kind"], sweep.id, plot, table.where),
        quick=[
            (k, v.url(path, table.params() | v.default_plot(k, swept, sweep.spec)))
            for k in v.sweep_kinds(sweep.spec)
        ],
        keep_table=v.pairs(table.params()),
        keep_plot=v.pairs(plot),
        kinds=v.sweep_kinds(sweep.spec),
        takes=v.PLOT_TAKES,
        options=v.plot_options(list(swept)),
        metrics=known_metrics(),  # a lab's registered per-tap metrics too
        downloads=downloads(
            sweep.id, table.where, plot.get("metric"), store.settings.max_page_size
        ),
        # Logged in (the cookie) or reads need the token anyway: no second ask to cancel.
        token_required=bool(request.app.state.settings.api_token)
        and not getattr(request.state, "authorized", False),
        active=sweep.status in v.ACTIVE,
        counts=v.counts_text,
        done=v.trials_done,
        text_of=v.text_of,
    )


@router.get("/sweeps/{sweep_id}/trials.csv")
@shown
def trials_csv(request: Request, sweep_id: str) -> Response:
    """The sweep's trials as CSV, one row each, in the page's filter and order: trial_id, index,
    every swept field (grid axes and sampled parameters), status, attempts, epochs and records
    done of their totals, last_epoch, diverged_epoch, results_from, the last epoch's scalar
    metrics (NaN and ±inf spelled as the API's CSV does) and the error."""
    from api.tables import csv_chunks

    store = request.app.state.store
    sweep = store.get_sweep(parse_id(sweep_id, "sweep"))
    fields = v.trial_fields(sweep.spec)
    table = v.table_query(query_of(request), fields)
    every = v.sort_trials(all_trials(store, sweep.id, table), table.sort, table.desc)
    body = b"".join(csv_chunks(trials_frame(every, fields)))
    name = f"sweep-{sweep.id}-trials.csv"
    headers = {**HEADERS, "Content-Disposition": f'attachment; filename="{name}"'}
    return Response(body, media_type="text/csv; charset=utf-8", headers=headers)


TRIAL_COLUMNS = ("status", "attempts", "epochs_done", "epochs_total", "records_done",
                 "records_total", "last_epoch", "diverged_epoch", "results_from")  # fmt: skip


def trials_frame(trials: list[TrialInfo], fields: list[str]) -> pd.DataFrame:
    """One row per trial (trials_csv's columns); integer columns that may be missing are
    nullable, the scalar metrics floats."""
    rows = [
        {
            "trial_id": t.id,
            "index": t.index,
            **{f: t.config.get(f) for f in fields},
            **{c: getattr(t, c) for c in TRIAL_COLUMNS},
            **{m: t.summary.get(m, math.nan) for m in SCALAR_METRICS},
            "error": t.error,
        }
        for t in trials
    ]
    columns = ["trial_id", "index", *fields, *TRIAL_COLUMNS, *SCALAR_METRICS, "error"]
    frame = pd.DataFrame(rows, columns=columns)
    for c in ("last_epoch", "diverged_epoch", "results_from"):
        frame[c] = frame[c].astype("Int64")
    return frame.astype({m: "float64" for m in SCALAR_METRICS})


@router.get("/compare", response_class=HTMLResponse)
@shown
def compare_page(request: Request) -> HTMLResponse:
    """Several sweeps (the index page's checkboxes, or ids typed there): what tells them
    apart, one figure with a line per sweep, and their rows as CSV."""
    from service.plots.compare import COMPARE_KINDS, differing_fields, sweep_labels

    store = request.app.state.store
    query = query_of(request)
    ids = v.compare_ids(query)
    sweeps = [store.get_sweep(i) for i in ids]
    specs = {s.id: s.spec for s in sweeps}
    plot = v.compare_choice(query, [s.spec for s in sweeps])
    swept = list(dict.fromkeys(a for s in sweeps for a in v.axes(s.spec) if a != "seed"))
    base = f"{v.API}/compare/metrics"
    csv = {"sweep": ids, "format": "csv"}
    links = [
        ("every metric, every epoch (CSV)", v.url(base, csv)),
        ("last epoch of each trial (CSV)", v.url(base, {**csv, "epoch": "last"})),
        ("mean, std, 95% CI over seeds (CSV)", v.url(base, {**csv, "aggregate": True})),
    ]
    if metric := plot.get("metric"):
        links.append((f"{metric} only (CSV)", v.url(base, {**csv, "metric": metric})))
    return render(
        "compare.html",
        title=f"sweeps {', '.join(map(str, ids))} compared",
        ids=ids,
        sweeps=sweeps,
        labels=sweep_labels(specs),
        differing=differing_fields(specs),
        plot=plot,
        kinds=COMPARE_KINDS,
        takes=v.PLOT_TAKES,
        metrics=known_metrics(),  # a lab's registered per-tap metrics too
        group_by=["epoch", *swept],
        plot_src=v.compare_plot_url(ids, plot),
        plot_png=v.compare_plot_url(ids, plot, fmt="png"),
        plot_chart=v.chart_url(v.compare_plot_url, plot["kind"], ids, plot),
        downloads=links,
    )


@router.get("/trials/{trial_id}", response_class=HTMLResponse)
@shown
def trial_page(request: Request, trial_id: str) -> HTMLResponse:
    """One trial: config, state, last epoch's scalar metrics and its plots."""
    store = request.app.state.store
    trial = store.get_trial(parse_id(trial_id, "trial"))
    sweep = store.get_sweep(trial.sweep_id)
    swept = v.axes(sweep.spec)
    recorded = recorded_layer_metrics(trial.config)
    plots = [
        {
            "src": v.plot_url(sweep.id, p, trial=trial.id),
            "full": v.plot_url(sweep.id, p, trial=trial.id, fmt="png"),
            "chart": v.chart_url(v.plot_url, p["kind"], sweep.id, p, trial=trial.id),
            "alt": f"{p.get('metric', 'training curves')} of trial {trial.id}",
        }
        for p in trial_plots(recorded, trial.config, stored_finite(store, trial.id))
    ]
    return render(
        "trial.html",
        title=f"trial {trial.id} of sweep {sweep.id}",
        trial=trial,
        sweep=sweep,
        swept=swept,
        config=sorted(trial.config.items(), key=lambda kv: (kv[0] not in swept, kv[0])),
        scalars=[(m, trial.summary.get(m)) for m in SCALAR_METRICS],
        plots=plots,
        init_only=trial.config.get("epochs") == 0,
        recorded=[
            (
                m,
                METRIC_LABELS.get(m, m),
                v.plot_url(sweep.id, {"kind": "layer_profile", "metric": m}, trial=trial.id),
            )
            for m in recorded
        ],
        csv=v.url(f"{v.API}/sweeps/{sweep.id}/metrics", {"trial": trial.id, "format": "csv"}),
        active=trial.status in v.ACTIVE,
    )


# --- parts ------------------------------------------------------------------------------------


def recorded_layer_metrics(config: dict[str, Any]) -> tuple[str, ...]:
    """The per-layer metrics a trial's model records (service.models.layer_metrics), in
    LAYER_METRICS' order; a stored config that no longer validates gets the MLP's."""
    return layer_metrics(trial_config(config))


def trial_config(config: dict[str, Any]) -> TrialConfig:
    try:
        return TrialConfig.model_validate(config)
    except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
        return TrialConfig()


def first_gap(
    recorded: tuple[str, ...], config: dict[str, Any], finite: Callable[[str], bool | None]
) -> str | None:
    """The isometry gap a trial page draws first: of the family's gaps and then their range gaps
    (service.plots.defaults.preferred_gaps), the first with a finite stored value; `finite(m)`
    says whether m has one (None: nothing stored yet). Before anything is stored, the family's
    choice for its shape (a range gap where n > d makes every gap +∞); where no gap has a
    finite value, the family's first gap (its +∞ pinned and counted)."""
    order = preferred_gaps(recorded)
    if not order:
        return None
    stored = False
    for m in order:
        has = finite(m)
        stored = stored or has is not None
        if has:
            return m
    if not stored:
        return family_gap([trial_config(config)])
    return order[0]


def trial_plots(
    recorded: tuple[str, ...],
    config: dict[str, Any],
    finite: Callable[[str], bool | None] = lambda m: None,
) -> list[dict[str, Any]]:
    """The trial page's plots, one per row: its first gap (first_gap) and gradient norm over
    layers, the token gap for a transformer, and the training curves unless it is init-only
    (epochs 0, whose page says so instead of drawing an axes with one point)."""
    gap = first_gap(recorded, config, finite)
    chosen = [m for m in (gap, "grad_norm", "token_isometry_gap") if m and m in recorded]
    plots: list[dict[str, Any]] = [{"kind": "layer_profile", "metric": m} for m in chosen]
    if config.get("epochs") != 0:
        plots.append({"kind": "training_curves"})
    return plots


def stored_finite(store: Store, trial_id: int) -> Callable[[str], bool | None]:
    """finite(m) for first_gap: whether any stored value of the trial's metric m is finite
    (None when none is stored)."""

    def finite(metric: str) -> bool | None:
        try:
            _, values = store.trial_history(trial_id, metric)
        except IsosweepError:  # too many points to weigh here: count it as drawable
            return True
        return bool(np.isfinite(values).any()) if values.size else None

    return finite


def sort_header(
    path: str, table: v.TableQuery, axis_names: list[str], plot: dict[str, Any]
) -> list[tuple[str, str, str]]:
    """(label, href, state) of each trials-table column: a click sorts by it, a second click
    reverses; state is "asc", "desc" or ""."""
    labels = {"index": "trial", "epoch": "epoch", "diverged": "diverged at", "error": "error"}
    out = []
    for col in v.sort_columns(axis_names):
        state = ("desc" if table.desc else "asc") if table.sort == col else ""
        flip = "asc" if state == "desc" else "desc" if state == "asc" else None
        href = v.url(path, table.params(sort=col, dir=flip, page=None) | plot)
        out.append((labels.get(col, col), href, state))
    return out


def table_rows(store: Store, sweep_id: int, q: v.TableQuery) -> tuple[list[TrialInfo], int, int]:
    """One page of the trials table, and the number of trials matching. The store pages in
    expansion order itself; any other order reads every matching trial (a sweep holds at most
    ISOSWEEP_MAX_TRIALS_PER_SWEEP) and sorts them here."""
    size = min(v.PAGE_SIZE, store.settings.max_page_size)
    offset = (q.page - 1) * size

    def page(start: int, n: int) -> tuple[list[TrialInfo], int]:
        return store.list_trials(sweep_id, status=q.status, where=q.where, offset=start, limit=n)

    if q.sort == "index" and not q.desc:
        rows, total = page(offset, size)
        return rows, total, size
    ordered = v.sort_trials(all_trials(store, sweep_id, q), q.sort, q.desc)
    return ordered[offset : offset + size], len(ordered), size


def all_trials(store: Store, sweep_id: int, q: v.TableQuery) -> list[TrialInfo]:
    """Every trial matching the table's status and config filters, in expansion order, read a
    page of the store's largest size at a time."""
    every: list[TrialInfo] = []
    chunk = store.settings.max_page_size
    while True:
        part, total = store.list_trials(
            sweep_id, status=q.status, where=q.where, offset=len(every), limit=chunk
        )
        every += part
        if not part or len(every) >= total:
            return every


def downloads(
    sweep_id: int, where: dict[str, list[str]], metric: str | None, max_page: int
) -> list[tuple[str, str]]:
    """(label, href) of the sweep's CSV files (and its trials as JSON, as many as one page of
    the API holds), with the page's config filters."""
    base = f"{v.API}/sweeps/{sweep_id}/metrics"
    csv = {**where, "format": "csv"}
    links = [
        ("every metric, every epoch (CSV)", v.url(base, csv)),
        ("last epoch of each trial (CSV)", v.url(base, {**csv, "epoch": "last"})),
        ("mean, std, 95% CI over seeds (CSV)", v.url(base, {**csv, "aggregate": True})),
    ]
    if metric:
        links.append((f"{metric} only (CSV)", v.url(base, {**csv, "metric": metric})))
    links.append(
        ("trials (JSON)", v.url(f"{v.API}/sweeps/{sweep_id}/trials", {**where, "limit": max_page}))
    )
    links.append(("trials (CSV): swept and sampled fields, status, epochs, last metrics",
                  v.url(f"/sweeps/{sweep_id}/trials.csv", where)))  # fmt: skip
    return links
