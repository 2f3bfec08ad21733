"""TrialConfig.tap_metrics: the per-tap metrics (effective_rank, stable_rank, a lab's
registered ones) of each block's output at every recorded epoch (docs/probe.md). One trials
column; each stored `config` lacking the key gains it as false — no trial written before this
revision recorded them — so those rows read as the configs they ran.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.store.migrations.fill import fill_config_keys

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

FIELD = "tap_metrics"


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column(FIELD, sa.Boolean(), nullable=False, server_default=sa.false()))
    fill_config_keys({FIELD: False})


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column(FIELD)
