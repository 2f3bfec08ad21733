"""Run the papers' experiments (the specs of EXPERIMENTS, examples/*.yaml) with the real runner,
draw docs/img/repro/*.png from the store, and print the numbers docs/reproductions.md quotes, as
markdown tables.

    .venv/bin/python docs/make_reproductions.py [--db PATH] [--only NAME [NAME …]] [--skip-run]

Each sweep runs through `isosweep run SPEC --database-url sqlite:///PATH` (local Ray), into one
SQLite file (default build/repro/repro.db, not committed). A sweep already completed in that file
with the same spec is not run again; `--skip-run` only draws and prints from what is stored.
The figures come from service.plots.stored.make_plot, as the API and the dashboard draw them;
the few that no plot kind draws (a stream's mean square against the ℓ + const line, 1 − cosine on
a log axis) are drawn here with matplotlib from the same tidy frame (`Store.read_metrics`), and
their titles say so.
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

from service.plots import draw as plot_draw  # noqa: E402
from service.plots import render  # noqa: E402
from service.plots.overlay import line_prediction  # noqa: E402
from service.plots.stored import make_plot  # noqa: E402
from service.spec import SweepSpec, load_spec  # noqa: E402
from service.store import Store  # noqa: E402
from service.theory import isometry_strength  # noqa: E402

OUT = ROOT / "docs" / "img" / "repro"
DEFAULT_DB = ROOT / "build" / "repro" / "repro.db"
log = logging.getLogger("repro")


@dataclass
class Figure:
    """One PNG: the file name under docs/img/repro/ and make_plot's arguments. `epochs` keeps
    only those recorded epochs (make_plot cannot leave one out): the frame is read with them and
    drawn by service.plots.render, the function make_plot ends in. `custom` (kind "custom"):
    a figure no plot kind draws, `custom(store, sweep_id, args) -> PNG bytes`, from the frame
    `Store.read_metrics` reads with args["metric"] and args["where"]."""

    file: str
    kind: str
    args: dict[str, Any]
    epochs: list[int] | None = None
    custom: Callable[[Store, int, dict[str, Any]], bytes] | None = None


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
    relative_grad_numbers(store, sid, {"norm": "batch", "dataset": "gaussian"})
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
    geo = lambda v: f"{np.exp(np.mean(np.log(v))):.3g}"  # noqa: E731 (the figure's points)
    show(
        "isometry_gap/norm at ℓ = L, dataset gaussian, geometric mean over seeds (the figure)",
        md_table(pivot_cells(last, ["norm", "init"], "depth", geo)),
    )
    ranged = store.read_metrics(sid, metrics="range_isometry_gap/norm", epoch=0)
    last = ranged[(ranged["layer"] == ranged["depth"]) & (ranged["dataset"] == "gaussian")]
    show(
        "range_isometry_gap/norm (the gap outside the structural null space) at ℓ = L, dataset "
        "gaussian, mean over seeds",
        md_table(pivot_cells(last, ["norm", "init"], "depth", cell)),
    )


def relative_grad_numbers(store: Store, sid: int, where: dict[str, Any]) -> None:
    """The gradient overlay's numbers: ‖∂ℒ/∂W₁‖/‖∂ℒ/∂W_L‖ per depth, geometric mean over seeds
    (the figure's points) and the prediction (its dashed line: service.plots.overlay)."""
    g = store.read_metrics(sid, metrics="grad_norm", epoch=0, where=where)
    first = g[g["layer"] == 1].set_index(["trial_id"])["value"]
    last = g[g["layer"] == g["depth"]].set_index(["trial_id"])["value"]
    rel = g[g["layer"] == 1]
    rel = rel.assign(value=rel["trial_id"].map(first / last).to_numpy(float))
    geo = lambda v: f"{np.exp(np.mean(np.log(v))):.3g}"  # noqa: E731
    table = pivot_cells(rel, ["init"], "depth", geo)
    trials = trials_where(store, sid, {**where, "init": "gaussian"})
    got = line_prediction(store, trials, "grad_norm", x="depth", layer=1)
    if got is not None:
        table.loc["prediction"] = [f"{v:.3g}" for v in got[1]]
    text = ", ".join(f"{k}={v}" for k, v in where.items())
    show(f"‖∂ℒ/∂W₁‖/‖∂ℒ/∂W_L‖ at initialization ({text}): measured (geomean over seeds), "
         "predicted", md_table(table))  # fmt: skip


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
        _, p = line_prediction(store, trials, "isometry_gap/norm")  # (L,) the overlay's line
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


# --- the model families' experiments -------------------------------------------------------------


def seed_means(frame: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Mean over seeds of `value` per (keys…, layer); +∞ stays +∞."""
    return frame.groupby([*keys, "layer"])["value"].mean()


def custom_figure(nrows: int = 1) -> tuple[Any, list[Any]]:
    return plot_draw.new_figure(nrows, height=3.6 if nrows > 1 else 4.4)


def desmith_stream(store: Store, sid: int, args: dict[str, Any]) -> bytes:
    """rms² of the residual stream per block (mean over seeds, each seed a dot) beside De &
    Smith's rms²_ℓ ≈ rms²_1 + c²·(ℓ − 1), one panel per residual_scale c."""
    rms = store.read_metrics(sid, metrics=args["metric"], epoch=0, where=args["where"])
    rms = rms.assign(value=rms["value"].astype(float) ** 2)
    scales = sorted(rms["residual_scale"].unique(), reverse=True)
    fig, axes = custom_figure(len(scales))
    for ax, c in zip(axes, scales, strict=True):
        part = rms[rms["residual_scale"] == c]
        ell = np.sort(part["layer"].unique()).astype(float)
        m = part.groupby("layer")["value"].mean().to_numpy(float)  # (L,)
        ax.plot(part["layer"], part["value"], ".", color="0.6", ms=3, label="each seed")
        ax.plot(ell, m, "-", color="C0", label="mean over seeds")
        ax.plot(
            ell,
            m[0] + c**2 * (ell - 1),
            "--",
            color="C3",
            label=f"De & Smith: rms²₁ + c²·(ℓ − 1), c = {c:g}",
        )
        ax.set_ylabel(plot_draw.wrap(f"rms² of the stream x_ℓ (residual_scale {c:g})", 30))
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("block ℓ")
    fixed = ", ".join(f"{k} = {v}" for k, v in args["where"].items())
    fig.suptitle("residual stream mean square per block, resmlp with a BatchNorm branch")
    axes[0].set_title(
        plot_draw.wrap(
            f"drawn by docs/make_reproductions.py from the stored `rms` (squared) · {fixed} · "
            f"epoch 0 · {part['seed'].nunique()} seeds",
            110,
        ),
        fontsize=8,
        loc="left",
        color="0.3",
    )
    return plot_draw.to_bytes(fig, "png")


def desmith_numbers(store: Store, sid: int) -> None:
    rms = store.read_metrics(sid, metrics="rms", epoch=0)
    rms = rms.assign(value=rms["value"].astype(float) ** 2)
    g = store.read_metrics(sid, metrics="grad_norm", epoch=0, layers=[1])
    rows = []
    for (c, L), part in rms.groupby(["residual_scale", "depth"]):
        m = part.groupby("layer")["value"].mean()
        g0 = g[(g["residual_scale"] == c) & (g["depth"] == L)]["value"]
        growth = (m.iloc[-1] - m.iloc[0]) / ((L - 1) * c**2)  # De & Smith: 1
        rows.append(
            {
                "residual_scale": c,
                "depth": L,
                "rms² ℓ = 1 → L": f"{m.iloc[0]:.2f} → {m.iloc[-1]:.2f}",
                "(rms²_L − rms²_1)/((L − 1)c²)": f"{growth:.3f}",
                "grad_norm ℓ = 1 (seeds)": f"{g0.mean():.3g} ({', '.join(f'{v:.3g}' for v in g0)})",
                "√(rms²_L/rms²_1)": f"{np.sqrt(m.iloc[-1] / m.iloc[0]):.2f}",
            }
        )
    show(
        "stream mean square and first-block gradient, mean over seeds",
        md_table(pd.DataFrame(rows).set_index(["residual_scale", "depth"])),
    )
    mg = g.groupby(["residual_scale", "depth"])["value"].mean().unstack("depth")
    ratios = mg.div(mg.shift(axis=1)).iloc[:, 1:].round(2)
    show("grad_norm ℓ = 1: ratio between consecutive depths", md_table(ratios))
    rows = []
    deep = store.read_metrics(sid, metrics="rms", epoch=0, where={"depth": 64})
    for c, part in deep.groupby("residual_scale"):
        m = part.groupby("layer")["value"].mean()
        got = line_prediction(store, trials_where(store, sid, {"depth": 64, "residual_scale": c}),
                              "rms")  # fmt: skip
        p = got[1] if got is not None else np.full(64, np.nan)
        for ell in (1, 4, 16, 64):
            rows.append({"residual_scale": c, "ℓ": ell, "rms measured": f"{m[ell]:.4f}",
                         "rms predicted": f"{p[ell - 1]:.4f}",
                         "rel. error": f"{m[ell] / p[ell - 1] - 1:+.2%}"})  # fmt: skip
    show("the rms overlay, depth 64: measured (mean over seeds) and predicted",
         md_table(pd.DataFrame(rows).set_index(["residual_scale", "ℓ"])))  # fmt: skip


def scaled_resnet_numbers(store: Store, sid: int) -> None:
    """The 1/√L residual network: the stream's growth and the first block's gradient per depth."""
    rms = store.read_metrics(sid, metrics="rms", epoch=0)
    rms = rms.assign(value=rms["value"].astype(float) ** 2)
    g = store.read_metrics(sid, metrics="grad_norm", epoch=0, layers=[1])
    rows = []
    for (act, L), part in rms.groupby(["activation", "depth"]):
        m = part.groupby("layer")["value"].mean()
        g0 = g[(g["activation"] == act) & (g["depth"] == L)]["value"].astype(float)
        c = 1 / np.sqrt(L)
        rows.append(
            {
                "activation": act,
                "depth": L,
                "residual_scale": f"{c:.4g}",
                "rms² ℓ = 1 → L": f"{m.iloc[0]:.3f} → {m.iloc[-1]:.3f}",
                "(rms²_L − rms²_1)/((L − 1)c²)": f"{(m.iloc[-1] - m.iloc[0]) / (L - 1) / c**2:.3f}",
                "grad_norm ℓ = 1 (seeds)": f"{g0.mean():.3g} ({', '.join(f'{v:.3g}' for v in g0)})",
            }
        )
    show(
        "stream mean square and first-block gradient, residual_scale = 1/√depth",
        md_table(pd.DataFrame(rows).set_index(["activation", "depth"])),
    )


def xiao_numbers(store: Store, sid: int) -> None:
    gaps = store.read_metrics(sid, metrics="isometry_gap/act", epoch=0)
    last = gaps[gaps["layer"] == gaps["depth"]]
    cell = lambda v: f"{np.mean(v):.4f}"  # noqa: E731
    show(
        "isometry_gap/act at ℓ = L, mean over seeds",
        md_table(pivot_cells(last, ["init", "activation"], "depth", cell)),
    )
    spread = gaps.groupby(["init", "activation", "depth", "seed"])["value"].agg(np.ptp)
    spread = spread.groupby(["init", "activation", "depth"]).max().unstack("depth")
    show(
        "spread over one network's blocks (max − min), the larger of the seeds",
        md_table(spread.map(lambda v: f"{v:.2g}")),
    )
    first = store.read_metrics(sid, metrics="isometry_gap/linear", epoch=0, layers=[1])
    ortho = first[(first["init"] == "delta_orthogonal") & (first["activation"] == "identity")]
    show(
        "isometry_gap/linear at ℓ = 1, delta_orthogonal (= the input's gap), per seed",
        md_table(ortho.groupby("seed")["value"].mean().map(lambda v: f"{v:.4f}")),
    )
    w = store.read_metrics(
        sid, metrics="weight_isometry_gap", epoch=0, where={"init": "delta_orthogonal"}
    )
    inner = w[w["layer"] > 1]["value"]
    show(
        "weight_isometry_gap, delta_orthogonal, blocks 2..L",
        f"max {inner.max():.2g}; block 1: {w[w['layer'] == 1]['value'].unique()}",
    )


def dong_one_minus_cosine(store: Store, sid: int, args: dict[str, Any]) -> bytes:
    """1 − token_cosine per layer on a log axis, with and without skips (a collapsed sequence's
    distance from rank one; 0 values are marked at the bottom)."""
    cos = store.read_metrics(sid, metrics=args["metric"], epoch=0, where=args["where"])
    fig, (ax,) = custom_figure()
    for i, (skip, part) in enumerate(cos.groupby("skip")):
        m = 1.0 - part.groupby("layer")["value"].mean()
        ell, v = m.index.to_numpy(float), m.to_numpy(float)
        ok = v > 0
        ax.plot(ell[ok], v[ok], "o-", color=f"C{i}", label=f"skip = {str(skip).lower()}")
        if (~ok).any():
            ax.plot(ell[~ok], np.full((~ok).sum(), np.nan), "v", color=f"C{i}")
            zero = ell[~ok]
            ax.annotate(
                f"1 − cos ≤ 0 (exact collapse) at ℓ ≥ {int(zero.min())}",
                (zero.min(), 0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 4),
                textcoords="offset points",
                fontsize=8,
                color=f"C{i}",
            )
    ax.set_yscale("log")
    ax.axhline(1e-14, color="0.5", lw=0.8, ls=":")
    ax.annotate(
        "below ~1e-14: float64 rounding of the cosine (tokens equal to float32 precision)",
        (0.01, 1e-14),
        xycoords=("axes fraction", "data"),
        xytext=(0, 3),
        textcoords="offset points",
        fontsize=8,
        color="0.4",
    )
    ax.set_xlabel("block ℓ")
    ax.set_ylabel(
        plot_draw.wrap(
            "1 − token_cosine: 1 − mean cosine between a sample's tokens (0 = rank one)", 45
        )
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fixed = ", ".join(f"{k} = {v}" for k, v in args["where"].items())
    fig.suptitle("distance from rank collapse, attention-only transformer")
    ax.set_title(
        plot_draw.wrap(
            f"drawn by docs/make_reproductions.py from the stored `token_cosine` · {fixed} · "
            f"epoch 0 · mean over {cos['seed'].nunique()} seeds",
            110,
        ),
        fontsize=8,
        loc="left",
        color="0.3",
    )
    return plot_draw.to_bytes(fig, "png")


def dong_numbers(store: Store, sid: int) -> None:
    t = store.read_metrics(sid, metrics=["token_cosine", "token_isometry_gap"], epoch=0)
    deep = t[t["depth"] == t["depth"].max()]
    for metric, fmt in (("token_cosine", "{:.4f}"), ("token_isometry_gap", "{:.3g}")):
        part = deep[deep["metric"] == metric]
        table = part.groupby(["skip", "layer"])["value"].mean().unstack("layer")
        show(
            f"{metric} per layer, depth {int(deep['depth'].max())}, mean over seeds",
            md_table(table.map(fmt.format)),
        )
    cos = deep[deep["metric"] == "token_cosine"]
    gap = 1.0 - cos.groupby(["skip", "layer"])["value"].mean().unstack("layer")
    show("1 − token_cosine per layer (the log-axis figure)", md_table(gap.map("{:.2g}".format)))
    last = t[t["layer"] == t["depth"]]
    cells = last.groupby(["skip", "depth", "metric"])["value"].mean().unstack("metric")
    table = cells.apply(
        lambda r: f"{r['token_cosine']:.4f} / {r['token_isometry_gap']:.3g}", axis=1
    ).unstack("depth")
    show("token_cosine / token_isometry_gap at ℓ = L, mean over seeds", md_table(table))


# --- models people already have: timm and Hugging Face transformers ---------------------------

GPT2_LAYERS = [1, 2, 3, 4, 6, 8, 10, 12]
INIT_SD = "model_params.initializer_range"


def gpt2_numbers(store: Store, sid: int) -> None:
    """Per init s.d. and block, the mean over seeds of the token and sample measurements."""
    metrics = ["token_cosine", "token_isometry_gap", "isometry_gap/output", "rms"]
    t = store.read_metrics(sid, metrics=metrics, epoch=0, layers=GPT2_LAYERS)
    for metric in metrics:
        part = t[t["metric"] == metric]
        table = part.groupby([INIT_SD, "layer"])["value"].mean().unstack("layer")
        show(f"{metric} per block, mean over seeds", md_table(table.map("{:.4g}".format)))
    spread = t[t["metric"] == "token_cosine"].groupby([INIT_SD, "seed"])["value"].agg(np.ptp)
    show("token_cosine: max − min over the 12 blocks, per seed", md_table(spread.unstack("seed")))


STAGE_METRICS = ["isometry_gap/output", "rms", "mean_cosine", "grad_norm"]


def timm_numbers(store: Store, sid: int) -> None:
    """Per network and stage, the mean over seeds of the gap, rms, cosine and gradient."""
    t = store.read_metrics(sid, metrics=STAGE_METRICS, epoch=0)
    keys = ["model_params.arch", "model_params.model_args"]
    for metric in STAGE_METRICS:
        part = t[t["metric"] == metric]
        table = part.groupby([*keys, "layer"])["value"].mean().unstack("layer")
        show(f"{metric} per stage, mean over seeds", md_table(table.map("{:.3g}".format)))
    g = t[(t["metric"] == "grad_norm") & (t["layer"] == 1)]
    cells = g.groupby(keys)["value"].apply(lambda v: ", ".join(f"{x:.3g}" for x in v))
    show("grad_norm of layer1, per seed", md_table(cells))


# --- the experiments ---------------------------------------------------------------------------

# Meterez et al. 2024's gradient-against-depth figures: seeds pooled by their geometric mean (the
# mean of log, as the tables below), log y and log x. The first two are the field's default for
# a gradient norm against depth (service.plots.defaults.default_pooling); x is asked for, since
# its `auto` scale follows the depths' spread. docs/reproductions.md §1–§2.
PAPER_AXES: dict[str, str] = {"stat": "geomean", "xscale": "log", "yscale": "log"}

EXPERIMENTS = [
    Experiment(
        "meterez-bn-gradients",
        ROOT / "examples" / "meterez-bn-gradients.yaml",
        [
            Figure(
                "bn-gradients-depth.png",
                "depth_scaling",
                dict(
                    metric="grad_norm",
                    layer=1,
                    group_by="init",
                    where={"norm": "batch"},
                    **PAPER_AXES,
                ),
            ),
            Figure(
                "bn-gradients-overlay.png",
                "theory_overlay",
                dict(
                    metric="grad_norm",
                    x="depth",
                    layer=1,
                    group_by="init",
                    where={"norm": "batch", "dataset": "gaussian"},
                    **PAPER_AXES,
                ),
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
                    metric="grad_norm",
                    layer=1,
                    group_by="activation",
                    where={"init": "orthogonal"},
                    **PAPER_AXES,
                ),
            ),
            Figure(
                "shaping-gaussian.png",
                "depth_scaling",
                dict(
                    metric="grad_norm",
                    layer=1,
                    group_by="activation",
                    where={"init": "gaussian"},
                    **PAPER_AXES,
                ),
            ),
            Figure(
                "shaping-shaped.png",
                "depth_scaling",
                dict(
                    metric="grad_norm",
                    layer=1,
                    group_by="init",
                    where={"gain_exponent": 0.4},
                    **PAPER_AXES,
                ),
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
    Experiment(
        "de-smith-residual-depth",
        ROOT / "examples" / "de-smith-residual-depth.yaml",
        [
            Figure(
                "desmith-stream-ms.png",
                "custom",
                dict(metric="rms", where={"depth": 64}),
                custom=desmith_stream,
            ),
            Figure(
                "desmith-rms-profile.png",
                "layer_profile",
                dict(metric="rms", group_by="residual_scale", where={"depth": 64}, band="std"),
            ),
            Figure(
                "desmith-rms-overlay.png",
                "theory_overlay",
                dict(metric="rms", x="layer", group_by="residual_scale", where={"depth": 64}),
            ),
            Figure(
                "desmith-grad-depth.png",
                "depth_scaling",
                dict(metric="grad_norm", layer=1, group_by="residual_scale", band="std"),
            ),
        ],
        desmith_numbers,
    ),
    Experiment(
        "xiao-delta-orthogonal",
        ROOT / "examples" / "xiao-delta-orthogonal.yaml",
        [
            *(
                Figure(
                    f"xiao-gap-depth-{act}.png",
                    "depth_scaling",
                    dict(
                        metric="isometry_gap/act",
                        group_by="init",
                        where={"activation": act},
                        xscale="log",
                        yscale="linear",
                        band="std",
                    ),
                )
                for act in ("identity", "tanh")
            ),
            Figure(
                "xiao-gap-profile.png",
                "layer_profile",
                dict(
                    metric="isometry_gap/act",
                    group_by="init",
                    where={"depth": 32, "activation": "identity"},
                    yscale="linear",
                    band="std",
                ),
            ),
        ],
        xiao_numbers,
    ),
    Experiment(
        "dong-rank-collapse",
        ROOT / "examples" / "dong-rank-collapse.yaml",
        [
            Figure(
                "dong-token-cosine.png",
                "layer_profile",
                dict(
                    metric="token_cosine",
                    group_by="skip",
                    where={"depth": 12},
                    yscale="linear",
                    band="std",
                ),
            ),
            Figure(
                "dong-one-minus-cosine.png",
                "custom",
                dict(metric="token_cosine", where={"depth": 12}),
                custom=dong_one_minus_cosine,
            ),
            Figure(
                "dong-token-gap.png",
                "layer_profile",
                dict(metric="token_isometry_gap", group_by="skip", where={"depth": 12}, band="std"),
            ),
        ],
        dong_numbers,
    ),
    Experiment(
        "resnet-scaled-depth",
        ROOT / "examples" / "resnet-scaled-depth.yaml",
        [
            Figure(
                "resnet-scaled-grad-depth.png",
                "depth_scaling",
                dict(metric="grad_norm", layer=1, group_by="activation", band="std"),
            ),
            Figure(
                "resnet-scaled-rms-profile.png",
                "layer_profile",
                dict(metric="rms", group_by="activation", where={"depth": 64}, band="std"),
            ),
        ],
        scaled_resnet_numbers,
    ),
    Experiment(
        "gpt2-token-isometry",
        ROOT / "examples" / "gpt2-token-isometry.yaml",
        [
            Figure(
                "gpt2-token-cosine.png",
                "layer_profile",
                dict(metric="token_cosine", group_by=INIT_SD, yscale="linear", band="std"),
            ),
            Figure(
                "gpt2-token-gap.png",
                "layer_profile",
                dict(metric="token_isometry_gap", group_by=INIT_SD, yscale="linear", band="std"),
            ),
            Figure(
                "gpt2-rms.png",
                "layer_profile",
                dict(metric="rms", group_by=INIT_SD, yscale="linear", band="std"),
            ),
        ],
        gpt2_numbers,
    ),
    Experiment(
        "timm-resnet-stages",
        ROOT / "examples" / "timm-resnet-stages.yaml",
        [
            Figure(
                "timm-stage-gaps.png",
                "layer_profile",
                dict(metric="isometry_gap/output", group_by="model_params.arch", band="std"),
            ),
            Figure(
                "timm-stage-grads.png",
                "layer_profile",
                dict(metric="grad_norm", group_by="model_params.arch", band="std"),
            ),
        ],
        timm_numbers,
    ),
]


# --- running and drawing -----------------------------------------------------------------------


def stored_sweep(store: Store, exp: Experiment) -> Any | None:
    """The newest completed sweep of this experiment whose spec is the file's spec, or None.
    A stored spec is read as the spec model reads it today, so that a field added since it was
    stored (at its default) does not make it another spec."""
    want = load_spec(exp.spec, settings=store.settings).model_dump(mode="json")
    sweeps, _ = store.list_sweeps(status="completed", limit=store.settings.max_page_size)

    def same(stored: dict[str, Any]) -> bool:
        if stored == want:
            return True
        try:
            return SweepSpec.model_validate(stored).model_dump(mode="json") == want
        except ValueError:  # a spec today's model refuses is not this one
            return False

    return next((s for s in sweeps if s.name == exp.name and same(s.spec)), None)


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
    if fig.custom is not None:
        return fig.custom(store, sid, fig.args)
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
        "--only",
        choices=names,
        nargs="+",
        action="extend",
        metavar="NAME",
        help=f"just these experiments (one or more; repeatable): {', '.join(names)}",
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
