"""ServerThread (api/server.py), the in-process server of the tests and benchmarks: its stop
wakes uvicorn's loop at once and skips the connections' grace when none is open; with a
keep-alive connection still open it falls back to uvicorn's own shutdown, which closes it."""

from __future__ import annotations

import httpx
import pytest

from api.app import create_app
from api.server import ServerThread
from service.settings import Settings
from service.store import Store


@pytest.fixture
def app_args(sqlite_url):
    settings = Settings(database_url=sqlite_url)
    store = Store(sqlite_url, settings=settings)
    yield settings, store
    store.close()


def test_a_server_stops_with_no_connection_open(app_args):
    settings, store = app_args
    server = ServerThread(create_app(settings, store=store)).start()
    with httpx.Client(base_url=f"{server.url}/api/v1") as client:
        assert client.get("/healthz").status_code == 200
    server.stop()
    assert not server.thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/api/v1/healthz")


def test_a_server_stops_with_a_keep_alive_connection_open(app_args):
    settings, store = app_args
    server = ServerThread(create_app(settings, store=store)).start()
    with httpx.Client(base_url=f"{server.url}/api/v1") as client:
        assert client.get("/healthz").status_code == 200  # the connection stays in the pool
        assert server.server.server_state.connections
        server.stop()
        assert not server.thread.is_alive()
        assert not server.server.server_state.connections  # uvicorn's shutdown closed it
        with pytest.raises(httpx.TransportError):
            client.get("/healthz")


def test_a_server_told_to_stop_before_it_serves_stops():
    """exit() before the loop runs: the first tick sees should_exit."""
    app = create_app(Settings(database_url="sqlite:///:memory:"))
    server = ServerThread(app)
    server.server.exit()
    server.thread.start()
    server.thread.join(20)
    assert not server.thread.is_alive()
