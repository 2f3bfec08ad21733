"""Revision 0008 (TrialConfig.tap_metrics): a trial written at revision 0007 reads, after the
upgrade, as the config it ran — no per-tap metrics (false) — and the new column filters in
SQL; downgrading to 0007 drops the column and nothing else. On SQLite and Postgres."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect
from support import run_alembic, store_trial_at_revision

from service.config import TrialConfig
from service.store import Store


def _columns(database_url: str) -> set[str]:
    engine = create_engine(database_url)
    try:
        return {c["name"] for c in inspect(engine).get_columns("trials")}
    finally:
        engine.dispose()


def test_rows_before_0008_read_as_run_without_the_tap_metrics(database_url):
    full = TrialConfig(depth=3, seed=4).to_dict()
    old = {k: v for k, v in full.items() if k not in ("tap_metrics", "model_params")}
    store_trial_at_revision(database_url, "0007", old)  # model_params: a JSON column's default
    before = _columns(database_url)
    assert "tap_metrics" not in before
    with Store(database_url) as store:  # migrates to head
        trial = store.get_trial(1)
        assert trial.config == {**old, "tap_metrics": False}  # as the trial ran
        assert TrialConfig(**trial.config) == TrialConfig(depth=3, seed=4)
        assert store.list_trials(1, where={"tap_metrics": False})[1] == 1
        assert store.list_trials(1, where={"tap_metrics": True})[1] == 0
    assert _columns(database_url) == before | {"tap_metrics"}
    run_alembic(database_url, "downgrade", "0007")
    assert _columns(database_url) == before
