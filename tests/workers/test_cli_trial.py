"""`isosweep trial`, driven as a user runs it: the installed console script in a subprocess."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.config import SCALAR_METRICS, TrialConfig
from service.jsonfmt import decode_float
from service.models import layer_metrics

BIN = Path(sys.executable).with_name("isosweep")
pytestmark = pytest.mark.skipif(not BIN.exists(), reason="pip install -e . (console script)")


def isosweep(*args, cwd=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [str(BIN), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


@pytest.mark.slow  # a subprocess importing torch and training: seconds
def test_json_lines_per_recorded_epoch(tmp_path):
    cfg = tmp_path / "trial.json"
    cfg.write_text(
        json.dumps(
            {
                "depth": 4,
                "width": 32,
                "batch_size": 100,
                "epochs": 3,
                "max_train_samples": 300,
                "record_every": 2,
            }
        )
    )
    res = isosweep("trial", "--config", str(cfg), "--set", "seed=3", "--set", "epochs=2")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    recs = [json.loads(line) for line in lines]  # a standard parser reads every line
    assert [r["epoch"] for r in recs] == [0, 2]  # --set overrides the file
    r0 = recs[0]
    for k in layer_metrics(TrialConfig()):  # the default MLP (with batch norm)
        assert isinstance(r0[k], list) and len(r0[k]) == 4  # index 0 ↔ block 1
    for k in SCALAR_METRICS:  # the head's update ratio has no previous record at epoch 0
        assert isinstance(r0[k], float | int) or (k, r0[k]) == ("head_update_ratio", "NaN")
    # digits has 64 features < n = 100: block 1's Linear Gram is singular, spelled "Infinity"
    assert r0["isometry_gap/linear"][0] == "Infinity"
    assert decode_float(r0["isometry_gap/linear"][0]) == math.inf
    assert all(v == "Infinity" for v in r0["isometry_gap/norm"])  # n = 100 > d = 32: singular
    assert len(r0["input_gram"]) == 100 and "input_gram" not in recs[1]
    assert r0["diverged"] is False


@pytest.mark.slow  # a subprocess importing torch and training: seconds
def test_defaults_without_config_and_determinism():
    args = ("trial", "--set", "depth=2", "--set", "epochs=1", "--set", "width=16")
    a, b = isosweep(*args), isosweep(*args)
    assert a.returncode == 0, a.stderr
    strip = [
        {k: v for k, v in json.loads(x).items() if k != "epoch_time_s"}
        for x in a.stdout.splitlines()
    ]
    assert strip == [
        {k: v for k, v in json.loads(x).items() if k != "epoch_time_s"}
        for x in b.stdout.splitlines()
    ]


@pytest.mark.slow  # a subprocess importing torch and training: seconds
def test_divergence_is_a_record_not_an_error():
    res = isosweep(
        "trial",
        "--set",
        "depth=3",
        "--set",
        "norm=none",
        "--set",
        "lr=1e6",
        "--set",
        "epochs=5",
        "--set",
        "max_train_samples=300",
    )
    assert res.returncode == 0, res.stderr
    last = json.loads(res.stdout.splitlines()[-1])
    assert last["diverged"] is True and last["train_loss"] in ("NaN", "Infinity")


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--set", "depht=3"], ["depht", "unknown field"]),
        (["--set", "norm=group"], ["norm", "'batch'", "'layer_scale'"]),
        (["--set", "activation=swish"], ["activation", "'relu'", "'step'"]),
        (["--set", "depth=0"], ["depth", "greater than or equal to 1"]),
        (["--set", "batch_size=5000"], ["batch_size", "training samples"]),
    ],
)
def test_invalid_config_exits_non_zero_naming_the_field(args, needles):
    res = isosweep("trial", *args)
    assert res.returncode != 0 and res.stdout == ""
    for needle in needles:
        assert needle in res.stderr


def test_unreadable_or_non_object_config(tmp_path):
    res = isosweep("trial", "--config", str(tmp_path / "missing.json"))
    assert res.returncode != 0 and "missing.json" in res.stderr
    bad = tmp_path / "list.json"
    bad.write_text("[1, 2]")
    res = isosweep("trial", "--config", str(bad))
    assert res.returncode != 0 and "JSON object" in res.stderr
    cfg = tmp_path / "unknown.json"
    cfg.write_text('{"widht": 3}')
    res = isosweep("trial", "--config", str(cfg))
    assert res.returncode != 0 and "widht: unknown field" in res.stderr


# Modules an init-only trial on an offline dataset has no use for: torch._dynamo (imported by
# building a torch optimizer, ~1 s), scikit-learn (~1 s; digits is read from its CSV directly)
# and torchvision.
NEEDLESS = ("torch._dynamo", "sklearn", "torchvision")
PROBE_IMPORTS = """
import json, sys
from workers.train import fit
records = list(fit({{"depth": 10, "epochs": {epochs}, "dataset": "{dataset}"}}))
print(json.dumps(sorted(m for m in {needless} if m in sys.modules)))
"""


def loaded_after_fit(epochs: int, dataset: str = "digits") -> list[str]:
    code = PROBE_IMPORTS.format(epochs=epochs, dataset=dataset, needless=NEEDLESS)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.slow  # subprocesses importing torch: seconds
@pytest.mark.parametrize("dataset", ["digits", "gaussian"])
def test_init_only_trial_imports_no_optimizer_compiler_or_sklearn(dataset):
    """The filed defect: `epochs = 0` built the SGD optimizer, importing torch._dynamo, and
    digits imported all of scikit-learn."""
    assert loaded_after_fit(0, dataset) == []


@pytest.mark.slow
def test_training_builds_the_optimizer_so_the_probe_above_can_fail():
    assert "torch._dynamo" in loaded_after_fit(1, "gaussian")
