"""What stops a web page from driving the API, and what keeps results to those with the token:
the Host allow-list (DNS rebinding), the refusal of cross-origin mutations (a form POST, a
no-cors fetch), mutations only in the API's content types, the token on reads, and the
dashboard's login cookie. Requests are built by hand with the headers a browser sends; the
last test has real Chromium do the attacks from a page of another origin. SQLite only: none of
this depends on the backend."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from api_support import fill, spec, submit
from support import require

from api.cli.client import Api as CliApi

pytestmark = pytest.mark.sqlite_only

TOKEN = "s3cret-token"
EVIL = "http://evil.example"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
CROSS_SITE = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site"}


def port_of(api) -> int:
    return int(api.url.rsplit(":", 1)[1])


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# --- Host --------------------------------------------------------------------------------------


def test_a_foreign_host_header_is_refused(api):
    """A DNS-rebinding page reaches the API under its own name: the Host header says so."""
    port = port_of(api)
    sid = submit(api, spec("mine", seeds=1))["id"]
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        h = {"Host": host}
        for path in ("/sweeps", f"/sweeps/{sid}", "/healthz"):
            r = api.get(path, headers=h)
            assert r.status_code == 400, (host, path, r.text)
            assert r.json()["error"]["type"] == "bad_host" and "ISOSWEEP_ALLOWED_HOSTS" in r.text
        assert api.client.get(f"{api.url}/", headers=h).status_code == 400  # the dashboard
        assert api.post("/sweeps", json=spec(), headers=h).status_code == 400
        assert api.post(f"/sweeps/{sid}/cancel", headers=h).status_code == 400
    assert api.get("/sweeps").json()["count"] == 1
    assert not api.store.get_sweep(sid).cancel_requested
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert api.get("/sweeps", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_is_configurable(start_api):
    lab = start_api(allowed_hosts=["lab.example.org"])
    port = port_of(lab)
    assert lab.get("/sweeps", headers={"Host": f"lab.example.org:{port}"}).status_code == 200
    assert lab.get("/sweeps").status_code == 400  # 127.0.0.1 is no longer among them
    anywhere = start_api(allowed_hosts=["*"])
    assert anywhere.get("/sweeps", headers={"Host": "whatever.example"}).status_code == 200


def test_allowed_hosts_from_the_environment(monkeypatch):
    from service.settings import LOOPBACK_HOSTS, Settings

    monkeypatch.setenv("ISOSWEEP_ALLOWED_HOSTS", " lab.example.org, localhost ")
    assert Settings().allowed_hosts == ["lab.example.org", "localhost"]
    monkeypatch.setenv("ISOSWEEP_ALLOWED_HOSTS", "")
    assert Settings().allowed_hosts == LOOPBACK_HOSTS


# --- cross-origin mutations ---------------------------------------------------------------------


def test_a_cross_site_form_post_cannot_cancel(api):
    """<form method=post action=http://127.0.0.1:8000/api/v1/sweeps/1/cancel> on evil.example."""
    sid = submit(api, spec("victim", seeds=1))["id"]
    headers = {**CROSS_SITE, **FORM, "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
    r = api.post(f"/sweeps/{sid}/cancel", content=b"", headers=headers)
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert err["type"] == "forbidden" and "cross-origin" in err["message"]
    assert not api.store.get_sweep(sid).cancel_requested


def test_a_no_cors_fetch_cannot_submit_or_cancel(api):
    """fetch(url, {method: "POST", mode: "no-cors", body}) on evil.example: a text/plain body,
    or a Blob with no type at all (then no Content-Type is sent)."""
    sid = submit(api, spec("victim", seeds=1))["id"]
    no_cors = {**CROSS_SITE, "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "empty"}
    body = json.dumps(spec("planted")).encode()
    assert api.post("/sweeps", content=body, headers=no_cors).status_code == 403
    plain = {**no_cors, "Content-Type": "text/plain;charset=UTF-8"}
    assert api.post(f"/sweeps/{sid}/cancel", content=b"x", headers=plain).status_code == 403
    assert api.post(f"/sweeps/{sid}/cancel", headers=no_cors).status_code == 403
    assert api.get("/sweeps").json()["count"] == 1
    assert not api.store.get_sweep(sid).cancel_requested


def test_the_origin_decides_where_sec_fetch_site_is_not_sent(api):
    """Browsers send Sec-Fetch-* only to trustworthy origins (https, loopback): over plain http
    to a lab machine, the Origin header is what tells a foreign page."""
    sid = submit(api, spec("victim", seeds=1))["id"]
    port = port_of(api)
    foreign = [EVIL, "null", f"http://localhost:{port + 1}", f"http://evil.example:{port}"]
    for origin in foreign:
        r = api.post(f"/sweeps/{sid}/cancel", headers={"Origin": origin})
        assert r.status_code == 403, origin
    for site in ("cross-site", "same-site"):  # same-site: another port of this machine
        r = api.post(f"/sweeps/{sid}/cancel", headers={"Sec-Fetch-Site": site})
        assert r.status_code == 403, site
    assert not api.store.get_sweep(sid).cancel_requested
    same = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
    assert api.post(f"/sweeps/{sid}/cancel", headers=same).status_code == 200  # the dashboard
    assert api.post("/sweeps", json=spec(), headers={"Origin": same["Origin"]}).status_code == 201


def test_mutations_accept_only_the_api_content_types(api):
    """Even without an Origin (curl, a script): a form or text body is not the API's."""
    sid = submit(api, spec("victim", seeds=1))["id"]
    for media in ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain"):
        r = api.post(f"/sweeps/{sid}/cancel", content=b"a=1", headers={"Content-Type": media})
        assert r.status_code == 422, media
        err = r.json()["error"]
        assert err["field"] == "body" and "application/json" in err["allowed"]
    r = api.post("/sweeps", content=json.dumps(spec()).encode())  # a body of no stated type
    assert r.status_code == 422 and "Content-Type" in r.json()["error"]["message"]
    assert not api.store.get_sweep(sid).cancel_requested
    assert api.post(f"/sweeps/{sid}/cancel").status_code == 200  # no body: nothing to type
    yaml = {"Content-Type": "application/yaml"}
    assert api.post("/sweeps", content=b"name: y\nseeds: 1", headers=yaml).status_code == 201


# --- the token on reads -------------------------------------------------------------------------


def test_with_a_token_reads_need_it_too(start_api):
    api = start_api(api_token=TOKEN)
    sid = submit(api, spec("results", depth=[2, 3], seeds=1), token=TOKEN)["id"]
    api.client.headers.update(bearer())  # fill lists the trials through the API
    fill(api, sid)
    del api.client.headers["Authorization"]
    reads = [
        "/sweeps",
        f"/sweeps/{sid}",
        f"/sweeps/{sid}/trials",
        f"/sweeps/{sid}/metrics",
        f"/sweeps/{sid}/metrics?format=csv",
        f"/sweeps/{sid}/plots/layer_profile",
    ]
    for path in reads:
        r = api.get(path)
        assert r.status_code == 401, (path, r.status_code)
        assert r.headers["www-authenticate"] == "Bearer"
        assert api.get(path, headers=bearer("wrong")).status_code == 401
        assert api.get(path, headers=bearer()).status_code == 200, path
    page = api.client.get(f"{api.url}/sweeps/{sid}")  # the dashboard: to its login page
    assert page.status_code == 303 and page.headers["location"] == f"/login?next=/sweeps/{sid}"
    for open_path in ("/api/v1/healthz", "/static/dashboard.js", "/openapi.json", "/login"):
        assert api.client.get(f"{api.url}{open_path}").status_code == 200, open_path
    doc = api.client.get(f"{api.url}/openapi.json").json()
    assert doc["paths"]["/api/v1/sweeps"]["get"]["security"] == [{"bearer": []}]


def test_open_reads_opens_reads_but_not_writes(start_api):
    api = start_api(api_token=TOKEN, open_reads=True)
    sid = submit(api, spec("shared", seeds=1), token=TOKEN)["id"]
    assert api.get(f"/sweeps/{sid}").status_code == 200
    assert api.client.get(f"{api.url}/sweeps/{sid}").status_code == 200
    assert api.post(f"/sweeps/{sid}/cancel").status_code == 401
    doc = api.client.get(f"{api.url}/openapi.json").json()
    assert "security" not in doc["paths"]["/api/v1/sweeps"]["get"]


def test_the_cli_client_sends_the_token_on_reads_and_writes(start_api, monkeypatch):
    api = start_api(api_token=TOKEN)
    sid = submit(api, spec("cli", seeds=1), token=TOKEN)["id"]
    monkeypatch.setenv("ISOSWEEP_API_TOKEN", TOKEN)
    with CliApi(api.url) as cli:
        assert cli.json("GET", f"/sweeps/{sid}")["name"] == "cli"
        assert cli.json("POST", f"/sweeps/{sid}/cancel")["cancel_requested"] is True


# --- the dashboard's login cookie ---------------------------------------------------------------


def test_the_dashboard_asks_for_the_token_once_and_keeps_it_in_a_cookie(start_api):
    api = start_api(api_token=TOKEN)
    sid = submit(api, spec("logged", seeds=1), token=TOKEN)["id"]
    base = api.url
    same = {"Origin": base, "Sec-Fetch-Site": "same-origin"}
    with httpx.Client(base_url=base, timeout=30) as browser:
        form = browser.get("/login", params={"next": f"/sweeps/{sid}"})
        assert form.status_code == 200 and 'type="password"' in form.text
        wrong = browser.post("/login", data={"token": "nope", "next": "/"}, headers=same)
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        assert not browser.cookies
        r = browser.post("/login", data={"token": TOKEN, "next": f"/sweeps/{sid}"}, headers=same)
        assert r.status_code == 303 and r.headers["location"] == f"/sweeps/{sid}"
        cookie = r.headers["set-cookie"]
        attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")}
        assert {"httponly", "samesite", "path"} <= attrs and "samesite=lax" in cookie.lower()
        assert TOKEN not in cookie  # a value derived from the token, not the token
        page = browser.get(f"/sweeps/{sid}")
        assert page.status_code == 200 and 'name="token"' not in page.text  # no second ask
        assert browser.get(f"/api/v1/sweeps/{sid}/metrics?format=csv").status_code == 200
        assert "logged in" in browser.get("/login").text
        cross = browser.post(f"/api/v1/sweeps/{sid}/cancel", headers=CROSS_SITE)
        assert cross.status_code == 403  # the cookie does not make a foreign page's POST good
        assert browser.post(f"/api/v1/sweeps/{sid}/cancel", headers=same).status_code == 200
        out = browser.post("/logout", headers=same)
        assert out.status_code == 303
        assert browser.get(f"/api/v1/sweeps/{sid}").status_code == 401
    with httpx.Client(base_url=base, timeout=30) as other:
        r = other.post("/login", data={"token": TOKEN, "next": "//evil.example/x"}, headers=same)
        assert r.status_code == 303 and r.headers["location"] == "/"  # no open redirect
        forged = httpx.Cookies({"isosweep_session": TOKEN})
        assert httpx.get(f"{base}/api/v1/sweeps", cookies=forged).status_code == 401
        odd = {b"Cookie": b"isosweep_session=\xe9\xff", b"Authorization": b"Bearer \xe9"}
        assert httpx.get(f"{base}/api/v1/sweeps", headers=odd).status_code == 401


def test_without_a_token_there_is_nothing_to_log_in_to(api):
    r = api.client.get(f"{api.url}/login")
    assert r.status_code == 303 and r.headers["location"] == "/"


# --- in a real browser --------------------------------------------------------------------------

ATTACK = """<!doctype html><html><body>
<form id="f" method="post" action="{api}/api/v1/sweeps/{sid}/cancel" target="sink"></form>
<iframe name="sink"></iframe>
<script>
fetch("{api}/api/v1/sweeps", {{method: "POST", mode: "no-cors",
  body: new Blob([JSON.stringify({{name: "planted"}})])}}).catch(() => {{}});
fetch("{api}/api/v1/sweeps/{sid}/cancel", {{method: "POST", mode: "no-cors", body: "x"}})
  .catch(() => {{}});
document.getElementById("f").submit();
</script></body></html>"""


def chromium_or_skip() -> Path:
    """Debian's Chromium. Missing, the test skips, or fails where ISOSWEEP_REQUIRE_BROWSER=1
    (CI)."""
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        reason = f"Chromium not found at {chromium} (`make browser` installs Debian's package)"
        if require("ISOSWEEP_REQUIRE_BROWSER"):
            pytest.fail(f"ISOSWEEP_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    return chromium


@pytest.fixture
def foreign_page():
    """serve(html) → the URL of a page on another origin (another port) that serves `html`."""
    servers = []

    def serve(html: str) -> str:
        class Page(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(html.encode())

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield serve
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.mark.browser
@pytest.mark.slow
def test_a_page_on_another_origin_cannot_drive_the_api_in_chromium(api, foreign_page):
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    sid = submit(api, spec("victim", seeds=1))["id"]
    attack = foreign_page(ATTACK.format(api=api.url, sid=sid))
    seen: list[tuple[str, str, int]] = []  # (method, path, status) of each answer from the API

    def on_response(r) -> None:
        if "/api/v1/" in r.url:
            seen.append((r.request.method, r.url.removeprefix(api.url), r.status))

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), headless=True, args=["--no-sandbox"])
        page = b.new_page()
        page.on("response", on_response)
        page.goto(attack)
        for _ in range(200):  # up to 20 s for the three answers, then a while for any more
            if len(seen) >= 3:
                break
            page.wait_for_timeout(100)
        page.wait_for_timeout(1000)
        b.close()
    # All three attempts (the no-cors submit, the no-cors cancel, the form's cancel) reached the
    # API, and each was refused.
    cancel = f"/api/v1/sweeps/{sid}/cancel"
    assert sorted(seen) == [
        ("POST", "/api/v1/sweeps", 403),
        ("POST", cancel, 403),
        ("POST", cancel, 403),
    ], seen
    assert api.get("/sweeps").json()["count"] == 1
    assert not api.store.get_sweep(sid).cancel_requested


@pytest.mark.browser
@pytest.mark.slow
def test_log_in_once_then_read_and_cancel_in_chromium(start_api):
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    api = start_api(api_token=TOKEN)
    sid = submit(api, spec("stop-me", seeds=1), token=TOKEN)["id"]
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), headless=True, args=["--no-sandbox"])
        page = b.new_page()
        page.set_default_timeout(20_000)
        page.on("dialog", lambda d: d.accept())
        page.goto(f"{api.url}/sweeps/{sid}")
        assert page.url == f"{api.url}/login?next=/sweeps/{sid}"  # asked for the token
        page.fill("input[name=token]", TOKEN)
        page.click("form.login button")
        page.wait_for_url(f"{api.url}/sweeps/{sid}")
        assert page.locator("#cancel input[name=token]").count() == 0  # not asked again
        assert page.evaluate("document.cookie") == ""  # HttpOnly: no script can read it
        page.click("#cancel button")
        page.locator("#sweep-head .badge", has_text="cancelled").wait_for()
        page.goto(f"{api.url}/")  # another page: still logged in
        assert page.url == f"{api.url}/"
        b.close()
    assert api.store.get_sweep(sid).status == "cancelled"


