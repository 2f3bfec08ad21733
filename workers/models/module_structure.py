"""The structure of a registered module's taps (docs/models.md, "Structure"), derived from
what the module is made of: the same rules as the built-in families (workers/structure.py),
applied to its torch.nn layers.

`ModuleGraph.of(module, taps, d_in)` traces the module once (torch.fx `symbolic_trace` with a
tracer that marks where each tapped submodule's output is), records each node's features from
a shape propagation of a 2-sample batch, and `ModuleGraph.structures(p, x, mode)` follows a
`Structure` through the nodes for the probe batch x, the trial's parameter values p and the
mode the forward ran in ("batch": normalization layers on the batch's statistics, as a trial's
probe; "eval": eval mode, BatchNorm on its running statistics, dropout off). Where
the whole module cannot be traced (Python control flow on values, say), each tapped submodule
is traced on its own, its input treated as unknown. Per node:

- the input: its own zero rows and columns (`input_structure`);
- nn.Linear: rank ≤ min(rank, out); a bias adds 1bᵀ (rank + 1, 1 leaves the null space) unless
  it is absent or exactly 0 (its values decide, so a zero-initialised bias counts as none);
- nn.LayerNorm over all features: rank ≤ min(rank, d − 1) (+ 1 for β ≠ 0), over the last k of
  them (tokens): ≤ (d/k)·min(k − 1, rank) (+ 1); nn.GroupNorm(G): ≤ G·min(d/G − 1, rank)
  (+ 1), G = 1 keeping the rank;
- nn.BatchNorm1d/2d/3d on the batch's statistics (mode "batch", or a BatchNorm without running
  statistics): on (n, C) it centres every feature over the batch, rank ≤ min(rank, n − 1) with
  1 in the null space if β = 0 (else rank + 1); on (n, C, …) the mean is over the batch and
  positions, rank + 1. On its running statistics (mode "eval") it is the affine map
  H·D + 1cᵀ per feature, D = γ/√(var + ε), c = β − μ·D: the rank kept, 1 kept in the null
  space where c = 0, else rank + 1;
- nn.Dropout in mode "eval": the identity;
- nn.Identity, nn.Flatten, reshapes that keep the batch axis, a product with a number: as the
  input; a non-linear element-wise activation (nn.ReLU, nn.GELU, torch.tanh, …) ends every
  forced dependence, rank ≤ min(n, d), as the families assume;
- a residual add (or difference) of two nodes: rank ≤ the sum, 1 in the null space if in both;
  plus a number: rank + 1 unless it is 0;
- a node that is an affine map of an earlier node o (a Linear, a BatchNorm, a reshape, a scaling,
  an add of two maps of the same o): rank ≤ rank(o) + 1 for the constant rows 1vᵀ of its
  biases and shifts, counted once (`_affine_origin`); a norm with β ≠ 0 is its β = 0 output
  plus one such row;
- a submodule with an `isosweep_structure(n, features) -> (ones_in_null, rank)` method: what it
  declares (and tracing does not enter it) — for what the rules cannot see;
- rows that are all equal (an affine map of a rank-0 node: a one-channel-per-group GroupNorm's β)
  stay equal through an element-wise activation: rank ≤ 1;
- anything else: unknown (`Structure.known` False, rank only min(n, d)); an unknown input stays
  unknown through the rank-keeping layers and ends at a non-linearity.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, fx
from torch import nn as tnn

from workers.structure import Structure, _is_zero, input_structure

DECLARED = "isosweep_structure"  # a submodule's declaration of its output's structure

_ACTIVATIONS = (
    tnn.ReLU, tnn.ReLU6, tnn.LeakyReLU, tnn.PReLU, tnn.RReLU, tnn.ELU, tnn.SELU, tnn.CELU,
    tnn.GELU, tnn.SiLU, tnn.Mish, tnn.Tanh, tnn.Sigmoid, tnn.Softplus, tnn.Softsign,
    tnn.Hardtanh, tnn.Hardswish, tnn.Hardsigmoid, tnn.Tanhshrink, tnn.LogSigmoid,
    tnn.Softshrink, tnn.Hardshrink, tnn.Threshold, tnn.Dropout, tnn.AlphaDropout,
)  # fmt: skip
_ACT_FUNCTIONS = {
    torch.relu, torch.tanh, torch.sigmoid, torch.nn.functional.relu, torch.nn.functional.gelu,
    torch.nn.functional.silu, torch.nn.functional.leaky_relu, torch.nn.functional.elu,
    torch.nn.functional.selu, torch.nn.functional.mish, torch.nn.functional.softplus,
    torch.nn.functional.tanh, torch.nn.functional.sigmoid, torch.nn.functional.hardtanh,
    torch.nn.functional.relu6, torch.nn.functional.dropout, torch.sin, torch.cos, torch.exp,
    torch.abs, torch.square,
}  # fmt: skip
_ACT_METHODS = {"relu", "tanh", "sigmoid", "sin", "cos", "exp", "abs", "square"}
_ADD = {operator.add, operator.iadd, torch.add, operator.sub, operator.isub, torch.sub}
_SCALE = {operator.mul, operator.imul, torch.mul, operator.truediv, torch.div, operator.neg}
_SAME_FUNCTIONS = {torch.flatten, torch.reshape, operator.pos, torch.clone}
_METHOD_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
               "div": operator.truediv}  # fmt: skip
_SAME_METHODS = {"view", "reshape", "flatten", "contiguous", "clone", "view_as", "reshape_as"}


class _Wrap(tnn.Module):
    """A submodule traced alone, as the child `m` (its parameters are `m.<name>`)."""

    def __init__(self, m: tnn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, x: Tensor) -> Any:
        return self.m(x)


class _TapTracer(fx.Tracer):
    """symbolic_trace's tracer that notes the node of each tapped submodule's output (a tuple
    output: its first element) and does not enter submodules that declare their structure."""

    def __init__(self, taps: set[str]) -> None:
        super().__init__()
        self.taps = taps
        self.tap_nodes: dict[str, fx.Node] = {}

    def is_leaf_module(self, m: tnn.Module, module_qualified_name: str) -> bool:
        return hasattr(m, DECLARED) or super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: tnn.Module, forward: Callable, args: Any, kwargs: Any) -> Any:
        name = self.path_of_module(m)
        out = super().call_module(m, forward, args, kwargs)
        if name in self.taps:
            first = out[0] if isinstance(out, tuple | list) and out else out
            if isinstance(first, fx.Proxy):
                self.tap_nodes.setdefault(name, first.node)
        return out


@dataclass
class _Traced:
    """One traced graph: its nodes' output features (numel per sample; None where not a
    per-sample tensor), the tap nodes, and whether its input is the module's own (else a
    tapped submodule's, unknown)."""

    graph: fx.Graph
    root: tnn.Module
    prefix: str  # the graph's module path inside the registered module ("" for all of it)
    features: dict[fx.Node, int | None]
    tap_nodes: dict[str, fx.Node]
    whole: bool


