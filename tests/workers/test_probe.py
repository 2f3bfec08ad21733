"""isosweep.probe (workers/probe.py, docs/probe.md): a trial's measurement of one batch through
any torch.nn.Module — equal to fit's own epoch-0 record for each built-in family on the same
weights (float64, 1e-9), equal to numpy's float64 SVD of the tap features for a module no family
describes, structural +inf from the module's layers, the module left exactly as it was, and
clear errors."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from torch import nn as tnn

import isosweep
from service.config import TrialConfig
from service.errors import InvalidInput
from workers.probe import probe
from workers.structure import refine
from workers.train import Trial, fit

RTOL = 1e-9


@pytest.fixture
def fresh_metrics(monkeypatch):
    from service import metric_names

    monkeypatch.setattr(metric_names, "_LAB", {})


# --- the built-in families as torch.nn.Modules ------------------------------------------------


class _Tap(tnn.Module):
    """The identity at one tap of a family's block, holding the block's listed weights (so that
    probe's "parameters inside the tapped module" are the family's layer weights) and declaring
    the structure the family's own rules give for the last batch (`isosweep_structure`) and,
    at a transformer's attention taps, the block's attention weights (`isosweep_attention`)."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        super().__init__()
        self.w = tnn.ParameterList([tnn.Parameter(w.detach().clone()) for w in weights])
        self.declared: tuple[bool, int] | None = None
        self.weights: torch.Tensor | None = None

    def isosweep_structure(self, n: int, features: int) -> tuple[bool, int]:
        return self.declared if self.declared is not None else (False, min(n, features))

    def isosweep_attention(self) -> torch.Tensor | None:
        return self.weights

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h


