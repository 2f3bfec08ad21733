"""`isosweep submit | status | cancel | results | plot | compare`: the REST API's client
(docs/api.md).

    isosweep submit examples/demo.yaml --wait      # a progress bar until the sweep finishes
    isosweep status 3                              # counts, progress, ETA and the trials
    isosweep results 3 --metric grad_norm --layer 1 --epoch 0 --aggregate --csv -o grad.csv
    isosweep plot 3 depth_scaling --group-by init -o grad.png
    isosweep compare 3 4 --metric grad_norm --kind depth_scaling -o fig.png   # one line a sweep
    isosweep compare 3 4 --metric grad_norm --layer 1 --epoch last --aggregate  # one table

The server is --api-url (default ISOSWEEP_API_URL, else http://127.0.0.1:8000); a token in
ISOSWEEP_API_TOKEN is sent as `Authorization: Bearer …`. A server error prints its message in
red and exits 1; exit codes of `submit --wait`: 0 completed, 1 failed, 2 cancelled, 130 when
the wait is interrupted (the sweep runs on). httpx is imported only when a command runs.

The commands are a layer over isosweep.Client (isosweep/client.py): argument parsing, printing
and exit codes here; the URL, the token, error answers, paging, downloads and the event stream
there, once for both.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from api.cli.common import CommandError, err, out
from api.cli.display import format_eta, number, print_trials, styled, table, trial_fields
from api.cli.run import EXIT_CANCELLED, EXIT_COMPLETED, EXIT_FAILED, EXIT_INTERRUPTED
from isosweep.client import (
    DEFAULT_API_URL,
    METRICS_PAGE_ROWS,
    ApiError,
    Client,
    ClientError,
    RowsQuery,
    compare_query,
    metrics_query,
    read_rows,
    sweeps_query,
    trials_query,
)
from service.status import SweepStatus, TrialStatus, trials_finished

TABLE_ROWS = 50  # rows a table shows unless --limit says otherwise
JSON_PAGE_ROWS = 10_000  # rows per request up to a --limit (the route's default JSON page)

# --- talking to the API -----------------------------------------------------------------------


class Api(Client):
    """isosweep.Client as the commands use it: whatever it raises in the block becomes a
    CommandError: the server's own message for an error answer (about a --where key in the
    option's words, where_error), the URL and --api-url for a server that cannot be reached,
    the file for a spec it cannot read."""

    url_hint = "--api-url or ISOSWEEP_API_URL"

    def __init__(self, url: str | None, *, timeout: float = 60.0, where: Any = ()):
        super().__init__(url, timeout=timeout)  # the token from ISOSWEEP_API_TOKEN
        self.where = frozenset(where)  # the --where keys sent: their errors say --where KEY

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
        exc = exc_info[1]
        if isinstance(exc, ApiError):
            raise CommandError(error_message(exc, self.where)) from None
        if isinstance(exc, ClientError):
            raise CommandError(exc.message) from None


def error_message(error: ApiError, where: Any = ()) -> str:
    """An error answer as one line (plain text: common.fail prints it as given): its message
    (HTTP status), the token hint on a 401; an error about a config filter (a key of `where`,
    the --where options sent) in the CLI's words (where_error)."""
    field = (error.field or "").split(".")[0]
    return str(where_error(error, field) if field and field in where else error)


def where_error(error: ApiError, key: str) -> ApiError:
    """A REST answer about the query parameter `key`, said of `--where key`: an unknown one
    is "--where activaton: unknown config field; did you mean 'activation'? (allowed: the
    config fields)", not the route's "unknown query parameter" and its parameter list."""
    from service.config import FILTER_FIELDS
    from service.errors import InvalidInput

    option = f"--where {key}"
    if error.message.startswith(f"{key}: unknown query parameter"):
        message = InvalidInput(
            "unknown config field", field=option, allowed=FILTER_FIELDS, given=key
        ).message
        allowed: list[str] | None = list(FILTER_FIELDS)
    else:
        message = f"--where {error.message}" if error.message.startswith(key) else error.message
        allowed = error.allowed
    return ApiError(message, status=error.status, type=error.type, field=option, allowed=allowed)


