"""The dashboard's login: with a token configured (and reads not open, api/guards.py), a page
asks for it once and opens a server-side login session (service/store/logins.py), whose random
key the browser keeps in an HttpOnly, SameSite=Lax cookie; the guard accepts a live session like
the bearer token.

    GET  /login?next=/sweeps/3   the form (a redirect to / when no token is configured)
    POST /login                  token=…&next=… → 303 to `next` with the cookie, 401, or 429
    POST /logout                 → 303 to /login: the session revoked (every copy of the
                                   cookie dies with it), the cookie cleared

A session ends at logout, at its expiry (ISOSWEEP_SESSION_TTL_S after the login), by `isosweep
sessions revoke`, and when the token changes. Failed logins are throttled per client address and
in all (api/limits.py; a wrong bearer token on the API counts too): past the bound a 429 with
Retry-After, and the token is not even compared (always in constant time) while it lasts.

SameSite=Lax keeps the cookie off every cross-site POST, and the guard's origin check refuses
one from another origin on this site; Lax rather than Strict so that a link to a sweep from
elsewhere (a chat, a mail) opens the page instead of asking again.
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.dashboard.pages import render
from api.guards import SESSION_COOKIE, _cookie, throttle_of
from api.limits import client_key

router = APIRouter(include_in_schema=False)


def _token(request: Request) -> str | None:
    return request.app.state.settings.api_token


def safe_next(target: str | None) -> str:
    """A path on this server to go back to: never another host (`//evil`, `https://…`)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/") -> Response:
    if not _token(request):
        return RedirectResponse("/", status_code=303)
    signed_in = bool(getattr(request.state, "authorized", False))
    return render("login.html", title="log in", next=safe_next(next), signed_in=signed_in)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    from service.store.logins import LoginSessions

    token = _token(request)
    if not token:
        return RedirectResponse("/", status_code=303)
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    given = (form.get("token") or [""])[0].strip()
    target = safe_next((form.get("next") or ["/"])[0])
    throttle, address = throttle_of(request.app.state), client_key(request)
    wait = throttle.retry_after(address)
    if wait is not None:  # nothing is compared while it lasts
        page = render("login.html", 429, title="log in", next=target, signed_in=False, wait=wait)
        page.headers["Retry-After"] = str(wait)
        return page
    if not hmac.compare_digest(given.encode(), token.encode()):
        throttle.failed(address)
        return render("login.html", 401, title="log in", next=target, signed_in=False, wrong=True)
    throttle.succeeded(address)
    settings = request.app.state.settings
    key = await run_in_threadpool(
        LoginSessions(request.app.state.store).open,
        token,
        ttl_s=settings.session_ttl_s,
        client=address,
        user_agent=request.headers.get("user-agent"),
    )
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        key,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    from service.store.logins import LoginSessions

    key = _cookie(request.headers.get("cookie", ""), SESSION_COOKIE)
    if key and _token(request):
        await run_in_threadpool(LoginSessions(request.app.state.store).revoke_key, key)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax")
    return response
