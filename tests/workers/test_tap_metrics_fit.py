"""The per-tap metrics in a trial's record (workers/custom_metrics.py through workers/metrics.py,
workers/train.py, workers/packed.py; docs/probe.md): effective and stable rank of each block's
output with TrialConfig.tap_metrics, against numpy's SVD of the same features; a lab's
registered metric recorded by fit; the transformer's attention entropy per layer and head,
log T for uniform attention and numpy's softmax(QKᵀ/√d_h) on the same weights; the update
ratio between recorded epochs against closed forms (weights set by hand, one SGD step of a
known gradient); a pack's members recording them as fit does alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from service import metric_names
from service.config import TrialConfig
from service.models import layer_metrics
from workers.packed import fit_packed
from workers.train import EpochStats, Trial, fit

RTOL = 1e-9  # float64 networks: the same numbers by two computations, up to rounding
SMALL = {"depth": 3, "width": 16, "batch_size": 12, "dtype": "float64"}
TRANSFORMER = {**SMALL, "model": "transformer", "heads": 2, "mlp_ratio": 1}
STILL = EpochStats(1.0, 0.5, 0.0)  # a record's training stats (not what is checked here)


@pytest.fixture
def lab(monkeypatch):
    """A lab's metric registered as a configured module would (service.metric_names)."""
    monkeypatch.setattr(metric_names, "_LAB", {})
    metric_names.register_lab_metric("frobenius", lambda H: float(torch.linalg.norm(H)))


def _ranks(H: np.ndarray) -> tuple[float, float]:
    s = np.linalg.svd(H.reshape(len(H), -1), compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum())), float((s**2).sum() / s[0] ** 2)


def _features(trial: Trial) -> list[np.ndarray]:
    """Each block's output as the record measures it: the token stream where there is one."""
    _, taps = trial.net.forward(trial.params, trial.state, trial.probe[0], "batch", taps=True)
    return [t.detach().numpy() for t in (taps.tokens or taps.outputs)]


@pytest.mark.parametrize(
    "extra",
    [{}, {"model": "resmlp", "norm": "layer"}, {"model": "cnn", "width": 4}, TRANSFORMER],
    ids=["mlp", "resmlp", "cnn", "transformer"],
)
def test_fit_records_the_ranks_of_each_block_output_against_numpy(extra, lab):
    config = TrialConfig(**{**SMALL, **extra}, epochs=0, tap_metrics=True)
    record = next(iter(fit(config)))
    feats = _features(Trial(config))  # the same weights and probe batch
    want = np.array([_ranks(h) for h in feats])
    np.testing.assert_allclose(record["effective_rank"], want[:, 0], rtol=RTOL)
    np.testing.assert_allclose(record["stable_rank"], want[:, 1], rtol=RTOL)
    frob = [np.linalg.norm(h) for h in feats]
    np.testing.assert_allclose(record["frobenius"], frob, rtol=RTOL)  # the lab's, per block
    names = layer_metrics(config)  # what the store's reads expect of the trial
    assert {"effective_rank", "stable_rank"} <= set(names) and names[-1] == "frobenius"
    off = next(iter(fit(config.model_copy(update={"tap_metrics": False}))))
    assert not {"effective_rank", "stable_rank", "frobenius"} & set(off)
    assert "frobenius" not in layer_metrics(config.model_copy(update={"tap_metrics": False}))


def test_a_registered_models_trial_records_the_ranks_of_its_taps(monkeypatch, lab):
    from service import models

    monkeypatch.setattr(models, "_REGISTRY", {})
    monkeypatch.setattr(models, "_loaded", True)

    def build(params, *, d_in, n_classes, config):
        blocks = torch.nn.Sequential(
            *(torch.nn.Sequential(torch.nn.Linear(d_in if i == 0 else 8, 8), torch.nn.Tanh())
              for i in range(2))
        )  # fmt: skip
        return torch.nn.Sequential(blocks, torch.nn.Linear(8, n_classes))

    models.register_model("two_tanh", build, taps="0.{i}")
    config = TrialConfig(model="two_tanh", depth=2, batch_size=12, epochs=0, tap_metrics=True,
                         dtype="float64")  # fmt: skip
    record = next(iter(fit(config)))
    trial = Trial(config)
    x = trial.probe[0]
    h1 = torch.tanh(F.linear(x, trial.params["0.0.0.weight"], trial.params["0.0.0.bias"]))
    h2 = torch.tanh(F.linear(h1, trial.params["0.1.0.weight"], trial.params["0.1.0.bias"]))
    h1, h2 = h1.detach(), h2.detach()
    want = np.array([_ranks(h.numpy()) for h in (h1, h2)])
    np.testing.assert_allclose(record["effective_rank"], want[:, 0], rtol=RTOL)
    np.testing.assert_allclose(record["stable_rank"], want[:, 1], rtol=RTOL)
    frob = [float(h1.norm()), float(h2.norm())]
    np.testing.assert_allclose(record["frobenius"], frob, rtol=RTOL)


# --- attention entropy ------------------------------------------------------------------------


def test_uniform_attention_has_entropy_log_t_in_every_layer_and_head():
    """Zero query and key weights (no bias): every score 0, every query attends uniformly to
    the T = 8 row tokens of a digit: entropy log 8 exactly by construction."""
    config = TrialConfig(**{**TRANSFORMER, "heads": 4}, epochs=0)
    trial = Trial(config)
    with torch.no_grad():
        for ell in range(1, config.depth + 1):
            trial.params[f"Wq{ell}"].zero_()
            trial.params[f"Wk{ell}"].zero_()
    record = trial.record(0, STILL)
    heads = record["attention_entropy_heads"]
    assert heads.shape == (3, 4)
    np.testing.assert_allclose(heads, math.log(8), rtol=1e-14)
    np.testing.assert_allclose(record["attention_entropy"], math.log(8), rtol=1e-14)


