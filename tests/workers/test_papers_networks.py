"""The two papers' networks, written here with plain torch.nn modules as the authors' code builds
them, against isosweep configured to match (docs/papers.md).

- Meterez et al. 2024: Linear (bias, torch's default init) → BatchNorm1d (ε = 1e-5) → σ, hidden
  weights orthogonal ignoring any gain (torch.nn.init.orthogonal_), the head included (their
  reset_parameters loops over every Linear), width = batch.
- Joudaki et al. 2023: inputs scaled to unit RMS, then Linear → σ → a custom LayerNorm that
  centres and scales each sample with ε = 0; torch's default init throughout.

No tensor is copied from isosweep into the reference: the reference draws its own weights
(seeded torch init) and they are loaded INTO isosweep's parameters, so both compute on the same
weights and batch. The reference gaps come from float64 SVDs of the reference's hidden states,
the reference gradient norms from autograd through the reference modules.

The isosweep configs are docs/papers.md's own YAML blocks (read from the page, so the page
cannot drift from what is tested), plus what the page leaves to the experiment: depth, dataset
and, for Joudaki et al., width and a batch below it.
"""

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from service.config import TrialConfig
from service.documents import load_yaml
from workers import metrics, nn
from workers.data import load_dataset
from workers.train import Trial, generator

DEPTH = 12
F64 = torch.float64
PAPERS = Path(__file__).resolve().parents[2] / "docs" / "papers.md"


def documented(heading: str) -> dict:
    """The `parameters` of the first YAML block under the docs/papers.md section whose heading
    starts with `heading`, read as a spec is read (service.documents.load_yaml)."""
    text = PAPERS.read_text()
    section = re.search(rf"^## {re.escape(heading)}.*?(?=^## |\Z)", text, re.M | re.S)
    assert section is not None, heading
    block = re.search(r"^```yaml\n(.*?)^```", section.group(0), re.M | re.S)
    assert block is not None, f"no YAML block under {heading!r}"
    return dict(load_yaml(block.group(1))["parameters"])


# Meterez et al. 2024's network as the page gives it (width = batch = 100, orthogonal_ for every
# Linear, the head included: head_init unset)
MEZ = {**documented("Meterez et al. 2024"), "depth": DEPTH, "dataset": "gaussian"}
# Joudaki et al. 2023's (batch < width: centred rows span d − 1 dimensions); the page leaves
# their uniform init out (not an isosweep init): the reference's weights are loaded in anyway
JOU = {**documented("Joudaki et al. 2023"), "depth": DEPTH, "dataset": "gaussian", "width": 100,
       "batch_size": 32}  # fmt: skip


def test_the_page_gives_the_networks_the_references_build():
    """What the reference modules below assume of the page's configs (a drift fails here)."""
    assert {k: MEZ[k] for k in ("width", "batch_size", "norm", "order", "init")} == {
        "width": 100, "batch_size": 100, "norm": "batch", "order": "norm_act",
        "init": "orthogonal",
    }  # fmt: skip
    assert MEZ["orthogonal_gain"] is False and "head_init" not in MEZ  # the head like the rest
    assert (MEZ["bias"], MEZ["bias_init"], MEZ["norm_eps"]) == (True, "torch", 1e-5)
    assert (JOU["norm"], JOU["order"], JOU["norm_eps"], JOU["input_norm"]) == (
        "layer", "act_norm", 0.0, "unit_rms",
    )  # fmt: skip
    assert (JOU["bias"], JOU["bias_init"]) == (True, "torch")


