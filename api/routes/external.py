"""External sweeps: trials recorded by the user's own training loop (`isosweep.Monitor`,
docs/own-loop.md; the store side is service/store/external.py).

    POST /external/sweeps                       {name, config}       → the sweep (found or created)
    POST /external/sweeps/{id}/trials           {run, depth, batch_size, config} → the trial
    POST /external/trials/{id}/records          {step, record}       → what was stored
    POST /external/trials/{id}/finish                                 → {trial, sweep}

Records are idempotent by step: the same step with the same record again is a 200 that stores
nothing (`stored: false`); another record for a stored step is a 409; a step below the last
stored one a 422. Cancel is the ordinary `POST /sweeps/{id}/cancel`: every answer to a record
says `cancel_requested`, which the loop's Monitor turns into `record() → False`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.errors import JSON_BODY_RESPONSES, WRITE_RESPONSES
from api.routes.deps import INT32_MAX, StoreDep, SweepId, TrialId
from api.routes.sweeps import sweep_public, trial_public
from api.schemas import SweepPublic, TrialPublic
from service.errors import InvalidInput
from service.jsonfmt import NONFINITE, to_jsonable
from service.store import external

router = APIRouter(tags=["external"])

RESPONSES = {**WRITE_RESPONSES, **JSON_BODY_RESPONSES}

Name = Annotated[str, Field(min_length=1, max_length=external.MAX_NAME)]


class ExternalSweepBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Name = Field(description="the sweep's name; found again by it")
    config: dict[str, Any] = Field(
        default_factory=dict, description="the run's free-form config (nested: dotted names)"
    )


class ExternalTrialBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run: Name = Field(description="the run key: the same key finds the same trial again")
    depth: int = Field(ge=1, le=100_000, description="the number of taps (per-layer length)")
    batch_size: int = Field(ge=1, le=INT32_MAX, description="the probe batch's n")
    config: dict[str, Any] = Field(default_factory=dict)


class ExternalRecordBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: int = Field(ge=0, le=INT32_MAX, description="the loop's step: the record's epoch")
    record: dict[str, Any] = Field(
        description='metric → number or per-tap list (NaN/±inf as "NaN", "Infinity", '
        '"-Infinity"); `diverged` optional'
    )


def _numbers(v: Any, where: str) -> Any:
    """A record value with the API's non-finite spellings read back as floats."""
    if isinstance(v, str):
        if v in NONFINITE:
            return NONFINITE[v]
        raise InvalidInput(f"a number or a list of numbers, not {v!r}", field=where)
    if isinstance(v, list):
        return [_numbers(x, where) for x in v]
    return v


@router.post("/external/sweeps", response_model=SweepPublic, responses=RESPONSES, tags=["external"])
def open_external_sweep(body: ExternalSweepBody, store: StoreDep) -> SweepPublic:
    """Find the external sweep called `name`, or create it (running, never claimed by a
    runner); its spec is {external: true, name, parameters: the flattened config, runs}."""
    return sweep_public(external.store_open_sweep(store, body.name, external.flatten(body.config)))


@router.post("/external/sweeps/{sweep_id}/trials", response_model=TrialPublic, responses=RESPONSES)
def open_external_trial(sweep_id: SweepId, body: ExternalTrialBody, store: StoreDep) -> TrialPublic:
    """Find the external sweep's trial of run key `run`, or create it (running)."""
    info = external.store_open_trial(
        store,
        sweep_id,
        body.run,
        depth=body.depth,
        batch_size=body.batch_size,
        config=external.flatten(body.config),
    )
    return trial_public(info)


@router.post("/external/trials/{trial_id}/records", responses=RESPONSES)
def append_external_record(
    trial_id: TrialId, body: ExternalRecordBody, store: StoreDep
) -> dict[str, Any]:
    """Store one step's record: {stored, step, last_step, diverged, cancel_requested, status}."""
    record = {k: _numbers(v, f"record.{k}") for k, v in body.record.items() if k != "epoch"}
    record["epoch"] = body.step
    return external.store_append(store, trial_id, record)


@router.post("/external/trials/{trial_id}/finish", responses=RESPONSES)
def finish_external_trial(trial_id: TrialId, store: StoreDep) -> dict[str, Any]:
    """End the run: the trial `completed` (or `diverged`); the sweep finishes with its last
    run (`cancelled` after a cancel)."""
    done = external.store_finish(store, trial_id)
    return {
        "trial": to_jsonable(trial_public(done["trial"]).model_dump(mode="json")),
        "sweep": to_jsonable(sweep_public(done["sweep"]).model_dump(mode="json")),
    }
