"""Time to draw each plot kind as PNG and SVG, with the renderer and mathtext parser shared
across figures (service.plots.draw: `Canvas`, `_share_mathtext`) against the baseline of a
renderer and parser of each figure's own (matplotlib's plain canvas), in the same process,
the two modes taking turns rep by rep (service.plots.memo bypassed); then the same figure
asked for again, which the memo answers without drawing.

The frame: a small sweep's tidy rows (2 inits × 4 depths × 3 seeds, 4 epochs, every layer),
the kind of figure a sweep's page asks for. Each figure is built anew per draw (as a request
does); what is timed is `render`, building included.

    .venv/bin/python bench/render.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from matplotlib.backends.backend_agg import FigureCanvasAgg

from service.errors import InvalidInput
from service.plots import PLOT_KINDS, draw, memo, render

METRIC = "isometry_gap/act"


def frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    trial = 0
    for init in ("gaussian", "orthogonal"):
        for depth in (4, 8, 16, 32):
            for seed in range(3):
                trial += 1
                for epoch in range(4):
                    gaps = np.exp(rng.normal(np.log(0.05 * np.arange(1, depth + 1)), 0.3))
                    for layer, gap in enumerate(gaps, 1):
                        rows.append(dict(
                            trial_id=trial, sweep_id=1, epoch=epoch, layer=layer, metric=METRIC,
                            value=float(gap), depth=depth, init=init, seed=seed,
                            activation="tanh", width=64, batch_size=32,
                        ))  # fmt: skip
    return pd.DataFrame(rows)


class _OwnRenderer:
    """The baseline: every figure's canvas makes its renderer (and so its parser) anew."""

    def __enter__(self) -> None:
        self.saved = draw.Canvas.get_renderer, draw._share_mathtext
        draw.Canvas.get_renderer = FigureCanvasAgg.get_renderer  # type: ignore[method-assign]
        draw._share_mathtext = lambda renderer: None

    def __exit__(self, *exc: object) -> None:
        draw.Canvas.get_renderer, draw._share_mathtext = self.saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    rows = frame()
    cases = [(k, f, g) for k in PLOT_KINDS for f in ("png", "svg") for g in (None, "init")]
    times: dict[tuple[str, str], list[float]] = {}

    def one(mode: str, kind: str, fmt: str, group: str | None) -> None:
        extra = {"group_by": group} if group else {}
        start = time.perf_counter()
        with memo.bypassed():  # what is timed is the drawing
            render(kind, rows, metric=METRIC, fmt=fmt, **extra)
        times.setdefault((mode, fmt), []).append(time.perf_counter() - start)

    ok = []
    for case in cases:  # once each, not timed: imports, fonts, the first parse
        try:
            one("warm", *case)
            ok.append(case)
        except InvalidInput:  # a kind that needs more arguments than this frame's defaults
            pass
    cases = ok
    for _ in range(args.reps):
        with _OwnRenderer():
            for case in cases:
                one("own", *case)
        for case in cases:
            one("shared", *case)
    kinds = sorted({k for k, _, _ in cases})
    print(f"{len(cases)} figures ({', '.join(kinds)}; PNG and SVG; by default and by init), "
          f"{args.reps} reps each, {len(rows)} rows")  # fmt: skip
    for fmt in ("png", "svg"):
        own = statistics.median(times[("own", fmt)])
        shared = statistics.median(times[("shared", fmt)])
        total_own, total_shared = sum(times[("own", fmt)]), sum(times[("shared", fmt)])
        print(
            f"{fmt}: median {own * 1e3:6.1f} ms (own renderer) → {shared * 1e3:6.1f} ms "
            f"(shared): {shared / own:.2f}×; all {fmt} draws {total_shared / total_own:.2f}×"
        )
    # The same frame and arguments again (another request that reads the same rows: a filter
    # every trial passes): service.plots.memo answers it without drawing.
    again = []
    for case in cases:
        kind, fmt, group = case
        extra = {"group_by": group} if group else {}
        memo.clear()
        render(kind, rows, metric=METRIC, fmt=fmt, **extra)
        start = time.perf_counter()
        render(kind, rows, metric=METRIC, fmt=fmt, **extra)
        again.append(time.perf_counter() - start)
    drawn = statistics.median(times[("shared", "png")] + times[("shared", "svg")])
    print(
        f"asked again (memo): median {statistics.median(again) * 1e3:6.2f} ms against "
        f"{drawn * 1e3:6.1f} ms drawn: {statistics.median(again) / drawn:.4f}×"
    )


if __name__ == "__main__":
    main()
