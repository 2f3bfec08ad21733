"""What every sub-command shares: failing in red with a non-zero exit, and the rich consoles."""

from __future__ import annotations

import sys
from typing import NoReturn

from rich.console import Console
from rich.text import Text

# Piped output (logs, `| less`) is not cut to rich's default 80 columns: tables stay whole.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


class CommandError(Exception):
    """Raised by a sub-command to stop with a message in red and exit code 1 (2 for usage)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.message = message
        self.code = code


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `error: message` to stderr and exit. The message is plain text, never markup: it
    often holds user input (a spec's name, a file path, `[/x]`), printed as given."""
    err.print(Text.assemble(("error: ", "bold red"), message), highlight=False, soft_wrap=True)
    sys.exit(code)


def parse_overrides(items: list[str] | None) -> dict[str, object]:
    """`key=value` pairs; values are read as YAML scalars (numbers, booleans, null, strings)."""
    import yaml

    result: dict[str, object] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"--set expects key=value, got {item!r}", code=2)
        result[key.strip()] = yaml.safe_load(value) if value != "" else ""
    return result
