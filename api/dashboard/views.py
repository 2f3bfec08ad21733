"""What the dashboard's templates show, computed from the store's SweepInfo / TrialInfo: number
and time formatting (NaN/±inf as NaN/∞/−∞), a sweep's axes, the trials table (filter, sort,
page) and the plot choices with defaults that suit the sweep. No FastAPI here."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup, escape

from service.config import FILTER_FIELDS
from service.errors import InvalidInput
from service.metric_names import is_loop_scalar
from service.models import known_metrics
from service.param_columns import FIELD as PARAMS
from service.param_columns import canonical, param_of, spec_param_axes
from service.plots import PLOT_KINDS, PLOT_PARAMETERS
from service.plots.defaults import default_metric, default_metric_of, sweep_configs
from service.plots.search import SEARCH_PARAMETERS, SEARCH_PLOT_KINDS
from service.spec import SweepSpec, swept_fields_of, swept_values_of
from service.status import TrialStatus, trials_finished
from service.store import TrialInfo
from service.store.models import TRIAL_STATUSES

ACTIVE = frozenset({TrialStatus.QUEUED, TrialStatus.RUNNING})  # a page polls while any is
PAGE_SIZE = 50  # rows of a trials or sweeps page
SUMMARY_COLUMNS = ("train_loss", "test_loss", "train_acc", "test_acc")
API = "/api/v1"

# The optional parameters each plot kind reads that a page can set (the others are an error).
PLOT_TAKES: dict[str, tuple[str, ...]] = {
    kind: tuple(p for p in ("x", "group_by", "epoch", "layer", "stat", "yscale") if p in takes)
    for kind, takes in {**PLOT_PARAMETERS, **SEARCH_PARAMETERS}.items()
}
ALL_PLOT_KINDS = (*PLOT_KINDS, *SEARCH_PLOT_KINDS)  # service/plots/search.py: a search's
# The kinds a page draws in the browser from their JSON (static/charts.js); a heatmap stays the
# API's image (a line-chart library draws no colour grid as well as matplotlib does).
CHART_KINDS = frozenset(ALL_PLOT_KINDS) - {"heatmap"}
PLOT_OPTIONS = ("metric", "x", "group_by", "epoch", "layer", "stat", "yscale")


def sweep_kinds(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The kinds a sweep's page offers: every metric kind (theory_overlay only where the theory
    draws a gap the sweep's family records: overlay_metric), the search kinds for a sampled
    search (service/plots/search.py), halving_rungs for early stopping."""
    kinds = [k for k in PLOT_KINDS if k != "theory_overlay" or overlay_metric(spec) is not None]
    if spec.get("search"):
        kinds += [k for k in SEARCH_PLOT_KINDS if k != "halving_rungs"]
    if spec.get("early_stop"):
        kinds.append("halving_rungs")
    return tuple(kinds)


# --- formatting -------------------------------------------------------------------------------


def number(x: float | int | str | None, digits: int = 4) -> Markup:
    """A value for a table cell: 4 significant digits; NaN, ∞ and −∞ in their own style (the
    API spells them "NaN", "Infinity", "-Infinity"; those strings are accepted too)."""
    if x is None:
        return Markup('<span class="none">—</span>')
    value = float(x)
    if math.isnan(value):
        return Markup('<span class="nonfinite" title="NaN">NaN</span>')
    if math.isinf(value):
        sign, word = ("", "+inf") if value > 0 else ("−", "−inf")
        return Markup(f'<span class="nonfinite" title="{word}">{sign}∞</span>')
    return escape(f"{value:.{digits}g}")


def duration(seconds: float | None) -> str:
    """An ETA or elapsed time a person reads at a glance: 42 s, 3 min, 1 h 20 min."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s} s"
    minutes = round(s / 60)
    if minutes < 60:
        return f"{minutes} min"
    h, m = divmod(minutes, 60)
    return f"{h} h {m} min" if m else f"{h} h"


def when(t: datetime | None) -> str:
    return "—" if t is None else t.strftime("%Y-%m-%d %H:%M:%S UTC")


def percent(fraction: float) -> str:
    # Floor, so that 100% means done (99.6% stays 99%).
    return f"{math.floor(fraction * 100 + 1e-9):d}%"


def url(path: str, params: Mapping[str, Any] | None = None) -> str:
    """path?query with list values repeated and empty values left out."""
    items = pairs(params)
    return f"{path}?{urlencode(items)}" if items else path


def pairs(params: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(name, text) of query parameters: lists repeated, None and "" left out (also the
    hidden inputs that carry one form's state through another)."""
    out = []
    for k, v in (params or {}).items():
        for item in v if isinstance(v, list | tuple) else [v]:
            if item is not None and item != "":
                out.append((k, text_of(item)))
    return out


