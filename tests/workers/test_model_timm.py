"""`model: timm` (workers/models/timm_model.py, service/library_models.py, docs/models.md "Models
people already have"): a timm ResNet measured as a trial — the trial's layout, its measurement
equal to `isosweep.probe` of the timm module itself and to a numpy SVD of hooked features and
plain autograd (float64, 1e-9) — with no network reached; pretrained, unknown architectures,
file-reading arguments and a wrong depth refused naming the field; a server without the extra
answering 422; and one sweep of both library families through Ray Tune."""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from library_support import close, gap_of, offline  # noqa: F401  (offline: a fixture)

from service.config import TrialConfig
from service.errors import InvalidInput
from service.models import layer_metrics
from workers.models.base import as_images
from workers.probe import probe
from workers.train import Trial, fit

pytest.importorskip("timm")

ROOT = Path(__file__).resolve().parents[2]
SCALARS = ("train_loss", "train_acc", "test_loss", "test_acc", "head_grad_norm",
           "head_weight_isometry_gap")  # fmt: skip
STAGES = ["layer1", "layer2", "layer3", "layer4"]
RESNET = dict(model="timm", model_params={"arch": "resnet18"}, depth=4, dataset="digits")


def loaded(trial: Trial) -> torch.nn.Module:
    """The trial's module holding the trial's own tensors (float64)."""
    module = copy.deepcopy(trial.net.module).to(torch.float64)
    module.load_state_dict({k: v.detach() for k, v in {**trial.params, **trial.state}.items()})
    return module


@pytest.mark.slow
@pytest.mark.usefixtures("offline")
def test_a_resnet_trial_records_the_trial_layout():
    config = TrialConfig(**RESNET, batch_size=16, epochs=1, max_train_samples=64)
    assert config.model_params["taps"] == STAGES  # the ResNet rule: its four stages
    records = list(fit(config))
    assert [r["epoch"] for r in records] == [0, 1]
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    for r in records:
        for key in layer_metrics(config):
            assert r[key].shape == (4,), key
        assert {"isometry_gap/output", "grad_norm", "rms"} <= set(layer_metrics(config))
        for key in SCALARS:
            assert isinstance(r[key], float), key
        assert np.isfinite(r["isometry_gap/output"]).all()
    # timm zero-initializes each residual block's last BatchNorm γ: at init a block is its
    # shortcut, and layer1 (no downsampling conv) has no weight the loss reaches
    assert records[0]["grad_norm"][0] == 0.0 and (records[0]["grad_norm"][1:] > 0).all()
    # layer2..4 output ReLU(BN(conv x)) (their first block's projection shortcut; the identity
    # blocks after it pass it on): BN gives each channel mean 0, variance 1 over the batch, and
    # a symmetric z keeps E[z²; z > 0] = 1/2, so rms = 1/√2 (measured 0.703–0.712 over seeds
    # and batch sizes 16–64: BN's outputs are nearly symmetric)
    np.testing.assert_allclose(records[0]["rms"][1:], math.sqrt(0.5), rtol=0.03)
    assert records[1]["grad_norm"][0] > 0  # one epoch later γ has moved


@pytest.mark.slow
@pytest.mark.usefixtures("offline")
def test_the_measurement_is_probes_and_numpys_on_the_same_weights():
    config = TrialConfig(**RESNET, batch_size=12, epochs=0, dtype="float64")
    record = next(iter(fit(config)))
    trial = Trial(config)  # the same weights and probe batch (seeded as fit seeds them)
    x, y = trial.probe
    module = loaded(trial)
    images = as_images(x, "digits")  # (n, 1, 8, 8)
    # isosweep.probe of the timm model itself, as a user would call it
    got = probe(module.net, images, y=y, taps=STAGES)
    for key in ("isometry_gap/output", "range_isometry_gap/output", "rms", "mean_cosine",
                "grad_norm", "weight_isometry_gap", "head_grad_norm",
                "head_weight_isometry_gap"):  # fmt: skip
        close(got[key], record[key])
    # numpy's SVD of the stage outputs and autograd's gradient, from a plain forward
    plain = copy.deepcopy(module).train()  # BatchNorm on the batch's statistics, as the probe
    feats: dict[str, torch.Tensor] = {}
    for name in STAGES:
        stage = plain.net.get_submodule(name)
        stage.register_forward_hook(lambda m, i, o, name=name: feats.__setitem__(name, o))
    F.cross_entropy(plain(x), y).backward()
    gaps = [gap_of(feats[s].detach().numpy()) for s in STAGES]
    close(gaps, record["isometry_gap/output"])
    grads = []
    for s in STAGES:
        ws = [p.grad for p in plain.net.get_submodule(s).parameters() if p.ndim >= 2]
        grads.append(math.sqrt(sum(float(g.square().sum()) for g in ws)))
    close(grads, record["grad_norm"])
    close(float(plain.net.fc.weight.grad.norm()), record["head_grad_norm"])


def refused(**kw) -> InvalidInput:
    with pytest.raises(InvalidInput) as exc:
        TrialConfig(**{**RESNET, **kw})
    return exc.value


