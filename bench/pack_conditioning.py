"""Packed vs alone at epoch 0, by conditioning (workers/packed.py's docstring quotes it): for
five float32 configurations (mlp: tanh/BatchNorm depth 20, identity/batch_scale depth 30,
ReLU depth 20, leaky_relu/BatchNorm depth 25 at n = d = 16; resmlp: gelu/BatchNorm/Adam depth
14 on 256 digits samples, the audit's case), 4 members each, every finite isometry gap of each
member's epoch-0 record from `fit_packed` against `fit` alone, binned by the Gram's
λ_min/λ_max (from its float64 spectrum, two decades a bin): the share that is bit-identical,
the largest and the median relative difference.

    .venv/bin/python bench/pack_conditioning.py      # ~5 minutes on 2 cores
"""

from __future__ import annotations

import collections
import math

import numpy as np
import torch

from service.config import TrialConfig
from workers.packed import fit_packed
from workers.train import fit

BASES = [
    dict(depth=20, width=32, batch_size=32, norm="batch", activation="tanh"),
    dict(depth=30, width=32, batch_size=32, norm="batch_scale", activation="identity"),
    dict(depth=20, width=32, batch_size=32, norm="none", activation="relu"),
    dict(
        model="resmlp",
        depth=14,
        width=32,
        batch_size=32,
        norm="batch",
        activation="gelu",
        optimizer="adam",
        max_train_samples=256,
    ),
    dict(depth=25, width=16, batch_size=16, norm="batch", activation="leaky_relu"),
]


def differences() -> list[tuple[float, float]]:
    """(λ_min/λ_max, |packed − alone| / alone) of every finite epoch-0 isometry gap."""
    rows = []
    for base in BASES:
        configs = [
            TrialConfig(
                **base, epochs=0, spectra=True, seed=s, init=["gaussian", "orthogonal"][s % 2]
            )
            for s in range(4)
        ]
        packed = dict(fit_packed(configs))
        for i, config in enumerate(configs):
            alone, mine = next(iter(fit(config))), packed[i]
            for key in alone:
                if not key.startswith("isometry_gap/"):
                    continue
                lam = np.asarray(alone[f"spectrum/{key.split('/')[1]}"])
                for ell, (a, m) in enumerate(zip(alone[key], mine[key], strict=True)):
                    if not (math.isfinite(a) and math.isfinite(m)) or a <= 0:
                        continue
                    spec = lam[ell][np.isfinite(lam[ell])]
                    rows.append((float(spec.min() / spec.max()), abs(m - a) / a))
    return rows


def main() -> None:
    torch.set_num_threads(1)
    rows = differences()
    bins: dict[int, list[float]] = collections.defaultdict(list)
    for ratio, diff in rows:
        bins[math.floor(math.log10(max(ratio, 1e-300))) // 2 * 2].append(diff)
    for k in sorted(bins, reverse=True):
        v = np.array(bins[k])
        print(
            f"λ_min/λ_max in [1e{k}, 1e{k + 2}): {len(v)} gaps, bit-identical "
            f"{np.mean(v == 0):.2f}, max {v.max():.2e}, median {np.median(v):.2e}"
        )
    print("total", len(rows))


if __name__ == "__main__":
    main()