def _trace(root: tnn.Module, taps: set[str], prefix: str, example: Tensor) -> _Traced | None:
    """The graph of `root` with each node's features from one shape propagation of `example`
    (a 2-sample batch, in eval mode, no gradients); None where tracing or the propagation
    fails."""
    from torch.fx.passes.shape_prop import ShapeProp

    tracer = _TapTracer(set() if prefix else taps)
    if prefix:  # a tapped submodule alone: wrapped, so that a torch.nn layer stays one node
        root = _Wrap(root)
    was = root.training
    try:
        graph = tracer.trace(root)
        gm = fx.GraphModule(root, graph)
        root.eval()
        with torch.no_grad():
            ShapeProp(gm).propagate(example)
    except Exception:
        return None
    finally:
        root.train(was)
    features: dict[fx.Node, int | None] = {}
    for node in gm.graph.nodes:
        meta = node.meta.get("tensor_meta")
        shape = getattr(meta, "shape", None)
        ok = shape is not None and len(shape) >= 1 and shape[0] == len(example)
        features[node] = math.prod(shape[1:]) if ok else None
    tap_nodes = dict(tracer.tap_nodes)
    if prefix:
        out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        first = out[0] if isinstance(out, tuple | list) and out else out
        if isinstance(first, fx.Node):
            tap_nodes.setdefault(prefix, first)
    return _Traced(gm.graph, root, prefix, features, tap_nodes, whole=not prefix)