# --- the sub-commands -------------------------------------------------------------------------


def register(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--api-url",
        help=f"the server (default ISOSWEEP_API_URL, else {DEFAULT_API_URL}); "
        "the token comes from ISOSWEEP_API_TOKEN",
    )
    common.add_argument("--timeout", type=float, default=60.0, help="seconds per request")

    p = subparsers.add_parser("submit", parents=[common], help="submit a sweep spec to the API")
    p.add_argument("spec", type=Path, metavar="SPEC", help="sweep spec file (.yaml or .json)")
    p.add_argument("--wait", action="store_true", help="show progress until the sweep finishes")
    p.add_argument("--rerun", action="store_true", help="run trials even if results are stored")
    p.add_argument("--poll-s", type=float, default=1.0, help="--wait polls this often (s)")
    p.set_defaults(func=submit)

    p = subparsers.add_parser("status", parents=[common], help="sweeps, or one sweep's trials")
    p.add_argument("sweep", nargs="?", type=int, metavar="SWEEP", help="a sweep id")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.add_argument("--limit", type=int, default=TABLE_ROWS, help="rows shown (default 50)")
    p.set_defaults(func=status)

    p = subparsers.add_parser("cancel", parents=[common], help="cancel a sweep")
    p.add_argument("sweep", type=int, metavar="SWEEP")
    p.set_defaults(func=cancel)

    p = subparsers.add_parser(
        "results",
        parents=[common],
        help="a sweep's metrics: table, CSV or JSON",
        description="Tidy rows (trial_id, swept config fields, epoch, metric, layer, value) of a "
        "sweep, or with --aggregate mean (and --stat's geomean or median), std, ci95, count and "
        "n_finite over seeds. NaN and ±inf "
        "are values (CSV: NaN, Infinity, -Infinity).",
    )
    p.add_argument("sweep", type=int, metavar="SWEEP")
    p.add_argument("--metric", action="append", metavar="M", help="a metric (repeatable)")
    p.add_argument("--epoch", action="append", metavar="N|last", help="an epoch, or last")
    p.add_argument("--layer", action="append", type=int, metavar="L", help="a layer ℓ ≥ 1")
    p.add_argument("--where", action="append", metavar="K=V", help="config filter (repeatable)")
    p.add_argument("--aggregate", action="store_true", help="mean and 95%% CI over seeds")
    p.add_argument("--stat", choices=("mean", "geomean", "median"), help="with --aggregate: "
                   "also this pooled value (a geomean or median column)")  # fmt: skip
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV (every row) instead of a table")
    fmt.add_argument("--json", action="store_true", help="JSON {data, count, columns}")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here (CSV default)")
    p.add_argument("--limit", type=int, help="at most this many rows (table: 50)")
    p.set_defaults(func=results)

    p = subparsers.add_parser("plot", parents=[common], help="save a plot of a sweep (PNG, SVG)")
    p.add_argument("sweep", type=int, metavar="SWEEP")
    p.add_argument("kind", metavar="KIND", help="layer_profile, depth_scaling, training_curves, "
                   "heatmap, theory_overlay; of a search: search_history, search_slice, "
                   "parallel_coordinates, param_importances, halving_rungs")  # fmt: skip
    p.add_argument("--metric", action="append", metavar="M", help="repeatable (training_curves)")
    p.add_argument("--x", help="the x axis: a config field, epoch or layer")
    p.add_argument("--group-by", help="one line (or heatmap row) per value of")
    p.add_argument("--epoch", metavar="N|last", help="a recorded epoch, or last")
    p.add_argument("--layer", type=int, metavar="L", help="layer ℓ ≥ 1, or −k from the end")
    p.add_argument("--trial", type=int, metavar="T", help="draw only this trial")
    p.add_argument("--where", action="append", metavar="K=V", help="config filter (repeatable)")
    p.add_argument("-o", "--output", type=Path, metavar="FILE",
                   help="default sweep-SWEEP-KIND.FORMAT; - for stdout")  # fmt: skip
    p.add_argument("--format", choices=("png", "svg"), help="default from -o, else png")
    p.add_argument("--stat", metavar="S", help="pool seeds by mean, geomean or median "
                   "(default: geomean for a gap or gradient norm against depth or layer, else "
                   "mean)")  # fmt: skip
    p.add_argument("--band", metavar="B", help="ci, std, iqr or none (default ci; median: iqr)")
    p.add_argument("--nonfinite", metavar="N", help="propagate (default) or exclude: drop "
                   "NaN/±inf values of a point, counted in the figure")  # fmt: skip
    p.add_argument("--xscale", metavar="S", help="auto (default), log or linear")
    p.add_argument("--yscale", metavar="S", help="auto, log or linear (default: log for a gap "
                   "or gradient norm against depth or layer, else auto)")  # fmt: skip
    p.add_argument("--mode", choices=("min", "max"), help="a search kind's objective: min or "
                   "max (default: the search's)")  # fmt: skip
    p.set_defaults(func=plot)

    p = subparsers.add_parser(
        "compare",
        parents=[common],
        help="several sweeps in one table, or with --kind one figure",
        description="The sweeps' tidy rows stacked with sweep_id and sweep, a label naming the "
        'spec parameters that differ between them ("sweep 3 (norm=batch)"); with --kind, '
        "one figure with a line per sweep (layer_profile, depth_scaling, training_curves).",
    )
    p.add_argument("sweeps", type=int, nargs="+", metavar="SWEEP", help="sweep ids (at most 8)")
    p.add_argument("--kind", metavar="KIND", help="draw this plot kind instead of a table: "
                   "layer_profile, depth_scaling or training_curves")  # fmt: skip
    p.add_argument("--metric", action="append", metavar="M", help="a metric (repeatable)")
    p.add_argument("--epoch", action="append", metavar="N|last", help="an epoch, or last "
                   "(a figure: one)")  # fmt: skip
    p.add_argument("--layer", action="append", type=int, metavar="L", help="a layer ℓ ≥ 1 "
                   "(a figure: one, or −k from the end)")  # fmt: skip
    p.add_argument("--where", action="append", metavar="K=V", help="config filter (repeatable)")
    p.add_argument("--aggregate", action="store_true", help="table: mean and 95%% CI over seeds")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="table: CSV (every row)")
    fmt.add_argument("--json", action="store_true", help="table: JSON {data, count, columns}")
    p.add_argument("--limit", type=int, help="table: at most this many rows (default 50)")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here: a figure "
                   "(default compare-3-4-KIND.FORMAT; - for stdout) or CSV")  # fmt: skip
    p.add_argument("--x", help="figure: the x axis (depth_scaling: a numeric config field)")
    p.add_argument("--group-by", help="figure: one line per value of (default: sweep)")
    p.add_argument("--format", choices=("png", "svg"), help="figure: default from -o, else png")
    for name, text in PLOT_OPTION_HELP.items():
        p.add_argument(f"--{name}", metavar=name[0].upper(), help=f"figure: {text}")
    p.set_defaults(func=compare)


