"""`isosweep run SPEC.yaml`: one sweep in the foreground with a progress bar; `isosweep runner`:
the loop that runs queued sweeps (what `isosweep serve` starts beside the API).

Both import Ray and the engine only when they run, never when the CLI starts.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import Any

from api.cli.common import err, out

# Exit codes of `isosweep run`.
EXIT_COMPLETED, EXIT_FAILED, EXIT_CANCELLED, EXIT_INTERRUPTED = 0, 1, 2, 130
SUMMARY_ROWS = 50  # trials listed in the final table
FOLLOW_S = 1.0  # how often `run` re-reads a sweep that another runner is driving


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "run",
        help="run one sweep in the foreground, with a progress bar",
        description=(
            "Validate SPEC (YAML or JSON), store it as a new sweep and run it here on Ray Tune "
            "(the cluster in RAY_ADDRESS, else a local instance), showing trials done, epochs and "
            "an ETA. Trials whose results are already stored are reused unless --rerun. Exit "
            "code: 0 completed, 1 failed (or invalid spec), 2 cancelled, 130 interrupted (the "
            "sweep goes back to the queue for the next runner). Also the entry point "
            "of `ray job submit … -- isosweep run SPEC --database-url postgresql://…`."
        ),
    )
    p.add_argument("spec", type=Path, metavar="SPEC", help="sweep spec file (.yaml or .json)")
    add_database_url(p)
    p.add_argument("--rerun", action="store_true", help="run trials even if results are stored")
    p.add_argument("--quiet", action="store_true", help="no progress bar; just the outcome")
    p.add_argument("--lease-s", type=positive, help="lease on the sweep (ISOSWEEP_RUNNER_LEASE_S)")
    p.set_defaults(func=run_spec)

    r = subparsers.add_parser(
        "runner",
        help="run queued sweeps on Ray Tune, one at a time, until stopped",
        description=(
            "Claim the next queued sweep (highest priority, then oldest), run its unfinished "
            "trials on Ray Tune (the cluster in RAY_ADDRESS, else a local instance), repeat; "
            "poll when idle. SIGTERM/SIGINT stop it cleanly and put its sweep back in the queue; "
            "after a crash the next runner resumes the sweep once its lease runs out."
        ),
    )
    add_database_url(r)
    r.add_argument("--once", action="store_true", help="exit when nothing is queued")
    r.add_argument("--lease-s", type=positive, help="lease on a claimed sweep, seconds "
                   "(ISOSWEEP_RUNNER_LEASE_S)")  # fmt: skip
    r.add_argument("--poll-s", type=positive, help="idle poll interval (ISOSWEEP_RUNNER_POLL_S)")
    r.add_argument("--runner-id", help="name of this runner in the store (default host:pid)")
    r.add_argument("--num-cpus", type=int, help="CPUs of a local Ray instance (default: all)")
    r.add_argument("--num-gpus", type=int, help="GPUs of a local Ray instance (default: all)")
    r.set_defaults(func=run_runner)


def add_database_url(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", help="SQLAlchemy URL (default ISOSWEEP_DATABASE_URL)")


def open_store(database_url: str | None):
    from service.settings import Settings
    from service.store import Store

    settings = Settings(**({"database_url": database_url} if database_url else {}))
    return Store(settings.database_url, settings=settings)


def shown_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# --- isosweep runner ---------------------------------------------------------------------------


def run_runner(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its per-plugin lines are noise here
    store = open_store(args.database_url)
    from workers.runner import Runner

    runner = Runner(
        store,
        runner_id=args.runner_id,
        lease_s=args.lease_s,
        poll_s=args.poll_s,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
    )
    logging.getLogger("isosweep.runner").info(
        "runner %s on %s (lease %gs, poll %gs)",
        runner.runner_id, shown_url(store.url), runner.lease_s, runner.poll_s,
    )  # fmt: skip
    try:
        runner.run_forever(until_idle=args.once)
    finally:
        store.close()
    return 0


# --- isosweep run ------------------------------------------------------------------------------


def run_spec(args: argparse.Namespace) -> int:
    from service.spec import load_spec

    store = open_store(args.database_url)
    try:
        spec = load_spec(args.spec, settings=store.settings)  # InvalidInput names the field
        if args.rerun:
            spec = spec.model_copy(update={"rerun": True})
        configure_logging()
        sweep = store.create_sweep(spec)
        out.print(f"sweep [bold]{sweep.id}[/] ({sweep.name}): {sweep.n_trials} trials")
        if sweep.status == "queued":
            sweep = drive(store, sweep.id, lease_s=args.lease_s, quiet=args.quiet)
        print_summary(store, sweep)
        return exit_code(sweep)
    finally:
        store.close()


def configure_logging() -> None:
    from rich.logging import RichHandler

    handler = RichHandler(console=err, show_path=False, show_time=False)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[handler])


def drive(store, sweep_id: int, *, lease_s: float | None, quiet: bool):
    """Run the sweep here until it is finished, interrupted, or driven by another runner
    (then follow its progress from the store until it finishes)."""
    from workers.runner import Runner, SignalStop

    bar = Bar(sweep_id, quiet=quiet)
    runner = Runner(store, lease_s=lease_s, progress=bar.update)
    with bar, SignalStop(runner.stop) as runner.signals:
        try:
            while not runner.stopping.is_set():
                if runner.run_once(sweep_id) is None:  # finished, or another runner drives it
                    info = store.get_sweep(sweep_id)
                    if info.status not in ("queued", "running"):
                        return info
                    bar.follow(info)  # follow it from the store
                    runner.stopping.wait(FOLLOW_S)
        finally:
            runner.shutdown()
    return store.get_sweep(sweep_id)


class Bar:
    """A rich progress bar on stderr: trials done/total, epochs recorded/expected, ETA.

    Updated from one thread (the driver's callbacks and the follow loop run in drive's); rich's
    Progress locks its own state against its refresh thread.
    """

    def __init__(self, sweep_id: int, *, quiet: bool):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("[bold]sweep {task.fields[sweep]}"),
            BarColumn(),
            TextColumn("trials {task.fields[trials]}"),
            TextColumn("epochs {task.fields[epochs]}"),
            TextColumn("ETA {task.fields[eta]}"),
            TimeElapsedColumn(),
            console=err,
            disable=quiet,
        )
        self.task = self.progress.add_task(
            "", total=None, sweep=sweep_id, trials="…", epochs="…", eta="…"
        )

    def __enter__(self) -> Bar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, p: Any) -> None:
        """From the driver: a SweepProgress (epochs count this run's trials only)."""
        self.progress.update(
            self.task,
            total=max(p.epochs_total, 1),
            completed=p.epochs_done,
            trials=f"{p.trials_done}/{p.trials_total}",
            epochs=f"{p.epochs_done}/{p.epochs_total}",
            eta=format_eta(p.eta_s),
        )

    def follow(self, info: Any) -> None:
        """From the store, while another runner drives the sweep."""
        done = sum(n for s, n in info.counts.items() if s not in ("queued", "running"))
        self.progress.update(
            self.task,
            total=1.0,
            completed=info.progress,
            trials=f"{done}/{info.n_trials}",
            epochs=f"{info.progress:.0%}",
            eta=format_eta(info.eta_s) + f" (runner {info.runner_id})",
        )


def format_eta(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def exit_code(sweep) -> int:
    if sweep.status == "completed":
        return EXIT_COMPLETED
    if sweep.status == "cancelled":
        return EXIT_CANCELLED
    if sweep.status == "failed":
        return EXIT_FAILED
    err.print(
        f"sweep {sweep.id} is still {sweep.status}: the next runner resumes it (or cancel it)"
    )
    return EXIT_INTERRUPTED


def print_summary(store, sweep) -> None:
    """The sweep's outcome, and a table of its first trials: swept fields, status, last
    epoch's losses and accuracies (NaN/inf shown as such)."""
    from rich import box
    from rich.table import Table

    from service.spec import SweepSpec, swept_fields

    fields = swept_fields(SweepSpec.model_validate(sweep.spec))
    trials, total = store.list_trials(sweep.id, limit=SUMMARY_ROWS)
    retried = any(t.attempts > 1 for t in trials)
    table = Table(title=f"sweep {sweep.id} ({sweep.name})", box=box.SIMPLE_HEAD, pad_edge=False)
    columns = ["trial", *fields, "status", *(["tries"] if retried else []), "epoch"]
    for name in [*columns, "train_loss", "test_acc"]:
        left = name in ("status", "init", "activation", "norm", "order", "dataset", "optimizer")
        table.add_column(name, justify="left" if left else "right", no_wrap=True)
    for t in trials:
        table.add_row(
            str(t.id),
            *(str(t.config.get(f)) for f in fields),
            t.status + ("*" if t.results_from is not None else ""),
            *([str(t.attempts)] if retried else []),
            "-" if t.last_epoch is None else f"{t.last_epoch}/{t.config['epochs']}",
            fmt(t.summary.get("train_loss")),
            fmt(t.summary.get("test_acc")),
        )
    out.print(table)
    if any(t.results_from is not None for t in trials):
        out.print("* results reused from an identical trial stored before (--rerun to run it)")
    if total > len(trials):
        out.print(f"… and {total - len(trials)} more trials (isosweep status {sweep.id})")
    counts = ", ".join(f"{n} {s}" for s, n in sweep.counts.items() if n)
    style = {"completed": "green", "failed": "red", "cancelled": "yellow"}.get(sweep.status, "")
    line = f"sweep {sweep.id}: [bold {style}]{sweep.status}[/] ({counts})"
    out.print(line + (f" — {sweep.error}" if sweep.error else ""))


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
