"""The plain MLP (model: mlp) as a `Net`: workers/nn.py's functions, unchanged, behind the
family interface — the records are those of the engine before the families existed, bit for bit
(tests/workers/test_models.py holds them to it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from service.config import TrialConfig
from workers import nn
from workers.models.base import Fit, Mode, Params, State, Taps


class SpecBlocks:
    """The shapes and choices of a family whose blocks are the MLP's, read from `self.spec`
    (the nn.Spec of those blocks): MLPNet and ResMLPNet share them."""

    spec: nn.Spec
    head_weight = "W_head"

    @property
    def depth(self) -> int:
        return self.spec.depth

    @property
    def width(self) -> int:
        return self.spec.width

    @property
    def norm(self) -> str:
        return self.spec.norm

    @property
    def n_classes(self) -> int:
        return self.spec.n_classes

    @property
    def dtype(self) -> torch.dtype:
        return self.spec.dtype

    @property
    def kinds(self) -> tuple[str, ...]:
        """A block's taps: nn.block's z, norm output (not with norm "none") and σ's."""
        return ("linear", "act") if self.spec.norm == "none" else ("linear", "norm", "act")

    def init_state(self) -> State:
        return nn.init_state(self.spec)

    def layer_weights(self) -> list[list[str]]:
        return [[f"W{ell}"] for ell in range(1, self.depth + 1)]


@dataclass(frozen=True)
class MLPNet(SpecBlocks):
    config: TrialConfig
    spec: nn.Spec = field(init=False)

    def __post_init__(self) -> None:
        if not hasattr(self, "spec"):
            object.__setattr__(self, "spec", nn.make_spec(self.config))

    @classmethod
    def of_spec(cls, spec: nn.Spec) -> MLPNet:
        """The Net of an nn.Spec alone (measuring a network built by hand: no config, so no
        `init_params`)."""
        net = object.__new__(cls)
        object.__setattr__(net, "spec", spec)
        object.__setattr__(net, "config", None)
        return net

    @property
    def d_in(self) -> int:
        return self.spec.d_in

    def init_params(self, generator: torch.Generator) -> Params:
        return nn.init_params_of(self.spec, self.config, generator)

    def forward(
        self, p: Params, s: State, x: Tensor, mode: Mode, *, taps: bool = False
    ) -> tuple[Tensor, Taps | None]:
        logits, triples = nn.forward(self.spec, p, s, x, mode, taps=taps)
        if triples is None:
            return logits, None
        slot = {"linear": 0, "norm": 1, "act": 2}
        layers = {k: [t[slot[k]] for t in triples] for k in self.kinds}
        last = 2 if self.spec.order == "norm_act" else 1  # the block's output h_ℓ
        return logits, Taps(layers, [t[last] for t in triples])

    def structures(self, p: Params, x: Tensor, taps: Taps, fit: Fit) -> dict:
        from workers.structure import structures

        z, a = taps.layers["linear"], taps.layers["act"]
        n = taps.layers.get("norm", z)
        forced = structures(self.spec, p, x, list(zip(z, n, a, strict=True)), fit)
        slot = {"linear": 0, "norm": 1, "act": 2}
        return {k: [f[slot[k]] for f in forced] for k in self.kinds}
