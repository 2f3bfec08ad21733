"""service.config: names derived from one source (the datasets, the keys of an epoch record)."""

import pytest

from service.config import DATASET_SHAPES, METRICS, RECORD_KEYS, TrialConfig, parse_trial_config
from service.errors import InvalidInput


def test_datasets_are_the_keys_of_dataset_shapes():
    for name in DATASET_SHAPES:
        assert TrialConfig(dataset=name).dataset == name
    with pytest.raises(InvalidInput) as exc:
        parse_trial_config({"dataset": "imagenet"})
    assert exc.value.field == "dataset"
    assert all(f"'{name}'" in exc.value.message for name in DATASET_SHAPES)


def test_record_keys_are_not_metrics():
    assert RECORD_KEYS == ("epoch", "diverged", "input_gram")
    assert not set(RECORD_KEYS) & set(METRICS)
