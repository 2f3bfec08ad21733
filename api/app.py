"""The FastAPI app: `create_app(settings, store=…)`.

    app = create_app()                    # opens the store of ISOSWEEP_DATABASE_URL on startup
    app = create_app(settings, store=s)   # uses an open Store (tests, `isosweep serve`)

Routes live under /api/v1 (api/routes), OpenAPI at /openapi.json and /docs, the dashboard at /.
Errors have one shape (api/errors.py); NaN/±inf are "NaN", "Infinity", "-Infinity"
(api/schemas.py). Requests pass the guards first (api/guards.py): the Host allow-list, the
refusal of cross-origin mutations, the token, the API's media types, the body limit.
Nothing here imports torch or Ray.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import swagger_ui_bundle
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import State

from api import dashboard
from api.cache import SingleFlightCache
from api.errors import install_error_handlers
from api.guards import (
    MUTATING,
    BodyLimit,
    ContentLength,
    HostCheck,
    MediaType,
    SameOrigin,
    TokenAuth,
    open_path,
)
from api.openapi import finish, operation_id
from api.routes import api_router
from api.routes.health import SupervisedRunner
from api.schemas import NonFiniteJSONResponse
from service import __version__, models
from service.settings import Settings, get_settings
from service.store import Store

DESCRIPTION = """Sweeps of signal propagation in deep networks: submit a sweep, follow it, read
its per-epoch, per-layer metrics as tidy rows (JSON, CSV, Parquet), plot them, and compare with
the mean-field theory. NaN and ±inf are the JSON strings "NaN", "Infinity", "-Infinity".
Errors: `{"error": {"type", "message", "field", "allowed"}}`. See docs/api.md."""


def create_app(
    settings: Settings | None = None,
    *,
    store: Store | None = None,
    runner: SupervisedRunner | None = None,
) -> FastAPI:
    """The API app. A store passed in stays the caller's to close; otherwise the app opens one
    on startup (running migrations) and closes it on shutdown. `runner`: what supervises the
    runner beside the API (`isosweep serve`: api.cli.supervise.RunnerSupervisor, whose
    `status()` healthz reports), or None when no runner is supervised here."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = app.state.store is None
        if own:
            current = app.state.settings  # set_state's latest
            app.state.store = await run_in_threadpool(Store, current.database_url, settings=current)
        try:
            yield
        finally:
            if own:
                app.state.store.close()
                app.state.store = None

    app = FastAPI(
        title="isosweep",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        default_response_class=NonFiniteJSONResponse,
        docs_url=None,  # served below from vendored Swagger UI files: /docs works offline
        redoc_url=None,
        generate_unique_id_function=operation_id,  # operationId = the handler's name
    )
    install_error_handlers(app)  # its CatchAll innermost, the guards (set_state) around it
    set_state(app, settings, store=store, runner=runner)
    app.include_router(api_router)
    app.include_router(dashboard.router)
    _offline_docs(app)
    return app


def set_state(
    app: FastAPI, settings: Settings, *, store: Store | None = None, runner: Any = None
) -> None:
    """What an app holds besides its routes, all of it new: settings, store, runner, the read
    cache, the OpenAPI document, the middleware (the guards, from these settings); and none of
    what requests add (the heavy-read queue, the throttles); and the registered models loaded
    (once per process: a misconfigured ISOSWEEP_MODEL_MODULES fails here, at start).
    create_app calls it; a test that serves many databases with one settings calls it again on
    the app it built once (FastAPI builds an app's included routes at its first request,
    ~0.2 s: tests/api/conftest.py)."""
    models.load_registered()
    app.state = State()
    app.state.settings = settings
    app.state.store = store
    app.state.runner = runner
    app.state.cache = SingleFlightCache()  # metric frames and plots, per sweep version
    app.openapi_schema = None
    app.openapi = lambda: _openapi(app, settings)  # type: ignore[method-assign]
    app.middleware_stack = None  # built anew at the first request, with these guards
    guards = _guards(settings)
    kinds = {cls for cls, _ in guards}
    app.user_middleware[:] = [m for m in app.user_middleware if m.cls not in kinds]
    for cls, options in guards:
        app.add_middleware(cls, **options)


def _guards(settings: Settings) -> list[tuple[Any, dict[str, Any]]]:
    """The guard middleware and its options, innermost first: a request meets HostCheck
    first, BodyLimit last (api/guards.py)."""
    return [
        (BodyLimit, {"max_bytes": settings.max_body_bytes}),
        (MediaType, {}),
        (TokenAuth, {"token": settings.api_token, "open_reads": settings.open_reads}),
        (SameOrigin, {}),
        (ContentLength, {}),
        (HostCheck, {"allowed": settings.allowed_hosts}),
    ]


def _offline_docs(app: FastAPI) -> None:
    """/docs with Swagger UI from the swagger-ui-bundle package instead of a CDN."""
    app.mount(
        "/docs-assets",
        StaticFiles(directory=str(swagger_ui_bundle.swagger_ui_path)),
        name="docs-assets",
    )

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title="isosweep API",
            swagger_js_url="/docs-assets/swagger-ui-bundle.js",
            swagger_css_url="/docs-assets/swagger-ui.css",
            swagger_favicon_url="/docs-assets/favicon-32x32.png",
        )


def _openapi(app: FastAPI, settings: Settings) -> dict[str, Any]:
    """FastAPI's document, plus the components of api.openapi (the SweepSpec body, metric rows)
    and, with a token, bearer security on every operation that needs it (mutating ones; reads
    too unless reads are open)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    finish(doc)
    if settings.api_token:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path, ops in doc["paths"].items():
            for method, op in ops.items():
                if open_path(path):
                    continue
                if method.upper() in MUTATING or not settings.open_reads:
                    op["security"] = [{"bearer": []}]
    app.openapi_schema = doc
    return doc
