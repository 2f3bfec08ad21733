"""`isosweep serve`: the API and a runner together, on the embedded default (SQLite, local Ray).

The API runs here (uvicorn, bound to 127.0.0.1 unless told otherwise) and never imports torch or
Ray. Beyond loopback it needs a token (ISOSWEEP_API_TOKEN), unless told that it may serve open
(ISOSWEEP_ALLOW_OPEN, --allow-open). The runner is a supervised child process (`isosweep
runner`, the database URL in its environment as ISOSWEEP_DATABASE_URL, not in its argv where
`ps` shows it; api/cli/supervise.py) that claims queued sweeps and drives Ray Tune: restarted
with back-off when it dies, its state in /api/v1/healthz (not ok while it is down). Stopping
serve (Ctrl-C, SIGTERM) stops the runner: SIGTERM, SIGKILL after RUNNER_GRACE_S, then every
process left in its session (Ray's). The runner is bound to this serve: it dies with it (a
parent-death signal, and a watchdog), a later serve of the same database and data directory ends
one an earlier serve left before starting its own (a pid file in ISOSWEEP_DATA_DIR), and a
runner whose loop makes no progress for ISOSWEEP_RUNNER_STALL_S is restarted (supervise.py).
At start, the login sessions of any other token are revoked (rotating the token ends them).
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from api.cli.common import CommandError, out
from api.cli.run import shown_url
from api.cli.supervise import RunnerSupervisor

if TYPE_CHECKING:  # imported where they run: the CLI starts without SQLAlchemy
    from service.settings import Settings
    from service.store import Store, SweepInfo

DEMO_SPEC = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the API (and dashboard) with a runner beside it",
        description=(
            "Serve the REST API, its docs (/docs) and the dashboard (/), and start a runner "
            "(`isosweep runner`) as a child process that runs queued sweeps on Ray, restarted "
            "with back-off if it dies (its state in /api/v1/healthz). Migrates the database "
            "first. Defaults come from ISOSWEEP_* variables (host 127.0.0.1); beyond loopback "
            "it needs ISOSWEEP_API_TOKEN, or --allow-open."
        ),
    )
    p.add_argument("--host", help="address to bind (default ISOSWEEP_HOST, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default ISOSWEEP_PORT, 8000)")
    p.add_argument("--database-url", help="SQLAlchemy URL (default ISOSWEEP_DATABASE_URL)")
    p.add_argument("--no-runner", action="store_true", help="serve the API only")
    p.add_argument(
        "--allow-open",
        action="store_true",
        default=None,
        help="serve beyond loopback without a token (ISOSWEEP_ALLOW_OPEN); anyone who reaches "
        "the address can then submit and cancel sweeps",
    )
    p.add_argument("--demo", action="store_true", help=f"submit {DEMO_SPEC.name} unless present")
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from api.server import serve_api
    from service.settings import Settings
    from service.store import Store

    given = {
        "host": args.host,
        "port": args.port,
        "database_url": args.database_url,
        "allow_open": args.allow_open,
    }
    settings = Settings(**{k: v for k, v in given.items() if v is not None})
    check_open(settings)
    check_port_free(settings.host, settings.port)
    store = Store(settings.database_url, settings=settings)  # migrates before anything runs
    end_other_tokens_sessions(store, settings)
    runner = None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.demo:
            submit_demo(store)
        if not args.no_runner:
            runner = RunnerSupervisor(
                settings.database_url,
                store=store,
                state_dir=settings.data_dir,
                stall_s=settings.runner_stall_s,
            ).start()
        announce(settings, runner)
        serve_api(settings, store=store, runner=runner)
    except KeyboardInterrupt:
        pass  # SIGINT or SIGTERM, after uvicorn has shut down gracefully
    finally:
        # A second signal (Ctrl-C twice) must not cut the cleanup short and orphan the runner
        # (in a session of its own, it gets no terminal signal): runner.stop() has a deadline.
        quiet = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            if runner is not None:
                runner.stop()
            store.close()
        finally:
            signal.signal(signal.SIGINT, quiet[signal.SIGINT])
            signal.signal(signal.SIGTERM, previous)
    return 0


def end_other_tokens_sessions(store: Store, settings: Settings) -> None:
    """Rotating the token ends every login session: those opened under another token (or, with
    no token now, every one) are marked revoked (the guard refuses them anyway)."""
    from service.store.logins import LoginSessions, token_tag

    logins = LoginSessions(store)
    ended = (
        logins.revoke_other_tokens(token_tag(settings.api_token))
        if settings.api_token
        else logins.revoke_all()
    )
    if ended:
        out.print(f"revoked {ended} login session(s) of another token")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback name or address (0.0.0.0, ::, other names: not)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_open(settings: Settings) -> None:
    """Refuse to serve beyond loopback with no token, unless allow_open says it is meant."""
    if is_loopback(settings.host) or settings.api_token or settings.allow_open:
        return
    raise CommandError(
        f"refusing to serve {settings.host} without a token: anyone who reaches it could "
        "submit and cancel sweeps. Set ISOSWEEP_API_TOKEN (e.g. "
        "export ISOSWEEP_API_TOKEN=$(openssl rand -hex 32)), serve on 127.0.0.1, or, to serve "
        "open on purpose, pass --allow-open (ISOSWEEP_ALLOW_OPEN=1)"
    )


def check_port_free(host: str, port: int) -> None:
    """Fail early, and clearly, when the address is taken (before a runner is started)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise CommandError(
                f"cannot listen on {host}:{port}: {exc.strerror}; try --port"
            ) from None


def submit_demo(store: Store) -> None:
    """Submit examples/demo.yaml unless a sweep of that name exists."""
    from service.spec import load_spec

    spec = load_spec(DEMO_SPEC, settings=store.settings)
    if any(s.name == spec.name for s in all_sweeps(store)):
        out.print(f"demo sweep {spec.name!r} already submitted")
        return
    sweep = store.create_sweep(spec)
    out.print(f"submitted the demo sweep {spec.name!r} (id {sweep.id}, {sweep.n_trials} trials)")


def all_sweeps(store: Store) -> list[SweepInfo]:
    page = store.settings.max_page_size
    found, offset = [], 0
    while True:
        batch, total = store.list_sweeps(offset=offset, limit=page)
        found += batch
        offset += page
        if offset >= total or not batch:
            return found


def announce(settings: Settings, runner: RunnerSupervisor | None) -> None:
    from rich.panel import Panel

    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    base = f"http://{host}:{settings.port}"
    lines = [
        f"dashboard  [bold]{base}/[/]",
        f"API docs   {base}/docs",
        f"database   {escape(shown_url(settings.database_url))}",
        f"runner     {runner_line(runner)}",
    ]
    out.print(Panel("\n".join(lines), title="isosweep is serving", expand=False))


def runner_line(runner: RunnerSupervisor | None) -> str:
    if runner is None:
        return "not started (--no-runner)"
    status = runner.status()
    return f"pid {status['pid']}, restarted when it dies (state in /api/v1/healthz)"
