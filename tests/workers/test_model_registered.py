"""Registered models (workers/models/registered.py, docs/models.md): a lab's torch.nn.Module
measured through the Net interface — the example module end to end, a closed-form check (a
Linear + ReLU stack equal to the built-in MLP gives the MLP's numbers), modes and state,
reproducible initialization, and the errors a lab meets."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import BaseModel, ConfigDict

from service import models
from service.config import TrialConfig
from service.errors import InvalidInput
from service.settings import get_settings
from workers import nn
from workers.metrics import probe_metrics
from workers.models import build
from workers.models.mlp import MLPNet
from workers.models.registered import RegisteredNet

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "registered_model"


@pytest.fixture
def registry(monkeypatch):
    """A fresh registry that has imported nothing yet, reading the environment anew: a test sets
    ISOSWEEP_MODEL_MODULES (or registers directly) and the registry, settings cache and example
    module are put back afterwards."""
    monkeypatch.setattr(models, "_REGISTRY", {})
    monkeypatch.setattr(models, "_loaded", False)
    monkeypatch.delenv("ISOSWEEP_MODEL_MODULES", raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.delitem(sys.modules, "wide_mlp", raising=False)
    get_settings.cache_clear()
    yield models
    get_settings.cache_clear()
    sys.modules.pop("wide_mlp", None)


@pytest.fixture
def wide_mlp(registry, monkeypatch):
    """The example module registered the way a server registers it: from the setting."""
    monkeypatch.setenv("ISOSWEEP_MODEL_MODULES", "wide_mlp")
    get_settings.cache_clear()
    assert "wide_mlp" in registry.registered()
    return registry


SMALL = dict(dataset="digits", width=16, batch_size=16, norm="none", max_train_samples=128)


# --- the example, end to end -------------------------------------------------------------------


def test_the_example_registers_from_the_setting_without_importing_torch():
    code = (
        "import sys; from service.models import registered, get_registered; "
        "names = sorted(registered()); assert 'torch' not in sys.modules, 'torch imported'; "
        "print(names, get_registered('wide_mlp').head)"
    )
    env = {**os.environ, "ISOSWEEP_MODEL_MODULES": "wide_mlp", "PYTHONPATH": f"{EXAMPLE}:{ROOT}"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['wide_mlp'] head.weight"


def test_the_example_trains_and_records_every_layer(wide_mlp):
    from workers.train import fit

    config = TrialConfig(
        model="wide_mlp", model_params={"expansion": 3}, epochs=1, depth=3, **SMALL
    )
    assert config.model_params == {"expansion": 3, "activation": "relu", "layer_norm": True}
    recs = list(fit(config))
    assert [r["epoch"] for r in recs] == [0, 1]
    for r in recs:
        assert math.isfinite(r["train_loss"]) and math.isfinite(r["test_loss"])
        for key in ("range_isometry_gap/output", "weight_isometry_gap", "grad_norm", "rms"):
            assert r[key].shape == (3,), key
            assert np.isfinite(r[key]).all(), key
        # width = batch = 16 and a LayerNorm closes each block: rank ≤ 15 < n while β = 0
        # (init); a trained β ≠ 0 adds 1βᵀ, rank ≤ 16 = n: regular
        gaps = r["isometry_gap/output"]
        assert (gaps == math.inf).all() if r["epoch"] == 0 else np.isfinite(gaps).all()
        assert "isometry_gap/linear" not in r
        assert math.isfinite(r["head_grad_norm"]) and math.isfinite(r["head_weight_isometry_gap"])
    # LayerNorm closes each block: every sample's output has mean square 1 (up to ε)
    np.testing.assert_allclose(recs[0]["rms"], 1.0, atol=1e-3)


def test_the_example_spec_expands_with_the_model_registered(wide_mlp):
    from service.spec import expand, load_spec

    spec = load_spec(EXAMPLE / "spec.yaml")
    trials = expand(spec)
    assert len(trials) == spec.n_trials == 6
    assert {t.model for t in trials} == {"wide_mlp"}
    assert {t.model_params["expansion"] for t in trials} == {1, 4}


def test_torchs_default_init_shrinks_each_wide_block_by_one_over_root_18(wide_mlp):
    """A closed form for the example without LayerNorm: nn.Linear's default init is
    U(±1/√fan_in), variance 1/(3·fan_in), so a Linear maps mean square q to q/3 (whatever its
    width), ReLU halves it, and a block Linear → ReLU → Linear multiplies it by 1/18: the rms
    shrinks by 1/√18 ≈ 0.2357 per block (mean field; measured 0.2353 at width 128)."""
    from workers.train import fit

    rms = []
    for seed in range(4):
        config = TrialConfig(
            model="wide_mlp",
            model_params={"expansion": 4, "layer_norm": False},
            **{**SMALL, "depth": 8, "width": 128, "batch_size": 32, "epochs": 0, "seed": seed},
            dtype="float64",
        )
        rms.append(next(fit(config))["rms"])
    ratio = np.exp(np.log(np.array(rms)[:, 1:] / np.array(rms)[:, :-1]).mean())
    assert ratio == pytest.approx(18**-0.5, rel=0.05)


def test_model_params_are_validated_by_the_registered_class(wide_mlp):
    with pytest.raises(InvalidInput) as exc:
        TrialConfig(model="wide_mlp", model_params={"expansion": "wide"})
    assert exc.value.field == "model_params.expansion"
    with pytest.raises(InvalidInput) as exc:
        TrialConfig(model="wide_mlp", model_params={"colour": "red"})
    assert exc.value.field == "model_params.colour" and "unknown field" in exc.value.message
    # defaults filled in: equal networks hash equal
    a = TrialConfig(model="wide_mlp", model_params={})
    b = TrialConfig(model="wide_mlp", model_params={"expansion": 2})
    assert a == b and hash(a) == hash(b)


def test_without_the_setting_the_model_is_unknown(registry):
    with pytest.raises(InvalidInput) as exc:
        TrialConfig(model="wide_mlp")
    assert exc.value.field == "model"
    assert "mlp, resmlp, cnn, transformer" in exc.value.message
    assert "wide_mlp" not in sys.modules


# --- closed form: a registered Linear + ReLU stack equal to the built-in MLP -------------------


def _mlp_twin(params: BaseModel, *, d_in: int, n_classes: int, config: TrialConfig):
    """blocks.{i} = Linear (no bias) → ReLU; head Linear: the built-in mlp with norm none, its
    weights copied in from the mlp's own init stream (workers.train.generator(seed, "init"))."""
    from workers.train import generator

    spec = nn.make_spec(config.model_copy(update={"model": "mlp", "model_params": {}}))
    w = nn.init_params_of(spec, config, generator(config.seed, "init"))
    dims = [d_in] + [config.width] * config.depth
    blocks = []
    for ell in range(1, config.depth + 1):
        lin = torch.nn.Linear(dims[ell - 1], dims[ell], bias=False)
        with torch.no_grad():
            lin.weight.copy_(w[f"W{ell}"])
        blocks.append(torch.nn.Sequential(lin, torch.nn.ReLU()))
    head = torch.nn.Linear(config.width, n_classes, bias=False)
    with torch.no_grad():
        head.weight.copy_(w["W_head"])

    class Twin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(blocks)
            self.head = head

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    return Twin()