class ModuleGraph:
    """What tracing saw of a registered module: per tap, the graph that follows it, or nothing
    (that tap's structure is unknown)."""

    def __init__(self, graphs: list[_Traced], taps: list[str]) -> None:
        self.graphs = graphs
        self.taps = taps
        self.of_tap = {t: g for g in graphs for t in g.tap_nodes}

    @classmethod
    def of(cls, module: tnn.Module, taps: list[str], d_in: int) -> ModuleGraph:
        """Trace the whole module; failing that, each tapped submodule on its own (its input's
        shape from one eval-mode forward of two zero samples)."""
        whole = _trace(module, set(taps), "", torch.zeros(2, d_in))
        if whole is not None and all(t in whole.tap_nodes for t in taps):
            return cls([whole], taps)
        inputs: dict[str, Tensor] = {}
        handles = []
        for t in taps:

            def pre(m: tnn.Module, args: Any, t: str = t) -> None:
                if len(args) == 1 and isinstance(args[0], Tensor) and t not in inputs:
                    inputs[t] = args[0].detach()

            handles.append(module.get_submodule(t).register_forward_pre_hook(pre))
        was = module.training
        try:
            module.eval()
            with torch.no_grad():
                module(torch.zeros(2, d_in))
        except Exception:
            pass
        finally:
            module.train(was)
            for h in handles:
                h.remove()
        graphs = [] if whole is None else [whole]
        for t in taps:
            if whole is not None and t in whole.tap_nodes:
                continue
            if t in inputs:
                g = _trace(module.get_submodule(t), {t}, t, torch.zeros_like(inputs[t]))
                if g is not None:
                    graphs.append(g)
        return cls(graphs, taps)

    def structures(
        self, p: dict[str, Tensor], x: Tensor, mode: str = "batch"
    ) -> dict[str, Structure]:
        """The Structure of each traced tap's output for the probe batch x (n, d_in), the
        parameter values p (named as the module's named_parameters; buffers too where p has
        them, else the module's own) and the forward's mode ("batch" or "eval"); untraced taps
        absent."""
        out: dict[str, Structure] = {}
        for g in self.graphs:
            s = _propagate(g, p, x, mode == "eval")
            for t, node in g.tap_nodes.items():
                if node in s:
                    out[t] = s[node]
        return out


