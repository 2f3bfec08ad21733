"""The one idempotent write the store's tables share: INSERT … ON CONFLICT DO UPDATE in the
engine's dialect (PostgreSQL or SQLite), executemany in chunks. The epoch records' metrics and
artifacts (service.store.results) and their spectra (service.store.spectra) both write with it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

CHUNK = 500  # rows per executemany


def upsert(
    s: Session, table: Table, rows: list[dict[str, Any]], keys: tuple[str, ...], cols: tuple
) -> None:
    """INSERT … ON CONFLICT (keys) DO UPDATE SET cols, executemany in chunks."""
    if not rows:
        return
    make = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    ins = make(table)
    stmt = ins.on_conflict_do_update(
        index_elements=list(keys), set_={c: ins.excluded[c] for c in cols}
    )
    for k in range(0, len(rows), CHUNK):
        s.execute(stmt, rows[k : k + CHUNK])
