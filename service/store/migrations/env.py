"""Alembic environment, configured in code: the store passes its open connection in
`config.attributes["connection"]`, so no alembic.ini is needed at runtime. Run from the command
line (`alembic -c service/store/migrations/alembic.ini …`), it connects to ISOSWEEP_DATABASE_URL.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from service.store.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite ALTERs need batch mode
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from service.settings import get_settings

    url = config.get_main_option("sqlalchemy.url") or get_settings().database_url
    engine = create_engine(url)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("isosweep migrations run online only (they need the dialect's connection)")
run_online()
