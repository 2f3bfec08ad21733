"""Revision 0004 (TrialConfig.epoch0_train_samples): a trial written at revision 0003 reads,
after the upgrade, as the config it ran — epoch 0 measured on the whole training set (null)."""

from __future__ import annotations

import json

from sqlalchemy import create_engine, text

from service.config import CONFIG_FIELDS, TrialConfig
from service.store import Store


def test_rows_before_0004_read_as_measured_on_every_sample(database_url):
    from alembic import command
    from alembic.config import Config

    from service.store.engine import MIGRATIONS

    old = {k: v for k, v in TrialConfig(depth=2).to_dict().items() if k != "epoch0_train_samples"}
    assert set(old) | {"epoch0_train_samples"} == set(CONFIG_FIELDS)
    engine = create_engine(database_url)
    with engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0003")
        conn.execute(
            text(
                "INSERT INTO sweeps (id, name, tags, spec, status, priority, cancel_requested,"
                " created_at) VALUES (1, 's', '[]', '{}', 'completed', 0, false, :now)"
            ),
            {"now": "2025-01-01 00:00:00"},
        )
        columns = ", ".join(f'"{k}"' for k in old)
        values = ", ".join(f":{k}" for k in old)
        conn.execute(
            text(
                'INSERT INTO trials (id, sweep_id, "index", config, config_hash, status, attempts,'
                f" epochs_done, epochs_total, {columns}) VALUES (1, 1, 0, :config, 'h',"
                f" 'completed', 1, 0, 11, {values})"
            ),
            {**old, "config": json.dumps(old)},
        )
    engine.dispose()
    with Store(database_url) as store:
        trial = store.get_trial(1)
        assert trial.config == {**old, "epoch0_train_samples": None}
        assert TrialConfig(**trial.config).epoch0_train_samples is None  # a valid config
        assert store.list_trials(1, where={"epoch0_train_samples": None})[1] == 1
        assert store.list_trials(1, where={"epoch0_train_samples": 5000})[1] == 0
