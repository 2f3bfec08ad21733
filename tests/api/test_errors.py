"""One error shape from one table: domain errors by status, FastAPI's own errors reshaped, a
storage failure as 503, and a genuine bug as 500 "internal" (and only that)."""

from __future__ import annotations

import httpx
import pytest

from api.app import create_app
from api.errors import (
    STATUS,
    BodyTooLarge,
    error_body,
    error_response,
    status_of,
    validation_body,
)
from api.schemas import NonFiniteJSONResponse
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


# --- no input gives a 500 -----------------------------------------------------------------------

BIG = "9" * 5000  # over Python's 4300-digit limit on int(str)


DASHBOARD = {"/": [], "/sweeps/{sweep_id}": [], "/trials/{trial_id}": [], "/login": ["next"]}


def _get_routes(app):
    """(path template, query parameter names) of every GET operation, and the dashboard's."""
    for path, ops in app.openapi()["paths"].items():
        if "get" in ops:
            yield path, [p["name"] for p in ops["get"].get("parameters", []) if p["in"] == "query"]
    yield from DASHBOARD.items()


def test_no_route_answers_500_to_a_5000_digit_integer(start_api):
    from api_support import fill, spec

    api = start_api()
    sid = api.post("/sweeps", json=spec("x", seeds=1)).json()["id"]
    fill(api, sid)
    app = create_app(api.settings, store=api.store)
    dashboard = {"page", "sort", "dir", "status", "kind", "metric", "epoch", "depth", "seed"}
    checked = 0
    for path, names in _get_routes(app):
        ids = {"sweep_id": sid, "trial_id": 1, "kind": "layer_profile", "name": "tanh"}
        urls = [path.format(**{k: BIG for k in ids})]  # every path parameter huge
        for name in {*names, *dashboard, "epoch", "limit"}:  # then each query parameter
            urls.append(path.format(**ids) + f"?{name}={BIG}")
        for url in urls:
            r = api.client.get(f"{api.url}{url}")
            assert r.status_code < 500, (url[:80], r.text[:200])
            checked += 1
    assert checked > 50


def test_a_5000_digit_integer_in_a_body_is_a_422(api):
    for body, media in (
        (f'{{"name": "x", "priority": {BIG}}}', "application/json"),
        (f"name: x\npriority: {BIG}\n", "application/yaml"),
        (f'{{"name": "x", "parameters": {{"depth": [-{BIG}]}}}}', "application/json"),
    ):
        r = api.post("/sweeps", content=body, headers={"Content-Type": media})
        assert r.status_code == 422, (media, r.text[:200])
        assert "digits" in r.json()["error"]["message"]


def test_error_rendering_survives_unpaired_surrogates(api):
    bodies = [
        '{"name": "x", "parameters": {"\\udc00": 1}}',
        '{"name": "x", "\\ud800x": 1}',
        '{"name": "x", "parameters": {"init": "\\udfff"}}',
    ]
    for body in bodies:
        r = api.post("/sweeps", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (body, r.text[:200])
        err = r.json()["error"]
        assert err["type"] == "invalid_input" and err["field"]
    body = error_body("invalid_input", "bad \udc00", field="a\ud800", allowed=["\udfff"])
    NonFiniteJSONResponse(body).body.decode("utf-8")  # renders


def test_error_bodies_are_capped_with_a_count(api):
    errors = [
        {"loc": ("body", "tags", i), "msg": "Input should be a valid string"} for i in range(10_000)
    ]
    message = validation_body(errors)["error"]["message"]
    assert len(message) < 2000 and "9990 more errors" in message
    body = {"name": "x", "tags": list(range(110_000))}  # a 660 KB list of non-strings
    r = api.post("/sweeps", json=body)
    assert r.status_code == 422
    assert len(r.content) < 4000, len(r.content)  # was 4.8 MB: every item's error
    assert r.json()["error"]["field"] == "body" and "values" in r.text
    r = api.post("/sweeps", json={"name": "x", "tags": list(range(5000))})  # under that bound
    assert r.status_code == 422 and len(r.content) < 4000
    assert r.json()["error"]["field"] == "tags" and "at most 100" in r.text


def test_duplicate_keys_and_lax_values_in_a_json_body_are_422(api):
    for body in (
        '{"name": "x", "name": "y"}',  # was 201 named "y"
        '{"name": "x", "parameters": {"depth": 2, "depth": 3}}',
        '{"name": "x", "parameters": {"depth": true}}',  # was read as depth 1
        '{"name": "x", "rerun": "yes"}',  # was read as true
        '{"name": "x", "parameters": {"lr": NaN}}',
    ):
        r = api.post("/sweeps", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (body, r.text)
    assert api.get("/sweeps").json()["count"] == 0