# --- Content-Length bounds ----------------------------------------------------------------------


def _raw(port: int, content_length: str | list[str], *, path: str = "/api/v1/sweeps") -> str:
    """A POST with these Content-Length header(s) and no body, over a raw socket; the status
    line of the answer. A server that waits for the announced body never answers: the socket's
    timeout (generous, for a loaded machine; the answers measured come in milliseconds) fails
    the test."""
    import socket

    values = [content_length] if isinstance(content_length, str) else content_length
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    head += "".join(f"Content-Length: {v}\r\n" for v in values) + "\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode("latin-1"))
        try:
            answer = s.recv(4096)
        except TimeoutError:
            return "no answer"
    return answer.split(b"\r\n", 1)[0].decode("latin-1")


def test_a_20_digit_content_length_is_answered_at_once(start_api):
    """The audit's case: 20 digits were ignored by the guard, and the server waited for a body
    that never came (no answer after 30 s), while 2000000 was a 413 at once."""
    api = start_api(max_body_bytes=1000)
    port = port_of(api)
    assert _raw(port, "9" * 20).endswith("400 Bad Request")
    assert _raw(port, "2000000").endswith("413 Request Entity Too Large")


def test_every_content_length_that_is_not_a_bounded_count_is_refused_at_once(start_api):
    """Huge values of every size (one digit more each time, well past 2**64) and malformed ones:
    each is a 400 — or a 413 for a well-formed count over the body limit — never a wait."""
    api = start_api(max_body_bytes=100)
    port = port_of(api)
    for digits in range(3, 41):  # 3 digits: 999 is over the 100-byte limit already
        status = _raw(port, "9" * digits)
        expected = "413 Request Entity Too Large" if digits <= 18 else "400 Bad Request"
        assert status.endswith(expected), (digits, status)
        if digits > 18:  # a small count, too long a numeral (a shorter one waits for 5 bytes)
            assert _raw(port, "0" * (digits - 1) + "5").endswith("400 Bad Request"), digits
    malformed = ["-1", "+5", "5a", "0x10", "1e3", "1_000", "1.0", "", " ", "5 5", "1,2",
                 "\xb2", "-" + "9" * 25, "9" * 200]  # fmt: skip
    for value in malformed:
        assert _raw(port, value).endswith("400 Bad Request"), repr(value)
    assert _raw(port, ["5", "6"]).endswith("400 Bad Request")  # two that disagree
    assert api.get("/sweeps").json()["count"] == 0
    r = api.post("/sweeps", json=spec())  # a true one still works
    assert r.status_code == 201


def test_the_content_length_check_answers_400_in_the_error_shape():
    from starlette.testclient import TestClient

    from api.app import create_app
    from service.settings import Settings

    app = create_app(Settings(database_url="sqlite://", allowed_hosts=["*"]), store=object())  # type: ignore[arg-type]
    with TestClient(app) as client:
        r = client.post("/api/v1/sweeps", headers={"Content-Length": "9" * 30}, content=b"")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "bad_request" and err["field"] == "Content-Length"
    assert "bounded non-negative integer" in err["message"]
