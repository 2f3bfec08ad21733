"""The model families (docs/models.md): `build(config)` gives the trial's `Net`.

mlp          workers/models/mlp.py          the plain MLP of workers/nn.py
resmlp       workers/models/resmlp.py       residual MLP blocks with a scaled branch
cnn          workers/models/cnn.py          convolutional blocks, global average pooling
transformer  workers/models/transformer.py  an encoder over image patches or rows
(registered) workers/models/registered.py   a lab's torch.nn.Module (service/models.py)
"""

from __future__ import annotations

import importlib

from service.config import TrialConfig
from workers.models.base import Net, Taps, as_images

__all__ = ["Net", "Taps", "as_images", "build"]

_FAMILIES = {
    "mlp": ("workers.models.mlp", "MLPNet"),
    "resmlp": ("workers.models.resmlp", "ResMLPNet"),
    "cnn": ("workers.models.cnn", "CNNNet"),
    "transformer": ("workers.models.transformer", "TransformerNet"),
}


def build(config: TrialConfig) -> Net:
    """The network of a trial (shapes and choices; its tensors come from `init_params`)."""
    where = _FAMILIES.get(config.model)
    if where is None:
        from workers.models.registered import RegisteredNet

        return RegisteredNet(config)
    module, name = where
    return getattr(importlib.import_module(module), name)(config)