def _propagate(
    g: _Traced, p: dict[str, Tensor], x: Tensor, running: bool = False
) -> dict[fx.Node, Structure]:
    """Each node's Structure; `running`: the forward ran in eval mode (BatchNorm on its running
    statistics, dropout the identity)."""
    n = x.shape[0]
    s: dict[Any, Structure] = {}  # fx nodes, and ("core", node): a norm's output with β = 0
    origin: dict[fx.Node, tuple[Any, bool]] = {}

    def full(node: fx.Node, known: bool) -> Structure:
        f = g.features.get(node)
        return Structure(False, min(n, f) if f else n, known)

    def param(qual: str, name: str) -> Tensor | None:
        """The trial's value of a layer's parameter: None where the layer has none; where p
        does not name it (a module shared under two paths: named_parameters lists it once),
        a non-zero stand-in — the rules then assume the larger rank."""
        key = f"{g.prefix}{qual[1:]}.{name}" if g.prefix else f"{qual}.{name}"  # m… → tap…
        if key in p:
            return p[key]
        if getattr(g.root.get_submodule(qual), name, None) is None:
            return None
        return torch.ones(1)

    def buffer(qual: str, name: str) -> Tensor | None:
        """A layer's buffer (running statistics): p's value where p names it, else the
        module's own (what an eval-mode forward of the module itself reads)."""
        key = f"{g.prefix}{qual[1:]}.{name}" if g.prefix else f"{qual}.{name}"
        return p[key] if key in p else getattr(g.root.get_submodule(qual), name, None)

    def rule_of(m: tnn.Module, qual: str, src: Structure | None, f: int, par: Any) -> Any:
        return _module_rule(m, qual, src, n, f, par, buffer if running else None)

    for node in g.graph.nodes:
        f = g.features.get(node)
        if node.op == "output":
            continue
        if node.op == "placeholder":
            s[node] = input_structure(x) if g.whole else full(node, False)
            origin[node] = (node, False)
            continue
        if f is None:
            continue  # not a per-sample tensor (a shape, a scalar, a tuple): nothing to follow
        args = [a for a in node.args if isinstance(a, fx.Node)]
        src = s.get(args[0]) if args else None
        rule: Structure | None = None
        if node.op == "call_module":
            m = g.root.get_submodule(str(node.target))
            rule = rule_of(m, str(node.target), src, f, param)
        elif node.op in ("call_function", "call_method"):
            rule = _function_rule(node, s, n, f)
        s[node] = rule if rule is not None else full(node, False)
        candidates: list[tuple[Any, bool]] = []  # on a tie the earliest origin wins
        o = _affine_origin(node, g, origin, param, buffer if running else None)
        if o is not None and o[0] in s:
            candidates.append(o)
        if node.op == "call_module" and rule is not None and src is not None:
            m = g.root.get_submodule(str(node.target))
            norms = tnn.LayerNorm | tnn.GroupNorm | tnn.modules.batchnorm._BatchNorm
            if isinstance(m, norms) and not _is_zero(param(str(node.target), "bias")):
                # a norm's shift β is one constant row 1βᵀ on top of its β = 0 output: later
                # constants (a bias) fall into the same span(1), counted once
                def no_shift(q: str, name: str) -> Tensor | None:
                    return None if name == "bias" else param(q, name)

                core = rule_of(m, str(node.target), src, f, no_shift)
                if core is not None:
                    s[("core", node)] = core
                    candidates.append((("core", node), True))
        if src is not None and _elementwise(node, g) and args[0] in origin:
            o_src, _ = origin[args[0]]
            if s[o_src].rank == 0:  # every row the same (1vᵀ): σ(1vᵀ) = 1σ(v)ᵀ, still one row
                s[("rows", node)] = Structure(False, 0)
                candidates.append((("rows", node), True))
        candidates.append((node, False))
        # rank ≤ that of the node it is affine in (+ 1 for a constant row): the tightest
        best = min(candidates, key=lambda oc: s[oc[0]].rank + int(oc[1]))
        origin[node] = best
        r = s[node]
        s[node] = Structure(r.ones_in_null, min(r.rank, s[best[0]].rank + int(best[1])), r.known)
    return {k: v for k, v in s.items() if isinstance(k, fx.Node)}


def _elementwise(node: fx.Node, g: _Traced) -> bool:
    """Whether the node applies one function to every entry alike (an activation; not dropout,
    whose mask differs from entry to entry)."""
    if node.op == "call_module":
        m = g.root.get_submodule(str(node.target))
        return isinstance(m, _ACTIVATIONS) and not isinstance(m, tnn.Dropout | tnn.AlphaDropout)
    if node.op == "call_function":
        return node.target in _ACT_FUNCTIONS and node.target is not torch.nn.functional.dropout
    return node.op == "call_method" and node.target in _ACT_METHODS


