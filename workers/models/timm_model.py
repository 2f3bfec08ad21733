"""`model: timm` — any timm architecture by name, at random init, measured as a registered model
(workers/models/registered.py; docs/models.md, "Models people already have").

The factory builds `timm.create_model(arch, pretrained=False, num_classes=C, in_chans=c,
**model_args)` for the trial's dataset (c channels, C classes, and `img_size` = the images'
H × W where the architecture takes one: ViTs, Swin, Mixer…) inside a small module that folds
the flattened batch (n, d_in) back into images (n, c, H, W) as the built-in cnn does
(`workers.models.base.as_images`). The timm model is its submodule `net`: the taps are
`net.<stage>` (the stage names service/library_models.py resolved: `layer1..layer4` for a
ResNet, `stages.{i}`, `blocks.{i}`, …), the parameters `net.…`.

Nothing is downloaded: pretrained is refused at validation and False here, and HF_HUB_OFFLINE=1
is set before timm is imported, so that no code path of timm's reaches the Hugging Face hub.
The weights are timm's own initialization, drawn from torch's global generator, which the
registered-model path seeds per trial.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from service.library_models import TimmParams
from workers.models.base import as_images


class TimmClassifier(torch.nn.Module):
    """A timm model fed the dataset's flattened inputs: (n, d_in) → images → (n, C) logits."""

    def __init__(self, net: torch.nn.Module, dataset: str) -> None:
        super().__init__()
        self.net = net
        self.dataset = dataset

    def forward(self, x: Tensor) -> Tensor:
        return self.net(as_images(x, self.dataset))


def create(arch: str, args: dict[str, Any], *, in_chans: int, num_classes: int, img: tuple) -> Any:
    """timm's `create_model` at random init, offline; `img_size` passed where the architecture's
    constructor takes it (an architecture that does not is built without)."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # before timm (and huggingface_hub) read it
    import timm

    kwargs = dict(pretrained=False, num_classes=num_classes, in_chans=in_chans, **args)
    try:
        return timm.create_model(arch, img_size=img, **kwargs)
    except TypeError as exc:
        if "img_size" not in str(exc):
            raise
    return timm.create_model(arch, **kwargs)


def build(params: TimmParams, *, d_in: int, n_classes: int, config: Any) -> torch.nn.Module:
    """The registered factory of `model: timm` (service.models.LIBRARY)."""
    from service.config import DATASET_IMAGES

    _, c, h, w = DATASET_IMAGES[config.dataset]
    net = create(params.arch, params.model_args, in_chans=c, num_classes=n_classes, img=(h, w))
    return TimmClassifier(net, config.dataset)
