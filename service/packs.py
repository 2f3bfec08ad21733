"""Which trials can share a packed model, and how many (docs/architecture.md, "Packed trials").
Torch-free: the driver groups trials with it; workers/packed.py trains the packs."""

from __future__ import annotations

import json
import math

from service.config import TrialConfig, estimate_memory_bytes

# The fields that may differ within a pack: they only set the initial parameters or the
# optimizer's hyper-parameters. Every other field fixes the batched computation.
PER_MEMBER = frozenset(
    {"seed", "init", "init_gain", "orthogonal_gain", "head_init", "bias_init", "lr",
     "momentum", "weight_decay"}
)  # fmt: skip
MAX_PACK = 64  # the automatic pack size's ceiling
PACK_MEMORY_BYTES = 4e9  # what an automatic pack may take (the trials' memory estimates summed)


def pack_key(config: TrialConfig | dict) -> str:
    """Trials with equal keys can run in one pack: their config without PER_MEMBER fields."""
    data = config.to_dict() if isinstance(config, TrialConfig) else config
    shared = {k: v for k, v in data.items() if k not in PER_MEMBER}
    return json.dumps(shared, sort_keys=True, separators=(",", ":"))


def auto_pack_size(config: TrialConfig, *, trials_left: int, slots: int) -> int:
    """The pack size when a spec leaves `pack` unset: as many members as PACK_MEMORY_BYTES holds
    (by the trials' memory estimate), at most MAX_PACK, and no more than keeps every slot the
    cluster has busy (⌈trials_left / slots⌉): packing must not idle a CPU or GPU."""
    by_memory = int(PACK_MEMORY_BYTES // max(estimate_memory_bytes(config), 1.0))
    spread = math.ceil(max(trials_left, 1) / max(slots, 1))
    return max(1, min(MAX_PACK, by_memory, spread))
