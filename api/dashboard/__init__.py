"""The page at `/`. A placeholder listing sweeps as plain HTML; the dashboard replaces it (keep
`router`: api.app includes it)."""

from __future__ import annotations

from html import escape

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
def dashboard(request: Request) -> HTMLResponse:
    """The sweeps, newest first, each linking to its JSON."""
    store = request.app.state.store
    sweeps, total = store.list_sweeps(limit=50)
    rows = "".join(
        f'<li><a href="/api/v1/sweeps/{s.id}">{s.id}: {escape(s.name)}</a> — {s.status}, '
        f"{s.progress:.0%} of {s.n_trials} trials</li>"
        for s in sweeps
    )
    body = (
        "<!doctype html><html><head><meta charset='utf-8'><title>isosweep</title></head><body>"
        f"<h1>isosweep</h1><p>{total} sweeps · <a href='/docs'>API docs</a></p>"
        f"<ul>{rows}</ul></body></html>"
    )
    return HTMLResponse(body)
