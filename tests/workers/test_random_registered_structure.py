"""Random registered modules against the truth (docs/models.md, "Structure"): random stacks of
nn.Linear (bias or not, zero or not), nn.LayerNorm, nn.BatchNorm1d, nn.GroupNorm, activations
and residual adds at random batch sizes n against widths d, measured in float64 and float32.
The truth of each tap: the float64 singular values of its float64 forward pass (the same
parameters), singular where σ_min/σ_max < 1e-13 and regular where it is > 1e-9 (the few between
are left out as ambiguous). A gap of +∞ on a regular Gram is a false +∞; a finite gap with a
finite error bar on a singular Gram a false finite (a finite gap whose error bar is +∞ is not
claimed as resolved: "flagged").

The truth's forward pass computes GroupNorm in two passes (each group's mean, then the centred
values), not with torch's fused kernel: a GroupNorm with one channel per group outputs exactly β
(each value minus its own mean), but the fused kernel leaves ~1e-14 of rounding there, which an
SVD reads as regular (seeds 180 and 238: `test_one_channel_groupnorms_are_infinite`).

Seed 168 (a LayerNorm over two features, a bias-free Linear, a GroupNorm, then a residual tanh
branch) is regular, not singular: its last tap's σ_min/σ_max is 3.3e-21 in exact arithmetic
(mpmath, 80 digits; true gap 33.9) — beyond float64, whose SVD reads 4e-17, and far beyond
float32, whose forward reads 1.3e-8 (gap 17.4). No structural rule applies; the error bar is +∞
in both dtypes (in float32 since the bar counts the tap's own rounding: workers/gaps.py).

Measured (modules 0..239, 468 taps, 1 of them ambiguous): before (every tap rank ≤ min(n,
features)), 60 false finite and 0 false +∞ in either dtype; after, 0 false +∞ and 0 false finite
in either dtype, 1 tap flagged (seed 168's) in each.

`count(k)` gives the counts of the first k modules for the structure rule in force and for the
rule before it (every tap treated as a non-linear map's output: rank ≤ min(n, features)).
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn as tnn

from service import models
from service.config import TrialConfig
from workers.gaps import isometry_gap
from workers.metrics import probe_metrics
from workers.models import build
from workers.structure import Structure, refine

D_IN, CLASSES = 64, 10
SINGULAR, REGULAR = 1e-13, 1e-9


class Residual(tnn.Module):
    def __init__(self, f: tnn.Module) -> None:
        super().__init__()
        self.f = f

    def forward(self, x):
        return x + self.f(x)


class Stack(tnn.Module):
    def __init__(self, stem: tnn.Module, blocks: list[tnn.Module], d: int) -> None:
        super().__init__()
        self.stem = stem
        self.blocks = tnn.ModuleList(blocks)
        self.head = tnn.Linear(d, CLASSES)

    def forward(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def _layers(rng: random.Random, d: int, k: int) -> tuple[list[tnn.Module], int]:
    """k random layers from width d; returns them and the width they end at."""
    out: list[tnn.Module] = []
    for _ in range(k):
        op = rng.choice(["linear", "linear", "ln", "bn", "gn", "act", "act"])
        if op == "linear":
            d2 = rng.choice([2, 4, 8, 12, 16, 24])
            lin = tnn.Linear(d, d2, bias=rng.random() < 0.6)
            if lin.bias is not None and rng.random() < 0.4:
                tnn.init.zeros_(lin.bias)
            out.append(lin)
            d = d2
        elif op == "ln":
            ln = tnn.LayerNorm(d)
            if rng.random() < 0.3:
                tnn.init.normal_(ln.bias)
            out.append(ln)
        elif op == "bn":
            bn = tnn.BatchNorm1d(d)
            if rng.random() < 0.3:
                tnn.init.normal_(bn.bias)
            out.append(bn)
        elif op == "gn":
            g = rng.choice([g for g in (1, 2, 4) if d % g == 0])
            gn = tnn.GroupNorm(g, d)
            if rng.random() < 0.3:
                tnn.init.normal_(gn.bias)
            out.append(gn)
        else:
            out.append(rng.choice([tnn.ReLU, tnn.Tanh, tnn.GELU, tnn.Identity])())
    return out, d


def random_module(seed: int):
    """A factory for module `seed` (the same architecture at every call) and its n, depth."""
    arch = random.Random(seed)
    depth = arch.randint(1, 3)
    n = arch.choice([4, 6, 8, 12, 16, 24])
    d0 = arch.choice([4, 8, 12, 16, 24])
    plan = arch.getstate()

    def factory(params, *, d_in, n_classes, config):
        rng = random.Random()
        rng.setstate(plan)
        blocks, d = [], d0
        for _ in range(depth):
            if rng.random() < 0.35:  # a residual block keeps the width
                inner, w = _layers(rng, d, rng.randint(1, 3))
                inner.append(tnn.Linear(w, d, bias=rng.random() < 0.5))
                blocks.append(Residual(tnn.Sequential(*inner)))
            else:
                layers, d = _layers(rng, d, rng.randint(1, 4))
                blocks.append(tnn.Sequential(*layers) if layers else tnn.Identity())
        return Stack(tnn.Linear(D_IN, d0, bias=rng.random() < 0.5), blocks, d)

    return factory, n, depth


def exact_group_norm(self: tnn.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    """GroupNorm in two passes: a group of one channel gives exactly 0 before the affine map."""
    n, c = x.shape[:2]
    g = x.reshape(n, self.num_groups, -1)
    centred = g - g.mean(dim=2, keepdim=True)
    var = centred.square().mean(dim=2, keepdim=True)
    y = (centred / torch.sqrt(var + self.eps)).reshape(x.shape)
    if self.affine:
        shape = (1, c) + (1,) * (x.ndim - 2)
        y = y * self.weight.view(shape) + self.bias.view(shape)
    return y


def reference_taps(net, p: dict, x: torch.Tensor) -> list[torch.Tensor]:
    """The float64 forward pass's taps (n, features), GroupNorm in two passes."""
    forward = tnn.GroupNorm.forward
    tnn.GroupNorm.forward = exact_group_norm  # type: ignore[method-assign]
    try:
        _, taps = net.forward(p, net.init_state(), x, "batch", taps=True)
    finally:
        tnn.GroupNorm.forward = forward  # type: ignore[method-assign]
    return [t.detach().reshape(len(x), -1) for t in taps.layers["output"]]


