"""What the CLI draws, once: the sweep progress bar and the trial table.

`isosweep run` (driving a sweep here, or following another runner's from the store) and
`isosweep submit --wait` (following it over REST) show the same bar; `isosweep run`'s summary and
`isosweep status SWEEP` print the same trial table, from trial dicts in the API's TrialPublic
shape (the store's TrialInfo.model_dump() has the same keys).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from rich.markup import escape

from api.cli.common import err, out
from service.jsonfmt import NONFINITE
from service.status import SweepStatus, trials_finished

STATUS_STYLE = {
    "queued": "dim", "running": "blue", "completed": "green", "diverged": "dark_orange",
    "failed": "red", "cancelled": "yellow", "stopped": "magenta",
}  # fmt: skip
LEFT = frozenset({"name", "status", "trials", "activation", "norm", "order", "init", "dataset",
                  "optimizer", "metric", "error", "dtype", "bias_init", "head_init",
                  "input_norm"})  # fmt: skip
TRIAL_METRICS = ("train_loss", "test_loss", "test_acc")  # the trial table's summary columns


def format_eta(seconds: float | None) -> str:
    """h:mm:ss, or -:--:-- when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class SweepBar:
    """A rich progress bar on stderr: trials done/total, epochs recorded, ETA, elapsed time.

    Fed from one thread; rich's Progress locks its own state against its refresh thread.
    """

    def __init__(self, sweep_id: int, *, quiet: bool = False):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn(f"[bold]sweep {sweep_id}"),
            BarColumn(),
            TextColumn("trials {task.fields[trials]}"),
            TextColumn("epochs {task.fields[epochs]}"),
            TextColumn("ETA {task.fields[eta]}"),
            TimeElapsedColumn(),
            console=err,
            disable=quiet,
        )
        self.task = self.progress.add_task("", total=None, trials="…", epochs="…", eta="…")

    def __enter__(self) -> SweepBar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def show(self, *, done: float, total: float, trials: str, epochs: str, eta: str) -> None:
        """Set the bar: `done` of `total` (epochs, or a share of 1.0), and the three labels."""
        self.progress.update(
            self.task, completed=done, total=total, trials=trials, epochs=epochs, eta=eta
        )

    def show_sweep(self, sweep: dict[str, Any], *, note: str = "") -> None:
        """From a sweep as the store or the API describes it (SweepInfo.model_dump() or
        SweepPublic): progress is the share of expected epochs recorded."""
        done = trials_finished(sweep["counts"])
        running = sweep["status"] == SweepStatus.RUNNING
        self.show(
            done=sweep["progress"],
            total=1.0,
            trials=f"{done}/{sweep['n_trials']}",
            epochs=f"{sweep['progress']:.0%}",
            eta=(format_eta(sweep["eta_s"]) + note) if running else sweep["status"],
        )


def number(value: Any) -> str:
    """A cell: finite floats to 6 significant digits; non-finite values (floats, or the API's
    "NaN"/"Infinity"/"-Infinity" spellings) as Python writes them, highlighted."""
    if isinstance(value, str) and value in NONFINITE:
        return f"[magenta]{NONFINITE[value]}[/]"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else f"[magenta]{value}[/]"
    return "-" if value is None else escape(str(value))


def styled(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, '')}]{status}[/]"


def table(title: str | None, columns: Iterable[str]):
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for name in columns:
        t.add_column(name, justify="left" if name in LEFT else "right")
    return t


def trial_fields(spec: dict[str, Any]) -> list[str]:
    """The trial table's config columns for a sweep (its stored spec): every field it varies in
    the spec's order — grid axes and sampled (random, Sobol, TPE) parameters — then `seed`."""
    from service.spec import swept_fields_of

    return swept_fields_of(spec)


def config_cell(value: Any) -> str:
    """A config value in the trial table: floats (a sampled learning rate) to 6 significant
    digits, the rest as written."""
    if isinstance(value, float):
        return number(value)
    return escape(str(value))


def print_trials(
    trials: list[dict[str, Any]],
    fields: list[str],
    *,
    total: int,
    title: str | None = None,
    more: str = "--limit",
) -> None:
    """The trial table: id, the swept fields, status (* = results reused), tries when any trial
    was retried, epoch, the last epoch's losses and accuracy, the diverged epoch and the error."""
    retried = any(t["attempts"] > 1 for t in trials)
    columns = ["trial", *fields, "status", *(["tries"] if retried else []), "epoch"]
    t = table(title, [*columns, *TRIAL_METRICS, "diverged", "error"])
    for tr in trials:
        t.add_row(
            str(tr["id"]), *(config_cell(tr["config"].get(f)) for f in fields),
            styled(tr["status"]) + ("*" if tr["results_from"] else ""),
            *([str(tr["attempts"])] if retried else []),
            # epochs trained (0 is the untrained network's record), of the run's: 8/8
            f"{'-' if tr['last_epoch'] is None else tr['epochs_done']}/{tr['epochs_total']}",
            *(number(tr["summary"].get(m)) for m in TRIAL_METRICS),
            "" if tr["diverged_epoch"] is None else str(tr["diverged_epoch"]),
            escape((tr["error"] or "")[:60]),
        )  # fmt: skip
    out.print(t)
    if any(tr["results_from"] for tr in trials):
        out.print("* results reused from an identical trial stored before (--rerun to run it)")
    if total > len(trials):
        out.print(f"… and {total - len(trials)} more trials ({more})")
