"""`isosweep.probe`: a trial's measurement of one batch through any torch.nn.Module (docs/probe.md).

    record = isosweep.probe(model, x, y=y, taps="blocks.{i}")
    record["isometry_gap/output"]   # (L,) float64, index 0 ↔ the first tap

Forward hooks at the tapped submodules capture their outputs (a tuple output: its first element)
during one forward pass; the record is then assembled by the very code that measures a trial
(`workers.metrics._measure`: the float64 gaps of workers/gaps.py, their range gaps and error
bounds, rms, mean cosine, weight gaps, gradient norms) with the structure of each tap derived
from the module's layers by the registered-model rules (workers/models/module_structure.py) —
there is no second rule here. Keys and layout are a registered model's trial record: one kind,
"output"; per-layer arrays indexed by tap; for 3-D taps (n, T, d) also the token metrics
(workers/token_metrics.py; NaN at the other taps).

The module is used as it is — no copy — and left as it was: the forward runs through
`torch.func.functional_call` with detached views of the parameters (gradients by
`torch.autograd.grad`: no `.grad` changes) and copies of the buffers (BatchNorm's running
statistics and counters stay as they were), every submodule's train/eval flag is restored,
torch's CPU (and the module's CUDA devices') random generators are forked (Dropout draws leave
the global stream unchanged), and the hooks are removed, also when the forward or the loss
raises.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from service.errors import InvalidInput
from workers.custom_metrics import update_ratios
from workers.metrics import _measure, _Member
from workers.models.base import Taps
from workers.models.module_structure import ModuleGraph
from workers.models.registered import capture, declared_attention, tap_structures
from workers.structure import Structure
from workers.token_metrics import token_metrics

F64 = torch.float64
MAX_LISTED = 40  # submodule names an error lists at most
NO_HEAD = "\0no-head"  # the stand-in head of a module without a matrix parameter

Loss = Callable[..., Tensor]


def probe(
    module: torch.nn.Module,
    x: Tensor | Sequence[Tensor],
    *,
    y: Tensor | None = None,
    loss: Loss | None = None,
    taps: str | Sequence[str] = "blocks.{i}",
    head: str | None = None,
    mode: Literal["batch", "eval"] = "batch",
    metrics: bool = True,
    previous: dict[str, Tensor] | None = None,
) -> dict[str, Any]:
    """The per-tap measurement of the batch `x` through `module` (docs/probe.md).

    x: the module's input (n, ...), or a tuple of its positional inputs (the first gives n).
    y, loss: with either, the loss is `loss(output, y)` (`loss(output)` without y; default the
    mean cross-entropy of logits (n, C) and labels (n,)) and the record has "grad_norm" per tap —
    ‖∂loss/∂θ‖_F over the parameters with two or more axes inside the tapped submodule, as a
    registered model's trial records it (NaN for a tap without one) — and "head_grad_norm".
    taps: a dotted name with "{i}" (i = 0, 1, … while such a submodule exists), one name, or a
    list of names. head: the classifier's weight (None: the module's last parameter with two
    or more axes; "head_*" keys are absent if there is none).
    mode: "batch" — train-mode behaviour on copies of the buffers (normalization layers use the
    batch's own statistics, as a trial's probe does); "eval" — eval mode, the running statistics.
    metrics: also the per-tap metrics (workers/custom_metrics.py): "effective_rank",
    "stable_rank" and the registered ones, as a trial with TrialConfig.tap_metrics has them.
    previous: parameters recorded earlier (name → tensor, e.g. a detached copy of
    `named_parameters()`): the record gets "update_ratio" per tap — ‖θ − θ_prev‖_F / ‖θ_prev‖_F
    over the parameters with two or more axes inside the tapped submodule — and
    "head_update_ratio".
    Taps that are nn.MultiheadAttention modules, or have a method `isosweep_attention()`
    returning their last forward's weights (n, heads, T, S), give "attention_entropy" (L,) and
    "attention_entropy_heads" (L, heads) (NaN at the other taps; `_attention_weights`).
    """
    args = (x,) if isinstance(x, Tensor) else tuple(x)
    if not args or not isinstance(args[0], Tensor) or args[0].ndim == 0:
        raise InvalidInput("probe: x must be a tensor (n, ...) or a tuple of them", field="x")
    first = args[0]
    n = first.shape[0]
    names = tap_names(module, taps)
    params = dict(module.named_parameters())
    head = _head(params, head)
    net = _ModuleNet(module, names, params, head, mode=mode)
    wanted = set(net.weight_names())
    p = {k: v.detach().requires_grad_(k in wanted) for k, v in params.items()}
    if head == NO_HEAD:
        p[NO_HEAD] = torch.eye(1, dtype=F64, device=first.device)
    if mode not in ("batch", "eval"):
        raise InvalidInput(f"probe: mode must be 'batch' or 'eval', not {mode!r}", field="mode")
    with _as_it_was(module):
        net.graph = _graph(module, names, first)  # traced before the forward (eval, zeros)
        buffers = {k: v.clone() for k, v in module.named_buffers()} if mode == "batch" else {}
        module.train(mode == "batch")
        tensors = {**{k: p[k] for k in params}, **buffers}
        outs, output = _forward(module, names, tensors, args, n)
        grads = _gradients(output, y, loss, p, net.weight_names())
        attention = _attention_weights(module, names)
    stand_in = {k: torch.zeros_like(p[k]) for k in net.weight_names()} if grads is None else grads
    taps_of = Taps({"output": outs}, outs, attention=attention if any(
        a is not None for a in attention) else None)  # fmt: skip
    record = _measure(net, [_Member(p, first, taps_of, stand_in)], tap_metrics=metrics)[0]
    if grads is None:
        record.pop("grad_norm")
        record.pop("head_grad_norm")
    if head == NO_HEAD:
        record.pop("head_grad_norm", None)
        record.pop("head_weight_isometry_gap")
    record.update(_token_metrics(outs))
    if previous is not None:
        head_weight = None if net.head_weight == NO_HEAD else net.head_weight
        record.update(update_ratios(net.layer_weights(), head_weight, params, previous))
    return record


def tap_names(module: torch.nn.Module, taps: str | Sequence[str]) -> list[str]:
    """The tapped submodules' names: a pattern with "{i}" expanded over i = 0, 1, … while the
    submodule exists, one name, or a list; a name that is not a submodule is an InvalidInput
    naming the closest ones."""
    known = [name for name, _ in module.named_modules() if name]
    have = set(known)
    if isinstance(taps, str):
        if "{i}" in taps:
            names = []
            while taps.format(i=len(names)) in have:
                names.append(taps.format(i=len(names)))
            if not names:
                _unknown(taps.format(i=0), known, f" (from the pattern {taps!r})")
            return names
        taps = [taps]
    names = list(taps)
    if not names:
        raise InvalidInput("probe: taps names no submodule (an empty list)", field="taps")
    for t in names:
        if t not in have:
            _unknown(t, known, "")
    if len(set(names)) != len(names):
        raise InvalidInput("probe: a submodule is tapped twice", field="taps")
    return names


def _unknown(name: str, known: list[str], where: str) -> None:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    listed = ", ".join(known[:MAX_LISTED]) + (" …" if len(known) > MAX_LISTED else "")
    raise InvalidInput(
        f"probe: {name!r}{where} is not a submodule of the module{hint} Its submodules: "
        f"{listed or '(none)'}",
        field="taps",
    )


def _head(params: dict[str, Tensor], head: str | None) -> str:
    matrices = [k for k, v in params.items() if v.ndim >= 2]
    if head is None:
        return matrices[-1] if matrices else NO_HEAD
    if head not in matrices:
        close = difflib.get_close_matches(head, matrices, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise InvalidInput(
            f"probe: head {head!r} is not a parameter with two or more axes{hint}", field="head"
        )
    return head


@dataclass
class _ModuleNet:
    """The `Net` face that `workers.metrics._measure` reads: one kind ("output") per tap, each
    tap's matrix parameters, the head; structures from the module's traced layers."""

    module: torch.nn.Module
    tap_names: list[str]
    params: dict[str, Tensor]
    head_weight: str
    graph: Any = None  # (ModuleGraph, a function of x giving what the graph was traced on)
    mode: str = "batch"  # the forward's ("eval": BatchNorm on its running statistics)

    kinds = ("output",)

    @property
    def depth(self) -> int:
        return len(self.tap_names)

    def layer_weights(self) -> list[list[str]]:
        ids = {id(t): k for k, t in self.params.items()}  # tied parameters: the first name
        out = []
        for tap in self.tap_names:
            sub = self.module.get_submodule(tap)
            ws = [ids[id(t)] for _, t in sub.named_parameters() if t.ndim >= 2]
            out.append(list(dict.fromkeys(ws)))
        return out

    def weight_names(self) -> list[str]:
        return [w for ws in self.layer_weights() for w in ws] + [self.head_weight]

    def structures(self, p: dict[str, Tensor], x: Tensor, taps: Taps, fit: Any) -> dict:
        """As a registered model's (RegisteredNet.structures): traced where tracing followed
        the tap, else unknown with rank ≤ min(n, features); refined by zero rows/columns."""
        traced: dict[str, Structure] = {}
        if self.graph is not None:
            graph, prefix, flat = self.graph
            got = graph.structures({f"{prefix}{k}": v for k, v in p.items()}, flat(x), self.mode)
            traced = {t: got[f"{prefix}{t}"] for t in self.tap_names if f"{prefix}{t}" in got}
        return {"output": tap_structures(self.tap_names, traced, taps.layers["output"], fit)}


class _Flat(torch.nn.Module):
    """The module fed a flattened batch (n, d_in), reshaped back: what ModuleGraph traces (it
    traces a module of (n, d_in) inputs). Its tap and parameter names carry the prefix "m."."""

    def __init__(self, m: torch.nn.Module, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.m = m
        self.shape = shape

    def forward(self, z: Tensor) -> Any:
        return self.m(z.reshape(-1, *self.shape))


def _graph(module: torch.nn.Module, names: list[str], x: Tensor) -> Any:
    """The module's ModuleGraph for the taps, traced on inputs of x's shape and dtype; None for
    a non-floating input (token ids: every tap's structure unknown). Seam: ModuleGraph.of
    traces (2, d_in) zeros of torch's default dtype, so a floating input of another shape is
    traced through `_Flat` with the default dtype set to x's for the call."""
    if not x.is_floating_point():
        return None
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(x.dtype)
        if x.ndim == 2:
            return ModuleGraph.of(module, names, x.shape[1]), "", lambda z: z
        flat = _Flat(module, tuple(x.shape[1:]))
        graph = ModuleGraph.of(flat, [f"m.{t}" for t in names], math.prod(x.shape[1:]))
        return graph, "m.", lambda z: z.reshape(len(z), -1)
    finally:
        torch.set_default_dtype(previous)


@contextmanager
def _as_it_was(module: torch.nn.Module):
    """Every submodule's train/eval flag put back, torch's random generators forked."""
    flags = [(m, m.training) for m in module.modules()]
    cuda = sorted({t.device.index or 0 for t in module.parameters() if t.device.type == "cuda"})
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        for m, was in flags:
            m.training = was
            m.__dict__.pop(ATTENTION_INPUTS, None)


def _forward(
    module: torch.nn.Module, names: list[str], tensors: dict[str, Tensor], args: tuple, n: int
) -> tuple[list[Tensor], Any]:
    captured: dict[str, list[Tensor]] = {t: [] for t in names}
    handles = []
    try:
        for t in names:
            sub = module.get_submodule(t)
            hook = capture(captured[t], f"probe: the tapped submodule {t!r}", "taps")
            handles.append(sub.register_forward_hook(hook))
            if isinstance(sub, torch.nn.MultiheadAttention):
                handles.append(sub.register_forward_pre_hook(_attention_inputs, with_kwargs=True))
        with torch.enable_grad():
            output = torch.func.functional_call(module, tensors, args)
    finally:
        for h in handles:
            h.remove()
    outs = []
    for t in names:
        got = captured[t]
        if len(got) != 1:
            raise InvalidInput(
                f"probe: the tapped submodule {t!r} ran {len(got)} times in one forward pass; "
                "tap a submodule that runs once",
                field="taps",
            )
        if got[0].ndim == 0 or got[0].shape[0] != n:
            raise InvalidInput(
                f"probe: the tapped submodule {t!r} gave shape {tuple(got[0].shape)} for {n} "
                "samples; a tap's output is (n, ...)",
                field="taps",
            )
        if not got[0].is_floating_point():
            raise InvalidInput(f"probe: the tapped submodule {t!r} gave integers", field="taps")
        outs.append(got[0])
    return outs, output


ATTENTION_INPUTS = "_isosweep_attention_inputs"  # what the pre-hook left on the module


def _attention_inputs(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    setattr(module, ATTENTION_INPUTS, (args, kwargs))


def _attention_weights(module: torch.nn.Module, names: list[str]) -> list[Tensor | None]:
    """Per tap, the attention weights (n, heads, T, S): of a tap with a method
    `isosweep_attention()` what it returns for the forward just run (a lab's own attention,
    which torch cannot be asked for them); of a tap that is nn.MultiheadAttention the module run
    again on the inputs its pre-hook saw, with need_weights, per head, dropout off; None at the
    other taps (workers/custom_metrics.attention_record turns them into the attention
    entropy)."""
    out: list[Tensor | None] = []
    for t in names:
        m = module.get_submodule(t)
        if not isinstance(m, torch.nn.MultiheadAttention):  # a lab's own says its weights
            out.append(declared_attention(m))  # (docs/probe.md), or None
            continue
        args, kwargs = m.__dict__.pop(ATTENTION_INPUTS)
        kwargs = {**kwargs, "need_weights": True, "average_attn_weights": False}
        was = m.training
        try:
            m.training = False  # the weights before dropout
            with torch.no_grad():
                _, a = m(*args, **kwargs)
        finally:
            m.training = was
        out.append(a if a.ndim == 4 else a[None])  # (heads, T, S) unbatched → (1, …)
    return out


def _gradients(
    output: Any, y: Tensor | None, loss: Loss | None, p: dict[str, Tensor], names: list[str]
) -> dict[str, Tensor] | None:
    """∂loss/∂θ for the listed weights, or None without y and loss (zeros stand in)."""
    if y is None and loss is None:
        return None
    with torch.enable_grad():
        if loss is None:
            if not isinstance(output, Tensor) or output.ndim != 2:
                raise InvalidInput(
                    "probe: the default loss is the cross-entropy of logits (n, C); this module "
                    "returns something else: pass loss=",
                    field="loss",
                )
            value = F.cross_entropy(output, y)
        else:
            value = loss(output, y) if y is not None else loss(output)
        if not isinstance(value, Tensor) or value.numel() != 1:
            raise InvalidInput("probe: the loss must be a scalar tensor", field="loss")
        wrt = [p[k] for k in names]
        live = [i for i, t in enumerate(wrt) if t.requires_grad]
        if live and not value.requires_grad:
            raise InvalidInput(
                "probe: the loss does not depend on the module's parameters (computed without "
                "gradients?)",
                field="loss",
            )
        g = (
            torch.autograd.grad(
                value.reshape(()), [wrt[i] for i in live], allow_unused=True, materialize_grads=True
            )
            if live
            else ()
        )
    grads = {k: torch.zeros_like(t) for k, t in zip(names, wrt, strict=True)}
    grads.update({names[i]: gi for i, gi in zip(live, g, strict=True)})
    return grads


def _token_metrics(outs: list[Tensor]) -> dict[str, np.ndarray]:
    """token_isometry_gap and token_cosine of the 3-D taps (n, T, d) — NaN at the others; no
    keys when no tap is 3-D."""
    three = [i for i, t in enumerate(outs) if t.ndim == 3]
    if not three:
        return {}
    out = {k: np.full(len(outs), math.nan) for k in ("token_isometry_gap", "token_cosine")}
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in three:
        groups.setdefault(tuple(outs[i].shape), []).append(i)
    for idx in groups.values():
        got = token_metrics([outs[i].detach() for i in idx])
        for k, v in got.items():
            out[k][idx] = v
    return out
