"""A lab's own `torch.nn.Module` (a registered model, service/models.py) as a `Net`
(docs/models.md, "Registering your own model").

The registration's factory builds the module: `factory(params, d_in=…, n_classes=…, config=…)`,
`params` being the model's typed parameters (its pydantic class, from `config.model_params`).
The module is used as a template and never holds the trial's tensors: its parameters and
buffers become the `Params` / `State` dicts (named as `named_parameters` / `named_buffers` name
them), and the forward pass is `torch.func.functional_call(module, (params, buffers), (x,))`, a
pure function of (params, state, x) like every family's.

- Modes: "train" runs the module in train mode on copies of the state tensors and copies what
  its BatchNorms updated back into them (in place: the engine's `State` sees it); "batch" runs
  it in train mode on copies, the state untouched; "running" in eval mode on the state itself.
- Randomness: `init_params(generator)` draws one 63-bit seed from the generator and builds a
  fresh module under `torch.manual_seed(seed)` inside `torch.random.fork_rng` (torch's global
  generator is left as it was), so the same config and seed give the same parameters. The
  module's own initializers run in float32 (torch's default dtype) and are then cast to
  `config.dtype`. Buffers (`init_state`) come from the template, built once per Net under the
  fixed seed 0: a random buffer is the same for every seed (make it a parameter if it should
  vary). Dropout inside the module draws from torch's global generator, which isosweep does not
  seed: such a module's training is not bit-reproducible.
- Taps: one per registered tap name (`RegisteredModel.tap_names(depth)`), the output of that
  submodule (a tuple output is measured at its first element), copied when captured so that a
  later in-place operation cannot change it; one kind, "output", which is also `Taps.outputs`
  (rms, mean_cosine). A tap's sample Gram is of its output reshaped (n, −1).
- Structure: derived from the module's layers (workers/models/module_structure.py: an fx trace,
  the built-in families' rules per torch.nn layer, declarations for what tracing cannot see),
  then refined by each tap's zero rows and columns; a tap it cannot follow is marked unknown
  (`Structure.known`), rank ≤ min(n, features), its error bar at the forward's precision.
- Weights: `layer_weights()` lists, per tap, the parameters with two or more axes inside that
  submodule (recursively, in `named_parameters` order); the first one's weight_isometry_gap is
  recorded (a kernel reshaped (out, −1)), the gradient norm is over all of them. A tap without
  such a parameter (a norm, an activation) gets [] — NaN weight gap and gradient norm for that
  layer. `head_weight` is the registration's `head`, or the module's last parameter with two or
  more axes.

Errors are InvalidInput naming `model` (or `model_params`): a factory that raises or does not
return a Module, a tap that is not a submodule (with the closest names), a forward pass that
does not give (n, n_classes) logits.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from service.config import DATASET_SHAPES, TrialConfig
from service.errors import InvalidInput, IsosweepError
from service.models import RegisteredModel, get_registered
from workers.models.base import Fit, Mode, Params, State, Taps
from workers.models.module_structure import ModuleGraph
from workers.structure import Structure

DTYPES = {"float32": torch.float32, "float64": torch.float64}
TEMPLATE_SEED = 0  # the template module's build (its buffers are init_state's)
MAX_LISTED = 40  # submodule names an error lists at most


@contextmanager
def _seeded(seed: int):
    """torch's global CPU generator set to `seed` inside, restored outside (the CUDA ones are
    neither touched nor used: the factory builds on the CPU)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@dataclass(frozen=True)
