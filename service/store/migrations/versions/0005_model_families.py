"""TrialConfig.model and the model families' fields (docs/models.md): one trials column each;
each stored `config` lacking the keys gains them at their defaults — model "mlp", the only
network trials written before this revision could run — so those rows read as the configs they
ran.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.store.migrations.fill import fill_config_keys

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# field → (column type, nullable, the value every older trial ran with)
FIELDS: dict[str, tuple[sa.types.TypeEngine, bool, object]] = {
    "model": (sa.String(32), False, "mlp"),
    "model_params": (sa.JSON(), False, {}),
    "residual_scale": (sa.Float(), False, 1.0),
    "kernel_size": (sa.Integer(), False, 3),
    "patch_size": (sa.Integer(), True, None),
    "heads": (sa.Integer(), False, 4),
    "mlp_ratio": (sa.Integer(), False, 4),
    "skip": (sa.Boolean(), False, True),
    "norm_position": (sa.String(32), False, "pre"),
}


def _server_default(value: object) -> str | sa.sql.elements.ColumnElement | None:
    """The column default for rows written before this revision (a quoted literal)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return sa.true() if value else sa.false()
    return "{}" if isinstance(value, dict) else str(value)


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        for name, (sql_type, nullable, value) in FIELDS.items():
            batch.add_column(
                sa.Column(name, sql_type, nullable=nullable, server_default=_server_default(value))
            )
    fill_config_keys({name: value for name, (_, _, value) in FIELDS.items()})


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        for name in FIELDS:
            batch.drop_column(name)
