"""Draw docs/img/plots/<kind>.png, one example per plot kind, from synthetic tidy frames.

    .venv/bin/python docs/make_plot_examples.py            # the metric kinds
    .venv/bin/python docs/make_plot_examples.py --search   # the search kinds (a temporary store)

The numbers are made up to look like the papers' figures (docs/science.md); they are not
measurements.
Each frame has the shape the store returns (docs/architecture.md, "The tidy frame").
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.plots import render  # noqa: E402

OUT = ROOT / "docs" / "img" / "plots"
F32_MAX = float(np.finfo(np.float32).max)  # a float32 gradient past this overflows to +inf


def tidy(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    frame["layer"] = frame["layer"].astype("Int64")
    return frame


def gradient_sweep(rng: np.random.Generator) -> pd.DataFrame:
    """BatchNorm, linear activation: log‖∂L/∂W₁‖ grows linearly in depth with Gaussian weights
    (it overflows float32 at depth 1000 in some seeds) and stays bounded with orthogonal ones."""
    rows, tid = [], 0
    for depth in (10, 30, 100, 300, 1000):
        for init in ("gaussian", "orthogonal"):
            for seed in range(10):
                tid += 1
                slope = 0.09 if init == "gaussian" else 0.0004
                g = np.exp(slope * depth + rng.normal(0, 0.05 * np.sqrt(depth) + 0.1))
                value = g if g < F32_MAX else np.inf
                cfg = dict(trial_id=tid, depth=depth, init=init, seed=seed, epoch=0)
                rows.append(cfg | dict(metric="grad_norm", layer=1, value=value))
    return tidy(rows)


def weight_gap_profile(rng: np.random.Generator) -> pd.DataFrame:
    """One orthogonal network trained for 100 epochs: the weight isometry gap grows during
    training, least in the middle layers (a U-shape across layers)."""
    rows, L = [], 40
    ell = np.arange(1, L + 1)
    u = ((ell - (L + 1) / 2) / (L / 2)) ** 2  # (L,) 0 in the middle, 1 at the ends
    for seed in range(5):
        for epoch in range(0, 101, 10):
            gap = (epoch / 100) * (0.02 + 0.3 * u) * np.exp(rng.normal(0, 0.05, L))
            for l, v in zip(ell, gap, strict=True):
                rows.append(
                    dict(
                        trial_id=seed + 1,
                        depth=L,
                        init="orthogonal",
                        seed=seed,
                        epoch=epoch,
                        metric="weight_isometry_gap",
                        layer=l,
                        value=v,
                    )
                )
    return tidy(rows)


def training_sweep(rng: np.random.Generator) -> pd.DataFrame:
    """Loss and accuracy over 60 epochs; one Gaussian seed diverges (NaN loss) at epoch 30."""
    rows, tid = [], 0
    for init in ("gaussian", "orthogonal"):
        for seed in range(6):
            tid += 1
            rate = 0.03 if init == "orthogonal" else 0.015
            for epoch in range(0, 61, 5):
                loss = 2.3 * np.exp(-rate * epoch) + 0.2 + rng.normal(0, 0.03)
                acc = 1 - loss / 2.6 + rng.normal(0, 0.01)
                diverged = init == "gaussian" and seed == 0 and epoch == 30
                cfg = dict(trial_id=tid, init=init, seed=seed, epoch=epoch)
                rows.append(
                    cfg | dict(metric="train_loss", layer=pd.NA, value=np.nan if diverged else loss)
                )
                rows.append(cfg | dict(metric="test_acc", layer=pd.NA, value=acc))
                if diverged:
                    break  # fit() stops after the diverged record
    return tidy(rows)


def gap_over_training(rng: np.random.Generator) -> pd.DataFrame:
    """Isometry gap per layer and epoch of one configuration (3 seeds); late in training the
    last layers' Gram turns singular in every seed (gap = +∞)."""
    rows, L = [], 30
    for seed in range(3):
        for epoch in range(0, 51, 5):
            for l in range(1, L + 1):
                gap = 2.0 * 0.85**l * (1 + epoch / 25) * np.exp(rng.normal(0, 0.05))
                if epoch >= 40 and l > 26:
                    gap = np.inf
                rows.append(
                    dict(
                        trial_id=seed + 1,
                        depth=L,
                        seed=seed,
                        epoch=epoch,
                        metric="isometry_gap/act",
                        layer=l,
                        value=gap,
                    )
                )
    return tidy(rows)