def _affine_origin(
    node: fx.Node,
    g: _Traced,
    origin: dict[fx.Node, tuple[Any, bool]],
    param: Callable[[str, str], Tensor | None],
    buffer: Callable[[str, str], Tensor | None] | None = None,
) -> tuple[Any, bool] | None:
    """(o, c) where the node's output is A·H_o + c·1vᵀ for an earlier node o — what a Linear, a
    BatchNorm (H D − 1μᵀD + 1βᵀ: a constant row), a reshape, a scaling and an add of two such
    maps of the same o keep — so its rank is ≤ rank(H_o) + c (the shared 1 counted once, as
    resmlp's tracker counts it); None where the node is no such map."""
    nodes = [a for a in node.args if isinstance(a, fx.Node)]
    if not nodes or any(a not in origin for a in nodes):
        return None
    o, c = origin[nodes[0]]
    if node.op == "call_module":
        m = g.root.get_submodule(str(node.target))
        if isinstance(m, tnn.Linear):
            return o, c or not _is_zero(param(str(node.target), "bias"))
        if isinstance(m, tnn.modules.batchnorm._BatchNorm):
            shift = _running_shift(m, str(node.target), param, buffer)
            return o, c or shift is None or not _is_zero(shift)
        if isinstance(m, tnn.Identity | tnn.Flatten) or _off(m, buffer):
            return o, c
        return None
    if node.op not in ("call_function", "call_method"):
        return None
    target = node.target
    if node.op == "call_method":
        target = _METHOD_OPS.get(str(target).rstrip("_"), target)
        if target in _SAME_METHODS:
            return (o, c) if _same_features(node, g.features.get(node) or -1) else None
    if target in _SAME_FUNCTIONS:
        return (o, c) if _same_features(node, g.features.get(node) or -1) else None
    others = [a for a in node.args if a not in nodes]
    if target in _ADD:
        if len(nodes) == 2:
            (o1, c1), (o2, c2) = origin[nodes[0]], origin[nodes[1]]
            return (o1, c1 or c2) if o1 is o2 else None
        if len(others) == 1 and isinstance(others[0], numbers.Number):
            return o, c or others[0] != 0
        return None
    scaled = len(nodes) == 1 and node.args[0] is nodes[0]
    if target in _SCALE and scaled and all(isinstance(a, numbers.Number) for a in others):
        return o, c
    return None


def _off(m: tnn.Module, buffer: Callable | None) -> bool:
    """A dropout layer in eval mode (`buffer` given): the identity."""
    return buffer is not None and isinstance(m, tnn.Dropout | tnn.AlphaDropout)


def _running_shift(
    m: tnn.Module,
    qual: str,
    param: Callable[[str, str], Tensor | None],
    buffer: Callable[[str, str], Tensor | None] | None,
) -> Tensor | None:
    """c = β − μ·γ/√(var + ε) of a BatchNorm on its running statistics (eval mode: `buffer`
    given), the constant row of H·D + 1cᵀ; None where it uses the batch's statistics."""
    if buffer is None:
        return None
    mean, var = buffer(qual, "running_mean"), buffer(qual, "running_var")
    if mean is None or var is None:  # track_running_stats=False: batch statistics in eval too
        return None
    gamma, beta = param(qual, "weight"), param(qual, "bias")
    scale = torch.rsqrt(var.detach().to(torch.float64) + m.eps)  # type: ignore[operator]
    if gamma is not None:
        scale = scale * gamma.detach().to(torch.float64)
    shift = -mean.detach().to(torch.float64) * scale
    return shift if beta is None else shift + beta.detach().to(torch.float64)


