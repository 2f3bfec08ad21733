"""Helpers that test modules in every folder share (imported as `support`; a conftest.py cannot
be imported by name: each folder has one, and `import conftest` finds whichever came last)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

# The smallest real training trial: the Ray tests of the driver and the runner sweep over it.
TINY = {"width": 16, "batch_size": 32, "dataset": "digits", "norm": "batch", "activation": "relu"}


def require(var: str) -> bool:
    """Whether the CI switch `var` (ISOSWEEP_REQUIRE_POSTGRES, …_BROWSER) makes a backend
    mandatory: a missing one then fails the test instead of skipping it."""
    return os.environ.get(var, "") not in ("", "0")


def free_port() -> int:
    """A loopback TCP port that nothing listens on at the moment."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def isosweep_command() -> list[str]:
    """The `isosweep` command line: the console script next to this Python, or, in a checkout
    where it is not installed, its target module run by this Python."""
    exe = Path(sys.executable).with_name("isosweep")
    if exe.is_file() and os.access(exe, os.X_OK):
        return [str(exe)]
    return [sys.executable, "-m", "api.cli.main"]


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes of a session: a runner started with start_new_session and
    everything it spawned, Ray's GCS, raylet and workers included."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
        if int(session) == sid and state != "Z":
            found.append(int(name))
    return found


def run_alembic(database_url: str, action: str, revision: str) -> None:
    """alembic `action` ("upgrade", "downgrade") to `revision` on the database, one transaction."""
    from alembic import command
    from sqlalchemy import create_engine

    from service.store.engine import alembic_config

    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            getattr(command, action)(alembic_config(conn), revision)
    finally:
        engine.dispose()


def store_trial_at_revision(database_url: str, revision: str, config: dict) -> None:
    """Migrate an empty database to `revision` and store one completed trial (id 1, sweep 1) whose
    config columns and stored config are `config`: a row as a server at that revision wrote it,
    for tests of the migrations after it."""
    import json

    from alembic import command
    from sqlalchemy import create_engine, text

    from service.store.engine import alembic_config

    engine = create_engine(database_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)
        conn.execute(
            text(
                "INSERT INTO sweeps (id, name, tags, spec, status, priority, cancel_requested,"
                " created_at) VALUES (1, 's', '[]', '{}', 'completed', 0, false, :now)"
            ),
            {"now": "2025-01-01 00:00:00"},
        )
        columns = ", ".join(f'"{k}"' for k in config)
        values = ", ".join(f":{k}" for k in config)
        conn.execute(
            text(
                'INSERT INTO trials (id, sweep_id, "index", config, config_hash, status, attempts,'
                f" epochs_done, epochs_total, {columns}) VALUES (1, 1, 0, :config, 'h',"
                f" 'completed', 1, 0, 11, {values})"
            ),
            {**config, "config": json.dumps(config)},
        )
    engine.dispose()
