"""The REST routes under /api/v1: thin handlers over the store, the plots and the theory."""

from fastapi import APIRouter, Depends

from api.routes import (
    compare,
    events,
    external,
    health,
    metrics,
    plots,
    spectra,
    sweeps,
    theory,
)
from api.routes.deps import reject_unknown_query

PREFIX = "/api/v1"

api_router = APIRouter(prefix=PREFIX, dependencies=[Depends(reject_unknown_query)])
for module in (sweeps, events, metrics, plots, compare, spectra, theory, health, external):
    api_router.include_router(module.router)

__all__ = ["PREFIX", "api_router"]
