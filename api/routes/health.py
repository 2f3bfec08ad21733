"""`GET /healthz`: liveness, whether the database answers, where Ray stands, and whether the
runner that `isosweep serve` supervises is alive.

The API process never imports Ray: Ray's reachability is a TCP connect to RAY_ADDRESS when one
is set (the runner then joins that cluster), and otherwise unknown (the runner starts a local
Ray of its own). Runners show through the sweeps they hold. Under `isosweep serve` the status is
"degraded" (HTTP 503) while its runner is dead or being restarted (app.state.runner: the
supervisor, api/cli/supervise.py); an API served alone (`--no-runner`, `create_app()`) reports
no runner.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Protocol
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.routes.deps import StoreDep
from api.schemas import (
    DatabaseHealth,
    HealthPublic,
    NonFiniteJSONResponse,
    RayHealth,
    RunnerHealth,
)
from service import __version__
from service.errors import IsosweepError
from service.status import SweepStatus
from service.store import SweepInfo

router = APIRouter(tags=["health"])

CONNECT_TIMEOUT_S = 0.5
RAY_CACHE_S = 5.0  # a TCP probe at most this often, however often healthz is polled
DEFAULT_PORTS = {"ray": 10001, "": 6379}  # Ray Client, GCS
RUNNERS_LISTED = 100  # running sweeps read for their runners' ids (at most a page of the store)
_probe: dict[str, tuple[float, bool]] = {}


@router.get(
    "/healthz",
    response_model=HealthPublic,
    responses={
        503: {
            "model": HealthPublic,
            "description": "the database does not answer, or serve's runner is down",
        }
    },
)
def read_health(store: StoreDep, request: Request) -> Response:
    """Liveness: the database answers a query; Ray's address and the runners holding sweeps;
    the state of the runner `isosweep serve` supervises."""
    running: list = []
    total = 0
    try:
        limit = min(RUNNERS_LISTED, store.settings.max_page_size)
        running, total = store.list_sweeps(status=SweepStatus.RUNNING, limit=limit)
        db = DatabaseHealth(ok=True, backend=store.dialect)
    except IsosweepError as exc:
        db = DatabaseHealth(ok=False, backend=store.dialect, error=exc.message)
    runner = runner_health(request)
    ok = db.ok and (runner is None or runner.ok)
    health = HealthPublic(
        status="ok" if ok else "degraded",
        version=__version__,
        database=db,
        ray=ray_health(running, total),
        runner=runner,
    )
    return NonFiniteJSONResponse(health.model_dump(mode="json"), status_code=200 if ok else 503)


class SupervisedRunner(Protocol):
    """What healthz reads of the runner beside the API (api.cli.supervise.RunnerSupervisor)."""

    def status(self) -> dict[str, Any]: ...


def runner_health(request: Request) -> RunnerHealth | None:
    """The supervised runner's state, or None when the API runs without one."""
    supervisor = getattr(request.app.state, "runner", None)
    return None if supervisor is None else RunnerHealth(**supervisor.status())


def ray_health(running: list[SweepInfo], total: int) -> RayHealth:
    """Where Ray stands; `running` is (the first page of) the running sweeps, `total` their
    number."""
    address = os.environ.get("RAY_ADDRESS") or None
    runners = sorted({s.runner_id for s in running if s.runner_id})
    held = f"{total} running sweep(s)" + (f" held by {', '.join(runners)}" if runners else "")
    if address is None or address in ("auto", "local"):
        reachable = None
        where = "no RAY_ADDRESS: the runner starts and stops a local Ray instance"
    else:
        reachable = _reachable(address)
        where = f"{address} {'accepts' if reachable else 'refuses'} connections"
    return RayHealth(
        address=address,
        reachable=reachable,
        running_sweeps=total,
        runners=runners,
        detail=f"{where}; {held}",
    )


def _reachable(address: str) -> bool:
    now = time.monotonic()
    cached = _probe.get(address)
    if cached and now - cached[0] < RAY_CACHE_S:
        return cached[1]
    ok = _connect(address)
    _probe[address] = (now, ok)
    return ok


def _connect(address: str) -> bool:
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port or DEFAULT_PORTS.get(parts.scheme, 6379)
        with socket.create_connection((parts.hostname or "127.0.0.1", port), CONNECT_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False
