"""The `spectra` table: per-epoch 2-D arrays of a trial (Gram eigenvalues, Jacobian singular
values; service.config.SPECTRUM_KEYS), one row per (trial, name, epoch).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "spectra",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("trial_id", "name", "epoch", name="pk_spectra"),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["trials.id"], name="fk_spectra_trial_id_trials", ondelete="CASCADE"
        ),
    )


def downgrade() -> None:
    op.drop_table("spectra")