def _twin_configs(**kw) -> tuple[TrialConfig, TrialConfig]:
    base = dict(SMALL, depth=4, width=24, dtype="float64", activation="relu", bias=False, **kw)
    return TrialConfig(model="mlp", **base), TrialConfig(model="mlp_twin", **base)


def _assert_same_measurements(mine: dict, theirs: dict) -> None:
    pairs = [
        ("isometry_gap/output", "isometry_gap/act"),
        ("range_isometry_gap/output", "range_isometry_gap/act"),
        *((k, k) for k in ("weight_isometry_gap", "grad_norm", "rms", "mean_cosine")),
        *((k, k) for k in ("head_grad_norm", "head_weight_isometry_gap")),
    ]
    for a, b in pairs:
        np.testing.assert_allclose(mine[a], theirs[b], rtol=1e-6, atol=0, err_msg=a)


@pytest.mark.parametrize("batch_size", [16, 32])  # n < width: finite; n > width: +∞ in both
def test_a_linear_relu_stack_measures_as_the_builtin_mlp(registry, batch_size):
    registry.register_model("mlp_twin", _mlp_twin, taps="blocks.{i}")
    mlp_cfg, twin_cfg = _twin_configs(batch_size=batch_size)
    mlp, twin = MLPNet(mlp_cfg), build(twin_cfg)
    from workers.train import generator

    p_mlp = mlp.init_params(generator(0, "init"))
    p_twin = twin.init_params(generator(0, "init"))
    assert torch.equal(p_twin["blocks.0.0.weight"], p_mlp["W1"])
    x = torch.randn(batch_size, 64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y = torch.arange(batch_size) % 10
    theirs = probe_metrics(mlp, p_mlp, mlp.init_state(), x, y)
    mine = probe_metrics(twin, p_twin, twin.init_state(), x, y)
    _assert_same_measurements(mine, theirs)
    gaps = mine["isometry_gap/output"]
    assert np.isfinite(gaps).all() if batch_size < 24 else (gaps == math.inf).all()


def test_a_linear_relu_stack_trains_as_the_builtin_mlp(registry):
    from workers.train import fit

    built = []

    def counted(*args, **kw):
        built.append(1)
        return _mlp_twin(*args, **kw)

    registry.register_model("mlp_twin", counted, taps="blocks.{i}")
    mlp_cfg, twin_cfg = _twin_configs(epochs=2, lr=0.05)
    theirs, mine = list(fit(mlp_cfg)), list(fit(twin_cfg))
    assert built  # fit built the registered module (not an MLP of the same fields)
    assert len(mine) == len(theirs) == 3
    for m, t in zip(mine, theirs, strict=True):
        for k in ("train_loss", "test_loss", "train_acc", "test_acc"):
            assert m[k] == pytest.approx(t[k], rel=1e-9, abs=1e-12), k
        _assert_same_measurements(m, t)


def test_a_purely_linear_registered_stack_is_infinite_past_its_bottleneck(registry):
    """A linear bottleneck 64 → 4 → 32 at n = 16 (the module's forward is an attribute, so fx
    cannot trace it whole; each tapped Linear is traced on its own, its input's 4 features
    bounding the rank): the first tap has 4 features, the second rank ≤ 4 by linearity — +∞
    at both, as the theory and the built-in mlp with identity σ say (before the structure
    tracer, the second read a large finite gap of rounding-level eigenvalues)."""

    def bottleneck(params, *, d_in, n_classes, config):
        net = torch.nn.Module()
        net.blocks = torch.nn.ModuleList(
            [torch.nn.Linear(d_in, 4, bias=False), torch.nn.Linear(4, 32, bias=False)]
        )
        net.head = torch.nn.Linear(32, n_classes, bias=False)
        net.forward = lambda x: net.head(net.blocks[1](net.blocks[0](x)))
        return net

    registry.register_model("bottleneck", bottleneck)
    net = build(TrialConfig(model="bottleneck", depth=2, **{**SMALL, "dtype": "float64"}))
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    rec = probe_metrics(
        net, net.init_params(torch.Generator().manual_seed(0)), {}, x, torch.arange(16) % 10
    )
    assert (rec["isometry_gap/output"] == math.inf).all()
    assert net.structure_known() == [True, True]


# --- modes, state, randomness --------------------------------------------------------------------


def _bn_net(params, *, d_in, n_classes, config):
    blocks = torch.nn.ModuleList(
        torch.nn.Sequential(
            torch.nn.Linear(d_in if i == 0 else config.width, config.width),
            torch.nn.BatchNorm1d(config.width),
            torch.nn.Tanh(),
        )
        for i in range(config.depth)
    )

    class BN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = blocks
            self.out = torch.nn.Linear(config.width, n_classes)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.out(x)

    return BN()


@pytest.fixture
def bn(registry):
    registry.register_model("bn_net", _bn_net)
    return build(TrialConfig(model="bn_net", depth=2, **{**SMALL, "norm": "batch"}))


def test_train_mode_updates_the_state_in_place_batch_mode_leaves_it(bn):
    p, s = bn.init_params(torch.Generator().manual_seed(0)), bn.init_state()
    assert set(s) == {
        f"blocks.{i}.1.{k}"
        for i in (0, 1)
        for k in ("running_mean", "running_var", "num_batches_tracked")
    }
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1)) + 3
    before = {k: v.clone() for k, v in s.items()}
    tensors = {k: v for k, v in s.items()}
    bn.forward(p, s, x, "batch")
    assert all(torch.equal(s[k], before[k]) for k in s)
    out_batch, _ = bn.forward(p, s, x, "batch")
    bn.forward(p, s, x, "train")
    assert all(s[k] is tensors[k] for k in s)  # the same tensors, updated in place
    assert not torch.equal(s["blocks.0.1.running_var"], before["blocks.0.1.running_var"])
    mean = s["blocks.0.1.running_mean"]
    z = x @ p["blocks.0.0.weight"].T + p["blocks.0.0.bias"]
    torch.testing.assert_close(mean, 0.1 * z.mean(dim=0))  # torch's momentum 0.1 from 0
    assert int(s["blocks.0.1.num_batches_tracked"]) == 1
    # running mode reads the running statistics: not the batch's own
    out_running, _ = bn.forward(p, s, x, "running")
    assert not torch.allclose(out_running, out_batch)
    # probe_metrics changes no state
    after = {k: v.clone() for k, v in s.items()}
    probe_metrics(bn, p, s, x, torch.arange(16) % 10)
    assert all(torch.equal(s[k], after[k]) for k in s)


