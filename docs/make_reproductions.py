"""Run the papers' experiments (examples/meterez-*.yaml, examples/joudaki-*.yaml) with the real
runner, draw docs/img/repro/*.png from the store, and print the numbers docs/reproductions.md
quotes, as markdown tables.

    .venv/bin/python docs/make_reproductions.py [--db PATH] [--only NAME] [--skip-run]

Each sweep runs through `isosweep run SPEC --database-url sqlite:///PATH` (local Ray), into one
SQLite file (default build/repro/repro.db, not committed). A sweep already completed in that file
with the same spec is not run again; `--skip-run` only draws and prints from what is stored.
The figures come from service.plots.stored.make_plot, as the API and the dashboard draw them.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.plots import render  # noqa: E402
from service.plots.stored import line_prediction, make_plot  # noqa: E402
from service.spec import load_spec  # noqa: E402
from service.store import Store  # noqa: E402
from service.theory import isometry_strength  # noqa: E402

OUT = ROOT / "docs" / "img" / "repro"
DEFAULT_DB = ROOT / "build" / "repro" / "repro.db"
log = logging.getLogger("repro")


@dataclass
class Figure:
    """One PNG: the file name under docs/img/repro/ and make_plot's arguments. `epochs` keeps
    only those recorded epochs (make_plot cannot leave one out): the frame is read with them and
    drawn by service.plots.render, the function make_plot ends in."""

    file: str
    kind: str
    args: dict[str, Any]
    epochs: list[int] | None = None


@dataclass
class Experiment:
    name: str  # the spec's `name`, and what --only takes
    spec: Path
    figures: list[Figure]
    numbers: Callable[[Store, int], None]  # prints the doc's tables


# --- helpers -----------------------------------------------------------------------------------


def md_table(frame: pd.DataFrame) -> str:
    """A frame as a markdown table (index included), for pasting into the doc."""
    frame = frame.reset_index()
    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(map(str, r)) + " |" for r in frame.itertuples(index=False)]
    return "\n".join([head, rule, *rows])


def log10_cell(values: np.ndarray) -> str:
    """Mean of log10 over the finite seeds, with how many seeds were +inf or NaN."""
    v = np.asarray(values, dtype=float)
    ok = np.isfinite(v)
    text = f"{np.mean(np.log10(v[ok])):.2f}" if ok.any() else "—"
    bad = [f"{n} {k}" for k, n in (("+∞", np.sum(v == np.inf)), ("NaN", np.sum(np.isnan(v)))) if n]
    return text + (f" ({', '.join(bad)})" if bad else "")


def pivot_cells(frame: pd.DataFrame, rows: list[str], col: str, cell: Callable) -> pd.DataFrame:
    """One cell per (rows…, col): `cell` of the seeds' values."""
    out = frame.groupby([*rows, col])["value"].apply(lambda s: cell(s.to_numpy()))
    return out.unstack(col)