class MeterezMLP(torch.nn.Module):
    def __init__(self, d_in, width, depth, n_classes):
        super().__init__()
        dims = [d_in] + [width] * depth
        self.fc = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in itertools.pairwise(dims))
        self.bn = torch.nn.ModuleList(torch.nn.BatchNorm1d(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, n_classes)
        for fc in [*self.fc, self.head]:  # every Linear alike, the head included
            torch.nn.init.orthogonal_(fc.weight)  # gain 1, whatever the experiment's gain

    def forward(self, x):
        taps = []
        for fc, bn in zip(self.fc, self.bn, strict=True):
            z = fc(x)
            n = bn(z)
            x = torch.tanh(n)
            taps.append((z, n, x))
        return self.head(x), taps


class CentredLayerNorm(torch.nn.Module):
    """Their LayerNorm: centre each sample over features, divide by its RMS; no ε, no γ/β."""

    def forward(self, x):
        x = x - x.mean(dim=-1, keepdim=True)
        return x / x.pow(2).mean(dim=-1, keepdim=True).sqrt()


class JoudakiMLP(torch.nn.Module):
    def __init__(self, d_in, width, depth, n_classes):
        super().__init__()
        dims = [d_in] + [width] * depth
        self.fc = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in itertools.pairwise(dims))
        self.ln = CentredLayerNorm()
        self.head = torch.nn.Linear(width, n_classes)

    def forward(self, x):
        x = x / x.pow(2).mean(dim=-1, keepdim=True).sqrt()  # unit RMS inputs
        taps = []
        for fc in self.fc:
            z = fc(x)
            a = torch.tanh(z)
            x = self.ln(a)
            taps.append((z, x, a))  # isosweep's (Linear, norm, activation) order
        return self.head(x), taps


def reference_gap(H: torch.Tensor, drop: int = 0) -> float:
    """−log of det^(1/n)/(tr/n) of H Hᵀ from the float64 singular values of H (n ≤ d), leaving
    out the `drop` smallest eigenvalues (the structural null space)."""
    s = torch.linalg.svdvals(H.detach().to(F64))
    lam = (s**2).sort(descending=True).values
    lam = lam[: len(lam) - drop]
    return float(torch.log(lam.mean()) - torch.log(lam).mean())


def load_into_isosweep(ref, trial):
    """The reference's weights INTO isosweep's parameters (the reference is the source)."""
    p = trial.params
    with torch.no_grad():
        for ell, fc in enumerate(ref.fc, start=1):  # their fc[ℓ − 1] is isosweep's block ℓ
            p[f"W{ell}"].copy_(fc.weight)
            p[f"b{ell}"].copy_(fc.bias)
            if hasattr(ref, "bn"):
                p[f"gamma{ell}"].copy_(ref.bn[ell - 1].weight)
                p[f"beta{ell}"].copy_(ref.bn[ell - 1].bias)
        p["W_head"].copy_(ref.head.weight)
        p["b_head"].copy_(ref.head.bias)


def raw_probe(config):
    """The probe batch's samples as the dataset holds them, before any input_norm (the probe is
    a seeded draw of batch_size training samples)."""
    data = load_dataset(config.dataset)
    idx = torch.randperm(len(data.X_train), generator=generator(config.seed, "probe"))
    idx = idx[: config.batch_size]
    return data.X_train[idx], data.y_train[idx]


def compare(Model, fields, dtype):
    config = TrialConfig(**fields, dtype=dtype)
    trial = Trial(config)
    torch.manual_seed(11)
    ref = Model(trial.spec.d_in, config.width, config.depth, trial.spec.n_classes)
    ref = ref.to(trial.spec.dtype).train()  # train mode: BatchNorm on the batch's statistics
    load_into_isosweep(ref, trial)
    x, y = raw_probe(config)
    x = x.to(trial.spec.dtype)
    logits, taps = ref(x)
    loss = F.cross_entropy(logits, y)
    grads = torch.autograd.grad(loss, [fc.weight for fc in ref.fc] + [ref.head.weight])
    m = metrics.probe_metrics(trial.spec, trial.params, trial.state, *trial.probe)
    return m, taps, grads


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("paper", ["meterez", "joudaki"])
def test_isosweep_measures_the_authors_network(paper, dtype):
    Model, fields = (MeterezMLP, MEZ) if paper == "meterez" else (JoudakiMLP, JOU)
    m, taps, grads = compare(Model, fields, dtype)
    rtol = 1e-9 if dtype == "float64" else 1e-5
    grad_ref = [float(torch.linalg.vector_norm(g.to(F64))) for g in grads]
    np.testing.assert_allclose(m["grad_norm"], grad_ref[:-1], rtol=rtol)
    assert m["head_grad_norm"] == pytest.approx(grad_ref[-1], rel=rtol)
    for slot, kind in enumerate(("linear", "norm", "act")):
        ref = np.array([reference_gap(t[slot]) for t in taps])
        got = m[f"isometry_gap/{kind}"]
        if paper == "meterez" and kind == "norm":
            # batch-centred outputs at n = d: H Hᵀ has the null vector 1 exactly (gap +inf)
            assert np.isinf(got).all()
            s = torch.stack([torch.linalg.svdvals(t[1].detach().to(F64)) for t in taps])
            assert float((s[:, -1] / s[:, 0]).max()) < 1e-5  # the reference: singular too
            ref = np.array([reference_gap(t[1], drop=1) for t in taps])
            if "range_isometry_gap/norm" in m:  # the gap on the n − 1 non-trivial eigenvalues
                np.testing.assert_allclose(m["range_isometry_gap/norm"], ref, rtol=1e-4)
            continue
        assert np.isfinite(ref).all() and (ref > 0).all()
        np.testing.assert_allclose(got, ref, rtol=max(rtol, 1e-6), err_msg=kind)