def measure(seed: int, dtype: str) -> tuple[list[str], dict, list[torch.Tensor]]:
    """Module `seed` measured in `dtype`: each tap's truth, the record, its taps as computed."""
    factory, n, depth = random_module(seed)
    models._REGISTRY.clear()
    models.register_model("rand", factory)
    cfg = TrialConfig(model="rand", dataset="digits", depth=depth, batch_size=n, width=8,
                      dtype=dtype)  # fmt: skip
    net = build(cfg)
    net64 = build(cfg.model_copy(update={"dtype": "float64"}))
    p = net.init_params(torch.Generator().manual_seed(seed))
    p64 = {key: v.to(torch.float64) for key, v in p.items()}
    g = torch.Generator().manual_seed(seed + 10**6)
    x = torch.randn(n, D_IN, generator=g, dtype=torch.float64)
    rec = probe_metrics(net, p, net.init_state(), x.to(net.dtype), torch.arange(n) % 10)
    _, taps = net.forward(p, net.init_state(), x.to(net.dtype), "batch", taps=True)
    want = [truth(h) for h in reference_taps(net64, p64, x)]
    return want, rec, [t.detach().reshape(n, -1) for t in taps.layers["output"]]


def truth(h: torch.Tensor) -> str:
    n = h.shape[0]
    s = torch.linalg.svdvals(h)
    if len(s) < n or s[0] == 0:
        return "singular"
    r = float(s[-1] / s[0])
    return "singular" if r < SINGULAR else "regular" if r > REGULAR else "ambiguous"