class FamilyModule(tnn.Module):
    """A built-in family's network (a workers.models Net and a Trial's tensors) as an
    nn.Module: `blocks.{i}` are the block outputs (Taps.outputs) and hold the block's weights,
    `<kind>.{i}` the family's taps of each kind, `streams.{i}` a transformer's token stream;
    the forward is the family's own in "batch" mode (the trial's probe)."""

    def __init__(self, trial: Trial) -> None:
        super().__init__()
        self.net = net = trial.net
        L = net.depth
        weights = net.layer_weights()
        self.paths: dict[str, str] = {}
        self.blocks = tnn.ModuleList([_Tap([trial.params[k] for k in ws]) for ws in weights])
        for i, ws in enumerate(weights):
            self.paths.update({k: f"blocks.{i}.w.{j}" for j, k in enumerate(ws)})
        self.kind_taps = tnn.ModuleDict(
            {k: tnn.ModuleList(_Tap([]) for _ in range(L)) for k in net.kinds}
        )
        self.streams = tnn.ModuleList(_Tap([]) for _ in range(L))
        rest = [k for k in trial.params if k not in self.paths and k != net.head_weight]
        self.rest = tnn.ParameterList(
            [tnn.Parameter(trial.params[k].detach().clone()) for k in rest]
        )
        self.paths.update({k: f"rest.{j}" for j, k in enumerate(rest)})
        self.head_w = tnn.Parameter(trial.params[net.head_weight].detach().clone())
        self.paths[net.head_weight] = "head_w"
        for j, (k, v) in enumerate(trial.state.items()):
            self.register_buffer(f"state{j}", v.detach().clone())
            self.paths[k] = f"state{j}"
        self.param_names = frozenset(trial.params)

    def _get(self, path: str) -> torch.Tensor:
        return functools.reduce(getattr, path.split("."), self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = {k: self._get(path) for k, path in self.paths.items()}
        params = {k: v for k, v in values.items() if k in self.param_names}
        state = {k: v for k, v in values.items() if k not in params}
        logits, taps = self.net.forward(params, state, x, "batch", taps=True)
        detached = {k: v.detach() for k, v in params.items()}
        forced = self.net.structures(detached, x, taps, refine)
        for kind in self.net.kinds:
            for i, (h, s) in enumerate(zip(taps.layers[kind], forced[kind], strict=True)):
                tap = self.kind_taps[kind][i]
                tap.declared = (s.ones_in_null, s.rank)
                if kind == "attn":
                    tap.weights = taps.attention[i]  # (n, heads, T, T)
                tap(h)
        outputs = {id(h): (k, i) for k in self.net.kinds for i, h in enumerate(taps.layers[k])}
        for i, h in enumerate(taps.outputs):
            if id(h) in outputs:  # the block output is one of the block's taps
                k, j = outputs[id(h)]
                self.blocks[i].declared = self.kind_taps[k][j].declared
            self.blocks[i](h)
        for i, h in enumerate(taps.tokens or []):
            self.streams[i](h)
        return logits


FAMILIES = [
    ("mlp", {"norm": "batch", "activation": "tanh"}),
    ("mlp", {"norm": "layer", "activation": "relu", "width": 8}),  # n > d: structural +inf
    ("resmlp", {"norm": "batch"}),
    ("cnn", {}),
    ("transformer", {}),
]


def _close(a, b) -> None:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a.shape == b.shape
    assert np.array_equal(np.isinf(a), np.isinf(b)) and np.array_equal(np.isnan(a), np.isnan(b))
    finite = np.isfinite(a)
    np.testing.assert_allclose(a[finite], b[finite], rtol=RTOL, atol=1e-12)


@pytest.mark.parametrize(
    ("model", "extra"), FAMILIES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(FAMILIES)]
)
def test_probe_equals_fits_own_record_for_each_family(model, extra):
    kw = {"depth": 3, "width": 16, "batch_size": 12, **extra}
    config = TrialConfig(model=model, epochs=0, dtype="float64", tap_metrics=True, **kw)
    record = next(iter(fit(config)))  # fit's epoch-0 record
    trial = Trial(config)  # the same weights and probe batch (seeded as fit seeds them)
    module = FamilyModule(trial)
    x, y = trial.probe
    L, kinds = trial.net.depth, trial.net.kinds
    blocks = probe(module, x, y=y, taps="blocks.{i}", head="head_w")
    for key in ("rms", "mean_cosine", "grad_norm", "weight_isometry_gap"):
        _close(blocks[key], record[key])
    _close(blocks["head_grad_norm"], record["head_grad_norm"])
    _close(blocks["head_weight_isometry_gap"], record["head_weight_isometry_gap"])
    names = [f"kind_taps.{k}.{i}" for k in kinds for i in range(L)]
    per_kind = probe(module, x, y=y, taps=names, head="head_w")
    for m in ("isometry_gap", "range_isometry_gap", "isometry_gap_error"):
        _close(per_kind[f"{m}/output"], np.concatenate([record[f"{m}/{k}"] for k in kinds]))
    if model == "transformer":  # the per-tap metrics of the token stream (n, T, d)
        streams = probe(module, x, taps="streams.{i}", head="head_w")
        for key in ("token_isometry_gap", "token_cosine", "effective_rank", "stable_rank"):
            _close(streams[key], record[key])
        attn = probe(module, x, taps="kind_taps.attn.{i}", head="head_w")
        for key in ("attention_entropy", "attention_entropy_heads"):
            _close(attn[key], record[key])
        assert record["attention_entropy_heads"].shape == (L, trial.config.heads)
    else:
        for key in ("effective_rank", "stable_rank"):
            _close(blocks[key], record[key])
    if extra.get("width") == 8:  # the control: n = 12 > d = 8 is +inf, not just large
        assert np.isinf(per_kind["isometry_gap/output"]).all()


# --- a module no family describes, against numpy ----------------------------------------------


class Gated(tnn.Module):
    """Gated blocks (h ↦ W_o(tanh(W_a h) ⊙ σ(W_b h)) + h) on a Conv1d stem: no family's."""

    def __init__(self, d: int = 24, depth: int = 3, classes: int = 4) -> None:
        super().__init__()
        self.stem = tnn.Conv1d(1, 2, 3, padding=1)
        self.proj = tnn.Linear(2 * 12, d)
        self.blocks = tnn.ModuleList(_Gate(d) for _ in range(depth))
        self.head = tnn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(torch.relu(self.stem(x[:, None, :])).flatten(1))
        for b in self.blocks:
            h = b(h)
        return self.head(h)