def test_attention_entropy_against_numpy_softmax():
    """Block 1 without a norm attends over the embedded row tokens x₀ = tokens W_embedᵀ + pos:
    A = softmax(Q Kᵀ/√d_h) per head, computed here in numpy from the trial's weights."""
    config = TrialConfig(**TRANSFORMER, epochs=0, norm="none")
    trial = Trial(config)
    record = trial.record(0, STILL)
    P = {k: v.detach().numpy() for k, v in trial.params.items()}
    x = trial.probe[0].numpy().reshape(-1, 8, 8)  # digits: 8 rows of 8 pixels are the tokens
    h = x @ P["W_embed"].T + P["pos"]
    q, k = h @ P["Wq1"].T, h @ P["Wk1"].T
    d_h = config.width // config.heads
    want = []
    for head in range(config.heads):
        sl = slice(head * d_h, (head + 1) * d_h)
        s = np.einsum("ntd,nsd->nts", q[..., sl], k[..., sl]) / math.sqrt(d_h)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        want.append(float(-(a * np.log(a)).sum(-1).mean()))
    np.testing.assert_allclose(record["attention_entropy_heads"][0], want, rtol=RTOL)
    assert record["attention_entropy"][0] == pytest.approx(np.mean(want), rel=RTOL)
    assert min(want) > 0 and max(want) < math.log(8)


# --- update ratio -----------------------------------------------------------------------------


def test_update_ratio_between_records_with_weights_set_by_hand():
    """W₁ ← (1 − 1/8)·W₁ gives 1/8; W₂ ← W₂ + E gives ‖E‖/‖W₂‖; W₃ unchanged gives 0; the head
    ×1.5 gives 0.5. NaN at the first record (nothing to compare with)."""
    trial = Trial(TrialConfig(**SMALL, epochs=0))
    first = trial.record(0, STILL)
    assert np.isnan(first["update_ratio"]).all() and math.isnan(first["head_update_ratio"])
    W2 = trial.params["W2"].detach().clone()
    E = torch.randn(W2.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        trial.params["W1"].mul_(1 - 0.125)
        trial.params["W2"].add_(E)
        trial.params["W_head"].mul_(1.5)
    second = trial.record(1, STILL)
    np.testing.assert_allclose(
        second["update_ratio"], [0.125, float(E.norm() / W2.norm()), 0.0], rtol=1e-12
    )
    assert second["head_update_ratio"] == pytest.approx(0.5, rel=1e-12)


def test_update_ratio_after_one_sgd_step_is_lr_times_the_gradient_over_the_weight():
    """max_train_samples = batch_size: epoch 1 is one SGD step on the whole subset, so
    W₁(1) − W₁(0) = −lr·∂L/∂W (L the mean cross-entropy of those samples; norm none: no
    batch statistics, the sample order cannot matter) and the ratio is lr·‖∂L/∂W‖/‖W‖."""
    config = TrialConfig(**SMALL, norm="none", epochs=1, max_train_samples=12, lr=0.3)
    records = list(fit(config))
    trial = Trial(config)  # the initial weights and the training subset
    X, y = trial.data.X_train, trial.data.y_train
    names = [w for ws in trial.net.layer_weights() for w in ws] + [trial.net.head_weight]
    logits, _ = trial.net.forward(trial.params, trial.state, X, "train")
    grads = torch.autograd.grad(F.cross_entropy(logits, y), [trial.params[k] for k in names])
    weights = [trial.params[k].detach() for k in names]
    want = [0.3 * float(g.norm() / w.norm()) for w, g in zip(weights, grads, strict=True)]
    np.testing.assert_allclose(records[1]["update_ratio"], want[:-1], rtol=1e-10)
    assert records[1]["head_update_ratio"] == pytest.approx(want[-1], rel=1e-10)
    assert "update_ratio" in layer_metrics(config)


# --- packs --------------------------------------------------------------------------------------


def test_a_packs_members_record_them_as_fit_does_alone(lab):
    """float64: the batched kernels round alike to ~1e-15, so a member's per-tap metrics,
    attention entropy and update ratio equal fit's alone at every recorded epoch."""
    base = TrialConfig(**TRANSFORMER, epochs=2, max_train_samples=48, tap_metrics=True)
    configs = [base, base.model_copy(update={"seed": 1, "lr": 0.05})]
    packed: dict[int, list[dict]] = {0: [], 1: []}
    for i, record in fit_packed(configs):
        packed[i].append(record)
    keys = ("effective_rank", "stable_rank", "frobenius", "attention_entropy",
            "attention_entropy_heads", "update_ratio", "head_update_ratio")  # fmt: skip
    for i, config in enumerate(configs):
        alone = list(fit(config))
        assert [r["epoch"] for r in packed[i]] == [r["epoch"] for r in alone] == [0, 1, 2]
        for got, want in zip(packed[i], alone, strict=True):
            present = [k for k in keys if k in want]
            assert present == [k for k in keys if k in got]
            for k in present:  # NaN where fit has NaN (epoch 0's update ratio)
                np.testing.assert_allclose(got[k], want[k], rtol=1e-9, err_msg=k)
        assert (
            np.isnan(alone[0]["update_ratio"]).all() and np.isfinite(alone[1]["update_ratio"]).all()
        )
