"""`isosweep serve`: the API and a runner together, on the embedded default (SQLite, local Ray).

The API runs here (uvicorn, bound to 127.0.0.1 unless told otherwise) and never imports torch or
Ray; the runner is a child process (`isosweep runner`, the database URL in its environment as
ISOSWEEP_DATABASE_URL, not in its argv where `ps` shows it) that claims queued sweeps and drives
Ray Tune. Stopping serve (Ctrl-C, SIGTERM) stops the runner: SIGTERM, then
SIGKILL after RUNNER_GRACE_S.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from rich.markup import escape

from api.cli.common import CommandError, err, out
from api.cli.run import shown_url

DEMO_SPEC = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"
RUNNER_GRACE_S = 20.0  # the runner's time to stop its trials before it is killed


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the API (and dashboard) with a runner beside it",
        description=(
            "Serve the REST API, its docs (/docs) and the dashboard (/), and start a runner "
            "(`isosweep runner`) as a child process that runs queued sweeps on Ray. Migrates the "
            "database first. Defaults come from ISOSWEEP_* variables (host 127.0.0.1)."
        ),
    )
    p.add_argument("--host", help="address to bind (default ISOSWEEP_HOST, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default ISOSWEEP_PORT, 8000)")
    p.add_argument("--database-url", help="SQLAlchemy URL (default ISOSWEEP_DATABASE_URL)")
    p.add_argument("--no-runner", action="store_true", help="serve the API only")
    p.add_argument("--demo", action="store_true", help=f"submit {DEMO_SPEC.name} unless present")
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from api.server import serve_api
    from service.settings import Settings
    from service.store import Store

    given = {"host": args.host, "port": args.port, "database_url": args.database_url}
    settings = Settings(**{k: v for k, v in given.items() if v is not None})
    check_port_free(settings.host, settings.port)
    store = Store(settings.database_url, settings=settings)  # migrates before anything runs
    runner = None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.demo:
            submit_demo(store)
        if not args.no_runner:
            runner = start_runner(settings.database_url)
        announce(settings, runner)
        serve_api(settings, store=store)
    except KeyboardInterrupt:
        pass  # SIGINT or SIGTERM, after uvicorn has shut down gracefully
    finally:
        # A second signal (Ctrl-C twice, `timeout` signalling the whole group) must not cut
        # the cleanup short and orphan the runner: stop_runner has its own deadline.
        quiet = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            if runner is not None:
                stop_runner(runner)
            store.close()
        finally:
            signal.signal(signal.SIGINT, quiet[signal.SIGINT])
            signal.signal(signal.SIGTERM, previous)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


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


def submit_demo(store) -> None:
    """Submit examples/demo.yaml unless a sweep of that name exists."""
    from service.spec import load_spec

    spec = load_spec(DEMO_SPEC, settings=store.settings)
    if any(s.name == spec.name for s in all_sweeps(store)):
        out.print(f"demo sweep {spec.name!r} already submitted")
        return
    sweep = store.create_sweep(spec)
    out.print(f"submitted the demo sweep {spec.name!r} (id {sweep.id}, {sweep.n_trials} trials)")


def all_sweeps(store) -> list:
    page = store.settings.max_page_size
    found, offset = [], 0
    while True:
        batch, total = store.list_sweeps(offset=offset, limit=page)
        found += batch
        offset += page
        if offset >= total or not batch:
            return found


def start_runner(database_url: str) -> subprocess.Popen:
    """`isosweep runner` as a child process; a thread reports it if it stops on its own. The
    URL (it may hold a password) goes in the child's environment, not its command line."""
    cmd = [sys.executable, "-m", "api.cli.main", "runner"]
    proc = subprocess.Popen(cmd, env={**os.environ, "ISOSWEEP_DATABASE_URL": database_url})
    threading.Thread(target=_watch, args=(proc,), name="runner-watch", daemon=True).start()
    return proc


def _watch(proc: subprocess.Popen) -> None:
    code = proc.wait()
    if code != 0 and not getattr(proc, "stopping", False):
        err.print(f"[bold red]the runner exited with code {code}[/]; the API keeps serving")


def stop_runner(proc: subprocess.Popen, grace_s: float = RUNNER_GRACE_S) -> int:
    """SIGTERM, then SIGKILL if it is still alive after `grace_s`; returns its exit code."""
    proc.stopping = True  # type: ignore[attr-defined]  # quiets _watch
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def announce(settings, runner: subprocess.Popen | None) -> None:
    from rich.panel import Panel

    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    base = f"http://{host}:{settings.port}"
    lines = [
        f"dashboard  [bold]{base}/[/]",
        f"API docs   {base}/docs",
        f"database   {escape(shown_url(settings.database_url))}",
        f"runner     {'pid ' + str(runner.pid) if runner else 'not started (--no-runner)'}",
    ]
    out.print(Panel("\n".join(lines), title="isosweep is serving", expand=False))
