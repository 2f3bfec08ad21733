"""Running the API with uvicorn: in the foreground (`serve_api`, for `isosweep serve`), or in a
background thread on a free loopback port (`ServerThread`, for tests and benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
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


class _PromptServer(uvicorn.Server):
    """uvicorn's server, made to stop promptly when told from another thread.

    uvicorn's main loop looks at `should_exit` every 0.1 s, and its shutdown then gives open
    connections a fixed 0.1 s to finish. `ServerThread.stop` wakes the loop at once (`exit`),
    and with no connection left open the shutdown skips that grace: ~0.2 s → ~1 ms a stop,
    paid by every test that starts a server. With a connection open, uvicorn's own shutdown
    runs unchanged."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=0.1)
            should_exit = await self.on_tick(counter)

    def exit(self) -> None:
        """Stop serving (thread-safe): what `should_exit = True` does, without the tick's wait."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                loop.call_soon_threadsafe(wake.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.server_state.connections or self.server_state.tasks:
            await super().shutdown(sockets)
            return
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


class ServerThread:
    """uvicorn in a daemon thread, on a free port of `host` (port 0 lets the OS choose).

    with ServerThread(create_app(settings, store=store)) as server:
        httpx.get(f"{server.url}/api/v1/healthz")
    """

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0):
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", lifespan="on", server_header=False
        )
        self.server = _PromptServer(config)
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
        self.server.exit()
        self.thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