def test_init_is_reproducible_and_leaves_torchs_generator_alone(bn):
    rng = torch.get_rng_state()
    a = bn.init_params(torch.Generator().manual_seed(5))
    b = bn.init_params(torch.Generator().manual_seed(5))
    c = bn.init_params(torch.Generator().manual_seed(6))
    assert torch.equal(torch.get_rng_state(), rng)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.0.weight"], c["blocks.0.0.weight"])
    assert all(v.dtype == torch.float32 and not v.requires_grad for v in a.values())
    assert bn.head_weight == "out.weight"  # no head registered: the last matrix


def test_float64_params_and_state(registry):
    registry.register_model("bn_net", _bn_net)
    net = build(TrialConfig(model="bn_net", depth=2, **{**SMALL, "dtype": "float64"}))
    p, s = net.init_params(torch.Generator().manual_seed(0)), net.init_state()
    assert {v.dtype for v in p.values()} == {torch.float64}
    assert s["blocks.0.1.running_var"].dtype == torch.float64
    assert s["blocks.0.1.num_batches_tracked"].dtype == torch.int64


def test_a_tap_without_weights_records_nan_weight_metrics(registry):
    registry.register_model("bn_net", _bn_net, taps=("blocks.0.0", "blocks.0.1", "blocks.1"))
    net = build(TrialConfig(model="bn_net", depth=3, **SMALL))
    assert net.layer_weights() == [["blocks.0.0.weight"], [], ["blocks.1.0.weight"]]
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    rec = probe_metrics(
        net, net.init_params(torch.Generator()), net.init_state(), x, torch.arange(16) % 10
    )
    assert np.isnan(rec["weight_isometry_gap"][1]) and np.isnan(rec["grad_norm"][1])
    assert np.isfinite(rec["weight_isometry_gap"][[0, 2]]).all()
    # blocks.0.1 is a BatchNorm1d at init (β = 0): centred over the batch, +∞; the others not
    assert rec["isometry_gap/output"][1] == math.inf
    assert np.isfinite(rec["isometry_gap/output"][[0, 2]]).all()


