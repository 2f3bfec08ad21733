"""Revision 0004 (TrialConfig.epoch0_train_samples): a trial written at revision 0003 reads,
after the upgrade, as the config it ran — epoch 0 measured on the whole training set (null)."""

from __future__ import annotations

from support import store_trial_at_revision

from service.config import CONFIG_FIELDS, TrialConfig
from service.store import Store


def test_rows_before_0004_read_as_measured_on_every_sample(database_url):
    old = {k: v for k, v in TrialConfig(depth=2).to_dict().items() if k != "epoch0_train_samples"}
    assert set(old) | {"epoch0_train_samples"} == set(CONFIG_FIELDS)
    store_trial_at_revision(database_url, "0003", old)
    with Store(database_url) as store:
        trial = store.get_trial(1)
        assert trial.config == {**old, "epoch0_train_samples": None}
        assert TrialConfig(**trial.config).epoch0_train_samples is None  # a valid config
        assert store.list_trials(1, where={"epoch0_train_samples": None})[1] == 1
        assert store.list_trials(1, where={"epoch0_train_samples": 5000})[1] == 0