def submit(args: argparse.Namespace) -> int:
    with Api(args.api_url, timeout=args.timeout) as api:
        sweep = api.submit(args.spec, rerun=args.rerun)  # a file it cannot read: SpecError
        reused = sweep["counts"][TrialStatus.COMPLETED] + sweep["counts"][TrialStatus.DIVERGED]
        out.print(
            f"sweep [bold]{sweep['id']}[/] ({escape(sweep['name'])}): {sweep['n_trials']} trials"
            + (f", {reused} with stored results" if reused else "")
        )
        if sweep.get("estimate"):  # a server that estimates costs (service.cost)
            out.print(escape(estimate_line(sweep["estimate"])))
        out.print(f"follow it: isosweep status {sweep['id']} · {api.url}/sweeps/{sweep['id']}")
        if not args.wait:
            return 0
        try:  # the bar on stderr, moved by the sweep's events (else polled every --poll-s)
            sweep = api.wait(sweep["id"], poll_s=args.poll_s)
        except KeyboardInterrupt:
            err.print(
                f"stopped waiting; sweep {sweep['id']} runs on (isosweep cancel {sweep['id']})"
            )
            return EXIT_INTERRUPTED
    print_outcome(sweep)
    return {SweepStatus.COMPLETED: EXIT_COMPLETED, SweepStatus.CANCELLED: EXIT_CANCELLED}.get(
        sweep["status"], EXIT_FAILED
    )


