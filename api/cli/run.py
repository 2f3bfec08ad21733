"""`isosweep run SPEC.yaml`: one sweep in the foreground with a progress bar; `isosweep runner`:
the loop that runs queued sweeps (what `isosweep serve` starts, and restarts, beside the API).

Both drive sweeps through workers.runner.Runner: a claim holds the sweep under a lease that a
heartbeat extends from the claim on (Ray's start-up included), so no other runner runs it
meanwhile; SIGTERM/SIGINT stop the trials and put the sweep back in the queue. `run` claims only
the sweep it stored, and follows it from the store while another runner drives it. Both import
Ray and the engine only when they run, never when the CLI starts.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from api.cli.common import err, out
from api.cli.display import SweepBar, format_eta, print_trials, styled
from service.status import SweepStatus

if TYPE_CHECKING:
    from service.store import Store, SweepInfo
    from workers.callbacks import SweepProgress

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


def open_store(database_url: str | None) -> Store:
    from service.settings import Settings
    from service.store import Store

    settings = Settings(database_url=database_url) if database_url else Settings()
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
        if sweep.status == SweepStatus.QUEUED:
            sweep = drive(store, sweep.id, lease_s=args.lease_s, quiet=args.quiet)
        print_summary(store, sweep)
        return exit_code(sweep)
    finally:
        store.close()


def configure_logging() -> None:
    from rich.logging import RichHandler

    handler = RichHandler(console=err, show_path=False, show_time=False)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[handler])


def drive(store: Store, sweep_id: int, *, lease_s: float | None, quiet: bool) -> SweepInfo:
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
                    if SweepStatus(info.status).is_finished():
                        return info
                    bar.follow(info)  # follow it from the store
                    runner.stopping.wait(FOLLOW_S)
        finally:
            runner.shutdown()
    return store.get_sweep(sweep_id)


class Bar:
    """The sweep's progress bar (api.cli.display.SweepBar), fed by the driver's SweepProgress
    while this process drives the sweep, and from the store while another runner does."""

    def __init__(self, sweep_id: int, *, quiet: bool):
        self.bar = SweepBar(sweep_id, quiet=quiet)

    def __enter__(self) -> Bar:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)

    def update(self, p: SweepProgress) -> None:
        """From the driver: a SweepProgress (epochs count this run's trials only)."""
        self.bar.show(
            done=p.epochs_done,
            total=max(p.epochs_total, 1),
            trials=f"{p.trials_done}/{p.trials_total}",
            epochs=f"{p.epochs_done}/{p.epochs_total}",
            eta=format_eta(p.eta_s),
        )

    def follow(self, info: SweepInfo) -> None:
        """From the store, while another runner drives the sweep."""
        self.bar.show_sweep(info.model_dump(), note=f" (runner {info.runner_id})")


def exit_code(sweep: SweepInfo) -> int:
    if sweep.status == SweepStatus.COMPLETED:
        return EXIT_COMPLETED
    if sweep.status == SweepStatus.CANCELLED:
        return EXIT_CANCELLED
    if sweep.status == SweepStatus.FAILED:
        return EXIT_FAILED
    err.print(
        f"sweep {sweep.id} is still {sweep.status}: the next runner resumes it (or cancel it)"
    )
    return EXIT_INTERRUPTED


def print_summary(store: Store, sweep: SweepInfo) -> None:
    """The sweep's outcome, and the trial table (api.cli.display) of its first trials."""
    from service.spec import SweepSpec, swept_fields

    fields = swept_fields(SweepSpec.model_validate(sweep.spec))
    trials, total = store.list_trials(sweep.id, limit=SUMMARY_ROWS)
    print_trials(
        [t.model_dump() for t in trials],
        fields,
        total=total,
        title=f"sweep {sweep.id} ({sweep.name})",
        more=f"isosweep status {sweep.id}",
    )
    counts = ", ".join(f"{n} {styled(s)}" for s, n in sweep.counts.items() if n)
    line = f"sweep {sweep.id}: [bold]{styled(sweep.status)}[/] ({counts})"
    out.print(line + (f" — {escape(sweep.error)}" if sweep.error else ""))
