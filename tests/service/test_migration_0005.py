"""Revision 0005 (TrialConfig.model and the families' fields): a trial written at revision 0004
— when every trial was an MLP — reads, after the upgrade, as the MLP config it ran, and the new
columns filter in SQL."""

from __future__ import annotations

from support import store_trial_at_revision

from service.config import CONFIG_FIELDS, TrialConfig
from service.store import Store

NEW = ("model", "model_params", "residual_scale", "kernel_size", "patch_size", "heads",
       "mlp_ratio", "skip", "norm_position")  # fmt: skip


LATER = ("precision_check", "tap_metrics")  # revisions 0007, 0008


def test_rows_before_0005_read_as_the_mlp_they_ran(database_url):
    full = TrialConfig(depth=3, seed=4).to_dict()
    old = {k: v for k, v in full.items() if k not in NEW + LATER}
    assert set(old) | set(NEW) | set(LATER) == set(CONFIG_FIELDS)
    store_trial_at_revision(database_url, "0004", old)
    with Store(database_url) as store:
        trial = store.get_trial(1)
        assert trial.config == full  # every new key at the value the trial ran with
        assert TrialConfig(**trial.config) == TrialConfig(depth=3, seed=4)
        assert store.list_trials(1, where={"model": "mlp"})[1] == 1
        assert store.list_trials(1, where={"model": "cnn"})[1] == 0
        assert store.list_trials(1, where={"skip": True, "patch_size": None})[1] == 1
