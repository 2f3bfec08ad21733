"""Shared fixtures: database URLs for both backends (a test marked `sqlite_only` runs on SQLite
alone), and the CI switches that make optional backends mandatory (ISOSWEEP_REQUIRE_POSTGRES=1,
ISOSWEEP_REQUIRE_BROWSER=1, set by .ci/run; support.require reads them)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from support import require

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

POSTGRES_URL = os.environ.get(
    "ISOSWEEP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "sqlite_only: the `database_url` fixture gives SQLite alone (no Postgres run)"
    )


def _postgres_run(item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("database_url") == "postgres"


def pytest_collection_modifyitems(config, items):
    """Drop the Postgres run of `sqlite_only` tests at collection: not run, not reported."""
    dropped = [i for i in items if i.get_closest_marker("sqlite_only") and _postgres_run(i)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(dropped)
        items[:] = [i for i in items if i not in gone]


def _postgres_admin():
    """A psycopg connection to the server's `postgres` database, or None when unreachable."""
    import psycopg

    base = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    admin = base.rsplit("/", 1)[0] + "/postgres"
    try:
        return psycopg.connect(admin, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        if require("ISOSWEEP_REQUIRE_POSTGRES"):
            pytest.fail(f"PostgreSQL is required (ISOSWEEP_REQUIRE_POSTGRES=1) but: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {admin}: {exc}")


@pytest.fixture
def postgres_url():
    """A fresh, empty Postgres database for one test; dropped afterwards."""
    conn = _postgres_admin()
    name = f"isosweep_t_{uuid.uuid4().hex[:12]}"
    conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'isosweep.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request):
    """Each test that takes this runs once on SQLite and once on Postgres; on SQLite alone when
    marked `sqlite_only` (its Postgres run is deselected at collection)."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    if request.node.get_closest_marker("sqlite_only"):
        pytest.skip("marked sqlite_only")
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def artifacts_dir():
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