def test_pretrained_is_refused():
    err = refused(model_params={"arch": "resnet18", "pretrained": True})
    assert err.field == "model_params.pretrained" and "downloads nothing" in err.message


def test_an_unknown_architecture_is_named_with_the_closest():
    err = refused(model_params={"arch": "resnet81"})
    assert err.field == "model_params.arch"
    assert "'resnet81'" in err.message and "resnet18" in err.message


@pytest.mark.parametrize(
    ("key", "says"),
    [("checkpoint_path", "reads no files"), ("pretrained_cfg", "reads no files"),
     ("num_classes", "from the dataset"), ("features_only", "logits")],
)  # fmt: skip
def test_model_args_that_load_files_or_that_the_dataset_sets_are_refused(key, says):
    err = refused(model_params={"arch": "resnet18", "model_args": {key: "x"}})
    assert err.field == f"model_params.model_args.{key}" and says in err.message


def test_depth_must_match_the_taps_and_a_tap_override_is_checked():
    assert "set depth=4" in refused(depth=10).message
    two = {"arch": "resnet18", "taps": ["layer2", "layer4"]}
    config = TrialConfig(**{**RESNET, "depth": 2, "model_params": two})
    assert config.model_params["taps"] == ["layer2", "layer4"]
    err = refused(model_params={"arch": "resnet18", "taps": "stage{i}"})
    assert err.field == "model_params.taps" and "layer1" in err.message
    err = refused(model_params={"arch": "resnet18", "model_args": {"widht": 2}})
    assert err.field == "model_params.model_args" and "widht" in err.message


def test_equal_networks_hash_equal():
    a = TrialConfig(**RESNET)
    b = TrialConfig(**{**RESNET, "model_params": {"arch": "resnet18", "taps": STAGES}})
    assert a == b and a.model_params == b.model_params


SERVER = """
import sys
{block}
from fastapi.testclient import TestClient
from api.app import create_app
from service.settings import Settings
from service.store import Store
settings = Settings(database_url="sqlite:///{db}")
app = create_app(settings, store=Store(settings.database_url, settings=settings))
client = TestClient(app, base_url="http://127.0.0.1")
loaded = [m for m in ("timm", "transformers") if sys.modules.get(m) is not None]
assert not loaded, f"imported at start: {{loaded}}"
for model, params, depth in (("timm", {{"arch": "resnet18"}}, 4), ("hf", {{}}, 2)):
    parameters = {{"model": model, "model_params": params, "depth": depth, "width": 8}}
    body = {{"name": model, "parameters": {{**parameters, "epochs": 0}}, "seeds": 1}}
    r = client.post("/api/v1/sweeps", json=body)
    print(model, r.status_code, (r.json().get("error") or {{}}).get("message", ""))
"""


def serve(tmp_path, block: str) -> str:
    code = SERVER.format(block=block, db=tmp_path / "db.sqlite")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow
def test_a_server_without_the_extras_answers_422_naming_the_extra(tmp_path):
    lines = serve(tmp_path, 'sys.modules["timm"] = None; sys.modules["transformers"] = None')
    timm_line, hf_line = lines.strip().splitlines()
    assert timm_line.startswith("timm 422") and "pip install 'isosweep[timm]'" in timm_line
    assert hf_line.startswith("hf 422") and "pip install 'isosweep[hf]'" in hf_line
    # with them the same specs are accepted (the check can fail), and the app started without
    # importing either library (asserted in the script)
    ok = serve(tmp_path / "with", "").strip().splitlines()
    assert [line.split()[:2] for line in ok] == [["timm", "201"], ["hf", "201"]]


# --- through Ray Tune: both library families in one sweep --------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_of_both_library_families_runs_through_ray_tune(sqlite_url, ray_local):
    from service.spec import parse_spec
    from service.store import Store
    from workers.driver import run_sweep

    spec = {
        "name": "library-families",
        "parameters": {
            "zip": [
                {"model": "timm", "model_params": {"arch": "resnet18"}, "depth": 4},
                {"model": "hf", "model_params": {"config": "gpt2"}, "depth": 2},
            ],
            "width": 8, "batch_size": 8, "epochs": 1, "dataset": "digits",
            "max_train_samples": 32, "epoch0_train_samples": 32,
        },
        "seeds": 1,
        "pack": 1,
    }  # fmt: skip
    with Store(sqlite_url) as store:
        sweep = store.create_sweep(parse_spec(spec))
        assert store.claim_sweep("library-test", 60.0).id == sweep.id
        info = run_sweep(store, sweep.id, runner_id="library-test")
        assert info.status == "completed", info
        trials, _ = store.list_trials(info.id)
        assert {t.config["model"]: t.status for t in trials} == {
            "timm": "completed",
            "hf": "completed",
        }
        for t in trials:
            epochs, gaps = store.trial_history(t.id, "isometry_gap/output")
            assert list(epochs) == [0, 1] and np.isfinite(np.stack(gaps)).all()
            assert np.stack(gaps).shape == (2, t.config["depth"])
        hf = next(t for t in trials if t.config["model"] == "hf")
        _, tokens = store.trial_history(hf.id, "token_cosine")
        assert np.stack(tokens).shape == (2, 2)