def estimate_line(estimate: dict[str, Any]) -> str:
    """ "cost: ≈ 1.3 h (12 trial-epochs, 4.1 TFLOP) on this runner's measured 3.1 GFLOP/s per
    CPU …" from a sweep's `estimate` (service.cost.CostEstimate)."""
    from service.cost import format_duration, format_flops

    return (
        f"cost: ≈ {format_duration(estimate['seconds'])} ({estimate['trial_epochs']} "
        f"trial-epochs, {format_flops(estimate['flops'])}, {estimate['parallel']} trials at "
        f"once) on {estimate['throughput_source']}"
    )


def status(args: argparse.Namespace) -> int:
    with Api(args.api_url, timeout=args.timeout) as api:
        if args.sweep is None:
            page = api.page(sweeps_query(), limit=args.limit)
            if args.json:
                return print_json(page)
            return print_sweeps(page)
        sweep = api.sweep(args.sweep)
        if args.json:
            return print_json(sweep)
        trials = api.page(trials_query(args.sweep), limit=args.limit)
    print_sweep(sweep)
    print_trials_page(sweep, trials)
    return 0


def cancel(args: argparse.Namespace) -> int:
    with Api(args.api_url, timeout=args.timeout) as api:
        sweep = api.cancel(args.sweep)
    if sweep["status"] == SweepStatus.RUNNING:
        out.print(f"sweep {sweep['id']}: cancel requested; its running trials stop soon")
    else:
        out.print(f"sweep {sweep['id']}: {styled(sweep['status'])}")
    return 0


def results(args: argparse.Namespace) -> int:
    return table_or_file(args, metrics_query(args.sweep, **row_filters(args)))


def row_filters(args: argparse.Namespace) -> dict[str, Any]:
    """The metrics routes' filters from results' and compare's options."""
    return {"metric": args.metric, "epoch": args.epoch, "layer": args.layer,
            "where": filters(args.where), "aggregate": args.aggregate,
            "stat": args.stat}  # fmt: skip


def table_or_file(args: argparse.Namespace, query: RowsQuery) -> int:
    """The rows of a metrics route (`query`) as a table, JSON, or CSV (--csv or -o FILE)."""
    kind = "json" if args.json else "csv" if args.csv or args.output else "table"
    if kind == "csv":
        return save_csv(args, query)
    limit = args.limit or (TABLE_ROWS if kind == "table" else None)
    with Api(args.api_url, timeout=args.timeout, where=filters(args.where)) as api:
        page = fetch_rows(api, query.path, query.params, limit)
    if kind == "json":
        text = json.dumps(page, ensure_ascii=False)
        if args.output:
            args.output.write_text(text + "\n", encoding="utf-8")
            err.print(f"wrote {len(page['data'])} rows to {escape(str(args.output))}")
        else:
            print(text)
        return 0
    print_rows(page)
    return 0


PLOT_OPTION_HELP = {  # compare's figure options, worded as plot's
    "stat": "mean, geomean or median (default: geomean for a gap or gradient norm against "
    "depth or layer, else mean)",
    "band": "ci, std, iqr or none (default ci; median: iqr)",
    "nonfinite": "propagate (default) or exclude",
    "xscale": "auto (default), log or linear",
    "yscale": "auto, log or linear (default: log for a gap or gradient norm against depth or "
    "layer, else auto)",
}


