"""Engines, the one transaction helper, and migrations on start.

SQLite: WAL (readers never block the writer, nor it them), a 30 s busy timeout, foreign keys on,
and `BEGIN IMMEDIATE` for write transactions: a writer takes the write lock when it begins, so
concurrent writers queue on the busy timeout instead of failing with "database is locked" when a
read transaction tries to upgrade. Read transactions use a plain deferred `BEGIN`. Writers of
one process (every Store of one database file) also queue on an in-process lock taken at
BEGIN IMMEDIATE and released at COMMIT or ROLLBACK, without a deadline short enough to fail a
long queue: only other processes' writers wait on the busy timeout.
Postgres: psycopg 3, READ COMMITTED; row locks where ordering matters (claim_sweep).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from service.errors import IsosweepError, StorageError
from service.store.models import Base

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
WRITER_QUEUE_S = 600.0  # the longest a write waits for the writers of its own process
WRITE = "isosweep_write"  # execution option marking a write transaction
MIGRATION_LOCK = 0x150_5EE9  # Postgres advisory lock key held while migrating


def normalize_url(url: str) -> str:
    """Route plain `postgresql://` (and `postgres://`) URLs to the psycopg 3 driver."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str) -> Engine:
    """An Engine for a SQLite or Postgres URL, configured as the module docstring says.

    Connections open lazily: an unreachable server surfaces as StorageError from the first
    transaction (or from migrate).
    """
    url = normalize_url(url)
    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    memory = u.database in (None, "", ":memory:")
    if memory:  # one shared connection; for tests and throwaway use only
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        path = str(u.database)
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
    _configure_sqlite(engine, wal=not memory, key=None if memory else _file_key(path))
    return engine


_writer_locks: dict[str, threading.RLock] = {}
_writer_locks_guard = threading.Lock()


def _file_key(database: str) -> str:
    return str(Path(database).expanduser().resolve())


def writer_lock(key: str) -> threading.RLock:
    """The in-process lock of the writers of one SQLite database (key: its resolved path)."""
    with _writer_locks_guard:
        return _writer_locks.setdefault(key, threading.RLock())


def _configure_sqlite(engine: Engine, *, wal: bool, key: str | None) -> None:
    lock = writer_lock(key) if key is not None else threading.RLock()  # memory: per engine

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        if wal:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; safe with WAL
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        if not conn.get_execution_options().get(WRITE, False):
            conn.exec_driver_sql("BEGIN")
            return
        if not lock.acquire(timeout=WRITER_QUEUE_S):
            raise StorageError(
                f"the database is busy: writes of this process queued over {WRITER_QUEUE_S:g} s"
            )
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            lock.release()
            raise
        conn.info[WRITE] = lock

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _on_end(conn: Any) -> None:
        held = conn.info.pop(WRITE, None)
        if held is not None:
            held.release()


class Sessions:
    """Sessions for read and write transactions over one engine."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._read = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(
            engine.execution_options(**{WRITE: True}), expire_on_commit=False
        )

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[Session]:
        """One transaction: commit at the end, or roll back on any error.

        Raises:
            StorageError: the database failed (the SQLAlchemy error is chained).
            IsosweepError: domain errors raised inside pass through unchanged.
        """
        session = (self._write if write else self._read)()
        try:
            yield session
            session.commit()
        except IsosweepError:
            session.rollback()
            raise
        except SQLAlchemyError as exc:
            session.rollback()
            raise StorageError(f"database error: {_reason(exc)}") from exc
        finally:
            session.close()


def _reason(exc: SQLAlchemyError) -> str:
    orig = getattr(exc, "orig", None)
    return str(orig if orig is not None else exc).strip().splitlines()[0]


def alembic_config(connection: Any = None) -> Config:
    """Alembic's config of the project's revisions (MIGRATIONS), run on `connection` if given."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def migrate(engine: Engine, *, replay: bool = False) -> None:
    """Bring the schema to the newest Alembic revision, in one transaction.

    An empty database (no table at all) gets the newest schema at once — the models' tables
    created, then stamped at head — rather than every revision replayed in turn (on SQLite each
    column change rebuilds its table: ~0.5 s of a new store's ~0.6 s). The two are the same
    schema: tests/service/test_store.py replays the revisions (`replay`) and compares them with
    the models. Safe when several processes start at once: Postgres serializes them on an
    advisory lock, SQLite on its write lock (BEGIN IMMEDIATE); the later ones find the schema
    at head.

    Raises:
        StorageError: the database is unreachable or a migration failed (rolled back).
    """
    cfg = alembic_config()
    try:
        with engine.execution_options(**{WRITE: True}).connect() as conn, conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
            cfg.attributes["connection"] = conn
            if not replay and not inspect(conn).get_table_names():
                Base.metadata.create_all(conn)
                command.stamp(cfg, "head")
            else:
                command.upgrade(cfg, "head")
    except SQLAlchemyError as exc:
        raise StorageError(f"cannot migrate the database: {_reason(exc)}") from exc
