"""The dashboard's login: with a token configured (and reads not open, api/guards.py), a page
asks for it once and keeps, in an HttpOnly, SameSite=Lax cookie, a value derived from it
(guards.session_value), which the guard accepts like the bearer token.

    GET  /login?next=/sweeps/3   the form (a redirect to / when no token is configured)
    POST /login                  token=…&next=… → 303 to `next` with the cookie, or 401
    POST /logout                 → 303 to /login, the cookie cleared

SameSite=Lax keeps the cookie off every cross-site POST, and the guard's origin check refuses
one from another origin on this site; Lax rather than Strict so that a link to a sweep from
elsewhere (a chat, a mail) opens the page instead of asking again.
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.dashboard.pages import render
from api.guards import SESSION_COOKIE, session_value

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
    token = _token(request)
    if not token:
        return RedirectResponse("/", status_code=303)
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    given = (form.get("token") or [""])[0].strip()
    target = safe_next((form.get("next") or ["/"])[0])
    if not hmac.compare_digest(given.encode(), token.encode()):
        return render("login.html", 401, title="log in", next=target, signed_in=False, wrong=True)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        session_value(token),
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax")
    return response