def compare(args: argparse.Namespace) -> int:
    """A table of the sweeps' rows (GET /compare/metrics), or with --kind a figure (GET
    /compare/plots/KIND)."""
    if args.kind is None:
        figure_only = [f"--{k.replace('_', '-')}" for k in ("x", "group_by", "format",
                       *PLOT_OPTION_HELP) if getattr(args, k) is not None]  # fmt: skip
        if args.output and args.output.suffix.lower() in (".png", ".svg"):
            figure_only.append(f"-o {args.output}")
        if figure_only:
            raise CommandError(f"{', '.join(figure_only)} draw a figure: add --kind KIND", code=2)
        return table_or_file(args, compare_query(args.sweeps, **row_filters(args)))
    if args.aggregate or args.csv or args.json or args.limit:
        raise CommandError("--aggregate, --csv, --json and --limit make a table: drop --kind",
                           code=2)  # fmt: skip
    for name in ("epoch", "layer"):
        if len(getattr(args, name) or []) > 1:
            raise CommandError(f"a figure shows one --{name}", code=2)
    fmt = args.format or ("svg" if args.output and args.output.suffix.lower() == ".svg" else "png")
    given = {"x": args.x, "group_by": args.group_by, "epoch": (args.epoch or [None])[0],
             "layer": (args.layer or [None])[0]}  # fmt: skip
    given |= {k: getattr(args, k) for k in PLOT_OPTION_HELP}
    params = {k: v for k, v in given.items() if v is not None}
    with Api(args.api_url, timeout=args.timeout, where=filters(args.where)) as api:
        image = api.compare_plot(args.sweeps, args.kind, format=fmt, where=filters(args.where),
                                 metric=args.metric, **params)  # fmt: skip
    if str(args.output) == "-":
        sys.stdout.buffer.write(image)
        return 0
    ids = "-".join(str(s) for s in dict.fromkeys(args.sweeps))
    path = args.output or Path(f"compare-{ids}-{args.kind}.{fmt}")
    path.write_bytes(image)
    out.print(f"wrote {escape(str(path))} ({len(image):,} bytes, {fmt})")
    return 0


def plot(args: argparse.Namespace) -> int:
    fmt = args.format or ("svg" if args.output and args.output.suffix.lower() == ".svg" else "png")
    given = {"x": args.x, "group_by": args.group_by, "epoch": args.epoch, "layer": args.layer}
    given |= {k: getattr(args, k) for k in ("stat", "band", "nonfinite", "xscale", "yscale")}
    given["mode"] = getattr(args, "mode", None)
    params = {k: v for k, v in {**given, "trial": args.trial}.items() if v is not None}
    with Api(args.api_url, timeout=args.timeout, where=filters(args.where)) as api:
        image = api.plot(args.sweep, args.kind, format=fmt, where=filters(args.where),
                         metric=args.metric, **params)  # fmt: skip
    if str(args.output) == "-":
        sys.stdout.buffer.write(image)
        return 0
    path = args.output or Path(f"sweep-{args.sweep}-{args.kind}.{fmt}")
    path.write_bytes(image)
    out.print(f"wrote {escape(str(path))} ({len(image):,} bytes, {fmt})")
    return 0


# --- pieces -----------------------------------------------------------------------------------


def filters(items: list[str] | None) -> dict[str, list[str]]:
    """--where k=v … → {k: [v, …]} (the API validates the fields and values; Api says its
    errors about them in the option's words, where_error)."""
    out_: dict[str, list[str]] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--where expects key=value, got {item!r}", code=2)
        out_.setdefault(key.strip(), []).append(value.strip())
    return out_


def fetch_rows(api: Any, path: str | int, params: Any, limit: int | None) -> dict:
    """JSON rows of a metrics route (`path`, or a sweep id: its metrics_query), page by page
    (isosweep.client.read_rows over `api.json`), up to `limit`. Every page makes the server
    read the sweep's frame again, so without a limit the pages are the route's largest
    (METRICS_PAGE_ROWS, its MAX_JSON_ROWS)."""
    size = METRICS_PAGE_ROWS if limit is None else JSON_PAGE_ROWS
    if isinstance(path, int):
        path = metrics_query(path).path
    return read_rows(api.json, path, params, size, limit)


