"""Shared fixtures: database URLs for both backends (a test marked `sqlite_only` runs on SQLite
alone), and the CI switches that make optional backends mandatory (ISOSWEEP_REQUIRE_POSTGRES=1,
ISOSWEEP_REQUIRE_BROWSER=1, set by .ci/run; support.require reads them)."""

from __future__ import annotations

import itertools
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


# The modules that take longest, longest first: with pytest-xdist's loadscope (`make test`: each
# module runs whole on one worker) they start first, so that none of them is the run's tail.
LONGEST_FIRST = (
    "test_surface.py",
    "test_fuzz.py",
    "test_serve.py",
    "test_cluster.py",
    "test_monitor.py",
    "test_multinode.py",
    "test_client.py",
    "test_lazy_sweep.py",
    "test_runner.py",
    "test_driver.py",
    "test_predict_vs_engine.py",
    "test_packed_runner.py",
    "test_lease.py",
    "test_search_runner.py",
    "test_halving_sync.py",
    "test_cli_theory_trial.py",
)


# Modules whose every test is slow and that do costly work at collection (test_fuzz.py:
# schemathesis builds its coverage phase's cases, ~10 s a process): not imported by a run
# whose -m deselects every slow test (`make test-fast`).
SLOW_ONLY = ("test_fuzz.py",)


def pytest_ignore_collect(collection_path, config):
    if collection_path.name in SLOW_ONLY and _deselects_slow(config.option.markexpr):
        return True
    return None


def _deselects_slow(markexpr: str) -> bool:
    """Whether -m `markexpr` deselects a test marked slow, whatever its other marks are among
    those a slow-only module's tests carry (postgres)."""
    if not markexpr:
        return False
    try:
        from _pytest.mark.expression import Expression  # pytest's own -m parser
    except ImportError:  # pragma: no cover - collect, as without this rule
        return False
    expr = Expression.compile(markexpr)
    return not any(expr.evaluate(_carries(marks)) for marks in ({"slow"}, {"slow", "postgres"}))


def _carries(marks: set[str]):
    """-m's matcher for a test with `marks` (none of them with arguments)."""

    def match(name: str, /, **kwargs) -> bool:
        return name in marks and not kwargs

    return match


def _rank(item) -> int:
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    """Drop the Postgres run of `sqlite_only` tests at collection: not run, not reported; then
    the longest modules first (a stable sort: the others keep their order). A test of a
    SLOW_ONLY module that is not marked slow is an error: test-fast would never run it."""
    fast = [
        i.nodeid for i in items if i.path.name in SLOW_ONLY and not i.get_closest_marker("slow")
    ]
    if fast:
        raise pytest.UsageError(
            f"{', '.join(fast)}: not marked slow in a module of SLOW_ONLY (tests/conftest.py), "
            "which `make test-fast` does not collect: mark it slow or move it to another module"
        )
    dropped = [i for i in items if i.get_closest_marker("sqlite_only") and _postgres_run(i)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(dropped)
        items[:] = [i for i in items if i not in gone]
    items.sort(key=_rank)
    _sweep_by_sweep(items)


def _sweep_by_sweep(items) -> None:
    """test_surface.py's cells sweep by sweep, in the order the sweeps run (each cell waits for
    its sweep to end: the reads of the first sweeps go on while the runner runs the next), then
    its tests of every sweep at once; in place, the other tests where they were."""
    ours = [i for i in items if i.path.name == "test_surface.py"]

    def sweep(item) -> str | None:
        spec = getattr(item, "callspec", None)
        return spec.params.get("name") if spec is not None else None

    names = list(dict.fromkeys(n for i in ours if (n := sweep(i)) is not None))
    ordered = iter(sorted(ours, key=lambda i: names.index(n) if (n := sweep(i)) else len(names)))
    items[:] = [next(ordered) if i.path.name == "test_surface.py" else i for i in items]


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


@pytest.fixture(scope="session")
def _postgres_database():
    """(url, connection) of a Postgres database of this test process's own (each pytest-xdist
    worker has one), dropped at the end of the session."""
    import psycopg

    admin = _postgres_admin()
    name = f"isosweep_t_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    try:
        yield url, conn
    finally:
        conn.close()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def postgres_url(_postgres_database):
    """An empty Postgres database for one test: the session's, its sessions ended and its
    schema dropped and made anew (what a new database gives, without CREATE DATABASE's
    checkpoint: ~0.01 s rather than ~0.1 s idle and seconds on a busy machine)."""
    url, conn = _postgres_database
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    conn.execute("DROP SCHEMA public CASCADE")
    conn.execute("CREATE SCHEMA public")
    # A URL of this test's own, as a database of its own had: what a process caches per
    # database URL (the cost model's measured throughput, the overlay's predictions per trial
    # id) must not carry over from the previous test's rows.
    return f"{url}?application_name=isosweep_test_{next(_TEST_NUMBERS)}"


_TEST_NUMBERS = itertools.count(1)


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
