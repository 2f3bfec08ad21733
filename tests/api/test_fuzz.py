"""Property-based fuzzing of every operation in the OpenAPI document (schemathesis 4): whatever
a client sends, positive or negative, the API never answers 500 and every answer conforms to the
document (status codes, content types, body schemas). On SQLite and Postgres, because the two
refuse different things (NUL bytes, 64-bit integers) and either could leak as a server error."""

from __future__ import annotations

import json

import pytest
from api_support import fill, spec
from fuzz_support import APP, LIMITS, schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


READ_TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def wired(start_api):
    """A small filled sweep (ids 1.. exist) in a fresh database, behind APP."""
    api = start_api(**LIMITS)
    s = api.post("/sweeps", json=spec("seeded", depth=[2, 3], init=["gaussian", "orthogonal"]))
    fill(api, s.json()["id"])
    APP.state.store, APP.state.settings = api.store, api.settings
    yield
    APP.state.store = None


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,  # the same cases every run: a failure here is reproducible
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors_and_no_schema_violations(case):
    # Latency is not checked here: schemathesis's 10 s read timeout failed plots on a loaded
    # 2-core machine, so the client waits longer than the plot time limit (a 504 is declared).
    case.call_and_validate(checks=CHECKS, timeout=READ_TIMEOUT_S)


# Schemathesis rarely builds the values the databases refuse, so they get a generator of their
# own: strings with NUL and unpaired surrogates, integers far outside 32 and 64 bits.
TEXT = st.text(st.characters(exclude_categories=()), max_size=12)
INT = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([2**31, 2**63, -(2**31) - 1]))
SPECS = st.fixed_dictionaries(
    {"name": TEXT},
    optional={
        "description": st.none() | TEXT,
        "tags": st.lists(TEXT, max_size=3),
        "priority": INT,
        "max_failures": INT,
        "seeds": st.one_of(INT, st.lists(INT, max_size=3)),
        "parameters": st.fixed_dictionaries(
            {},
            optional={
                "epochs": st.integers(0, 3),
                "record_every": INT,
                "max_train_samples": INT,
                "activation": TEXT,
                "lr": st.floats(allow_nan=True, allow_infinity=True),
            },
        ),
    },
)


@pytest.mark.slow
@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(body=SPECS)
def test_specs_the_database_cannot_store_are_422_not_5xx(api, body):
    raw = json.dumps(body, allow_nan=True).encode()  # ASCII: lone surrogates as \\udxxx escapes
    r = api.post("/sweeps", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code in (201, 422), (body, r.text)
    if r.status_code == 422:
        assert r.json()["error"]["field"], r.text
    else:
        assert api.get(f"/sweeps/{r.json()['id']}").json()["name"] == body["name"].strip()