def save_csv(args: argparse.Namespace, query: RowsQuery) -> int:
    """Stream the API's CSV of a metrics route (`query`; every row, or --limit) to -o FILE or
    stdout."""
    limit = args.limit or None
    with Api(args.api_url, timeout=args.timeout, where=filters(args.where)) as api:
        if not args.output:
            api.save_csv(query, sys.stdout.buffer, limit=limit)
            sys.stdout.flush()
            return 0
        with open(args.output, "wb") as sink:
            r = api.save_csv(query, sink, limit=limit)
    rows = r.headers.get("X-Total-Count", "?")
    err.print(f"wrote {escape(str(args.output))} ({rows} rows)")
    return 0


def print_json(data: Any) -> int:
    print(json.dumps(data, ensure_ascii=False, indent=2))
    return 0


def print_sweeps(page: dict[str, Any]) -> int:
    if not page["data"]:
        out.print("no sweeps yet (isosweep submit SPEC.yaml)")
        return 0
    t = table(None, ["id", "name", "status", "done", "trials", "progress", "ETA", "created"])
    for s in page["data"]:
        done = trials_finished(s["counts"])
        t.add_row(
            str(s["id"]), escape(s["name"]), styled(s["status"]), f"{done}/{s['n_trials']}",
            counts_text(s["counts"]), f"{s['progress']:.0%}",
            format_eta(s["eta_s"]) if s["status"] == SweepStatus.RUNNING else "",
            s["created_at"][:19].replace("T", " "),
        )  # fmt: skip
    out.print(t)
    if page["count"] > len(page["data"]):
        out.print(f"… {page['count'] - len(page['data'])} older sweeps (--limit)")
    return 0


def counts_text(counts: dict[str, int]) -> str:
    """ "3 completed, 1 running": the statuses that have trials, coloured."""
    return ", ".join(f"{n} {styled(k)}" for k, n in counts.items() if n)


def print_outcome(s: dict[str, Any]) -> None:
    line = f"sweep {s['id']}: [bold]{styled(s['status'])}[/] ({counts_text(s['counts'])})"
    out.print(line + (f" — {escape(s['error'])}" if s["error"] else ""))


def print_sweep(s: dict[str, Any]) -> None:
    out.print(f"sweep [bold]{s['id']}[/] ({escape(s['name'])}): {styled(s['status'])}")
    out.print(f"  trials    {s['n_trials']}: {counts_text(s['counts'])}")
    eta = f", ETA {format_eta(s['eta_s'])}" if s["status"] == SweepStatus.RUNNING else ""
    out.print(f"  progress  {s['progress']:.1%}{eta}")
    if s.get("best"):
        b = s["best"]
        out.print(
            f"  best      trial {b['trial_id']}: {b['metric']} = {b['value']:.6g} "
            f"(epoch {b['epoch']}, {b['mode']})"
        )
    for key in ("created_at", "started_at", "finished_at"):
        if s[key]:
            out.print(f"  {key.removesuffix('_at'):<9} {s[key][:19].replace('T', ' ')} UTC")
    if s["cancel_requested"] and s["status"] == SweepStatus.RUNNING:
        out.print("  [yellow]cancel requested[/]")
    if s["error"]:
        out.print(f"  [red]{escape(s['error'])}[/]")


def print_trials_page(sweep: dict[str, Any], page: dict[str, Any]) -> None:
    print_trials(page["data"], trial_fields(sweep["spec"]), total=page["count"])


def print_rows(page: dict[str, Any]) -> None:
    if not page["data"]:
        out.print("no rows match")
        return
    t = table(None, page["columns"])
    for row in page["data"]:
        t.add_row(*(number(row[c]) for c in page["columns"]))
    out.print(t)
    if page["count"] > len(page["data"]):
        shown = len(page["data"])
        out.print(f"{shown} of {page['count']} rows; --csv (or --limit) for all of them")
