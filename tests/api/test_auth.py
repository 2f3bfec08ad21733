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


# --- login sessions (server-side, revocable) ---------------------------------------------------

SAME = {"Sec-Fetch-Site": "same-origin"}


def _log_in(base: str, token: str = TOKEN) -> str:
    """POST /login with the token; the session cookie's value."""
    import httpx

    r = httpx.post(f"{base}/login", data={"token": token, "next": "/"}, headers=SAME)
    assert r.status_code == 303, r.text
    return r.cookies["isosweep_session"]


def _with(cookie: str) -> dict[str, str]:
    return {"Cookie": f"isosweep_session={cookie}", **SAME}


def test_a_copied_cookie_dies_with_its_session_at_logout(start_api):
    """The audit's case: a copy of the cookie kept reading and writing after logout. Now the
    cookie names a server-side session, and logout revokes it: every copy is refused."""
    import httpx

    api = start_api(api_token=TOKEN)
    cookie = _log_in(api.url)
    copy = dict(_with(cookie))
    assert httpx.get(f"{api.url}/api/v1/sweeps", headers=copy).status_code == 200
    r = httpx.post(f"{api.url}/api/v1/sweeps", json=spec(), headers=copy)
    assert r.status_code == 201
    out = httpx.post(f"{api.url}/logout", headers=_with(cookie))
    assert out.status_code == 303
    assert httpx.get(f"{api.url}/api/v1/sweeps", headers=copy).status_code == 401
    assert httpx.post(f"{api.url}/api/v1/sweeps", json=spec(), headers=copy).status_code == 401
    page = httpx.get(f"{api.url}/", headers=copy)
    assert page.status_code == 303 and page.headers["location"].startswith("/login")
    assert api.store.list_sweeps()[1] == 1  # the refused write wrote nothing
    assert len(cookie) >= 40 and cookie != _log_in(api.url)  # random, one per login


def test_sessions_are_stored_listed_revoked_and_expire(start_api):
    import httpx

    from service.store.logins import LoginSessions

    api = start_api(api_token=TOKEN, session_ttl_s=3600)
    first, second = _log_in(api.url), _log_in(api.url)
    logins = LoginSessions(api.store)
    listed = logins.list()
    assert [s.id for s in listed] == [1, 2]
    for s in listed:
        assert s.revoked_at is None and s.client == "127.0.0.1"
        assert s.created_at <= s.last_used_at < s.expires_at
        assert abs((s.expires_at - s.created_at).total_seconds() - 3600) < 1
    assert first not in repr(listed) and TOKEN not in repr(listed)  # only a hash is stored
    assert logins.revoke(1) is True and logins.revoke(1) is False  # once
    assert httpx.get(f"{api.url}/api/v1/sweeps", headers=_with(first)).status_code == 401
    assert httpx.get(f"{api.url}/api/v1/sweeps", headers=_with(second)).status_code == 200
    from datetime import UTC, datetime

    from sqlalchemy import update

    from service.store.models import SqlLoginSession

    with api.store.engine.begin() as conn:  # its expiry passes
        past = datetime(2020, 1, 1, tzinfo=UTC)
        conn.execute(update(SqlLoginSession).where(SqlLoginSession.id == 2).values(expires_at=past))
    assert httpx.get(f"{api.url}/api/v1/sweeps", headers=_with(second)).status_code == 401
    assert [s.active for s in logins.list()] == [False, False]


def test_a_new_token_ends_every_session(start_api, database_url):
    """Sessions carry a tag of the token they were opened with: a server restarted with another
    token refuses them all, and `revoke_other_tokens` (serve, at start) marks them revoked."""
    import httpx

    from service.store.logins import LoginSessions, token_tag

    api = start_api(api_token=TOKEN)
    cookie = _log_in(api.url)
    again = start_api(api_token="another-token")  # the same database, a rotated token
    assert httpx.get(f"{again.url}/api/v1/sweeps", headers=_with(cookie)).status_code == 401
    logins = LoginSessions(again.store)
    assert logins.revoke_other_tokens(token_tag("another-token")) == 1
    assert [s.active for s in logins.list()] == [False]
    assert httpx.get(f"{api.url}/api/v1/sweeps", headers=_with(cookie)).status_code == 401


def test_the_sessions_command_lists_and_revokes(start_api, capsys):
    import httpx

    from api.cli.main import main
    from service.store.logins import LoginSessions

    api = start_api(api_token=TOKEN)
    cookie = _log_in(api.url)
    _log_in(api.url)
    url = api.settings.database_url
    assert main(["sessions", "list", "--database-url", url]) == 0
    shown = capsys.readouterr().out
    assert "127.0.0.1" in shown and "active" in shown and cookie not in shown
    assert main(["sessions", "revoke", "1", "--database-url", url]) == 0
    assert httpx.get(f"{api.url}/api/v1/sweeps", headers=_with(cookie)).status_code == 401
    assert main(["sessions", "revoke", "--all", "--database-url", url]) == 0
    assert "1 session" in capsys.readouterr().out
    assert not any(s.active for s in LoginSessions(api.store).list())
    with pytest.raises(SystemExit) as exit_:
        main(["sessions", "revoke", "99", "--database-url", url])
    assert exit_.value.code == 1 and "no session 99" in capsys.readouterr().err
