"""A lab's own model, registered with isosweep (docs/models.md): an MLP whose blocks widen to
`expansion` × width and come back, with an optional LayerNorm.

    stem   Linear(d_in → width)
    blocks.{i}, i = 0..depth−1:  Linear(width → expansion·width) → σ → Linear(→ width) [→ LayerNorm]
    head   Linear(width → n_classes)

Registered at import (name "wide_mlp", one tap per block: `blocks.{i}`, head weight
"head.weight"). torch is imported inside the factory only, so importing this module — as the
API server does at start, from ISOSWEEP_MODEL_MODULES — stays light:

    PYTHONPATH=examples/registered_model ISOSWEEP_MODEL_MODULES=wide_mlp isosweep serve
    isosweep submit examples/registered_model/spec.yaml
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.models import register_model


class WideMLPParams(BaseModel):
    """The model's own parameters: a spec's `model_params`, validated here (a wrong type or an
    unknown key is a 422 naming model_params.<field>)."""

    model_config = ConfigDict(extra="forbid")

    expansion: int = Field(2, ge=1, le=16, description="hidden width of a block, × width")
    activation: Literal["relu", "tanh", "gelu"] = "relu"
    layer_norm: bool = Field(True, description="a LayerNorm closes each block")


def build(params: WideMLPParams, *, d_in: int, n_classes: int, config: Any) -> Any:
    """The module for one trial: `config` is its TrialConfig (width and depth are read here)."""
    import torch
    from torch import nn

    act = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}[params.activation]
    d, wide = config.width, params.expansion * config.width

    def block() -> nn.Module:
        layers = [nn.Linear(d, wide, bias=config.bias), act(), nn.Linear(wide, d, bias=config.bias)]
        return nn.Sequential(*layers, *([nn.LayerNorm(d)] if params.layer_norm else []))

    class WideMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Linear(d_in, d, bias=config.bias)
            self.blocks = nn.ModuleList(block() for _ in range(config.depth))
            self.head = nn.Linear(d, n_classes, bias=config.bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.stem(x)
            for b in self.blocks:
                h = b(h)
            return self.head(h)

    return WideMLP()


register_model("wide_mlp", build, params=WideMLPParams, taps="blocks.{i}", head="head.weight")
