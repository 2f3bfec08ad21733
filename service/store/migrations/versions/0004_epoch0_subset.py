"""TrialConfig.epoch0_train_samples: epoch 0's train_loss/train_acc measured on a seeded subset.
One nullable trials column; each stored `config` lacking the key gains it as null (= all
training samples), which is what every trial written before this revision measured, so those
rows read as the configs they ran.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

FIELD = "epoch0_train_samples"
BATCH = 500


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column(FIELD, sa.Integer(), nullable=True))
    _fill_configs()


def _fill_configs() -> None:
    """Add the key, as null, to every stored config that lacks it."""
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
            if FIELD not in config:
                filled = {**config, FIELD: None}
                conn.execute(sa.update(trials).where(trials.c.id == trial_id).values(config=filled))
        last = rows[-1][0]


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column(FIELD)