def _module_rule(
    m: tnn.Module,
    qual: str,
    src: Structure | None,
    n: int,
    f: int,
    param: Callable[[str, str], Tensor | None],
    buffer: Callable[[str, str], Tensor | None] | None = None,
) -> Structure | None:
    """The Structure of m's output from its input's (`src`); `buffer` given: eval mode."""
    if hasattr(m, DECLARED):
        ones, rank = getattr(m, DECLARED)(n, f)
        return Structure(bool(ones), max(0, min(int(rank), n, f)))
    if _off(m, buffer):
        return src
    if isinstance(m, _ACTIVATIONS):
        return Structure(False, min(n, f))
    if src is None:
        return None
    if isinstance(m, tnn.Identity | tnn.Flatten):
        return src
    if isinstance(m, tnn.Linear):
        if _is_zero(param(qual, "bias")):
            return Structure(src.ones_in_null, min(src.rank, f), src.known)
        return Structure(False, min(src.rank + 1, n, f), src.known)
    beta0 = _is_zero(param(qual, "bias"))
    if isinstance(m, tnn.LayerNorm):
        k = math.prod(m.normalized_shape)
        if k == f:
            return Structure(False, min(n, min(src.rank, f - 1) + int(not beta0)), src.known)
        # each of the f/k positions centred and scaled on its own: ≤ k − 1 and ≤ rank(H) each
        r = (f // k) * min(k - 1, src.rank)
        return Structure(False, min(n, f, r + int(not beta0)), src.known)
    if isinstance(m, tnn.GroupNorm):
        if m.num_groups == 1:
            return Structure(False, min(n, min(src.rank, f - 1) + int(not beta0)), src.known)
        # each group centred and scaled on its own: ≤ its size − 1 and ≤ rank(H) each
        r = m.num_groups * min(f // m.num_groups - 1, src.rank)
        return Structure(False, min(n, f, r + int(not beta0)), src.known)
    if isinstance(m, tnn.modules.batchnorm._BatchNorm):
        shift = _running_shift(m, qual, param, buffer)
        if shift is not None:  # eval mode: H·D + 1cᵀ, an affine map per feature
            if _is_zero(shift):
                return Structure(src.ones_in_null, min(src.rank, f), src.known)
            return Structure(False, min(src.rank + 1, n, f), src.known)
        if f == m.num_features:  # (n, C): every feature centred over the batch
            r = min(src.rank, n - 1, f)
            if beta0:
                return Structure(True, r, src.known)
            return Structure(False, min(r + 1, n, f), src.known)
        return Structure(False, min(src.rank + 1, n, f), src.known)
    return None


def _function_rule(node: fx.Node, s: dict[fx.Node, Structure], n: int, f: int) -> Structure | None:
    target = node.target
    nodes = [a for a in node.args if isinstance(a, fx.Node)]
    if any(a not in s for a in nodes) or not nodes:
        return None
    first = s[nodes[0]]
    if node.op == "call_method":
        if target in _ACT_METHODS:
            return Structure(False, min(n, f))
        if target in _SAME_METHODS:
            return first if _same_features(node, f) else None
        if target in ("add", "sub", "add_", "sub_", "mul", "mul_", "div", "div_"):
            target = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
                      "div": operator.truediv}[str(target).rstrip("_")]  # fmt: skip
        else:
            return None
    if target in _ACT_FUNCTIONS:
        return Structure(False, min(n, f))
    if target in _SAME_FUNCTIONS:
        return first if _same_features(node, f) else None
    if target in _ADD:
        if len(nodes) == 2:
            a, b = s[nodes[0]], s[nodes[1]]
            return Structure(
                a.ones_in_null and b.ones_in_null, min(n, f, a.rank + b.rank), a.known and b.known
            )
        other = [a for a in node.args if not isinstance(a, fx.Node)]
        if len(other) == 1 and isinstance(other[0], numbers.Number):
            if other[0] == 0:
                return first
            return Structure(False, min(n, f, first.rank + 1), first.known)
        return None
    numbers_only = all(isinstance(a, numbers.Number) for a in node.args if a is not nodes[0])
    if target in _SCALE and len(nodes) == 1 and numbers_only and node.args[0] is nodes[0]:
        return first  # a tensor times (or over) a number
    return None


def _same_features(node: fx.Node, f: int) -> bool:
    """A reshape that keeps the batch axis and each sample's features as they were."""
    src = node.args[0]
    meta = src.meta.get("tensor_meta") if isinstance(src, fx.Node) else None
    shape = getattr(meta, "shape", None)
    return shape is not None and len(shape) >= 1 and math.prod(shape[1:]) == f
