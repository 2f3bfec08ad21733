"""Sweeps and their trials: submit, list, read, cancel; a sweep's trials; one trial."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from api.errors import ERROR_RESPONSES, WRITE_RESPONSES
from api.openapi import SPEC_BODY
from api.routes.deps import (
    ConfigFilters,
    Offset,
    SettingsDep,
    StoreDep,
    SweepId,
    TrialId,
)
from api.schemas import (
    BestTrial,
    SweepPublic,
    SweepsPublic,
    SweepStatus,
    TrialPublic,
    TrialsPublic,
    TrialStatus,
)
from api.spec_body import read_spec
from service.search.best import best_trial
from service.settings import Settings
from service.spec import parse_spec
from service.store import Store, SweepInfo, TrialInfo

router = APIRouter(tags=["sweeps"])

SweepLimit = Annotated[int, Query(ge=1, description="page size (≤ ISOSWEEP_MAX_PAGE_SIZE)")]


def sweep_public(info: SweepInfo) -> SweepPublic:
    return SweepPublic.model_validate(info.model_dump())


def trial_public(info: TrialInfo) -> TrialPublic:
    return TrialPublic.model_validate(info.model_dump())


@router.post(
    "/sweeps",
    status_code=201,
    response_model=SweepPublic,
    responses=WRITE_RESPONSES,
    openapi_extra=SPEC_BODY,
)
async def create_sweep(request: Request, store: StoreDep, settings: SettingsDep) -> SweepPublic:
    """Submit a sweep spec as JSON, or as YAML (Content-Type application/yaml); 201 with it."""
    data = await read_spec(request)
    info = await run_in_threadpool(_create, store, data, settings)
    return sweep_public(info)


def _create(store: Store, data: dict[str, Any] | str, settings: Settings) -> SweepInfo:
    return store.create_sweep(parse_spec(data, settings=settings))


@router.get("/sweeps", response_model=SweepsPublic, responses=ERROR_RESPONSES)
def read_sweeps(
    store: StoreDep,
    status: Annotated[SweepStatus | None, Query(description="only sweeps with this status")] = None,
    offset: Offset = 0,
    limit: SweepLimit = 50,
) -> SweepsPublic:
    """List sweeps, newest first, with the total count."""
    infos, total = store.list_sweeps(status=status, offset=offset, limit=limit)
    return SweepsPublic(data=[sweep_public(i) for i in infos], count=total)


@router.get("/sweeps/{sweep_id}", response_model=SweepPublic, responses=ERROR_RESPONSES)
def read_sweep(sweep_id: SweepId, store: StoreDep) -> SweepPublic:
    """One sweep with trial counts by status, progress and ETA; for a search (`search: {kind:
    tpe}`) or early stopping, `best`: the best completed trial so far and its value."""
    info = store.get_sweep(sweep_id)
    out = sweep_public(info)
    best = best_trial(store, sweep_id, info.spec)
    if best is not None:
        out.best = BestTrial(**best)
    return out


@router.post("/sweeps/{sweep_id}/cancel", response_model=SweepPublic, responses=WRITE_RESPONSES)
def cancel_sweep(sweep_id: SweepId, store: StoreDep) -> SweepPublic:
    """Cancel a sweep: queued trials stop at once, running ones soon; stored results stay."""
    return sweep_public(store.request_cancel(sweep_id))


@router.get("/sweeps/{sweep_id}/trials", response_model=TrialsPublic, responses=ERROR_RESPONSES)
def read_trials(
    sweep_id: SweepId,
    store: StoreDep,
    filters: ConfigFilters,
    status: Annotated[TrialStatus | None, Query(description="only trials with this status")] = None,
    offset: Offset = 0,
    limit: SweepLimit = 100,
) -> TrialsPublic:
    """A sweep's trials in expansion order, filtered by status and config fields."""
    infos, total = store.list_trials(
        sweep_id, status=status, where=filters, offset=offset, limit=limit
    )
    return TrialsPublic(data=[trial_public(i) for i in infos], count=total)


@router.get("/trials/{trial_id}", response_model=TrialPublic, responses=ERROR_RESPONSES)
def read_trial(trial_id: TrialId, store: StoreDep) -> TrialPublic:
    """One trial: config, status, attempts, error, progress and last scalar metrics."""
    return trial_public(store.get_trial(trial_id))