# --- errors a lab meets -------------------------------------------------------------------------


def test_a_tap_that_is_not_a_submodule_names_the_closest(registry):
    registry.register_model("bn_net", _bn_net, taps="block.{i}")
    with pytest.raises(InvalidInput) as exc:
        build(TrialConfig(model="bn_net", depth=2, **SMALL))
    assert exc.value.field == "model"
    assert "'block.0' is not a submodule" in exc.value.message
    assert "did you mean blocks.0" in exc.value.message
    assert "blocks.1.2" in exc.value.message  # the module's submodules are listed


def test_too_few_blocks_for_the_depth_says_so(registry):
    def fixed(params, *, d_in, n_classes, config):
        return _bn_net(
            params, d_in=d_in, n_classes=n_classes, config=config.model_copy(update={"depth": 2})
        )

    registry.register_model("fixed", fixed)
    with pytest.raises(InvalidInput) as exc:
        build(TrialConfig(model="fixed", depth=3, **SMALL))
    assert "'blocks.2' is not a submodule" in exc.value.message
    assert "depth=3" in exc.value.message


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    blocks: int = 2


def test_a_factory_that_raises_or_returns_no_module(registry):
    def raises(params, *, d_in, n_classes, config):
        raise ValueError(f"{params.blocks} blocks is not enough")

    registry.register_model("raises", raises, params=Strict)
    registry.register_model("nothing", lambda params, **kw: 42)
    with pytest.raises(InvalidInput) as exc:
        build(TrialConfig(model="raises", **SMALL))
    assert exc.value.field == "model" and "ValueError: 2 blocks is not enough" in exc.value.message
    with pytest.raises(InvalidInput, match=r"returned int, not a torch\.nn\.Module"):
        build(TrialConfig(model="nothing", **SMALL))


