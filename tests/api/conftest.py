"""A live API for each test: uvicorn on a free loopback port (a background thread), over a fresh
database on SQLite and on Postgres (the `database_url` fixture), spoken to with httpx. Results
are written straight through the Store with hand-made records: no Ray, no torch."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api.app import create_app, set_state
from api.server import ServerThread
from service.settings import Settings
from service.store import Store


@dataclass
class Api:
    """A running API: its base URL, a client for /api/v1, and the store behind it."""

    url: str
    client: httpx.Client
    store: Store
    settings: Settings

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.client.get(path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.client.post(path, **kw)


# One TLS context for every test client: httpx builds (and loads the CA bundle into) a new one
# per client otherwise, ~25 ms each; the servers here speak plain HTTP on loopback anyway.
_TLS = ssl.create_default_context()


# One app per settings (the database aside) in this process: FastAPI builds an app's included
# routes at its first request (~0.2 s, most of a small test's time). A test gets the app an
# earlier one built, with everything else new (api.app.set_state: settings, store, caches,
# throttles, OpenAPI document, middleware; the registered models loaded) and its own server.
# A second server a test starts while its first runs gets an app of its own; so does a test
# that builds its app itself (create_app).
_APPS: dict[str, FastAPI] = {}
_SERVING: set[int] = set()  # ids of the apps of the servers now running


def _app(settings: Settings, store: Store) -> FastAPI:
    key = repr(sorted(settings.model_dump(exclude={"database_url"}).items()))
    app = _APPS.get(key)
    if app is None or id(app) in _SERVING:
        app = create_app(settings, store=store)
        _APPS.setdefault(key, app)
    else:
        set_state(app, settings, store=store)
    _SERVING.add(id(app))
    return app


@pytest.fixture
def start_api(database_url):
    """start_api(**settings) → Api; every server and store started is stopped afterwards."""
    started: list[tuple[ServerThread, Store, httpx.Client, FastAPI]] = []

    def start(**overrides: Any) -> Api:
        settings = Settings(database_url=database_url, **overrides)
        store = Store(database_url, settings=settings)
        app = _app(settings, store)
        server = ServerThread(app).start()
        client = httpx.Client(base_url=f"{server.url}/api/v1", timeout=60, verify=_TLS)
        started.append((server, store, client, app))
        return Api(server.url, client, store, settings)

    yield start
    for server, store, client, app in started:
        client.close()
        server.stop()
        store.close()
        _SERVING.discard(id(app))


@pytest.fixture
def api(start_api) -> Api:
    return start_api()
