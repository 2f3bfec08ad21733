"""The server defaults that backfilled rows older than a column (revisions 0002, 0005, 0007 and
0008 added each column with the value every older trial ran with) are dropped: they were for
those rows alone — the store writes every column of every trial — and without them a migrated
database has exactly the models' schema, which a new database gets at once
(service.store.engine.migrate; tests/service/test_store.py compares the two, defaults
included). Downgrading puts them back.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# column → the server default its revision gave it (the value every older trial ran with)
BACKFILLED: dict[str, str | sa.sql.elements.ColumnElement] = {
    "dtype": "float32",
    "norm_eps": "1e-05",
    "bias_init": "zero",
    "orthogonal_gain": sa.true(),
    "input_norm": "none",
    "spectra": sa.false(),
    "jacobian_samples": "0",
    "model": "mlp",
    "model_params": "{}",
    "residual_scale": "1.0",
    "kernel_size": "3",
    "heads": "4",
    "mlp_ratio": "4",
    "skip": sa.true(),
    "norm_position": "pre",
    "precision_check": sa.false(),
    "tap_metrics": sa.false(),
}


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        for name in BACKFILLED:
            batch.alter_column(name, server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        for name, default in BACKFILLED.items():
            batch.alter_column(name, server_default=default)
