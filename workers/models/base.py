"""What every model family gives the engine (docs/models.md): a `Net` — one trial's network as
shapes and choices, no tensors — whose forward pass is a pure function of (params, state, x).

    net = build(config)                       # workers.models.build
    params = net.init_params(generator)       # dict of tensors on the CPU, in net.dtype
    state = net.init_state()                  # running statistics (BatchNorm), or {}
    logits, taps = net.forward(params, state, x, "batch", taps=True)

Nothing hides per-instance state (no nn.Module attributes), so the tensors of several trials
can be stacked along a leading axis and run as one batched model (docs/architecture.md,
"Packed trials"). `taps` holds what the probe measurements need (workers/metrics.py):

- `layers[kind][ℓ]`: the representation of block ℓ + 1 at one tap (n, ...), whose sample Gram
  (reshaped (n, −1)) gives isometry_gap/<kind>;
- `outputs[ℓ]`: block ℓ + 1's output — the residual stream where there is one — for rms and
  mean_cosine;
- `tokens[ℓ]` (transformers): the (n, T, d) stream after block ℓ + 1, for the token metrics;
- `attention[ℓ]` (attention layers): block ℓ + 1's attention weights (n, heads, T, S), rows
  summing to 1, for the attention entropy (workers/custom_metrics.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import torch
from torch import Tensor

from service.config import DATASET_IMAGES
from workers.structure import Fit, Structure

if TYPE_CHECKING:
    from service.config import TrialConfig

Params = dict[str, Tensor]
State = dict[str, Tensor]
# How a normalization layer gets its statistics:
#   "train"   — the batch's own, and running statistics are updated (a training step);
#   "batch"   — the batch's own, running statistics untouched (measuring; eval_norm = "batch");
#   "running" — the running statistics (torch's eval mode).
Mode = Literal["train", "batch", "running"]
__all__ = ["Fit", "Mode", "Net", "Params", "State", "Structure", "Taps", "as_images"]


@dataclass
class Taps:
    """The representations a forward pass exposes for measurement (see the module docstring)."""

    layers: dict[str, list[Tensor]]
    outputs: list[Tensor]
    tokens: list[Tensor] | None = None
    attention: list[Tensor] | None = None


class Net(Protocol):
    """One trial's network (workers/models/*.py implement it)."""

    config: TrialConfig
    depth: int  # L, the number of blocks: every per-layer metric has L values
    width: int  # the blocks' width: hidden features, channels or model dimension (docs/models.md)
    norm: str  # the blocks' normalization (workers/nn.py NORMS)
    d_in: int  # flattened input size
    n_classes: int
    dtype: torch.dtype
    kinds: tuple[str, ...]  # the keys of Taps.layers, in record order
    head_weight: str  # the classifier's weight: head_grad_norm, head_weight_isometry_gap

    def init_params(self, generator: torch.Generator) -> Params: ...

    def init_state(self) -> State: ...

    def forward(
        self, p: Params, s: State, x: Tensor, mode: Mode, *, taps: bool = False
    ) -> tuple[Tensor, Taps | None]: ...

    def structures(
        self, p: Params, x: Tensor, taps: Taps, fit: Fit
    ) -> dict[str, list[Structure]]: ...

    def layer_weights(self) -> list[list[str]]: ...


def as_images(x: Tensor, dataset: str) -> Tensor:
    """Flattened inputs (n, d_in) as the dataset's images (n, C, H, W), channels first: a view
    for "chw" sets, a permuted view for "hwc" ones (CIFAR as torchvision stores it)."""
    layout, c, h, w = DATASET_IMAGES[dataset]
    if layout == "hwc":
        return x.reshape(len(x), h, w, c).permute(0, 3, 1, 2)
    return x.reshape(len(x), c, h, w)
