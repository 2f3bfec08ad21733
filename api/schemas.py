"""What the REST API sends and how it spells it: the public response models and the JSON
response class that writes NaN/±inf as "NaN", "Infinity", "-Infinity" (service.jsonfmt).

Models are named for what they are: SweepPublic (one sweep), SweepsPublic (a page of them,
`{"data": [...], "count": N}`), TrialPublic, TrialsPublic, MetricsPublic, ActivationPublic,
ActivationsPublic, HealthPublic and ErrorPublic (the one error shape, api/errors.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, PlainSerializer, WithJsonSchema
from starlette.responses import JSONResponse

from service import jsonfmt
from service.store.models import SWEEP_STATUSES, TRIAL_STATUSES

# A float that may be NaN or ±inf: a JSON number when finite, else one of three strings.
NONFINITE_SPELLINGS = tuple(jsonfmt.NONFINITE)  # "NaN", "Infinity", "-Infinity"
REAL_SCHEMA = {
    "anyOf": [{"type": "number"}, {"type": "string", "enum": list(NONFINITE_SPELLINGS)}],
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


class SweepPublic(BaseModel):
    """A sweep with its trials' counts by status, progress (0..1) and ETA."""

    id: int
    name: str
    description: str | None
    tags: list[str]
    status: SweepStatus
    priority: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    counts: dict[str, int] = Field(description="trials by status (all six statuses present)")
    n_trials: int
    progress: float = Field(description="recorded epochs over expected epochs, 0..1")
    eta_s: float | None = Field(description="seconds left (running sweeps), else null")
    cancel_requested: bool
    runner_id: str | None
    error: str | None
    spec: dict[str, Any] = Field(description="the validated SweepSpec")


class SweepsPublic(BaseModel):
    """A page of sweeps, newest first, and how many match in all."""

    data: list[SweepPublic]
    count: int


class TrialPublic(BaseModel):
    """One trial: config, status, progress and the last recorded epoch's scalar metrics."""

    id: int
    sweep_id: int
    index: int = Field(description="position in the sweep's expansion")
    config: dict[str, Any] = Field(description="the resolved TrialConfig")
    config_hash: str
    status: TrialStatus
    attempts: int
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    epochs_done: int
    epochs_total: int
    last_epoch: int | None
    diverged_epoch: int | None
    results_from: int | None = Field(description="the trial whose stored results this reuses")
    summary: dict[str, Real] = Field(description="scalar metrics of the last recorded epoch")


class TrialsPublic(BaseModel):
    """A page of a sweep's trials in expansion order, and how many match in all."""

    data: list[TrialPublic]
    count: int


# --- metrics --------------------------------------------------------------------------------

CELL_SCHEMA = {
    "anyOf": [
        {"type": "number"},
        {"type": "string"},
        {"type": "boolean"},
        {"type": "null"},
    ]
}
Cell = Annotated[Any, WithJsonSchema(CELL_SCHEMA)]


class MetricsPublic(BaseModel):
    """A page of tidy rows: trial_id, the sweep's swept config fields, epoch, metric, layer
    (null for scalar metrics) and value; aggregated, mean, std, ci95, count and n_finite
    instead of trial_id, seed and value. NaN/±inf are the strings "NaN", "Infinity",
    "-Infinity"."""

    data: list[dict[str, Cell]]
    count: int = Field(description="rows matching in all (the page holds at most `limit`)")
    columns: list[str] = Field(description="the row keys, in order")


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


class HealthPublic(BaseModel):
    """Liveness: the database answers a query, and where Ray stands."""

    status: Literal["ok", "degraded"]
    version: str
    database: DatabaseHealth
    ray: RayHealth
