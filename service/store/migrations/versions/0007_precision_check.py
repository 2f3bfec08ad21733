"""TrialConfig.precision_check: epoch 0's probe re-run in float64 beside a float32 trial's
(docs/science.md, "Precision"). One trials column; each stored `config` lacking the key gains it
as false — no trial written before this revision re-ran anything — so those rows read as the
configs they ran.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.store.migrations.fill import fill_config_keys

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

FIELD = "precision_check"


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column(FIELD, sa.Boolean(), nullable=False, server_default=sa.false()))
    fill_config_keys({FIELD: False})


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column(FIELD)
