"""One error shape from one table: domain errors by status, FastAPI's own errors reshaped, a
storage failure as 503, and a genuine bug as 500 "internal" (and only that)."""

from __future__ import annotations

import httpx
import pytest

from api.app import create_app
from api.errors import STATUS, BodyTooLarge, error_response, status_of, validation_body
from api.server import ServerThread
from service.errors import (
    Conflict,
    DataUnavailable,
    InvalidInput,
    IsosweepError,
    LimitExceeded,
    NotFound,
    StorageError,
    Unauthorized,
)
from service.settings import Settings
from service.store import Store


@pytest.mark.parametrize(
    ("exc", "status", "type_"),
    [
        (InvalidInput("bad", field="depth"), 422, "invalid_input"),
        (LimitExceeded("too many", field="limit"), 422, "limit_exceeded"),
        (BodyTooLarge("too big", field="body"), 413, "limit_exceeded"),
        (NotFound("no sweep"), 404, "not_found"),
        (Conflict("running"), 409, "conflict"),
        (Unauthorized("token"), 401, "unauthorized"),
        (DataUnavailable("no cifar"), 503, "data_unavailable"),
        (StorageError("db down"), 503, "storage_error"),
        (IsosweepError("other"), 400, "error"),
    ],
)
def test_the_table(exc, status, type_):
    assert status_of(exc) == status
    r = error_response(exc)
    assert r.status_code == status
    import json

    body = json.loads(r.body)
    assert body["error"]["type"] == type_ and body["error"]["message"] == exc.message
    assert body["error"]["field"] == getattr(exc, "field", None)
    assert ("www-authenticate" in r.headers) == (status == 401)


def test_every_domain_error_class_has_a_row():
    import service.errors as errors

    classes = [
        c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, IsosweepError)
    ]
    assert set(classes) <= set(STATUS)


def test_validation_errors_name_each_field():
    body = validation_body(
        [
            {"loc": ("query", "limit"), "msg": "Input should be greater than or equal to 1"},
            {"loc": ("query", "metric", 0), "msg": "Input should be 'train_loss'"},
            {"loc": ("body", "seeds", 2), "msg": "bad", "type": "int_type"},
            {"loc": ("path", "sweep_id"), "msg": "x", "type": "missing"},
        ]
    )
    err = body["error"]
    assert err["type"] == "invalid_input" and err["field"] == "limit"
    assert err["message"] == (
        "limit: Input should be greater than or equal to 1; metric: Input should be "
        "'train_loss'; seeds[2]: bad; sweep_id: required"
    )


@pytest.fixture
def served(sqlite_url):
    servers = []

    def serve(app):
        server = ServerThread(app).start()
        servers.append(server)
        return httpx.Client(base_url=server.url, timeout=30)

    yield serve
    for s in servers:
        s.stop()


def test_a_bug_is_a_logged_500_internal(served, sqlite_url, caplog):
    settings = Settings(database_url=sqlite_url)
    with Store(sqlite_url, settings=settings) as store:
        app = create_app(settings, store=store)

        @app.get("/boom")
        def boom() -> None:
            raise RuntimeError("a bug")

        client = served(app)
        with caplog.at_level("ERROR", logger="isosweep.api"):
            r = client.get("/boom")
        assert r.status_code == 500
        assert r.json() == {
            "error": {
                "type": "internal",
                "message": "internal error in isosweep (a bug; see the server log)",
                "field": None,
                "allowed": None,
            }
        }
        assert "a bug" in caplog.text  # the traceback went to the log, not to the client
        assert client.get("/api/v1/healthz").status_code == 200  # and the server lives on


def test_an_unreachable_database_is_503(served):
    url = "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2"
    store = Store(url, migrate=False, settings=Settings(database_url=url))
    try:
        client = served(create_app(Settings(database_url=url), store=store))
        r = client.get("/api/v1/sweeps")
        assert r.status_code == 503 and r.json()["error"]["type"] == "storage_error"
        h = client.get("/api/v1/healthz")
        assert h.status_code == 503
        assert h.json()["status"] == "degraded" and h.json()["database"]["ok"] is False
        assert h.json()["database"]["error"]
    finally:
        store.close()