class _Gate(tnn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.a, self.b, self.o = tnn.Linear(d, d), tnn.Linear(d, d), tnn.Linear(d, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.o(torch.tanh(self.a(h)) * torch.sigmoid(self.b(h))) + h


def _numpy_gap(H: np.ndarray, drop: int = 0) -> float:
    lam = np.linalg.svd(H.reshape(len(H), -1), compute_uv=False) ** 2
    lam = lam[: len(lam) - drop] if drop else lam
    return float(np.log(lam.mean()) - np.log(lam).mean())


def _numpy_cosine(H: np.ndarray) -> float:
    U = H / np.linalg.norm(H, axis=1, keepdims=True)
    C = U @ U.T
    n = len(H)
    return float((C.sum() - np.trace(C)) / (n * (n - 1)))


def _features(module: tnn.Module, names: list[str], x: torch.Tensor) -> list[np.ndarray]:
    got: dict[str, torch.Tensor] = {}
    handles = [
        module.get_submodule(t).register_forward_hook(lambda m, i, o, t=t: got.__setitem__(t, o))
        for t in names
    ]
    with torch.no_grad():
        module(x)
    for h in handles:
        h.remove()
    return [got[t].double().numpy() for t in names]


def test_probe_equals_numpy_on_a_module_no_family_describes():
    torch.manual_seed(3)
    module = Gated().double()
    x = torch.randn(10, 12, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1])
    names = ["stem", "proj", "blocks.0", "blocks.1.a", "blocks.2"]
    record = probe(module, x, y=y, taps=names)
    H = _features(module, names, x)
    # n = 10 < every tap's features: all Grams regular, the gaps finite
    _close(record["isometry_gap/output"], [_numpy_gap(h) for h in H])
    _close(record["range_isometry_gap/output"], [_numpy_gap(h) for h in H])
    _close(record["rms"], [np.sqrt(np.mean(h**2)) for h in H])
    _close(record["mean_cosine"], [_numpy_cosine(h.reshape(len(h), -1)) for h in H])
    # gradients: an independent backward on a copy, through .grad
    import copy

    twin = copy.deepcopy(module)
    torch.nn.functional.cross_entropy(twin(x), y).backward()
    want = []
    for t in names:
        mats = [p.grad for p in twin.get_submodule(t).parameters() if p.ndim >= 2]
        want.append(math.sqrt(sum(float((g**2).sum()) for g in mats)))
    _close(record["grad_norm"], want)
    _close(record["head_grad_norm"], float(twin.head.weight.grad.norm()))
    s = np.linalg.svd(module.proj.weight.detach().numpy(), compute_uv=False) ** 2
    _close(record["weight_isometry_gap"][1], np.log(s.mean()) - np.log(s).mean())
    # only the stem's output (n, 2, 12) is 3-D: the token metrics there, NaN at the others
    tokens = record["token_isometry_gap"]
    assert np.isfinite(tokens[0]) and np.isnan(tokens[1:]).all()


def test_structural_inf_from_the_module_layers_and_the_range_gap_against_numpy():
    """BatchNorm1d (β = 0 at init) centres every feature over the batch: 1 is in the Gram's
    null space, so the gap is +inf by structure, and the range gap is the gap of the other n − 1
    eigenvalues; the Tanh after it ends the dependence (finite)."""
    torch.manual_seed(0)
    d, n = 20, 12
    module = tnn.Sequential(tnn.Linear(d, d), tnn.BatchNorm1d(d), tnn.Tanh(), tnn.Linear(d, 3))
    module = module.double()
    x = torch.randn(n, d, dtype=torch.float64)
    record = probe(module, x, taps=["0", "1", "2"])
    assert "grad_norm" not in record  # no y, no loss
    gap, rng = record["isometry_gap/output"], record["range_isometry_gap/output"]
    assert math.isinf(gap[1]) and math.isfinite(gap[0]) and math.isfinite(gap[2])
    module.train()
    H = _features(module, ["0", "1", "2"], x)
    _close(rng, [_numpy_gap(H[0]), _numpy_gap(H[1], drop=1), _numpy_gap(H[2])])
    assert record["isometry_gap_error/output"][1] == 0  # a structural +inf is exact


def test_token_metrics_at_3d_taps_only():
    torch.manual_seed(1)
    layer = tnn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    module = tnn.Sequential(tnn.Linear(4, 8), layer, tnn.Flatten(), tnn.Linear(8 * 5, 3)).double()
    x = torch.randn(6, 5, 4, dtype=torch.float64)
    record = probe(module, x, taps=["0", "1", "2"])
    assert np.isfinite(record["token_isometry_gap"][:2]).all()
    assert np.isnan(record["token_isometry_gap"][2])
    # a token's Gram: its own closed form on one sample
    from workers.token_metrics import token_metrics

    H = _features(module, ["1"], x)[0]
    want = token_metrics([torch.from_numpy(H)])
    _close(record["token_isometry_gap"][1], want["token_isometry_gap"][0])
    _close(record["token_cosine"][1], want["token_cosine"][0])


# --- the module is left as it was ---------------------------------------------------------------


def _snapshot(module: tnn.Module) -> dict:
    return {
        "buffers": {k: v.clone() for k, v in module.named_buffers()},
        "params": {k: v.detach().clone() for k, v in module.named_parameters()},
        "grad": {
            k: None if v.grad is None else v.grad.clone() for k, v in module.named_parameters()
        },
        "training": {k: m.training for k, m in module.named_modules()},
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules()),
        "rng": torch.get_rng_state(),
    }


