"""Revision 0009 drops the server defaults that backfilled older rows: a trial written at 0008
reads the same after it, no trials column keeps a default, and downgrading puts each back. On
SQLite and Postgres."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect
from support import run_alembic, store_trial_at_revision

from service.config import TrialConfig
from service.store import Store

BACKFILLED = {
    "dtype", "norm_eps", "bias_init", "orthogonal_gain", "input_norm", "spectra",
    "jacobian_samples", "model", "model_params", "residual_scale", "kernel_size", "heads",
    "mlp_ratio", "skip", "norm_position", "precision_check", "tap_metrics",
}  # fmt: skip


def _defaults(database_url: str) -> dict[str, object]:
    engine = create_engine(database_url)
    try:
        return {c["name"]: c.get("default") for c in inspect(engine).get_columns("trials")}
    finally:
        engine.dispose()


def test_the_backfill_defaults_are_dropped_and_rows_read_the_same(database_url):
    full = TrialConfig(depth=3, seed=4, model="resmlp", residual_scale=0.5).to_dict()
    config = {k: v for k, v in full.items() if k != "model_params"}  # its column's default
    store_trial_at_revision(database_url, "0008", config)
    before = _defaults(database_url)
    assert all(before[name] is not None for name in BACKFILLED)
    with Store(database_url) as store:  # migrates to head
        assert store.get_trial(1).config == config
        assert store.list_trials(1, where={"residual_scale": 0.5})[1] == 1
    after = _defaults(database_url)
    assert all(after[name] is None for name in BACKFILLED)
    run_alembic(database_url, "downgrade", "0008")
    assert _defaults(database_url) == before
