"""Revision 0007 (TrialConfig.precision_check): a trial written at revision 0006 reads, after
the upgrade, as the config it ran — no precision check (false) — and the new column filters in
SQL; downgrading to 0006 drops the column and nothing else. On SQLite and Postgres."""

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


def test_rows_before_0007_read_as_run_without_the_check(database_url):
    full = TrialConfig(depth=3, seed=4).to_dict()
    later = ("precision_check", "model_params", "tap_metrics")  # tap_metrics: revision 0008
    old = {k: v for k, v in full.items() if k not in later}
    store_trial_at_revision(database_url, "0006", old)  # model_params: a JSON column's default
    before = _columns(database_url)
    assert "precision_check" not in before
    with Store(database_url) as store:  # migrates to head
        trial = store.get_trial(1)
        assert trial.config == {**old, "precision_check": False, "tap_metrics": False}
        assert TrialConfig(**trial.config) == TrialConfig(depth=3, seed=4)
        assert store.list_trials(1, where={"precision_check": False})[1] == 1
        assert store.list_trials(1, where={"precision_check": True})[1] == 0
    assert _columns(database_url) == before | {"precision_check", "tap_metrics"}
    run_alembic(database_url, "downgrade", "0006")
    assert _columns(database_url) == before
