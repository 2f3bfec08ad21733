"""`model: hf` (workers/models/hf_model.py, service/library_models.py, docs/models.md "Models
people already have"): a GPT-2-style transformers model built from its config class, measured as
a trial at its blocks — the trial's layout with the token metrics, its measurement equal to
`isosweep.probe` of the same module and to numpy's SVD of the hooked hidden states (float64,
1e-9) — with no network reached; BERT and LLaMA configs built the same way; bad sizes and
dropout refused naming the field. (A server without the extra, and a sweep through Ray Tune:
tests/workers/test_model_timm.py.)"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from library_support import close, gap_of, offline  # noqa: F401  (offline: a fixture)

from service.config import TrialConfig
from service.errors import InvalidInput
from service.models import layer_metrics
from workers.probe import probe
from workers.train import Trial, fit

pytest.importorskip("transformers")

GPT2 = dict(model="hf", model_params={"config": "gpt2"}, depth=3, width=32, dataset="digits")
TOKEN_METRICS = ("token_isometry_gap", "token_cosine")


def token_reference(H: np.ndarray) -> tuple[float, float]:
    """token_isometry_gap and token_cosine of a stream (n, T, d) from numpy: per sample the gap
    of its T × T token Gram (SVD) and the mean off-diagonal cosine of its tokens, averaged."""
    gaps, cosines = [], []
    for X in H:  # (T, d)
        gaps.append(gap_of(X))
        U = X / np.linalg.norm(X, axis=1, keepdims=True)
        C = U @ U.T
        T = len(X)
        cosines.append((C.sum() - np.trace(C)) / (T * (T - 1)))
    return float(np.mean(gaps)), float(np.mean(cosines))


@pytest.mark.slow
@pytest.mark.usefixtures("offline")
def test_a_gpt2_trial_records_the_trial_layout_with_token_metrics():
    config = TrialConfig(**GPT2, batch_size=16, epochs=1, max_train_samples=64)
    assert config.model_params == {
        "config": "gpt2", "heads": 4, "mlp_ratio": 4, "patch_size": None,
        "initializer_range": 0.02, "config_args": {},
    }  # fmt: skip
    assert set(TOKEN_METRICS) <= set(layer_metrics(config))
    records = list(fit(config))
    assert [r["epoch"] for r in records] == [0, 1]
    for r in records:
        for key in layer_metrics(config):
            assert r[key].shape == (3,), key
            if key == "update_ratio" and r["epoch"] == 0:  # no earlier record: NaN by design
                assert np.isnan(r[key]).all(), key
                continue
            assert np.isfinite(r[key]).all(), key
        assert r["token_cosine"].min() > 0 and r["token_cosine"].max() < 1


@pytest.mark.slow
@pytest.mark.usefixtures("offline")
def test_the_measurement_is_probes_and_numpys_on_the_same_weights():
    config = TrialConfig(**GPT2, batch_size=12, epochs=0, dtype="float64")
    record = next(iter(fit(config)))
    trial = Trial(config)  # the same weights and probe batch (seeded as fit seeds them)
    x, y = trial.probe
    module = copy.deepcopy(trial.net.module).to(torch.float64)
    module.load_state_dict({k: v.detach() for k, v in {**trial.params, **trial.state}.items()})
    got = probe(module, x, y=y, taps="model.h.{i}", head="head.weight")
    for key in ("isometry_gap/output", "range_isometry_gap/output", "rms", "mean_cosine",
                "grad_norm", "weight_isometry_gap", "head_grad_norm",
                "head_weight_isometry_gap", *TOKEN_METRICS):  # fmt: skip
        close(got[key], record[key])
    # numpy on the hidden states each GPT-2 block returns, from a plain forward
    feats: list[torch.Tensor] = []
    for block in module.model.h:
        block.register_forward_hook(
            lambda m, i, o: feats.append(o[0] if isinstance(o, tuple) else o)
        )
    with torch.no_grad():
        module(x)
    H = [h.numpy() for h in feats]  # depth × (n, T, d)
    assert H[0].shape == (12, 8, 32)  # digits: 8 rows of 8 pixels as tokens
    close([gap_of(h) for h in H], record["isometry_gap/output"])
    tokens = np.array([token_reference(h) for h in H])
    close(tokens[:, 0], record["token_isometry_gap"])
    close(tokens[:, 1], record["token_cosine"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "taps"), [("bert", "model.encoder.layer.0"), ("llama", "model.layers.0")]
)
@pytest.mark.usefixtures("offline")
def test_bert_and_llama_configs_build_and_measure(config, taps):
    c = TrialConfig(**{**GPT2, "model_params": {"config": config}, "depth": 2, "epochs": 0},
                    batch_size=8, max_train_samples=32, epoch0_train_samples=32)  # fmt: skip
    trial = Trial(c)
    assert trial.net.tap_names[0] == taps and trial.net.head_weight == "head.weight"
    record = next(iter(fit(c)))
    for key in ("isometry_gap/output", *TOKEN_METRICS):
        assert record[key].shape == (2,) and np.isfinite(record[key]).all(), key


def refused(**params) -> InvalidInput:
    with pytest.raises(InvalidInput) as exc:
        TrialConfig(**{**GPT2, "model_params": params})
    return exc.value


def test_sizes_that_do_not_fit_and_dropout_are_refused_naming_the_field():
    err = refused(heads=3)
    assert err.field == "model_params.heads" and "width=32" in err.message
    err = refused(config_args={"resid_pdrop": 0.1})
    assert err.field == "model_params.config_args.resid_pdrop"
    err = refused(config_args={"n_layer": 12})
    assert err.field == "model_params.config_args.n_layer" and "depth" in err.message
    err = refused(config="gpt3")
    assert err.field == "model_params.config" and "gpt2" in err.message


@pytest.mark.usefixtures("offline")
def test_patches_that_do_not_tile_the_images_are_refused_when_the_module_is_built():
    config = TrialConfig(**{**GPT2, "model_params": {"patch_size": 3}, "epochs": 0})
    with pytest.raises(InvalidInput) as exc:
        Trial(config)
    assert exc.value.field == "model_params.patch_size" and "8×8" in exc.value.message


@pytest.mark.usefixtures("offline")
def test_the_sizes_and_the_init_reach_the_module():
    """GPT-2's own init, a closed form: weights N(0, σ²) with σ = initializer_range, the
    residual projections (attn.c_proj, mlp.c_proj) N(0, σ²/(2·depth)) (GPT-2's scaling by
    1/√(2·n_layer)); shapes from width, heads and mlp_ratio. 2048 draws per matrix: the sample
    s.d. is within 5% of σ (its relative standard error is 1/√(2·2048) = 1.6%)."""
    for sigma in (0.02, 0.2):
        params = {"config": "gpt2", "mlp_ratio": 2, "initializer_range": sigma}
        trial = Trial(TrialConfig(**{**GPT2, "model_params": params, "depth": 4, "epochs": 0}))
        p = trial.params
        assert p["model.h.0.mlp.c_fc.weight"].shape == (32, 64)  # Conv1D: (in, out)
        assert p["model.h.0.attn.c_attn.weight"].shape == (32, 96)  # q, k, v
        assert p["model.wpe.weight"].shape == (8, 32)  # T = 8 rows of digits
        names = ("model.h.0.mlp.c_fc.weight", "model.h.3.mlp.c_proj.weight")
        fc, proj = (float(p[k].detach().std()) for k in names)
        assert fc == pytest.approx(sigma, rel=0.05)
        assert proj == pytest.approx(sigma / 8**0.5, rel=0.05)  # 2·depth = 8


def entropy_reference(a: np.ndarray) -> np.ndarray:
    """Per head: −Σ_s a log a (0 log 0 = 0) of each query's row, mean over queries and samples."""
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(a > 0, a * np.log(a), 0.0).sum(axis=-1)  # (n, heads, T)
    return h.mean(axis=(0, 2))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", "bert", "llama"])
