"""Revision 0004 (TrialConfig.epoch0_train_samples): a trial written at revision 0003 reads,
after the upgrade, as the config it ran — epoch 0 measured on the whole training set (null)."""

from __future__ import annotations

from support import store_trial_at_revision

from service.config import CONFIG_FIELDS, TrialConfig
from service.store import Store

# the fields added after 0004 (revision 0005: the model families; 0007: precision_check;
# 0008: tap_metrics)
LATER = ("model", "model_params", "residual_scale", "kernel_size", "patch_size", "heads",
         "mlp_ratio", "skip", "norm_position", "precision_check", "tap_metrics")  # fmt: skip


def test_rows_before_0004_read_as_measured_on_every_sample(database_url):
    later = {*LATER, "epoch0_train_samples"}
    old = {k: v for k, v in TrialConfig(depth=2).to_dict().items() if k not in later}
    assert set(old) | later == set(CONFIG_FIELDS)
    store_trial_at_revision(database_url, "0003", old)
    with Store(database_url) as store:
        trial = store.get_trial(1)
        assert trial.config == {
            **old,
            "epoch0_train_samples": None,
            **{k: v for k, v in TrialConfig().to_dict().items() if k in LATER},
        }
        assert TrialConfig(**trial.config).epoch0_train_samples is None  # a valid config
        assert store.list_trials(1, where={"epoch0_train_samples": None})[1] == 1
        assert store.list_trials(1, where={"epoch0_train_samples": 5000})[1] == 0
