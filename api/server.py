"""Running the API with uvicorn: in the foreground (`serve_api`, for `isosweep serve`), or in a
background thread on a free loopback port (`ServerThread`, for tests and benchmarks)."""

from __future__ import annotations

import gc
import threading
import time

import uvicorn
from fastapi import FastAPI

from api.app import create_app
from api.routes.health import SupervisedRunner
from service.settings import Settings, get_settings
from service.store import Store


def serve_api(
    settings: Settings | None = None,
    *,
    store: Store | None = None,
    runner: SupervisedRunner | None = None,
    log_level: str = "info",
    access_log: bool = True,
) -> None:
    """Serve the API on settings.host (default 127.0.0.1) and settings.port until a signal.

    uvicorn handles SIGINT/SIGTERM: it stops taking requests, finishes the running ones, shuts
    the app down (closing a store it opened), then re-raises the signal. `runner`: the
    supervisor of serve's runner, whose state healthz reports (api.cli.supervise).
    """
    settings = settings or get_settings()
    app = create_app(settings, store=store, runner=runner)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        access_log=access_log,
        server_header=False,
    )
    # The hundreds of thousands of objects built by the imports (routes, schemas, SQLAlchemy
    # and pandas internals) never die; freezing them keeps every full garbage collection from
    # walking them again, which otherwise stalls requests by tens of milliseconds (measured
    # with bench/api_latency.py: status p99 from ~75-150 ms down to ~20-25 ms).
    gc.collect()
    gc.freeze()
    uvicorn.Server(config).run()


class ServerThread:
    """uvicorn in a daemon thread, on a free port of `host` (port 0 lets the OS choose).

    with ServerThread(create_app(settings, store=store)) as server:
        httpx.get(f"{server.url}/api/v1/healthz")
    """

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0):
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", lifespan="on", server_header=False
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.host}")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