@pytest.mark.usefixtures("offline")
def test_attention_entropy_per_block_is_the_models_own_attention(arch):
    """Each block's attention entropy equals numpy's on the weights transformers itself returns
    (output_attentions=True, a separate forward), probe's on the same module; and at a tiny init
    (q·k ≈ 0: uniform attention) the closed forms: log T without a mask (BERT), the mean of
    log(q + 1) over the T queries, log(T!)/T, under the causal mask (GPT-2, LLaMA)."""
    from workers.models.transformer import to_tokens

    c = TrialConfig(**{**GPT2, "model_params": {"config": arch, "heads": 4}, "depth": 2},
                    batch_size=8, epochs=0, dtype="float64")  # fmt: skip
    assert "attention_entropy" in layer_metrics(c)
    record = next(iter(fit(c)))
    trial = Trial(c)
    x, y = trial.probe
    module = copy.deepcopy(trial.net.module).to(torch.float64)
    weights = {k: v.detach() for k, v in {**trial.params, **trial.state}.items()}
    # non-persistent buffers (BERT's position ids, LLaMA's rotary frequencies) are in the state
    assert not module.load_state_dict(weights, strict=False).missing_keys
    with torch.no_grad():
        embeds = module.embed(to_tokens(x, c.dataset, None))
        attentions = module.model(inputs_embeds=embeds, output_attentions=True).attentions
    want = np.stack([entropy_reference(a.numpy()) for a in attentions])  # (depth, heads)
    assert want.shape == (2, 4)
    close(record["attention_entropy_heads"], want)
    close(record["attention_entropy"], want.mean(axis=1))
    taps = trial.net.tap_names
    got = probe(module, x, y=y, taps=list(taps), head="head.weight")
    close(got["attention_entropy_heads"], want)

    params = {"config": arch, "heads": 4, "initializer_range": 1e-9}
    tiny = TrialConfig(**{**c.model_dump(), "model_params": params})
    T = 8  # digits: 8 rows as tokens
    uniform = math.log(T) if arch == "bert" else math.lgamma(T + 1) / T
    # LLaMA's eager softmax runs in float32 whatever the dtype (rounding ~1e-8)
    rtol = 1e-6 if arch == "llama" else 1e-9
    np.testing.assert_allclose(next(iter(fit(tiny)))["attention_entropy"], uniform, rtol=rtol)
