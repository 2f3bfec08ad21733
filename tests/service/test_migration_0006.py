"""Revision 0006 (the dashboard's login sessions): a database at 0005, with a trial in it,
upgrades to a `login_sessions` table that sessions are opened in and checked against, the trial
untouched; downgrading to 0005 removes that table and nothing else. On SQLite and Postgres."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, text
from support import run_alembic, store_trial_at_revision

from service.config import TrialConfig
from service.store import Store
from service.store.logins import LoginSessions


def _tables(database_url: str) -> set[str]:
    engine = create_engine(database_url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_0006_upgrades_from_0005_and_downgrades_back(database_url):
    full = TrialConfig(depth=3, seed=4).to_dict()
    # model_params: a JSON column, its default; precision_check, tap_metrics: revisions 0007's
    # and 0008's
    later = ("model_params", "precision_check", "tap_metrics")
    config = {k: v for k, v in full.items() if k not in later}
    store_trial_at_revision(database_url, "0005", config)
    at_0005 = _tables(database_url)
    assert "login_sessions" not in at_0005
    with Store(database_url) as store:  # migrates to head: 0006
        assert store.get_trial(1).config.items() >= config.items()  # older rows untouched
        logins = LoginSessions(store)
        key = logins.open("tok", ttl_s=60, client="10.0.0.1", user_agent="x" * 500)
        assert logins.check(key, "tok") and not logins.check(key, "other")
        (s,) = logins.list()
        assert (s.id, s.client, s.user_agent, s.state) == (1, "10.0.0.1", "x" * 200, "active")
        with store.engine.connect() as conn:
            version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            assert version >= "0006"  # head: 0006 or a later revision
            stored = conn.execute(text("SELECT key_hash FROM login_sessions")).scalar()
            assert stored != key and len(stored) == 64  # only the key's SHA-256
    assert _tables(database_url) == at_0005 | {"login_sessions"}
    run_alembic(database_url, "downgrade", "0005")
    assert _tables(database_url) == at_0005
    with Store(database_url) as store:  # and up again, empty
        assert LoginSessions(store).list() == []
