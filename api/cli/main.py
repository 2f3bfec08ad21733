"""Entry point of the `isosweep` command: one argparse sub-command per module of api/cli/."""

from __future__ import annotations

import argparse
import importlib
import sys

from api.cli.common import CommandError, fail
from service.errors import IsosweepError

# Each module defines `register(subparsers)`, which adds its sub-commands and sets `func`.
COMMAND_MODULES = (
    "api.cli.trial",  # trial: one trial in the foreground, JSON lines
    "api.cli.theory",  # theory: Hermite coefficients, β, mean-field predictions
    "api.cli.run",  # run, runner: sweeps on Ray Tune
    "api.cli.serve",  # serve: API + runner
    "api.cli.sessions",  # sessions: the dashboard's login sessions
    "api.cli.client",  # submit, status, cancel, results, plot: REST client
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="isosweep",
        description="Sweeps of signal propagation in deep networks: isometry, gradients, theory.",
    )
    from service import __version__

    parser.add_argument("--version", action="version", version=f"isosweep {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except CommandError as exc:
        fail(exc.message, exc.code)
    except IsosweepError as exc:
        fail(exc.message)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
