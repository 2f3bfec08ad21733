"""The bearer token (401 without, 2xx with; on reads too unless `open_reads`) and the request
body limit (413, declared or streamed). SQLite only: neither depends on the backend.
tests/api/test_security.py covers reads, the dashboard's login and cross-origin requests."""

from __future__ import annotations

import pytest
from api_support import spec

pytestmark = pytest.mark.sqlite_only

TOKEN = "s3cret-token"


def test_without_a_configured_token_writes_are_open(start_api):
    api = start_api()
    assert api.post("/sweeps", json=spec()).status_code == 201
    assert "securitySchemes" not in api.client.get(f"{api.url}/openapi.json").json()["components"]


def test_token_required_on_writes(start_api):
    api = start_api(api_token=TOKEN, open_reads=True)
    wrong = ["", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer", TOKEN]
    for header in wrong:
        headers = {"Authorization": header} if header else {}
        r = api.post("/sweeps", json=spec(), headers=headers)
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["type"] == "unauthorized"
    assert api.get("/sweeps").json()["count"] == 0  # nothing was written
    good = {"Authorization": f"Bearer {TOKEN}"}
    r = api.post("/sweeps", json=spec(), headers=good)
    assert r.status_code == 201
    sid = r.json()["id"]
    assert api.post(f"/sweeps/{sid}/cancel").status_code == 401
    assert api.post(f"/sweeps/{sid}/cancel", headers=good).status_code == 200
    assert api.get(f"/sweeps/{sid}").status_code == 200  # open reads need no token
    assert api.get("/healthz").status_code == 200


def test_openapi_declares_bearer_security_where_a_token_is_needed(start_api):
    for open_reads in (False, True):
        api = start_api(api_token=TOKEN, open_reads=open_reads)
        doc = api.client.get(f"{api.url}/openapi.json").json()
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        paths = doc["paths"]
        assert paths["/api/v1/sweeps"]["post"]["security"] == [{"bearer": []}]
        assert ("security" in paths["/api/v1/sweeps"]["get"]) is not open_reads
        assert "security" not in paths["/api/v1/healthz"]["get"]  # probes need no token


def test_body_over_the_limit_is_413_declared_or_streamed(start_api):
    api = start_api(max_body_bytes=400)
    small = {**spec(), "description": "x" * 100}
    assert api.post("/sweeps", json=small).status_code == 201
    big = {**spec(), "description": "x" * 1000}
    r = api.post("/sweeps", json=big)
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["field"] == "body" and "ISOSWEEP_MAX_BODY_BYTES" in err["message"]
    import json

    payload = json.dumps(big).encode()

    def chunks():  # no Content-Length: the limit counts the bytes as they arrive
        for i in range(0, len(payload), 100):
            yield payload[i : i + 100]

    r = api.post("/sweeps", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["field"] == "body"
    assert api.get("/sweeps").json()["count"] == 1


def test_the_token_is_checked_before_the_body(start_api):
    api = start_api(api_token=TOKEN, max_body_bytes=100)
    r = api.post("/sweeps", content=b"x" * 1000)
    assert r.status_code == 401