class RegisteredNet:
    config: TrialConfig
    entry: RegisteredModel = field(init=False)
    module: torch.nn.Module = field(init=False, repr=False)
    tap_names: tuple[str, ...] = field(init=False)
    head_weight: str = field(init=False)
    _layer_weights: tuple[tuple[str, ...], ...] = field(init=False, repr=False)
    _graph: ModuleGraph = field(init=False, repr=False)

    kinds = ("output",)

    def __post_init__(self) -> None:
        entry = get_registered(self.config.model)
        object.__setattr__(self, "entry", entry)
        module = self._build(TEMPLATE_SEED)
        object.__setattr__(self, "module", module)
        params = entry.params(**self.config.model_params)
        object.__setattr__(self, "tap_names", tuple(entry.tap_names(self.config.depth, params)))
        self._check_taps()
        names = self._weights_by_name()
        object.__setattr__(self, "head_weight", self._head())
        object.__setattr__(self, "_layer_weights", self._tap_weights(names))
        self._dry_run()
        object.__setattr__(self, "_graph", ModuleGraph.of(module, list(self.tap_names), self.d_in))

    # --- shapes ---------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return len(self.tap_names)

    @property
    def width(self) -> int:
        return self.config.width  # as the factory got it (it may not read it)

    @property
    def norm(self) -> str:
        return self.config.norm  # likewise: the module's own norms are its factory's

    @property
    def d_in(self) -> int:
        return DATASET_SHAPES[self.config.dataset][0]

    @property
    def n_classes(self) -> int:
        return DATASET_SHAPES[self.config.dataset][1]

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.config.dtype]

    # --- building ---------------------------------------------------------------------------

    def _build(self, seed: int) -> torch.nn.Module:
        """The factory's module, built on the CPU with torch's global generator at `seed`."""
        entry, config = self.entry, self.config
        params = entry.params(**config.model_params)  # validated already (check_params)
        factory = _factory(entry)
        try:
            with _seeded(seed):
                module = factory(params, d_in=self.d_in, n_classes=self.n_classes, config=config)
        except IsosweepError:
            raise
        except Exception as exc:
            raise InvalidInput(
                f"model {config.model!r}: its factory raised {type(exc).__name__}: {exc}",
                field="model",
            ) from None
        if not isinstance(module, torch.nn.Module):
            raise InvalidInput(
                f"model {config.model!r}: its factory returned {type(module).__name__}, not a "
                "torch.nn.Module",
                field="model",
            )
        return module

    def _submodule_names(self) -> list[str]:
        return [name for name, _ in self.module.named_modules() if name]

    def _check_taps(self) -> None:
        known = set(self._submodule_names())
        missing = [t for t in self.tap_names if t not in known]
        if not missing:
            return
        names = self._submodule_names()
        listed = ", ".join(names[:MAX_LISTED]) + (" …" if len(names) > MAX_LISTED else "")
        close = difflib.get_close_matches(missing[0], names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        pattern = self.entry.tap_pattern(self.entry.params(**self.config.model_params))
        per_block = isinstance(pattern, str)
        depth = (
            f" (taps {pattern!r} for depth={self.config.depth}: the factory should build "
            "config.depth blocks)"
            if per_block
            else ""
        )
        raise InvalidInput(
            f"model {self.config.model!r}: {missing[0]!r} is not a submodule of the built module"
            f"{depth}{hint} Its submodules: {listed or '(none)'}",
            field="model",
        )

    def _weights_by_name(self) -> dict[int, str]:
        """id(parameter) → its name in the module's named_parameters (tied ones: the first)."""
        return {id(t): name for name, t in self.module.named_parameters()}

    def _head(self) -> str:
        params = dict(self.module.named_parameters())
        head = self.entry.head
        if head is None:
            matrices = [k for k, v in params.items() if v.ndim >= 2]
            if not matrices:
                raise InvalidInput(
                    f"model {self.config.model!r} has no parameter with two or more axes: there "
                    "is no classifier weight to measure",
                    field="model",
                )
            return matrices[-1]
        if head not in params or params[head].ndim < 2:
            close = difflib.get_close_matches(head, list(params), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise InvalidInput(
                f"model {self.config.model!r}: its registered head {head!r} is not a parameter "
                f"with two or more axes{hint}",
                field="model",
            )
        return head

    def _tap_weights(self, names: dict[int, str]) -> tuple[tuple[str, ...], ...]:
        per_tap = []
        for tap in self.tap_names:
            sub = self.module.get_submodule(tap)
            ws = [names[id(t)] for _, t in sub.named_parameters() if t.ndim >= 2]
            per_tap.append(tuple(dict.fromkeys(ws)))  # a weight tied within the block once
        return tuple(per_tap)

    def _dry_run(self) -> None:
        """One forward of two zero inputs in eval mode on copies of everything: the factory's
        module takes (n, d_in), gives (n, n_classes) logits, and runs each tap once."""
        p = {k: v.detach().clone() for k, v in self.module.named_parameters()}
        s = {k: v.detach().clone() for k, v in self.module.named_buffers()}
        x = torch.zeros(2, self.d_in)
        try:
            with torch.no_grad():
                self.forward(p, s, x, "running", taps=True)
        except IsosweepError:
            raise
        except Exception as exc:
            raise InvalidInput(
                f"model {self.config.model!r}: a forward pass on a ({len(x)}, {self.d_in}) "
                f"batch of {self.config.dataset!r} inputs raised {type(exc).__name__}: {exc}",
                field="model",
            ) from None

    # --- the Net interface ------------------------------------------------------------------

    def init_params(self, generator: torch.Generator) -> Params:
        """Parameters of a module built under a seed drawn from `generator` (one draw)."""
        seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator))
        fresh = self._build(seed)
        p = {k: v.detach().to(self.dtype).clone() for k, v in fresh.named_parameters()}
        want = {k: v.shape for k, v in self.module.named_parameters()}
        if {k: v.shape for k, v in p.items()} != want:
            raise InvalidInput(
                f"model {self.config.model!r}: its factory builds different parameters from one "
                "call to the next (names or shapes); the module must depend on its params and "
                "config only",
                field="model",
            )
        return p

    def init_state(self) -> State:
        """The module's buffers (the template's), floating ones in config.dtype."""
        return {
            k: (v.detach().to(self.dtype) if v.is_floating_point() else v.detach()).clone()
            for k, v in self.module.named_buffers()
        }

    def forward(
        self, p: Params, s: State, x: Tensor, mode: Mode, *, taps: bool = False
    ) -> tuple[Tensor, Taps | None]:
        module = self.module
        module.train(mode != "running")
        # Copies in train and batch mode: the module updates them in place, and autograd may
        # save them; the engine's state tensors are views of one buffer (workers.train), whose
        # shared version counter an in-place update of one view would bump for all.
        buffers = {k: v.clone() for k, v in s.items()} if mode != "running" else s
        captured: dict[str, list[Tensor]] = {name: [] for name in self.tap_names}
        handles = []
        if taps:
            for name in self.tap_names:
                hook = capture(captured[name], "a tapped submodule", "model")
                handles.append(module.get_submodule(name).register_forward_hook(hook))
        try:
            out = torch.func.functional_call(module, {**p, **buffers}, (x,))
        finally:
            for h in handles:
                h.remove()
        if mode == "train":
            with torch.no_grad():
                for k, v in buffers.items():
                    s[k].copy_(v)
        if not isinstance(out, Tensor) or tuple(out.shape) != (len(x), self.n_classes):
            what = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise InvalidInput(
                f"model {self.config.model!r} must return logits of shape (n, n_classes) = "
                f"({len(x)}, {self.n_classes}) for {self.config.dataset!r}; it returned {what}",
                field="model",
            )
        if not taps:
            return out, None
        outs = []
        for name in self.tap_names:
            got = captured[name]
            if len(got) != 1:
                raise InvalidInput(
                    f"model {self.config.model!r}: the tapped submodule {name!r} ran "
                    f"{len(got)} times in one forward pass; tap a submodule that runs once",
                    field="model",
                )
            if got[0].ndim == 0 or got[0].shape[0] != len(x):
                raise InvalidInput(
                    f"model {self.config.model!r}: the tapped submodule {name!r} gave shape "
                    f"{tuple(got[0].shape)} for {len(x)} samples; a tap's output is (n, ...)",
                    field="model",
                )
            outs.append(got[0])
        # a library family whose taps are token streams (n, T, d): the token metrics too; whose
        # taps declare their attention (hf): the weights of the forward just run
        attention = (
            [declared_attention(module.get_submodule(n)) for n in self.tap_names]
            if self.entry.attention
            else None
        )
        return out, Taps({"output": outs}, outs, outs if self.entry.tokens else None, attention)

    def structures(self, p: Params, x: Tensor, taps: Taps, fit: Fit) -> dict:
        """Each tap's Structure as the module's layers force it (`ModuleGraph`, for p's
        values: a zero bias counts as none); a tap tracing could not follow: unknown, rank
        only min(n, features). Either refined by the tap's zero rows and columns."""
        traced = self._graph.structures(p, x)
        return {"output": tap_structures(self.tap_names, traced, taps.layers["output"], fit)}

    def structure_known(self) -> list[bool]:
        """Per tap, whether tracing followed it (its structure is derived, not unknown)."""
        return [t in self._graph.of_tap for t in self.tap_names]

    def layer_weights(self) -> list[list[str]]:
        return [list(ws) for ws in self._layer_weights]


