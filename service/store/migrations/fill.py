"""Data steps that more than one revision takes: stored `config` documents gain the keys of new
TrialConfig fields, so that old rows read as the configs they ran. Kept apart from the models
(revisions must not change with them); a revision calls these with its own constants."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

BATCH = 500  # trials read per round trip


def fill_config_keys(values: dict[str, Any]) -> None:
    """Add `values` (field → the value its rows had) to every stored trial config lacking one
    of those keys; keys a config already has are left as they are."""
    trials = sa.table("trials", sa.column("id", sa.Integer), sa.column("config", sa.JSON))
    conn = op.get_bind()
    last = 0
    while True:
        rows = conn.execute(
            sa.select(trials.c.id, trials.c.config)
            .where(trials.c.id > last)
            .order_by(trials.c.id)
            .limit(BATCH)
        ).all()
        if not rows:
            return
        for trial_id, config in rows:
            if any(k not in config for k in values):
                filled = {**values, **config}
                conn.execute(sa.update(trials).where(trials.c.id == trial_id).values(config=filled))
        last = rows[-1][0]
