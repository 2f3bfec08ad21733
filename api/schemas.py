"""What the REST API sends and how it spells it: the public response models and the JSON
response class that writes NaN/±inf as "NaN", "Infinity", "-Infinity" (service.jsonfmt).

Models are named for what they are: SweepPublic (one sweep), SweepsPublic (a page of them,
`{"data": [...], "count": N}`), TrialPublic, TrialsPublic, MetricsPublic, ActivationPublic,
ActivationsPublic, HealthPublic, ErrorPublic (the one error shape, api/errors.py) and ChartPublic
(a plot's JSON form).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, PlainSerializer, WithJsonSchema
from starlette.responses import JSONResponse

from service import jsonfmt
from service.config import METRICS
from service.store.models import SWEEP_STATUSES, TRIAL_STATUSES
from service.store.schemas import SweepInfo, TrialInfo

# A float that may be NaN or ±inf: a JSON number when finite, else one of three strings.
NONFINITE_SPELLINGS = tuple(jsonfmt.NONFINITE)  # "NaN", "Infinity", "-Infinity"
NONFINITE_SCHEMA = {
    "type": "string",
    "enum": list(NONFINITE_SPELLINGS),
    "title": "NonFinite",
    "description": "a float that is NaN, +inf or −inf, as JSON spells it here",
}
# the document holds NONFINITE_SCHEMA as a component of its own (api.openapi.finish): one enum
# for a generated client, not one per field
REAL_SCHEMA = {
    "anyOf": [{"type": "number"}, {"$ref": "#/components/schemas/NonFinite"}],
    "description": 'a number; NaN and ±inf are the strings "NaN", "Infinity", "-Infinity"',
}
Real = Annotated[
    float,
    PlainSerializer(jsonfmt.encode_float, return_type=float | str, when_used="json"),
    WithJsonSchema(REAL_SCHEMA),
]

SweepStatus = Literal[SWEEP_STATUSES]  # type: ignore[valid-type]
TrialStatus = Literal[TRIAL_STATUSES]  # type: ignore[valid-type]


class NonFiniteJSONResponse(JSONResponse):
    """application/json that never holds the non-standard tokens NaN / Infinity."""

    def render(self, content: Any) -> bytes:
        return jsonfmt.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()


# --- errors ---------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    type: str = Field(description="invalid_input, limit_exceeded, not_found, conflict, …")
    message: str = Field(description="what went wrong; names the field and the allowed values")
    field: str | None = Field(None, description="the offending parameter or body field")
    allowed: list[str] | None = Field(None, description="the values the field accepts")


class ErrorPublic(BaseModel):
    """Every error response: `{"error": {"type", "message", "field", "allowed"}}`."""

    error: ErrorDetail


# --- sweeps and trials ----------------------------------------------------------------------


class BestTrial(BaseModel):
    """The best completed trial so far of a sweep with a search objective or early stopping."""

    trial_id: int
    value: float = Field(description="its objective (the spec's metric at its epoch)")
    epoch: int = Field(description="the epoch the value was recorded at")
    metric: str
    mode: Literal["min", "max"]


class SweepPublic(SweepInfo):
    """A sweep with its trials' counts by status, progress (0..1) and ETA (the store's
    SweepInfo, with its status as an enum in the schema); `best` for one sweep read with a
    search objective or early stopping (null otherwise, and in lists)."""

    status: SweepStatus
    best: BestTrial | None = None


class SweepsPublic(BaseModel):
    """A page of sweeps, newest first, and how many match in all."""

    data: list[SweepPublic]
    count: int


class TrialPublic(TrialInfo):
    """One trial: config, status, progress and the last recorded epoch's scalar metrics (the
    store's TrialInfo, with NaN/±inf spelled as strings in JSON)."""

    status: TrialStatus
    summary: dict[str, Real] = Field(description="scalar metrics of the last recorded epoch")


class TrialsPublic(BaseModel):
    """A page of a sweep's trials in expansion order, and how many match in all."""

    data: list[TrialPublic]
    count: int


# --- metrics --------------------------------------------------------------------------------

