"""`isosweep theory --trial ID`: the mean-field prediction from a stored trial's input Gram,
depth, activation and gains, equal to the one `--input-gram FILE --gain α·g·√s` gives for the
same numbers; and coefficients below the quadrature's accuracy printed as 0."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess

import numpy as np
import pytest
from records import record, unit_gram
from support import isosweep_command

from service import theory
from service.spec import parse_spec
from service.store import Store

N = 6  # the probe batch: batch_size


def theory_cli(*args, env=None):
    environ = {**os.environ, **(env or {})}
    environ.pop("FORCE_COLOR", None)
    cmd = [*isosweep_command(), "theory", *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=environ)
    r.stdout = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)  # without colours, whatever the terminal
    return r


def _stored(url, moments=True, gram=True, **parameters):
    """One trial of a LayerNorm MLP (act_norm, the theorem's setting) with epoch 0 stored."""
    params = {"depth": 6, "width": 8, "batch_size": N, "epochs": 0, "norm": "layer",
              "order": "act_norm", **parameters}  # fmt: skip
    with Store(url) as store:
        sweep = store.create_sweep(parse_spec({"name": "t", "parameters": params, "seeds": 1}))
        (trial,), _ = store.list_trials(sweep.id)
        extra = {"input_gram": unit_gram(N, 3)} if gram else {}
        if moments:
            extra["input_moments"] = np.ones(N)
        store.start_trial(trial.id)
        store.write_records([(trial.id, record(trial.id, 0, params["depth"], **extra))])
        store.finish_trial(trial.id, "completed")
        return trial


@pytest.mark.parametrize("moments", [True, False])
def test_the_trials_prediction_is_the_gram_files(sqlite_url, tmp_path, moments):
    """kaiming (s = 2 in both layers), g = 0.8, α = 1.2: the recursion's gain is α·g·√2, and
    with unit moments the first layer's covariance is the Gram itself."""
    trial = _stored(sqlite_url, moments=moments, activation="tanh", activation_gain=1.2,
                    init_gain=0.8, init="kaiming", gain_exponent=0.3)  # fmt: skip
    gain = 1.2 * 0.8 * math.sqrt(2.0)
    r = theory_cli("--trial", trial.id, "--database-url", sqlite_url, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["trial"]["trial"] == trial.id and got["trial"]["gain"] == pytest.approx(gain)
    assert got["gain"] == pytest.approx(gain) and got["name"] == "tanh"
    np.save(tmp_path / "g.npy", unit_gram(N, 3))
    r = theory_cli("tanh", "--gain", gain, "--gain-exponent", 0.3, "--depth", 6,
                   "--input-gram", tmp_path / "g.npy", "--json")  # fmt: skip
    want = json.loads(r.stdout)["mean_field"]
    assert got["mean_field"]["depth"] == 6 and len(got["mean_field"]["gaps"]) == 6
    assert got["mean_field"]["gaps"] == pytest.approx(want["gaps"], rel=1e-12)
    direct = theory.mean_field_gaps("tanh", 6, unit_gram(N, 3), gain=gain, gain_exponent=0.3)
    assert got["mean_field"]["gaps"] == pytest.approx(direct.tolist(), rel=1e-12)
    assert got["coefficients"][0] == 0.0 and got["coefficients"][2] == 0.0  # tanh is odd


def test_the_trial_text_and_a_deeper_depth(sqlite_url):
    trial = _stored(sqlite_url, activation="relu", norm="batch")
    r = theory_cli("--trial", trial.id, "--database-url", sqlite_url, "--depth", 9, "--terms", 5)
    assert r.returncode == 0, r.stderr
    assert f"trial {trial.id} of sweep {trial.sweep_id}: relu, depth 6" in r.stdout
    assert "the theorem assumes" in r.stdout and "norm=batch" in r.stdout
    coefficients = r.stdout.split("Hermite coefficients")[1].split("mean-field")[0]
    rows = dict(re.findall(r"│\s+(\d)\s+│\s+(\S+)\s+│", coefficients))
    assert rows["3"] == "0" and rows["5"] == "0" and rows["4"] != "0"  # relu: c₃ = c₅ = 0
    assert len(re.findall(r"│\s+9\s+│", r.stdout)) == 1  # the gap table reaches ℓ = 9


def test_coefficients_below_the_accuracy_print_as_0():
    """relu's odd coefficients beyond c₁ vanish (Joudaki et al. 2023's closed form); the
    quadrature gives ~1e-16 for them. exp's cₖ = e^{α²/2}·αᵏ/√k! are real and printed while
    they are above 1e-14·‖σ‖."""
    r = theory_cli("relu", "--json", "--terms", 9)
    c = json.loads(r.stdout)["coefficients"]
    assert c[3] == c[5] == c[7] == c[9] == 0.0
    assert c[2] == pytest.approx(1 / (2 * math.sqrt(math.pi)), rel=1e-13)
    raw = theory.hermite_coefficients("relu", 1.0, 9)
    assert 0 < max(abs(raw[k]) for k in (3, 5, 7, 9)) < 1e-14  # what used to be printed
    c = json.loads(theory_cli("exp", "--json", "--terms", 30).stdout)["coefficients"]
    norm = math.exp(1.0)  # ‖σ‖ = √E e^{2X} = e
    for k, ck in enumerate(c):
        exact = math.exp(0.5) / math.sqrt(math.factorial(k))
        if ck != 0.0:  # printed: right to the quadrature's accuracy
            assert abs(ck - exact) <= 1e-15 * norm
        else:  # zeroed: below 1e-14·‖σ‖ (give or take that accuracy)
            assert exact < 1.1e-14 * norm
    assert c[:12] == pytest.approx([math.exp(0.5) / math.sqrt(math.factorial(k))
                                    for k in range(12)], rel=1e-12)  # fmt: skip
    assert c[-1] == 0.0  # c₃₀ = e^{½}/√30! ≈ 1.7e-16


def test_trial_errors_name_the_flag(sqlite_url):
    trial = _stored(sqlite_url, activation="tanh")
    db = ["--database-url", sqlite_url]
    r = theory_cli("relu", "--trial", trial.id, *db)
    assert r.returncode == 1 and "activation: 'relu' differs from trial" in r.stderr
    r = theory_cli("--trial", trial.id, "--gain", 2, *db)
    assert r.returncode == 1 and "gain: 2.0 differs" in r.stderr
    assert "no trial with id 999" in theory_cli("--trial", 999, *db).stderr
    other = _stored(sqlite_url, gram=False)
    r = theory_cli("--trial", other.id, *db)
    assert r.returncode == 1 and "trial: trial" in r.stderr and "no input Gram" in r.stderr
    r = theory_cli("--trial", trial.id, "--input-gram", "g.npy", *db)
    assert r.returncode == 2 and "not allowed with argument" in r.stderr


def test_predict_of_a_stored_trial_is_the_overlays(sqlite_url):
    """`theory predict --trial ID` predicts the trial's whole record on its stored input kernel:
    what service.theory.predict gives for that config and kernel (the numbers theory_overlay
    draws), every layer and key."""
    from service.config import parse_trial_config
    from service.jsonfmt import decode_float
    from service.plots.overlay import stored_input_kernel

    trial = _stored(sqlite_url, activation="tanh", norm="batch", order="norm_act", init_gain=1.3)
    r = theory_cli("predict", "--trial", trial.id, "--database-url", sqlite_url, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    with Store(sqlite_url) as store:
        stored = store.get_trial(trial.id)
        kernel = stored_input_kernel(store, trial.id)
    config = parse_trial_config(dict(stored.config))
    want = theory.predict(config, input_kernel=kernel)
    assert got["config"]["norm"] == "batch" and got["layers"] == list(range(1, 7))
    metrics = {k: v for k, v in want.items() if k not in ("unpredicted", "notes")}
    assert set(got["metrics"]) == set(metrics) and "grad_norm" in metrics
    for k, v in metrics.items():
        values = [decode_float(x) for x in got["metrics"][k]]  # ±inf and NaN come as strings
        assert values == pytest.approx(v.tolist(), rel=1e-12, nan_ok=True), k
    assert decode_float(got["metrics"]["grad_norm"][-1]) == 1.0  # relative to the last block's


def test_predict_of_a_stored_trial_refuses_what_would_change_it(sqlite_url):
    trial = _stored(sqlite_url)
    db = ["--database-url", sqlite_url]
    r = theory_cli("predict", "--trial", trial.id, "--set", "depth=4", *db)
    assert r.returncode == 1 and "overrides: --set does not apply with --trial" in r.stderr
    other = _stored(sqlite_url, gram=False, init_gain=0.7)
    r = theory_cli("predict", "--trial", other.id, *db)
    assert r.returncode == 1 and "no input Gram" in r.stderr
    assert "no trial with id 999" in theory_cli("predict", "--trial", 999, *db).stderr
