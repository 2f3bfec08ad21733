"""The fuzzed app and its OpenAPI schema (tests/api/test_fuzz.py), apart from the fuzzing so
that a module can read the schema without collecting schemathesis's tests (whose coverage
cases are built at collection)."""

from __future__ import annotations

import schemathesis

from api.app import create_app
from service.settings import Settings

LIMITS = {"max_trials_per_sweep": 24, "max_points": 50_000, "max_body_bytes": 20_000}
# The app is built once, without a store: `wired` plugs in a fresh, filled one for each test.
# (Loading the schema runs the app's lifespan, which opens its own store: keep it in memory.)
# Schemathesis calls the app as Host "testserver": allowed here (the live server's loopback
# names are the default).
APP = create_app(
    Settings(database_url="sqlite:///:memory:", allowed_hosts=["testserver"], **LIMITS)
)
# GET /sweeps/{id}/events streams until its sweep is final, and a client of the document reads
# each answer to its end: left out here (tests/api/test_events.py covers it).
EVENTS = "/api/v1/sweeps/{sweep_id}/events"
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(path=EVENTS)
