"""Initial tables: sweeps, trials (one column per TrialConfig field), metrics, artifacts.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _config_columns() -> list[sa.Column]:
    """TrialConfig's fields, in its order (service.config.CONFIG_FIELDS)."""
    name = sa.String(32)
    return [
        sa.Column("depth", sa.Integer(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("activation", name, nullable=False),
        sa.Column("activation_gain", sa.Float(), nullable=False),
        sa.Column("gain_exponent", sa.Float(), nullable=False),
        sa.Column("norm", name, nullable=False),
        sa.Column("order", name, nullable=False),
        sa.Column("init", name, nullable=False),
        sa.Column("init_gain", sa.Float(), nullable=False),
        sa.Column("bias", sa.Boolean(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("epochs", sa.Integer(), nullable=False),
        sa.Column("optimizer", name, nullable=False),
        sa.Column("lr", sa.Float(), nullable=False),
        sa.Column("momentum", sa.Float(), nullable=False),
        sa.Column("weight_decay", sa.Float(), nullable=False),
        sa.Column("dataset", name, nullable=False),
        sa.Column("max_train_samples", sa.Integer(), nullable=True),
        sa.Column("eval_norm", name, nullable=False),
        sa.Column("record_every", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("runner_id", sa.String(200), nullable=True),
        sa.Column("lease_s", sa.Float(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_sweeps"),
    )
    op.create_index(
        "ix_sweeps_status_priority_created_at", "sweeps", ["status", "priority", "created_at"]
    )
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("epochs_done", sa.Integer(), nullable=False),
        sa.Column("epochs_total", sa.Integer(), nullable=False),
        sa.Column("last_epoch", sa.Integer(), nullable=True),
        sa.Column("diverged_epoch", sa.Integer(), nullable=True),
        sa.Column("results_from", sa.Integer(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=True),
        *_config_columns(),
        sa.PrimaryKeyConstraint("id", name="pk_trials"),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name="fk_trials_sweep_id_sweeps", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["results_from"], ["trials.id"], name="fk_trials_results_from_trials"
        ),
        sa.UniqueConstraint("sweep_id", "index", name="uq_trials_sweep_id_index"),
    )
    op.create_index("ix_trials_sweep_id_status", "trials", ["sweep_id", "status"])
    op.create_index("ix_trials_config_hash_status", "trials", ["config_hash", "status"])
    op.create_table(
        "metrics",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("trial_id", "metric", "epoch", name="pk_metrics"),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["trials.id"], name="fk_metrics_trial_id_trials", ondelete="CASCADE"
        ),
    )
    op.create_table(
        "artifacts",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("trial_id", "name", name="pk_artifacts"),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["trials.id"], name="fk_artifacts_trial_id_trials", ondelete="CASCADE"
        ),
    )


def downgrade() -> None:
    op.drop_table("artifacts")
    op.drop_table("metrics")
    op.drop_index("ix_trials_config_hash_status", table_name="trials")
    op.drop_index("ix_trials_sweep_id_status", table_name="trials")
    op.drop_table("trials")
    op.drop_index("ix_sweeps_status_priority_created_at", table_name="sweeps")
    op.drop_table("sweeps")