def layernorm_sweep(rng: np.random.Generator) -> tuple[pd.DataFrame, dict]:
    """LayerNorm MLPs at initialization: the gap at the last layer decays geometrically in depth,
    with a width-1/√d floor; the 'prediction' is a pure geometric decay (2 − β)^(2ℓ)."""
    beta = {"relu": (3 * np.pi - 4) / (2 * np.pi - 2), "sin": 2 - 2 * np.e / (np.e**2 - 1)}
    rows, tid, theory = [], 0, {}
    for act, b in beta.items():
        ell = np.arange(1, 41)
        pred = 1.5 * (2 - b) ** (2 * ell)  # (40,)
        theory[act] = (ell, pred)
        for depth in (1, 2, 5, 10, 20, 40):
            for seed in range(8):
                tid += 1
                v = (pred[depth - 1] + 0.01) * np.exp(rng.normal(0, 0.1))
                rows.append(
                    dict(
                        trial_id=tid,
                        depth=depth,
                        activation=act,
                        seed=seed,
                        epoch=0,
                        metric="isometry_gap/norm",
                        layer=depth,
                        value=v,
                    )
                )
    return tidy(rows), theory


def main() -> None:
    rng = np.random.default_rng(0)
    OUT.mkdir(parents=True, exist_ok=True)
    norm_frame, theory = layernorm_sweep(rng)
    examples = {
        "layer_profile": (weight_gap_profile(rng), dict(metric="weight_isometry_gap")),
        "depth_scaling": (gradient_sweep(rng), dict(metric="grad_norm", group_by="init", layer=1)),
        "training_curves": (
            training_sweep(rng),
            dict(metric=["train_loss", "test_acc"], group_by="init"),
        ),
        "heatmap": (gap_over_training(rng), dict(metric="isometry_gap/act")),
        "theory_overlay": (norm_frame, dict(metric="isometry_gap/norm", theory=theory)),
    }
    for kind, (frame, kwargs) in examples.items():
        path = OUT / f"{kind}.png"
        path.write_bytes(render(kind, frame, **kwargs))
        print(path.relative_to(ROOT))


if __name__ == "__main__" and "--search" not in sys.argv:
    main()


# --- the search kinds (service/plots/search.py): drawn from a synthetic store -----------------


def search_examples() -> None:
    """docs/img/plots/<kind>.png for the search kinds, from made-up sweeps written to a temporary
    SQLite store: examples/lr_search.yaml (2 depths × 8 log-uniform learning rates × 2 seeds, a
    random search, every trial completed) for the search's figures, and
    examples/lr-depth-trainability.yaml (3 depths, 8 epochs, successive halving) for
    halving_rungs. test_loss(e) = L∞ + (2.3 − L∞)·exp(−e·k), L∞ a bowl in log10 lr that narrows
    with depth, k growing with lr; train_loss = 0.9·test_loss. The halving sweep's stops are
    decided by the rule (service.search.halving.decide) in trial order, as the asynchronous rule
    would with trials finishing in that order."""
    import tempfile

    from service.plots.search import SEARCH_PLOT_KINDS, make_search_plot
    from service.search.halving import decide, rungs
    from service.spec import load_spec
    from service.store import Store

    rng = np.random.default_rng(0)

    def losses(config: dict) -> np.ndarray:
        lr, depth, n = config["lr"], config["depth"], config["epochs"] + 1
        floor = 0.08 + (0.35 + depth / 60) * (np.log10(lr) + 1.3) ** 2
        k = 0.15 + 2.0 * lr**0.5
        return floor + (2.3 - floor) * np.exp(-k * np.arange(n)) + rng.normal(0, 0.01, n)

    def write(store: Store, tid: int, curve: np.ndarray, last: int, status: str) -> None:
        store.write_records([
            (tid, {"epoch": e, "diverged": False, "test_loss": float(curve[e]),
                   "train_loss": 0.9 * float(curve[e])})
            for e in range(last + 1)
        ])  # fmt: skip
        store.finish_trial(tid, status)

    with tempfile.TemporaryDirectory() as tmp, Store(f"sqlite:///{tmp}/docs.db") as store:
        plain = store.create_sweep(load_spec(ROOT / "examples" / "lr_search.yaml"))
        for t in store.list_trials(plain.id, limit=1000)[0]:
            write(store, t.id, losses(t.config), t.config["epochs"], "completed")
        halving = store.create_sweep(load_spec(ROOT / "examples" / "lr-depth-trainability.yaml"))
        at_rung: dict[int, list[float]] = {r: [] for r in rungs(1, 2, 8)}
        for t in sorted(store.list_trials(halving.id, limit=1000)[0], key=lambda t: t.index):
            curve, last, status = losses(t.config), t.config["epochs"], "completed"
            for r, seen in at_rung.items():
                stop = decide(seen, curve[r], "min", 2)
                seen.append(float(curve[r]))
                if stop:
                    last, status = r, "stopped"
                    break
            write(store, t.id, curve, last, status)
        for kind in SEARCH_PLOT_KINDS:
            path = OUT / f"{kind}.png"
            sweep = halving if kind == "halving_rungs" else plain
            path.write_bytes(make_search_plot(store, sweep.id, kind))
            print(path.relative_to(ROOT))


if __name__ == "__main__" and "--search" in sys.argv:
    OUT.mkdir(parents=True, exist_ok=True)
    search_examples()