def shown(v: Any) -> str:
    """A config value in a table: booleans as true/false, a missing one as —."""
    return "—" if v is None else text_of(v)


def text_of(v: Any) -> str:
    """A config value as the query string spells it (booleans as true/false)."""
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


# --- a sweep's shape --------------------------------------------------------------------------


def axes(spec: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The swept fields whose values are known from the spec (grid and linked axes, derived
    fields: service.spec.swept_values) and their values, in the spec's order, then `seed`."""
    return {k: v for k, v in swept_values_of(spec).items() if v is not None}


def filter_axes(spec: Mapping[str, Any]) -> dict[str, list[Any]]:
    """`axes`, with a model_params axis given as one axis per parameter its entries write
    (`model_params.<name>`, service.param_columns): the filters and group-bys a page offers."""
    out: dict[str, list[Any]] = {}
    for name, values in axes(spec).items():
        if name == PARAMS:
            out |= spec_param_axes(spec)
        else:
            out[name] = values
    return out


def trial_fields(spec: Mapping[str, Any]) -> list[str]:
    """The trials table's config columns: every field the sweep varies, in the spec's order —
    its grid axes and its sampled (random, Sobol, TPE) parameters — then `seed`."""
    return swept_fields_of(spec)


def sampled(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The sampled parameters and their distributions as the spec writes them."""
    return {k: spec["parameters"][k] for k in _stored(spec).sampled}


def fixed(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters every trial of the sweep shares."""
    return _stored(spec).fixed


def _stored(spec: Mapping[str, Any]) -> SweepSpec:
    """A SweepSpec over a spec the store validated already (not validated again)."""
    return SweepSpec.model_construct(**spec)


def counts_text(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    """(status, n) for the statuses that have trials, in the usual order."""
    return [(s, counts.get(s, 0)) for s in TRIAL_STATUSES if counts.get(s, 0)]


def trials_done(counts: Mapping[str, int]) -> int:
    return trials_finished(counts)


# --- the trials table -------------------------------------------------------------------------


@dataclass
class TableQuery:
    """What the trials table shows: a status, config filters, a sort column and a page."""

    status: str | None = None
    where: dict[str, list[str]] = field(default_factory=dict)
    sort: str = "index"
    desc: bool = False
    page: int = 1

    def params(self, **change: Any) -> dict[str, Any]:
        """The query string of this table (with `change` applied), for links and forms."""
        p: dict[str, Any] = {"status": self.status, **self.where}
        p |= {
            "sort": None if self.sort == "index" else self.sort,
            "dir": "desc" if self.desc else None,
        }
        p["page"] = self.page if self.page > 1 else None
        p |= change
        return p


def sort_columns(axis_names: list[str]) -> tuple[str, ...]:
    return ("index", *axis_names, "status", "epoch", *SUMMARY_COLUMNS, "diverged", "error")


def table_query(query: Mapping[str, list[str]], axis_names: list[str]) -> TableQuery:
    """Read the table's parameters from the page's query string.

    Raises:
        InvalidInput: an unknown status, sort column or direction, or a bad page (named).
    """
    status = param(query, "status") or None
    if status is not None and status not in TRIAL_STATUSES:
        raise InvalidInput(f"unknown value {status!r}", field="status", allowed=TRIAL_STATUSES)
    sort = param(query, "sort") or "index"
    allowed = sort_columns(axis_names)
    if sort not in allowed:
        raise InvalidInput(f"unknown column {sort!r}", field="sort", allowed=allowed)
    direction = param(query, "dir") or "asc"
    if direction not in ("asc", "desc"):
        raise InvalidInput(f"unknown value {direction!r}", field="dir", allowed=("asc", "desc"))
    names = [*FILTER_FIELDS, *(k for k in query if param_of(k) is not None)]  # model_params.<p>
    where = {k: [v for v in query[k] if v != ""] for k in names if k in query}
    where = {k: v for k, v in where.items() if v}
    return TableQuery(status, where, sort, direction == "desc", page_number(query))


def page_number(query: Mapping[str, list[str]]) -> int:
    text = param(query, "page") or "1"
    # The length first: int() of over 4300 digits raises ValueError, not a bounds check.
    if not text.isascii() or not text.isdigit() or len(text) > 7 or not 1 <= int(text) <= 10**6:
        raise InvalidInput(f"a page number 1, 2, …, got {text[:20]!r}", field="page")
    return int(text)


def param(query: Mapping[str, list[str]], name: str) -> str:
    """The last value of a query parameter, stripped; "" when absent."""
    values = query.get(name) or [""]
    return values[-1].strip()


def sort_trials(trials: list[TrialInfo], column: str, desc: bool) -> list[TrialInfo]:
    """Trials by one column; missing values (None) last and NaN just before them, whichever
    the direction, so a sort by loss shows real numbers first."""
    key = _column_key(column)
    values = [(key(t), t) for t in trials]
    present = [(v, t) for v, t in values if v is not None and not _is_nan(v)]
    nans = [t for v, t in values if v is not None and _is_nan(v)]
    missing = [t for v, t in values if v is None]
    try:
        present.sort(key=lambda vt: vt[0], reverse=desc)
    except TypeError:  # mixed types in one config column: compare as text
        present.sort(key=lambda vt: str(vt[0]), reverse=desc)
    return [t for _, t in present] + nans + missing


def _column_key(column: str) -> Callable[[Any], Any]:
    if column in SUMMARY_COLUMNS:
        return lambda t: t.summary.get(column)
    if column == "index":
        return lambda t: t.index
    if column == "status":
        return lambda t: TRIAL_STATUSES.index(t.status)
    if column == "epoch":
        return lambda t: t.last_epoch
    if column == "diverged":
        return lambda t: t.diverged_epoch
    if column == "error":
        return lambda t: t.error
    return lambda t: _sortable(t.config.get(column))


def _sortable(value: Any) -> Any:
    """A config value as a sort key: a document (model_params) as its canonical JSON text."""
    return canonical(value) if isinstance(value, dict | list) else value


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def pages(total: int, page: int, size: int = PAGE_SIZE) -> dict[str, int]:
    last = max(math.ceil(total / size), 1)
    first_row = (page - 1) * size + 1 if total else 0
    return {"page": page, "last": last, "first": first_row, "to": min(page * size, total)}


# --- plots ------------------------------------------------------------------------------------


def default_plot(kind: str | None, swept: Mapping[str, list[Any]], spec: Mapping[str, Any]) -> dict:
    """Plot options that suit the sweep: ‖∂L/∂W₁‖ against depth (Meterez et al. 2024) when
    depth is swept, grouped by the next axis; else the isometry gap over layers (Joudaki et al.
    2023). `swept` is axes(spec); `kind` None picks the kind too."""
    names = [a for a in swept if a != "seed"]
    if kind is None:
        kind = "depth_scaling" if "depth" in names else "layer_profile"
    choice: dict[str, Any] = {"kind": kind}
    if kind == "depth_scaling":
        choice |= {"metric": default_metric(kind, spec), "layer": 1}
        numeric = [a for a in names if all(_is_number(v) for v in swept[a])]
        x = "depth" if "depth" in names or not numeric else numeric[0]
        choice |= {"x": x} if x != "depth" else {}
        others = [a for a in names if a != x]
        choice |= {"group_by": others[0]} if others else {}
    elif kind in ("layer_profile", "heatmap"):  # a heatmap's axes: default_axes, from the spec
        choice["metric"] = default_metric(kind, spec)
    elif kind == "theory_overlay" and (metric := overlay_metric(spec)) is not None:
        choice["metric"] = metric  # the REST route's default where the overlay takes it
    return choice


def overlay_metric(spec: Mapping[str, Any]) -> str | None:
    """The metric a theory overlay of the sweep draws: one predict gives for every shape of the
    sweep from what its trials store (service.plots.overlay.predicted_metrics). The route's
    default (service.plots.defaults) where it is one of them; for a range gap (n > d) its gap;
    else the first such metric; None where the theory covers none (a transformer with MLP
    sublayers, a registered model), whose page then offers no overlay."""
    from service.plots.overlay import predicted_metrics

    drawable = predicted_metrics(sweep_configs(spec))
    default = str(default_metric("theory_overlay", spec)).removeprefix("range_")
    for m in (default, *drawable):
        if m in drawable:
            return m
    return None


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _known(metric: str, known: tuple[str, ...]) -> bool:
    return metric in known or is_loop_scalar(metric)  # a user's loop/ scalar (own-loop.md)


def plot_choice(
    query: Mapping[str, list[str]], swept: Mapping[str, list[Any]], spec: Mapping[str, Any]
) -> dict:
    """The plot the page shows: the kind and options from the query, or the sweep's default.

    Raises:
        InvalidInput: an unknown kind or metric (named, with the allowed values).
    """
    kind = param(query, "kind") or None
    if kind is not None and kind not in ALL_PLOT_KINDS:
        raise InvalidInput(f"unknown value {kind!r}", field="kind", allowed=ALL_PLOT_KINDS)
    if not any(param(query, k) for k in PLOT_OPTIONS):
        return default_plot(kind, swept, spec)
    choice = {"kind": kind or default_plot(None, swept, spec)["kind"]}
    choice |= {k: param(query, k) for k in PLOT_OPTIONS if param(query, k)}
    if choice.get("metric") and not _known(choice["metric"], known := known_metrics()):
        raise InvalidInput(f"unknown value {choice['metric']!r}", field="metric", allowed=known)
    return choice


def plot_url(sweep_id: int, choice: Mapping[str, Any], where: Mapping[str, Any] | None = None,
             *, trial: int | None = None, fmt: str = "svg") -> str:  # fmt: skip
    """The API's plot route for a choice, passing only the options the kind takes."""
    kind = choice["kind"]
    params: dict[str, Any] = {"metric": choice.get("metric")}
    params |= {k: choice.get(k) for k in PLOT_TAKES[kind]}
    params |= {**(where or {}), "trial": trial, "format": fmt}
    return url(f"{API}/sweeps/{sweep_id}/plots/{kind}", params)


def chart_url(url_of: Callable[..., str], kind: str, *args: Any, **kwargs: Any) -> str | None:
    """The JSON route of a plot the page draws as a chart (`url_of` with fmt="json": plot_url,
    compare_plot_url), or None for a kind it shows as the API's image (CHART_KINDS)."""
    return url_of(*args, **kwargs, fmt="json") if kind in CHART_KINDS else None


def plot_options(axis_names: list[str]) -> dict[str, list[str]]:
    """The values the plot form offers for x and group_by."""
    fields = [a for a in axis_names if a != "seed"]
    return {"x": ["layer", "epoch", *fields], "group_by": ["epoch", *fields]}


# --- comparing sweeps -------------------------------------------------------------------------

COMPARE_OPTIONS = ("metric", "group_by", "epoch", "layer", "stat", "yscale")


def compare_ids(query: Mapping[str, list[str]]) -> list[int]:
    """The compared sweeps: repeated `sweep` (the index page's checkboxes: oldest first) and
    the ids typed in `sweeps` ("3 4" or "3, 4"; in the order typed), each once.

    Raises:
        InvalidInput: an id that is not a number (field `sweeps`), or service.plots.compare's
            check (none, or too many).
    """
    from service.plots.compare import check_sweep_ids

    ticked = query.get("sweep") or []
    texts = sorted(ticked, key=lambda t: (len(t), t))  # numeric order of digit strings
    for typed in query.get("sweeps") or []:
        texts += typed.replace(",", " ").split()
    ids = []
    for t in texts:
        t = t.strip()
        if not t.isascii() or not t.isdigit() or len(t) > 10:
            raise InvalidInput(f"sweep ids are numbers, got {t[:20]!r}", field="sweeps")
        ids.append(int(t))
    return check_sweep_ids(ids)


def compare_default(specs: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The compare page's figure when none is asked for, one that applies to every compared
    sweep: ‖∂L/∂W₁‖ against depth where each of them varies depth (a sweep of one depth has
    no depth column to put on x); else the profile over layers of a gap every sweep's family
    records (service.plots.defaults.default_metric_of, pooled over their shapes); else the
    training curves (every family records the losses)."""
    from service.models import layer_metrics

    if all(len(axes(s).get("depth") or []) > 1 for s in specs):
        return {"kind": "depth_scaling", "metric": default_metric_of("depth_scaling", specs),
                "layer": 1}  # fmt: skip
    gap = default_metric_of("layer_profile", specs)
    configs = [c for s in specs for c in sweep_configs(s)]
    if all(gap in layer_metrics(c) for c in configs):
        return {"kind": "layer_profile", "metric": gap}
    return {"kind": "training_curves"}


def compare_choice(
    query: Mapping[str, list[str]], specs: list[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """The compare page's plot: the kind and options given, or compare_default(specs) when
    neither a kind nor an option is given (a kind alone: its defaults are the route's).

    Raises:
        InvalidInput: an unknown kind or metric (named, with the allowed values).
    """
    from service.plots.compare import COMPARE_KINDS

    given = param(query, "kind")
    if not given and not any(param(query, k) for k in COMPARE_OPTIONS):
        return compare_default(list(specs or []))
    kind = given or compare_default(list(specs or []))["kind"]
    if kind not in COMPARE_KINDS:
        raise InvalidInput(f"unknown value {kind!r}", field="kind", allowed=COMPARE_KINDS)
    choice: dict[str, Any] = {"kind": kind}
    choice |= {k: param(query, k) for k in COMPARE_OPTIONS if param(query, k)}
    if choice.get("metric") and not _known(choice["metric"], known := known_metrics()):
        raise InvalidInput(f"unknown value {choice['metric']!r}", field="metric", allowed=known)
    return choice


def compare_plot_url(ids: list[int], choice: Mapping[str, Any], *, fmt: str = "svg") -> str:
    """The API's compare plot route for a choice, passing only the options the kind takes."""
    kind = choice["kind"]
    params: dict[str, Any] = {"sweep": ids, "metric": choice.get("metric")}
    params |= {k: choice.get(k) for k in PLOT_TAKES[kind]}
    return url(f"{API}/compare/plots/{kind}", {**params, "format": fmt})
