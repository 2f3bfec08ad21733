"""The `login_sessions` table: the dashboard's server-side login sessions (a random key in the
cookie, its SHA-256 here; created, last used, expiry, revocation; service/store/logins.py).
Nothing older changes.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "login_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("token_tag", sa.String(64), nullable=False),
        sa.Column("client", sa.String(64), nullable=True),
        sa.Column("user_agent", sa.String(200), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("last_used_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_login_sessions"),
        sa.UniqueConstraint("key_hash", name="uq_login_sessions_key_hash"),
    )


def downgrade() -> None:
    op.drop_table("login_sessions")