def test_their_fc_1_is_isosweeps_layer_2():
    """Their notebooks' "∇W₁" is the gradient of fc_1 — the second Linear (0-based ModuleList
    index 1) — which isosweep records at layer ℓ = 2 (grad_norm index 1), not at ℓ = 1."""
    m, _, grads = compare(MeterezMLP, MEZ, "float64")
    fc_1 = float(torch.linalg.vector_norm(grads[1]))
    assert m["grad_norm"][1] == pytest.approx(fc_1, rel=1e-9)
    assert m["grad_norm"][0] != pytest.approx(fc_1, rel=1e-3)


def test_a_xavier_head_inflates_the_first_blocks_gradient():
    """The page's Meterez config initializes the head like every Linear (orthogonal_, rows of
    norm 1); the xavier head an earlier page gave (N(0, 2/(100 + 10)): rows of norm² ≈ 1.8)
    scales the backpropagated signal up — the audit measured grad_norm[0] × 1.21–1.52. The
    direction, seed by seed, at isosweep's own init."""
    ratios = []
    for seed in range(3):
        grads = []
        for head in (None, "xavier"):
            config = TrialConfig(**{**MEZ, "seed": seed, "epochs": 0, "head_init": head})
            t = Trial(config)
            grads.append(metrics.probe_metrics(t.net, t.params, t.state, *t.probe)["grad_norm"])
        ratios.append(grads[1][0] / grads[0][0])
    assert all(r > 1.05 for r in ratios), ratios


def test_isosweeps_own_init_for_the_meterez_network():
    """isosweep's own draws for the matching config: orthogonal weights with the gain ignored,
    the head included (its 10 rows orthonormal), biases U(−1/√fan_in, 1/√fan_in)."""
    config = TrialConfig(**{**MEZ, "init_gain": 1.5})
    spec = nn.make_spec(config)
    p = nn.init_params_of(spec, config, generator(config.seed, "init"))
    eye = torch.eye(100, dtype=F64)
    for ell in range(1, DEPTH + 1):
        W = p[f"W{ell}"].double()
        torch.testing.assert_close(W @ W.T, eye, atol=1e-5, rtol=0)  # not 1.5² I
    head = p["W_head"].double()  # 10 × 100, semi-orthogonal: W Wᵀ = I₁₀, not 1.5² I
    torch.testing.assert_close(head @ head.T, torch.eye(10, dtype=F64), atol=1e-5, rtol=0)
    biases = torch.cat([p[f"b{ell}"] for ell in range(1, DEPTH + 1)] + [p["b_head"]]).double()
    bound = 1 / math.sqrt(100)  # every fan_in is 100 here (the gaussian set has 100 features)
    assert float(biases.abs().max()) <= bound
    assert float(biases.var()) == pytest.approx(bound**2 / 3, rel=4 * math.sqrt(0.8 / len(biases)))
    assert float(biases.abs().max()) > 0.98 * bound