# A row's other cells (the swept config fields, `model_params.*`, …): JSON of any kind, a float
# NaN/±inf spelled as everywhere.
CELL_SCHEMA = {
    "anyOf": [
        REAL_SCHEMA,
        {"type": "string"},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "object"},
        {"type": "array", "items": {}},
    ]
}
INT_SCHEMA = {"type": "integer"}
METRIC_ROW_SCHEMA = {
    "type": "object",
    "title": "MetricRow",
    "description": "One tidy row: trial_id, the sweep's swept config fields, epoch, metric, layer "
    "(null for a scalar metric) and value; pooled over seeds (aggregate=true), mean (then "
    "geomean or median with that stat), std, ci95, count and n_finite instead of trial_id, seed "
    "and value; compared, sweep_id and sweep (its "
    "label). Which keys a row has depends on the sweep and the query: `columns` lists them.",
    "properties": {
        "trial_id": INT_SCHEMA,
        "sweep_id": INT_SCHEMA,
        "sweep": {"type": "string", "description": "the sweep's label (compare routes)"},
        "seed": INT_SCHEMA,
        "epoch": INT_SCHEMA,
        "metric": {"type": "string", "enum": list(METRICS)},
        "layer": {"anyOf": [INT_SCHEMA, {"type": "null"}], "description": "ℓ ≥ 1; null: scalar"},
        "value": REAL_SCHEMA,
        "mean": REAL_SCHEMA,
        "geomean": {**REAL_SCHEMA, "description": "with stat=geomean: exp of the mean log"},
        "median": {**REAL_SCHEMA, "description": "with stat=median"},
        "std": REAL_SCHEMA,
        "ci95": REAL_SCHEMA,
        "count": {**INT_SCHEMA, "description": "seeds pooled"},
        "n_finite": {**INT_SCHEMA, "description": "of them, finite values"},
    },
    "additionalProperties": CELL_SCHEMA,
}
# in the document as a component of its own (api.openapi.finish)
MetricRow = Annotated[dict[str, Any], WithJsonSchema({"$ref": "#/components/schemas/MetricRow"})]


class MetricsPublic(BaseModel):
    """A page of tidy rows: trial_id, the sweep's swept config fields, epoch, metric, layer
    (null for scalar metrics) and value; aggregated, mean, std, ci95, count and n_finite
    instead of trial_id, seed and value. NaN/±inf are the strings "NaN", "Infinity",
    "-Infinity"."""

    data: list[MetricRow]
    count: int = Field(description="rows matching in all (the page holds at most `limit`)")
    columns: list[str] = Field(description="the row keys, in order")


# --- charts (a plot's JSON form: service.plots.charts) ------------------------------------

CELL = {"anyOf": [REAL_SCHEMA, {"type": "string"}, {"type": "boolean"}, {"type": "null"}]}
Cell = Annotated[float | int | str | bool | None, WithJsonSchema(CELL)]  # an axis value


class ChartAxis(BaseModel):
    """An axis as the figure draws it."""

    label: str | None
    scale: Literal["linear", "log"] = Field(description="the figure's scale")
    integer: bool = Field(description="its values count (epoch, layer, depth): integer ticks")
    ticks: list[str] | None = Field(description="category labels at 0, 1, …; null: numeric")
    range: list[Real] | None = Field(description="[lo, hi] the figure shows; null: the data's")
    base: float = Field(description="the base of a log axis")


class ChartSeries(BaseModel):
    """One line (or set of points, or bars) with its band. `y`, `lo`, `hi` hold NaN and ±inf
    as the strings "NaN", "Infinity", "-Infinity": points a chart pins at the axis edge."""

    label: str
    style: Literal["line", "dashed", "points", "step", "bars"]
    key: int = Field(description="colour slot, 0 ≤ key < the chart's keys (a prediction "
                     "shares its measurement's)")  # fmt: skip
    color: str | None = Field(description="a fixed colour (#rrggbb), or null: by key")
    shade: float | None = Field(description="0..1 on the chart's colour map, or null: by key")
    x: list[Cell]
    y: list[Real]
    lo: list[Real] | None = Field(description="the band's lower edge per point, or null")
    hi: list[Real] | None = Field(description="the band's upper edge per point, or null")
    count: list[int] | None = Field(description="values pooled into each point (seeds)")
    flags: dict[str, list[bool]] | None = Field(
        description="per-point flags of the series (e.g. unresolved), or null"
    )