def _assert_same(before: dict, after: dict) -> None:
    for k in ("buffers", "params"):
        assert before[k].keys() == after[k].keys()
        for name, v in before[k].items():
            assert torch.equal(v, after[k][name]), f"{k} {name} changed"
    for name, g in before["grad"].items():
        h = after["grad"][name]
        assert (g is None) == (h is None) and (g is None or torch.equal(g, h)), name
    assert before["training"] == after["training"]
    assert before["hooks"] == after["hooks"]
    assert torch.equal(before["rng"], after["rng"])


def _stateful() -> tnn.Module:
    torch.manual_seed(2)
    m = tnn.Sequential(
        tnn.Linear(6, 10), tnn.BatchNorm1d(10), tnn.ReLU(), tnn.Dropout(0.3), tnn.Linear(10, 3)
    )
    m.train()
    m[1].eval()  # mixed modes: each submodule's flag must come back as it was
    m[0].weight.grad = torch.full_like(m[0].weight, 0.25)  # some .grad set, some None
    return m


def test_probe_leaves_the_module_as_it_was():
    m = _stateful()
    x, y = torch.randn(8, 6), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    before = _snapshot(m)
    record = probe(m, x, y=y, taps=["0", "1", "2", "3"])
    _assert_same(before, _snapshot(m))
    assert np.isfinite(record["grad_norm"][0]) and np.isnan(record["grad_norm"][1])
    # the control: a plain train-mode forward does change what the snapshot holds
    m.train()
    m(x)
    after = _snapshot(m)
    assert not torch.equal(before["buffers"]["1.running_mean"], after["buffers"]["1.running_mean"])
    assert before["training"] != after["training"]


def test_probe_leaves_the_module_as_it_was_when_the_loss_raises():
    m = _stateful()
    x = torch.randn(8, 6)
    before = _snapshot(m)

    def bad(out, y):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        probe(m, x, y=torch.zeros(8, dtype=torch.long), loss=bad, taps=["0"])
    _assert_same(before, _snapshot(m))


def test_eval_mode_uses_the_running_statistics():
    m = _stateful()
    m[1].running_mean.fill_(3.0)
    x = torch.randn(8, 6)
    a = probe(m, x, taps=["1"], mode="eval")
    b = probe(m, x, taps=["1"], mode="batch")
    m.eval()
    with torch.no_grad():
        h = m[1](m[0](x))
    assert a["rms"][0] == pytest.approx(float(h.double().square().mean().sqrt()), rel=1e-6)
    assert a["rms"][0] != pytest.approx(b["rms"][0], rel=1e-3)


# --- errors -------------------------------------------------------------------------------------


def test_a_wrong_tap_name_lists_the_close_names():
    m = Gated()
    with pytest.raises(
        InvalidInput, match=r"'blocks\.1\.c' is not a submodule.*did you mean blocks\.1\.[abo]"
    ):
        probe(m, torch.randn(4, 12), taps=["blocks.1.c"])
    with pytest.raises(
        InvalidInput, match=r"'block\.0'.*pattern 'block\.\{i\}'.*did you mean blocks\.0"
    ):
        probe(m, torch.randn(4, 12), taps="block.{i}")


def test_other_bad_input_is_named():
    m = Gated()
    x = torch.randn(4, 12)
    with pytest.raises(InvalidInput, match="ran 2 times"):
        shared = tnn.Linear(12, 12)
        probe(tnn.Sequential(shared, tnn.Tanh(), shared), x, taps=["0"])
    with pytest.raises(InvalidInput, match=r"head 'haed\.weight'.*did you mean head\.weight"):
        probe(m, x, head="haed.weight")
    with pytest.raises(InvalidInput, match="scalar"):
        probe(m, x, y=torch.zeros(4, dtype=torch.long), loss=lambda o, y: o)
    with pytest.raises(InvalidInput, match="mode"):
        probe(m, x, mode="train")
    with pytest.raises(InvalidInput, match="does not depend on the module's parameters"):
        probe(m, x, loss=lambda o: torch.tensor(1.0))
    # a module without any matrix parameter: no head keys, grad_norm NaN, nothing raised
    plain = probe(tnn.Sequential(tnn.Tanh(), tnn.LayerNorm(12)), x, taps=["0", "1"], loss=torch.sum)
    assert "head_grad_norm" not in plain and "head_weight_isometry_gap" not in plain
    assert np.isnan(plain["grad_norm"]).all()


