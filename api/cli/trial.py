"""`isosweep trial`: one trial in the foreground, one JSON object per recorded epoch on stdout."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from api.cli.common import CommandError, parse_overrides


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "trial",
        help="run one trial and print its epoch records as JSON lines",
        description=(
            "Run one trial (no Ray, no database) and print one JSON object per recorded epoch. "
            "Per-layer metrics are arrays indexed by block 1..L; NaN and ±inf are written as "
            'the strings "NaN", "Infinity", "-Infinity".'
        ),
    )
    p.add_argument("--config", type=Path, help="TrialConfig as JSON (default: all defaults)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar="KEY=VALUE",
        help="override one config field (repeatable), e.g. --set depth=50",
    )
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default: 1, as a sweep trial with resources.cpu = 1 runs); "
        "records are bit-identical at equal thread counts",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        help="torchvision datasets root (default: ISOSWEEP_DATA_DIR, else "
        "~/.local/share/isosweep/data — the directory `serve` and `run` use)",
    )
    p.set_defaults(func=run_trial)


def read_config(path: Path | None, overrides: list[str] | None):
    """The TrialConfig of a JSON file plus `key=value` overrides.

    Raises:
        CommandError: unreadable file or JSON that is not an object.
        InvalidInput: unknown keys or invalid values (names the field and what is allowed).
    """
    from service.config import parse_trial_config

    data: dict = {}
    if path is not None:
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise CommandError(f"--config: cannot read {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise CommandError(f"--config: {path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise CommandError(f"--config: {path} must hold a JSON object of TrialConfig fields")
    data.update(parse_overrides(overrides))
    return parse_trial_config(data)


def check_data(dataset: str, data_dir: Path | None) -> Path:
    """The absolute data directory; a torchvision set missing from it (downloads off) is refused
    before torch is imported, as a sweep would be at submit.

    Raises:
        DataUnavailable: names the directory and the missing files.
    """
    from service.datasets import missing_files, unavailable_message
    from service.errors import DataUnavailable
    from service.settings import get_settings

    settings = get_settings()
    root = settings.data_dir if data_dir is None else data_dir.expanduser().resolve()
    missing = [] if settings.allow_download else missing_files(dataset, root)
    if missing:
        raise DataUnavailable(unavailable_message(dataset, root, missing))
    return root


def run_trial(args: argparse.Namespace) -> int:
    config = read_config(args.config, args.overrides)
    data_dir = check_data(config.dataset, args.data_dir)
    from service.jsonfmt import dumps
    from workers.train import fit  # torch is imported here, not when the CLI starts

    try:
        records = fit(config, device=args.device, data_dir=data_dir, threads=args.threads)
        for record in records:
            sys.stdout.write(dumps(record) + "\n")
            sys.stdout.flush()
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
