"""What a finished sweep must have stored: one row per (trial, recorded epoch, metric, layer)."""

from __future__ import annotations

import pandas as pd

from service.config import SCALAR_METRICS, TrialConfig
from service.models import layer_metrics


def row_keys(frame: pd.DataFrame) -> list[tuple]:
    """(trial_id, epoch, metric, layer) of every tidy row; layer None for scalars."""
    layer = [None if pd.isna(v) else int(v) for v in frame.layer]
    return list(zip(frame.trial_id, frame.epoch, frame.metric, layer, strict=True))


def expected_keys(trials) -> set[tuple]:
    """The keys a complete run of these trials (TrialInfo) stores."""
    keys = set()
    for t in trials:
        config = TrialConfig(**t.config)
        for e in config.recorded_epochs:
            keys.update((t.id, e, m, None) for m in SCALAR_METRICS)
            for m in layer_metrics(config):
                keys.update((t.id, e, m, ell) for ell in range(1, config.depth + 1))
    return keys