def test_an_output_that_is_not_logits(registry):
    def features(params, *, d_in, n_classes, config):
        net = torch.nn.Module()
        net.blocks = torch.nn.ModuleList([torch.nn.Linear(d_in, 7)])
        net.forward = lambda x: net.blocks[0](x)
        return net

    def crashes(params, *, d_in, n_classes, config):
        net = torch.nn.Module()
        net.blocks = torch.nn.ModuleList([torch.nn.Linear(d_in + 1, n_classes)])
        net.forward = lambda x: net.blocks[0](x)
        return net

    registry.register_model("features", features)
    registry.register_model("crashes", crashes)
    with pytest.raises(InvalidInput) as exc:
        build(TrialConfig(model="features", depth=1, **SMALL))
    assert "(n, n_classes) = (2, 10)" in exc.value.message and "(2, 7)" in exc.value.message
    with pytest.raises(InvalidInput) as exc:
        build(TrialConfig(model="crashes", depth=1, **SMALL))
    assert exc.value.field == "model" and "a forward pass on a (2, 64) batch" in exc.value.message


def test_a_bad_registered_head(registry):
    registry.register_model("bn_net", _bn_net, head="out.wieght")
    with pytest.raises(InvalidInput, match=r"did you mean out\.weight"):
        build(TrialConfig(model="bn_net", depth=2, **SMALL))


def test_registered_net_is_what_build_gives(registry):
    registry.register_model("bn_net", _bn_net)
    assert isinstance(build(TrialConfig(model="bn_net", depth=2, **SMALL)), RegisteredNet)


def test_a_batchnorm_module_trains_and_its_running_statistics_move(registry):
    """Through fit: the state lands in the engine's flat buffer (in place), so eval_norm
    "running" reads statistics that training moved; the same config and seed repeat exactly."""
    from workers.train import Trial, fit

    registry.register_model("bn_net", _bn_net)
    config = TrialConfig(model="bn_net", depth=2, epochs=1, **{**SMALL, "norm": "batch"})
    trial = Trial(config)
    before = {k: v.clone() for k, v in trial.state.items()}
    trial.train_epoch()
    moved = [k for k in before if not torch.equal(before[k], trial.state[k])]
    assert "blocks.0.1.running_mean" in moved and "blocks.1.1.running_var" in moved
    a, b = list(fit(config)), list(fit(config))
    for ra, rb in zip(a, b, strict=True):
        for k in ("train_loss", "test_loss", "isometry_gap/output", "grad_norm"):
            np.testing.assert_array_equal(ra[k], rb[k], err_msg=k)


def test_the_docs_family_table_lists_every_models_tap_kinds(registry):
    """docs/models.md's table: a row per built-in family and one for registered models, whose
    kinds column is what service.models.tap_kinds says each records (norm and mlp present)."""
    import re

    from service.config import BUILTIN_MODELS

    text = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    text = text.split("## Families", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| (`\w+`|registered)[^|]*\|[^|]*\|[^|]*\|([^|]*)\|", text, re.M)
    kinds = {n.strip("`"): tuple(re.findall(r"`(\w+)`", col)) for n, col in rows[1:]}  # [0]: head
    registry.register_model("bn_net", _bn_net)
    assert set(kinds) == {*BUILTIN_MODELS, "registered"}
    for model in BUILTIN_MODELS:
        assert kinds[model] == models.tap_kinds(TrialConfig(model=model)), model
    assert kinds["registered"] == models.tap_kinds(TrialConfig(model="bn_net"))


def test_a_configured_module_that_cannot_be_imported_fails_loudly_every_time(registry, monkeypatch):
    monkeypatch.setenv("ISOSWEEP_MODEL_MODULES", "wide_mlp,isosweep_no_such_module")
    get_settings.cache_clear()
    for _ in range(2):  # not once, then silently without the models it failed to register
        with pytest.raises(RuntimeError, match=r"ISOSWEEP_MODEL_MODULES.*isosweep_no_such_module"):
            TrialConfig(model="wide_mlp")