class ChartGrid(BaseModel):
    """A heatmap's cells: values[i][j] at y[i], x[j]; `present` tells a NaN value from a hole."""

    label: str = Field(description="what the colour shows")
    x: list[Cell]
    y: list[Cell]
    values: list[list[Real]]
    present: list[list[bool]]


class ChartRule(BaseModel):
    """A line across the axes at a fixed x or y (σ = 1, λ = mean λ)."""

    axis: Literal["x", "y"]
    value: float
    label: str


class ChartPanel(BaseModel):
    """One axes of the figure: its caption (the figure's note), axes, series and legend title;
    `stat` names the pooled statistic (the pinned points' legend), `band` the band drawn."""

    caption: str
    x: ChartAxis
    y: ChartAxis
    legend: str | None
    stat: str | None
    band: str | None
    series: list[ChartSeries]
    grid: ChartGrid | None
    rules: list[ChartRule]


class ChartPublic(BaseModel):
    """A plot's numbers and texts for a browser chart (`format=json` on the plot routes,
    docs/api.md "Plots as JSON"): the same series the PNG/SVG draws."""

    kind: str
    title: str
    empty: str | None = Field(description="why there is nothing to draw (no data), else null")
    ordered: bool = Field(description="colours follow a numeric key (a sequential map)")
    keys: int = Field(description="colour slots used by the series")
    panels: list[ChartPanel]


# --- theory ---------------------------------------------------------------------------------


class ActivationPublic(BaseModel):
    """Hermite coefficients and isometry strength β of x ↦ σ(gain·x) (Joudaki et al. 2023)."""

    name: str
    gain: float
    formula: str
    params: dict[str, float]
    breakpoints: list[float]
    homogeneous: bool = Field(description="σ(a·x) = a^m·σ(x): β and κ do not depend on the gain")
    coefficients: list[Real] = Field(description="c₀..c_K in the basis Heₖ/√k!")
    beta: Real = Field(description="β = 2 − c₁²/Σ_{k≥1} cₖ², in [1, 2]")
    kappa_prime0: Real = Field(description="κ′(0) = 2 − β")
    moments: dict[str, Real]


class ActivationsPublic(BaseModel):
    """Every registered activation at one gain."""

    data: list[ActivationPublic]
    count: int


# --- health ---------------------------------------------------------------------------------


class DatabaseHealth(BaseModel):
    ok: bool
    backend: str = Field(description="sqlite or postgresql")
    error: str | None = None


class RayHealth(BaseModel):
    address: str | None = Field(description="RAY_ADDRESS, or null: the runner starts Ray locally")
    reachable: bool | None = Field(description="the address accepts connections; null: unknown")
    running_sweeps: int = Field(description="sweeps a runner holds now")
    runners: list[str] = Field(description="ids of the runners holding them")
    detail: str


class RunnerHealth(BaseModel):
    """The runner `isosweep serve` supervises beside the API."""

    ok: bool = Field(description="the runner process is alive")
    state: Literal["starting", "running", "restarting", "stopped"]
    pid: int | None
    runner_id: str | None = Field(description="its id in the store (the sweeps it holds)")
    restarts: int = Field(description="times it died and was started again")
    last_exit_code: int | None = Field(description="how it last exited (negative: a signal)")
    since: datetime = Field(description="when it entered this state")
    next_start_in_s: float | None = Field(description="while restarting: the back-off")


class HealthPublic(BaseModel):
    """Liveness: the database answers a query, where Ray stands, and (under `isosweep serve`)
    whether its runner is alive."""

    status: Literal["ok", "degraded"]
    version: str
    database: DatabaseHealth
    ray: RayHealth
    runner: RunnerHealth | None = Field(
        None, description="the runner `isosweep serve` supervises; null when none is"
    )
