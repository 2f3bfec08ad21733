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

from service.store.migrations.fill import fill_config_keys

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

FIELD = "epoch0_train_samples"


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column(FIELD, sa.Integer(), nullable=True))
    fill_config_keys({FIELD: None})


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column(FIELD)