def log10_slope(frame: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Least-squares slope of log10(value) against depth, per 100 layers, over finite seeds."""

    def slope(part: pd.DataFrame) -> str:
        ok = np.isfinite(part["value"].to_numpy(float))
        x, y = part["depth"].to_numpy(float)[ok], np.log10(part["value"].to_numpy(float)[ok])
        return f"{100 * np.polyfit(x, y, 1)[0]:+.2f}" if np.unique(x).size > 1 else "—"

    return frame.groupby(keys)[["depth", "value"]].apply(slope)


def trials_where(store: Store, sweep_id: int, where: dict[str, Any]) -> list[Any]:
    trials, _ = store.list_trials(sweep_id, where=where, limit=store.settings.max_page_size)
    return trials


def show(title: str, text: str) -> None:
    print(f"\n#### {title}\n\n{text}")


# --- the numbers of each experiment ------------------------------------------------------------


def bn_gradients_numbers(store: Store, sid: int) -> None:
    g = store.read_metrics(sid, metrics="grad_norm", epoch=0, layers=[1])
    keys = ["dataset", "norm", "init"]
    table = pivot_cells(g, keys, "depth", log10_cell)
    table["slope per 100 layers"] = log10_slope(g, keys)
    show("log10 ‖∂L/∂W₁‖ at initialization, mean over seeds, by depth", md_table(table))
    gaps = store.read_metrics(sid, metrics="isometry_gap/norm", epoch=0)
    finite = gaps.groupby(keys)["value"].apply(lambda s: f"{np.isfinite(s).mean():.0%}")
    show("share of finite isometry_gap/norm values (all layers, depths, seeds)", md_table(finite))
    show("layer from which the gap is finite, depth 1000, per seed", finite_from(gaps, 1000))
    last = gaps[(gaps["layer"] == gaps["depth"]) & (gaps["dataset"] == "gaussian")]
    cell = lambda v: f"{np.mean(v):.3g}"  # noqa: E731 (inf stays inf)
    table = pivot_cells(last, ["norm", "init"], "depth", cell)
    show(
        "isometry_gap/norm at the last layer ℓ = L, dataset gaussian, mean over seeds",
        md_table(table),
    )
    ranged = store.read_metrics(sid, metrics="range_isometry_gap/norm", epoch=0)
    last = ranged[(ranged["layer"] == ranged["depth"]) & (ranged["dataset"] == "gaussian")]
    show(
        "range_isometry_gap/norm (the gap outside the structural null space) at ℓ = L, dataset "
        "gaussian, mean over seeds",
        md_table(pivot_cells(last, ["norm", "init"], "depth", cell)),
    )


def finite_from(gaps: pd.DataFrame, depth: int) -> str:
    """Per configuration and seed, the layer from which on every gap is finite ('—': the last
    layer's is not)."""
    deep = gaps[gaps["depth"] == depth].sort_values("layer")
    keys = ["dataset", "norm", "init"]

    def start(v: np.ndarray) -> str:
        bad = np.flatnonzero(~np.isfinite(v))  # (k,) 0-based layers with a +∞ or NaN gap
        return "1" if bad.size == 0 else ("—" if bad[-1] == v.size - 1 else str(bad[-1] + 2))

    def per_seed(part: pd.DataFrame) -> str:
        return " ".join(start(p["value"].to_numpy(float)) for _, p in part.groupby("seed"))

    return md_table(deep.groupby(keys)[["seed", "layer", "value"]].apply(per_seed).rename("ℓ"))


def shaping_numbers(store: Store, sid: int) -> None:
    g = store.read_metrics(sid, metrics="grad_norm", epoch=0, layers=[1])
    keys = ["init", "activation", "gain_exponent"]
    table = pivot_cells(g, keys, "depth", log10_cell)
    table["slope per 100 layers"] = log10_slope(g, keys)
    show("log10 ‖∂L/∂W₁‖ at initialization, mean over finite seeds, by depth", md_table(table))


LAYERS_SHOWN = [1, 2, 5, 10, 20, 30]


def layernorm_numbers(store: Store, sid: int) -> None:
    gaps = store.read_metrics(sid, metrics="isometry_gap/norm", epoch=0)
    wide = gaps[gaps["width"] == gaps["width"].max()]
    rows = []
    for act in wide["activation"].unique():
        part = wide[wide["activation"] == act]
        m = part.groupby("layer")["value"].mean()  # (L,) mean over seeds
        trials = trials_where(store, sid, {"activation": act, "width": int(wide["width"].max())})
        _, p = line_prediction(store, trials, "norm")  # (L,) the overlay's dashed line
        beta = isometry_strength(act)
        row = {"activation": act, "β": f"{beta:.4f}", "(2−β)²": f"{(2 - beta) ** 2:.3f}"}
        row |= {"ratio 1→5 meas": f"{(m[5] / m[1]) ** 0.25:.3f}"}
        row |= {"ratio 1→5 pred": f"{(p[4] / p[0]) ** 0.25:.3f}"}
        row |= {f"ℓ={ell}": f"{m[ell]:.3g} / {p[ell - 1]:.2g}" for ell in LAYERS_SHOWN}
        rows.append(row)
    width = int(wide["width"].max())
    text = md_table(pd.DataFrame(rows).set_index("activation"))
    show(f"isometry_gap/norm, width {width}: measured / mean-field predicted", text)
    deep = gaps[gaps["layer"] == gaps["layer"].max()]  # depth is fixed: not a column
    table = pivot_cells(deep, ["activation"], "width", lambda v: f"{np.mean(v):.3g}")
    show("isometry_gap/norm at the last layer ℓ = 30 against width", md_table(table))


EPOCHS_SHOWN = [0, 5, 10, 25, 50]  # rows of the tables; the spec records 0, 5, …, 50
TRAINED_EPOCHS = list(range(5, 51, 5))  # the weight profiles' lines (epoch 0 left out)


def training_numbers(store: Store, sid: int) -> None:
    w = store.read_metrics(sid, metrics="weight_isometry_gap")
    for (init, L), part in w.groupby(["init", "depth"]):
        bands = {
            "ℓ 1–10": (1, 10),
            f"ℓ {L // 2 - 4}–{L // 2 + 5}": (L // 2 - 4, L // 2 + 5),
            f"ℓ {L - 9}–{L}": (L - 9, L),
        }
        rows = {}
        for name, (lo, hi) in bands.items():
            band = part[(part["layer"] >= lo) & (part["layer"] <= hi)]
            rows[name] = band.groupby("epoch")["value"].mean()
        gaps = pd.DataFrame(rows).loc[EPOCHS_SHOWN]  # (epochs, 3 bands)
        table = gaps.map(lambda v: f"{v:.2e}")
        table["first / middle"] = (gaps.iloc[:, 0] / gaps.iloc[:, 1]).round(1)
        table["last / middle"] = (gaps.iloc[:, 2] / gaps.iloc[:, 1]).round(1)
        title = f"weight_isometry_gap, {init} init, depth {L}, mean over 10 layers and seeds"
        show(title, md_table(table))
    s = store.read_metrics(sid, metrics=["train_loss", "train_acc", "test_acc"])
    table = s.groupby(["depth", "init", "epoch", "metric"])["value"].mean().unstack("metric")
    table = table[table.index.get_level_values("epoch").isin(EPOCHS_SHOWN)]
    show("training, mean over seeds", md_table(table.round(3)))


# --- the experiments ---------------------------------------------------------------------------

EXPERIMENTS = [
    Experiment(
        "meterez-bn-gradients",
        ROOT / "examples" / "meterez-bn-gradients.yaml",
        [
            Figure(
                "bn-gradients-depth.png",
                "depth_scaling",
                dict(metric="grad_norm", layer=1, group_by="init", where={"norm": "batch"}),
            ),
            Figure(
                "bn-gradients-profile.png",
                "layer_profile",
                dict(metric="grad_norm", group_by="init", where={"norm": "batch", "depth": 1000}),
            ),
            Figure(
                "bn-gradients-gaps.png",
                "depth_scaling",
                dict(
                    metric="isometry_gap/norm",
                    group_by="norm",
                    where={"dataset": "gaussian", "init": "orthogonal"},
                ),
            ),
        ],
        bn_gradients_numbers,
    ),
    Experiment(
        "meterez-shaping",
        ROOT / "examples" / "meterez-shaping.yaml",
        [
            Figure(
                "shaping-orthogonal.png",
                "depth_scaling",
                dict(
                    metric="grad_norm", layer=1, group_by="activation", where={"init": "orthogonal"}
                ),
            ),
            Figure(
                "shaping-gaussian.png",
                "depth_scaling",
                dict(
                    metric="grad_norm", layer=1, group_by="activation", where={"init": "gaussian"}
                ),
            ),
            Figure(
                "shaping-shaped.png",
                "depth_scaling",
                dict(metric="grad_norm", layer=1, group_by="init", where={"gain_exponent": 0.4}),
            ),
        ],
        shaping_numbers,
    ),
    Experiment(
        "joudaki-layernorm-isometry",
        ROOT / "examples" / "joudaki-layernorm-isometry.yaml",
        [
            Figure(
                "layernorm-overlay.png",
                "theory_overlay",
                dict(
                    metric="isometry_gap/norm",
                    x="layer",
                    group_by="activation",
                    where={"width": 1024},
                ),
            ),
            Figure(
                "layernorm-overlay-width128.png",
                "theory_overlay",
                dict(
                    metric="isometry_gap/norm",
                    x="layer",
                    group_by="activation",
                    where={"width": 128},
                ),
            ),
            Figure(
                "layernorm-width.png",
                "depth_scaling",
                dict(metric="isometry_gap/norm", x="width", group_by="activation"),
            ),
        ],
        layernorm_numbers,
    ),
    Experiment(
        "meterez-orthogonal-training",
        ROOT / "examples" / "meterez-orthogonal-training.yaml",
        [
            *(
                Figure(
                    f"orthogonal-training-weights-{L}.png",
                    "layer_profile",
                    dict(metric="weight_isometry_gap", where={"init": "orthogonal", "depth": L}),
                    epochs=TRAINED_EPOCHS,  # epoch 0 (≈ 1e-16) would squash the rest
                )
                for L in (200, 500)
            ),
            Figure(
                "orthogonal-training-curves.png",
                "training_curves",
                dict(metric=["train_loss", "train_acc", "test_acc"], group_by="init"),
            ),
        ],
        training_numbers,
    ),
]


# --- running and drawing -----------------------------------------------------------------------


def stored_sweep(store: Store, exp: Experiment) -> Any | None:
    """The newest completed sweep of this experiment whose spec is the file's spec, or None."""
    want = load_spec(exp.spec, settings=store.settings).model_dump(mode="json")
    sweeps, _ = store.list_sweeps(status="completed", limit=store.settings.max_page_size)
    return next((s for s in sweeps if s.name == exp.name and s.spec == want), None)


def isosweep_command() -> list[str]:
    exe = Path(sys.executable).with_name("isosweep")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "api.cli.main"]


def run_sweep(exp: Experiment, url: str) -> None:
    cmd = [*isosweep_command(), "run", str(exp.spec.relative_to(ROOT)), "--database-url", url]
    log.info("%s: running `%s`", exp.name, " ".join(cmd))
    t0 = time.monotonic()
    code = subprocess.run(cmd, cwd=ROOT, check=False).returncode
    log.info("%s: isosweep run exited %d after %.0f s", exp.name, code, time.monotonic() - t0)
    if code != 0:
        raise SystemExit(f"{exp.name}: isosweep run failed with exit code {code}")


def wall_time(info: Any) -> str:
    if info.started_at is None or info.finished_at is None:
        return "?"
    return f"{(info.finished_at - info.started_at).total_seconds():.0f} s"


def figure_png(store: Store, sid: int, fig: Figure) -> bytes:
    if fig.epochs is None:
        return make_plot(store, sid, fig.kind, fmt="png", **fig.args)
    args = dict(fig.args)
    where, metric = args.pop("where", None), args.pop("metric")
    frame = store.read_metrics(sid, metrics=metric, epoch=fig.epochs, where=where)
    return render(fig.kind, frame, metric=metric, fmt="png", **args)


def draw(store: Store, sid: int, exp: Experiment) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for fig in exp.figures:
        png = figure_png(store, sid, fig)
        (OUT / fig.file).write_bytes(png)
        log.info("%s: wrote docs/img/repro/%s (%d kB)", exp.name, fig.file, len(png) // 1024)


def reproduce(exp: Experiment, store: Store, url: str, *, skip_run: bool) -> None:
    info = stored_sweep(store, exp)
    if info is None and skip_run:
        log.warning("%s: no completed sweep with this spec in the store; skipped", exp.name)
        return
    if info is None:
        run_sweep(exp, url)
        info = stored_sweep(store, exp)
        if info is None:
            raise SystemExit(f"{exp.name}: the sweep did not complete (see the output above)")
    else:
        log.info("%s: sweep %d already completed in the store; not run again", exp.name, info.id)
    print(f"\n### {exp.name} (sweep {info.id}: {info.n_trials} trials, {wall_time(info)})")
    draw(store, info.id, exp)
    exp.numbers(store, info.id)


def main(argv: list[str] | None = None) -> int:
    names = [e.name for e in EXPERIMENTS]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--db", type=Path, default=DEFAULT_DB, help=f"SQLite file (default {DEFAULT_DB})"
    )
    p.add_argument(
        "--only", choices=names, action="append", help="just this experiment (repeatable)"
    )
    p.add_argument("--skip-run", action="store_true", help="draw and print from the store only")
    args = p.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    log.setLevel(logging.INFO)  # our progress; the libraries' INFO lines stay quiet
    args.db.parent.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{args.db.resolve()}"
    with Store(url) as store:
        for exp in EXPERIMENTS:
            if args.only is None or exp.name in args.only:
                reproduce(exp, store, url, skip_run=args.skip_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