def test_isosweep_exports_probe_lazily():
    assert isosweep.probe is probe
    assert isosweep.register_metric is not None
    assert "probe" in dir(isosweep)


def test_the_guides_code_runs_and_gives_its_printed_numbers(fresh_metrics):
    """docs/probe.md's python blocks, run in order; the numbers it prints are what they give."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "probe.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    scope: dict = {}
    for code in blocks:
        exec(compile(code, "docs/probe.md", "exec"), scope)
    np.testing.assert_allclose(
        scope["record"]["isometry_gap/output"],
        [0.61765826, 0.84119517, 0.94755447, 1.04569178],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        scope["record"]["grad_norm"], [1.54583238, 1.39724564, 1.18672984, 0.91324951], rtol=1e-6
    )
    assert np.isinf(scope["norms"]["isometry_gap/output"]).all()
    np.testing.assert_allclose(
        scope["norms"]["range_isometry_gap/output"],
        [0.54807311, 0.80598021, 0.83615541, 0.96534273],
        rtol=1e-6,
    )
    assert "frobenius" not in scope["norms"]  # registered after the probes
    x = scope["x"]
    got = probe(scope["model"], x, taps="blocks.{i}")["frobenius"]
    np.testing.assert_allclose(
        got[0], float(scope["model"].blocks[0](x).detach().double().norm()), rtol=1e-9
    )


def test_update_ratio_between_two_probes_closed_form():
    """‖ΔW‖/‖W‖ per tap: W ← (1 + c)W gives |c| exactly by construction (up to rounding); a
    bias's change is not a weight's; a tap without a matrix parameter is NaN."""
    torch.manual_seed(4)
    m = tnn.Sequential(tnn.Linear(5, 7), tnn.Tanh(), tnn.Linear(7, 7), tnn.Linear(7, 3)).double()
    previous = {k: v.detach().clone() for k, v in m.named_parameters()}
    E = torch.randn(7, 7, dtype=torch.float64)
    with torch.no_grad():
        m[0].weight.mul_(1 - 0.125)
        m[0].bias.add_(10.0)  # not counted: biases have one axis
        m[2].weight.add_(E)
        m[3].weight.mul_(1.5)
    x = torch.randn(4, 5, dtype=torch.float64)
    record = probe(m, x, taps=["0", "1", "2"], previous=previous)
    ratio = record["update_ratio"]
    assert ratio[0] == pytest.approx(0.125, rel=1e-12)
    assert math.isnan(ratio[1])
    assert ratio[2] == pytest.approx(float(E.norm() / previous["2.weight"].norm()), rel=1e-12)
    assert record["head_update_ratio"] == pytest.approx(0.5, rel=1e-12)
    same = probe(m, x, taps=["0"], previous={k: v.detach() for k, v in m.named_parameters()})
    assert same["update_ratio"][0] == 0
    with pytest.raises(InvalidInput, match=r"previous has no parameter '0\.weight'"):
        probe(m, x, taps=["0"], previous={})
    with pytest.raises(InvalidInput, match=r"previous\['0.weight'\] has shape \(2,\)"):
        probe(m, x, taps=["0"], previous={**previous, "0.weight": torch.zeros(2)})


class _BNBlocks(tnn.Module):
    def __init__(self, d_in: int, d: int, depth: int, classes: int) -> None:
        super().__init__()
        self.inp = tnn.Linear(d_in, d)
        self.blocks = tnn.ModuleList(
            tnn.Sequential(tnn.Linear(d, d), tnn.BatchNorm1d(d), tnn.ReLU()) for _ in range(depth)
        )
        self.head = tnn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h) + h
        return self.head(h)


def test_probe_equals_a_registered_models_trial(monkeypatch):
    """The registered-model path: fit's epoch-0 record of a registered module (its structure
    traced by the same ModuleGraph) and probe of that module holding the trial's weights agree
    on every key, structural +inf of the BatchNorm taps included."""
    from service import models

    monkeypatch.setattr(models, "_REGISTRY", {})
    monkeypatch.setattr(models, "_loaded", True)
    taps = (*(f"blocks.{i}.{j}" for i in range(2) for j in (0, 1)), "blocks.1")

    def build(params, *, d_in, n_classes, config):
        return _BNBlocks(d_in, config.width, 2, n_classes)

    models.register_model("bn_blocks", build, taps=taps, head="head.weight")
    config = TrialConfig(
        model="bn_blocks", depth=len(taps), width=24, batch_size=12, epochs=0, dtype="float64"
    )
    record = next(iter(fit(config)))
    trial = Trial(config)
    module = build(None, d_in=trial.net.d_in, n_classes=trial.net.n_classes, config=config)
    module = module.double()
    module.load_state_dict({**trial.params, **trial.state})
    x, y = trial.probe
    got = probe(module, x, y=y, taps=list(taps), head="head.weight")
    assert np.isinf(record["isometry_gap/output"][[1, 3]]).all()  # BatchNorm1d, β = 0
    for key in (
        "isometry_gap/output",
        "range_isometry_gap/output",
        "isometry_gap_error/output",
        "weight_isometry_gap",
        "grad_norm",
        "rms",
        "mean_cosine",
        "head_grad_norm",
        "head_weight_isometry_gap",
    ):
        _close(got[key], record[key])


def _encoder(d: int = 8, heads: int = 2, seed: int = 5) -> tnn.Module:
    torch.manual_seed(seed)
    layer = tnn.TransformerEncoderLayer(d, heads, 16, dropout=0.25, batch_first=True)
    return tnn.Sequential(layer, tnn.Flatten(), tnn.Linear(d * 6, 3)).double()


def test_attention_entropy_is_log_s_for_uniform_attention():
    """Zero query and key maps give equal scores: each query attends uniformly to its keys —
    log T without a mask, log(t + 1) at query t under a causal mask (mean over t)."""
    T = 6
    m = _encoder()
    d = 8
    with torch.no_grad():
        m[0].self_attn.in_proj_weight[: 2 * d].zero_()
        m[0].self_attn.in_proj_bias[: 2 * d].zero_()
    x = torch.randn(5, T, d, dtype=torch.float64)
    record = probe(m, x, taps=["0.self_attn", "0"])
    ent = record["attention_entropy_heads"]
    assert ent.shape == (2, 2)
    np.testing.assert_allclose(ent[0], [math.log(T)] * 2, rtol=1e-12)
    assert np.isnan(ent[1]).all()  # the layer's output is no attention module
    assert record["attention_entropy"][0] == pytest.approx(math.log(T), rel=1e-12)
    assert np.isnan(record["attention_entropy"][1])
    sa = m[0].self_attn
    assert not sa._forward_pre_hooks and not sa._forward_hooks
    assert not [k for k in sa.__dict__ if k.startswith("_isosweep")]  # nothing left behind

    class Causal(tnn.Module):
        def __init__(self, inner: tnn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mask = tnn.Transformer.generate_square_subsequent_mask(T, dtype=x.dtype)
            return self.inner[2](self.inner[1](self.inner[0](x, src_mask=mask, is_causal=True)))

    causal = probe(Causal(m), x, taps=["inner.0.self_attn"])["attention_entropy_heads"][0]
    want = np.mean([math.log(t + 1) for t in range(T)])
    np.testing.assert_allclose(causal, [want] * 2, rtol=1e-12)


def test_attention_entropy_against_numpy():
    m = _encoder(seed=6)
    x = torch.randn(4, 6, 8, dtype=torch.float64)
    record = probe(m, x, taps=["0.self_attn"])
    got = record["attention_entropy_heads"][0]
    attn = m[0].self_attn
    W, b = attn.in_proj_weight.detach().numpy(), attn.in_proj_bias.detach().numpy()
    h = x.numpy()  # what the attention sees: the layer's input (post-norm: LayerNorm after)
    q, k = h @ W[:8].T + b[:8], h @ W[8:16].T + b[8:16]
    want = []
    for head in range(2):
        sl = slice(4 * head, 4 * head + 4)
        s = np.einsum("ntd,nsd->nts", q[..., sl], k[..., sl]) / 2.0  # √(d/heads) = 2
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        want.append(float(-(a * np.log(a)).sum(-1).mean()))
    np.testing.assert_allclose(got, want, rtol=1e-9)
    assert (got > 0).all() and (got < math.log(6)).all()
    assert record["attention_entropy"][0] == pytest.approx(np.mean(want), rel=1e-9)
