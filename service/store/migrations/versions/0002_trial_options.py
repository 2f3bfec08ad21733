"""Trial options for publishable measurements: dtype, norm_eps, bias_init, head_init,
orthogonal_gain, input_norm, spectra, jacobian_samples (one trials column each, like every
TrialConfig field). Server defaults are the fields' defaults, and each stored `config` (the
resolved TrialConfig, whole) gains the new keys at their defaults, so rows written before this
revision read as the configs they ran.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.store.migrations.fill import fill_config_keys

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _columns() -> list[sa.Column]:
    """The new TrialConfig fields, in its order (service.config.CONFIG_FIELDS)."""
    name = sa.String(32)
    return [
        sa.Column("dtype", name, nullable=False, server_default="float32"),
        sa.Column("norm_eps", sa.Float(), nullable=False, server_default="1e-05"),
        sa.Column("bias_init", name, nullable=False, server_default="zero"),
        sa.Column("head_init", name, nullable=True),
        sa.Column("orthogonal_gain", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("input_norm", name, nullable=False, server_default="none"),
        sa.Column("spectra", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("jacobian_samples", sa.Integer(), nullable=False, server_default="0"),
    ]


# The defaults, written out: a migration must not change when TrialConfig later does.
DEFAULTS = {
    "dtype": "float32",
    "norm_eps": 1e-05,
    "bias_init": "zero",
    "head_init": None,
    "orthogonal_gain": True,
    "input_norm": "none",
    "spectra": False,
    "jacobian_samples": 0,
}


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        for column in _columns():
            batch.add_column(column)
    fill_config_keys(DEFAULTS)


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        for column in reversed(_columns()):
            batch.drop_column(column.name)