def count(k: int, start: int = 0, dtype: str = "float64") -> dict[str, dict[str, int]]:
    """Counts over modules start..start+k−1 (see the module docstring), measured in `dtype`;
    the truth is always from the float64 forward pass of the same parameters."""
    saved = dict(models._REGISTRY), models._loaded
    out = {
        rule: {"taps": 0, "false_inf": 0, "false_finite": 0, "flagged": 0, "ambiguous": 0}
        for rule in ("before", "after")
    }
    try:
        models._loaded = True
        for seed in range(start, start + k):
            wants, rec, taps = measure(seed, dtype)
            for i, (h, want) in enumerate(zip(taps, wants, strict=True)):
                old = isometry_gap(h, refine(Structure(False, min(h.shape)), h))
                new, err = rec["isometry_gap/output"][i], rec["isometry_gap_error/output"][i]
                for rule, gap, bar in (("before", old, 0.0), ("after", new, err)):
                    c = out[rule]
                    c["taps"] += 1
                    if want == "ambiguous":
                        c["ambiguous"] += 1
                    elif want == "regular" and gap == math.inf:
                        c["false_inf"] += 1
                    elif want == "singular" and math.isfinite(gap):
                        c["flagged" if bar == math.inf else "false_finite"] += 1
    finally:
        models._REGISTRY.clear()
        models._REGISTRY.update(saved[0])
        models._loaded = saved[1]
    return out


@pytest.fixture
def registry():
    saved = dict(models._REGISTRY), models._loaded
    models._loaded = True
    yield models
    models._REGISTRY.clear()
    models._REGISTRY.update(saved[0])
    models._loaded = saved[1]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_random_registered_modules_have_no_false_infinity_and_no_confident_false_finite(dtype):
    c = count(240, dtype=dtype)  # seeds 0..239: 168, 180 and 238 among them
    assert c["after"]["false_inf"] == 0
    assert c["after"]["false_finite"] == 0
    assert c["before"]["false_finite"] > 0  # the old rule missed some (it fails there)


@pytest.mark.parametrize("seed", [180, 238])
def test_one_channel_groupnorms_are_infinite(registry, seed):
    """GroupNorm(C, C) outputs exactly β, one row repeated: +∞ is right. The fused kernel's
    output has ~1e-14 of rounding that an SVD reads as a regular Gram; the two-pass reference
    gives the exact rows."""
    for dtype in ("float64", "float32"):
        wants, rec, taps = measure(seed, dtype)
        last = taps[-1]
        s = torch.linalg.svdvals(last.double())
        assert float(s[-1] / s[0]) > 1e-3  # the SVD of the computed tap: "regular"
        assert wants[-1] == "singular"  # the exact rows: rank ≤ 1
        assert rec["isometry_gap/output"][-1] == math.inf
        assert rec["isometry_gap_error/output"][-1] == 0


def test_a_gram_beyond_float64_is_flagged_in_either_dtype(registry):
    """Seed 168's last tap (module docstring): regular at σ_min/σ_max = 3.3e-21, beyond what a
    float64 forward resolves; its gap reads 29.1 (float64) or 17.4 (float32) against a true
    33.9, and the error bar says so: +∞ in both (float32's read 1e-8 before the bar counted the
    tap's own rounding)."""
    for dtype in ("float64", "float32"):
        _, rec, _ = measure(168, dtype)
        gap, err = rec["isometry_gap/output"][-1], rec["isometry_gap_error/output"][-1]
        assert math.isfinite(gap)  # set by rounding (no float64 method resolves σ_min) …
        assert err == math.inf  # … and not claimed as resolved


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_few_random_registered_modules(registry, dtype):
    c = count(12, start=500, dtype=dtype)
    assert c["after"]["false_inf"] == 0 and c["after"]["false_finite"] == 0