def _factory(entry: RegisteredModel) -> Any:
    """The registration's factory; a library family's "module:function" imported here."""
    if callable(entry.factory):
        return entry.factory
    module, _, name = entry.factory.partition(":")
    return getattr(importlib.import_module(module), name)


def tap_structures(
    names: Sequence[str], traced: Mapping[str, Structure], outputs: Sequence[Tensor], fit: Fit
) -> list[Structure]:
    """Each tap's Structure: as tracing derived it (`traced`, by tap name), else unknown with
    rank only min(n, features); either refined by the tap's zero rows and columns (`fit`)."""
    out = []
    for name, h in zip(names, outputs, strict=True):
        n, f = h.shape[0], h[0].numel()
        s = traced.get(name, Structure(False, min(n, f), known=False))
        out.append(fit(Structure(s.ones_in_null, min(s.rank, n, f), s.known), h))
    return out


ATTENTION_DECLARED = "isosweep_attention"  # a submodule's method giving its last weights


def declared_attention(module: torch.nn.Module) -> Tensor | None:
    """The attention weights (n, heads, T, S) of the forward just run, as a module with a method
    `isosweep_attention()` declares them (a lab's own attention; an hf block, workers/models/
    hf_model.py); None for a module without one, or one that says None."""
    declared = getattr(module, ATTENTION_DECLARED, None)
    if not callable(declared):
        return None
    a = declared()
    return None if a is None else a.detach()


def capture(into: list[Tensor], what: str, field: str) -> Any:
    """A forward hook that appends a copy of the module's output (its first, for a tuple) to
    `into` (a later in-place operation cannot change it); a non-tensor output is InvalidInput
    naming `what` (the tap) and `field`."""

    def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        t = output[0] if isinstance(output, tuple | list) and output else output
        if not isinstance(t, Tensor):
            raise InvalidInput(
                f"{what} ({type(module).__name__}) returned {type(output).__name__}, not a tensor",
                field=field,
            )
        into.append(t.clone())

    return hook
