"""`isosweep.Client`: the REST API (docs/api.md) from Python, with results as pandas DataFrames.

    with isosweep.Client("http://lab:8000", token="…") as c:
        sweep = c.submit("examples/demo.yaml", wait=True)     # a progress bar until it finishes
        grads = c.metrics(sweep["id"], metric="grad_norm", layer=1, epoch=0, aggregate=True)
        c.plot(sweep["id"], "depth_scaling", metric="grad_norm", path="grad.png")
        both = c.compare([3, 4], metric="grad_norm", epoch="last")   # a `sweep` label column
        c.compare_plot([3, 4], "depth_scaling", metric="grad_norm", path="compare.png")

The server is `url` (default ISOSWEEP_API_URL, else http://127.0.0.1:8000), the token `token`
(default ISOSWEEP_API_TOKEN), sent as `Authorization: Bearer …`. NaN and ±inf travel as the
strings "NaN", "Infinity", "-Infinity" (service.jsonfmt); every numeric column of a returned
DataFrame holds them as floats again. An error answer raises ApiError with the server's type,
message, field and allowed values; a server that cannot be reached raises ApiUnreachable.

The `isosweep` CLI's REST commands (api/cli/client.py) are a layer over this Client: the URL,
the token, error answers, paging (`read_rows`), downloads, the event stream and every route's
path and parameters live here once (the paged routes as `RowsQuery`s: `sweeps_query`,
`trials_query`, `metrics_query`, `compare_query`, read by `page`, `frame` and `save_csv`).
httpx and pandas are imported when first needed, so importing this module (and the CLI) stays
light.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service import jsonfmt, param_columns
from service.errors import IsosweepError
from service.jsonfmt import NONFINITE, decode_float
from service.status import SweepStatus

if TYPE_CHECKING:
    import httpx
    import pandas as pd

DEFAULT_API_URL = "http://127.0.0.1:8000"
PREFIX = "/api/v1"
METRICS_PAGE_ROWS = 100_000  # the metrics route's largest JSON page (its MAX_JSON_ROWS)
TRIALS_PAGE_ROWS = 1000  # the trials route's largest page by default (ISOSWEEP_MAX_PAGE_SIZE)
TOKEN_HINT = " (set ISOSWEEP_API_TOKEN to the server's token)"
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
_JSON = {"Content-Type": "application/json"}

# --- errors -----------------------------------------------------------------------------------


class ClientError(IsosweepError):
    """Base class of what the client raises: a spec it cannot read, an unreachable server, an
    error answer (ApiError)."""


class SpecError(ClientError):
    """A spec the client cannot send: an unreadable file, text that is not YAML or JSON."""


class ApiUnreachable(ClientError):
    """No answer: nothing listens at the URL, or the server did not answer in time."""


class ApiError(ClientError):
    """An error answer, in the API's one shape `{"error": {type, message, field, allowed}}`.

    Attributes: status (HTTP code), type ("invalid_input", "not_found", "unauthorized", …),
    message, field (the offending parameter or spec field, dotted, or None), allowed (the
    values the field takes, or None).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        type: str = "error",
        field: str | None = None,
        allowed: list[str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.type = type
        self.field = field
        self.allowed = allowed

    def __str__(self) -> str:
        return f"{self.message} (HTTP {self.status}){TOKEN_HINT if self.status == 401 else ''}"

    @classmethod
    def from_response(cls, r: httpx.Response) -> ApiError:
        """The error of an answer ≥ 400; a body not in the API's shape gives its text."""
        try:
            error = r.json()["error"]
            message = str(error["message"])
        except (ValueError, KeyError, TypeError):
            return cls(r.text.strip()[:300] or r.reason_phrase, status=r.status_code)
        allowed = error.get("allowed")
        return cls(
            message,
            status=r.status_code,
            type=str(error.get("type") or "error"),
            field=error.get("field"),
            allowed=list(allowed) if allowed is not None else None,
        )


# --- pieces -----------------------------------------------------------------------------------


def base_url(url: str | None = None) -> str:
    """The server's base URL: `url`, else ISOSWEEP_API_URL, else DEFAULT_API_URL, without a
    trailing slash or /api/v1 (either spelling works)."""
    url = (url or os.environ.get("ISOSWEEP_API_URL") or DEFAULT_API_URL).rstrip("/")
    return url.removesuffix(PREFIX)


def auth_headers(token: str | None = None) -> dict[str, str]:
    """The bearer header for `token` (default ISOSWEEP_API_TOKEN); none without a token."""
    token = os.environ.get("ISOSWEEP_API_TOKEN") if token is None else token
    return {"Authorization": f"Bearer {token}"} if token else {}


def unreachable(url: str, exc: Exception, *, where: str) -> ApiUnreachable:
    """A transport failure that names the server's URL and says how to point elsewhere."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return ApiUnreachable(f"the API at {url} did not answer in time")
    if isinstance(exc, httpx.ConnectError):
        return ApiUnreachable(
            f"cannot connect to the isosweep API at {url} ({exc}); "
            f"is `isosweep serve` running there? Set {where}"
        )
    return ApiUnreachable(f"talking to {url}: {exc}")


def spec_body(spec: Mapping[str, Any] | str | Path, *, rerun: bool = False) -> tuple[bytes, str]:
    """A sweep spec as the request body and its media type.

    `spec`: a mapping (sent as JSON; numpy values become numbers, NaN/±inf the API's
    spellings), a pathlib.Path or a str naming an existing file (.json is
    sent as JSON, anything else as YAML), or YAML/JSON text. With `rerun`, the spec gets
    `rerun: true` (run every trial even when results are stored).

    Raises:
        SpecError: an unreadable file, a str that looks like a missing file's name, text that is
            not YAML or JSON, a spec that is not a mapping.
    """
    if isinstance(spec, Mapping):
        data = {**spec, "rerun": True} if rerun else dict(spec)
        return jsonfmt.dumps(data, default=str).encode(), "application/json"
    path = _spec_path(spec)
    where = str(path) if path else "the spec"
    if path is None:
        text, media = str(spec), "application/yaml"
    else:
        text = _read_text(path)
        media = "application/json" if path.suffix.lower() == ".json" else "application/yaml"
    if not rerun:
        return text.encode(), media
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{where} is not YAML or JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{where}: a sweep spec is a mapping (name, parameters, …)")
    return jsonfmt.dumps({**data, "rerun": True}, default=str).encode(), "application/json"


def _spec_path(spec: str | Path) -> Path | None:
    """The file a spec names, or None for spec text."""
    if isinstance(spec, Path):
        return spec
    one_line = "\n" not in spec and len(spec) < 4096
    if one_line and Path(spec).is_file():
        return Path(spec)
    if one_line and spec.strip().lower().endswith(SPEC_SUFFIXES):
        raise SpecError(f"no spec file {spec!r} (give a path, YAML/JSON text or a dict)")
    return None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path} is not UTF-8 text") from None


# --- frames -----------------------------------------------------------------------------------


def _numeric_cell(v: Any) -> bool:
    if isinstance(v, str):
        return v in NONFINITE
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))


def decode_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Turn the spellings "NaN", "Infinity", "-Infinity" back into floats, in place, in every
    column whose cells are all numbers, nulls or those spellings (at least one of them). A
    column with any other string (a config field such as `init`, the metric's name) stays."""
    import pandas as pd

    for name in frame.columns:
        col = frame[name]
        if pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
            continue
        cells = col.tolist()
        spelled = any(isinstance(v, str) for v in cells)
        if spelled and all(_numeric_cell(v) for v in cells):
            frame[name] = pd.Series([decode_float(v) for v in cells], index=col.index, dtype=float)
    return frame


def _params(where: Mapping[str, Any] | None = None, **given: Any) -> list[tuple[str, Any]]:
    """Query parameters: a list value repeats its key; None leaves it out; config filters from
    `where` ({"depth": [2, 8], "init": "orthogonal"}); booleans as true/false."""
    items: list[tuple[str, Any]] = []
    for key, value in [*given.items(), *(where or {}).items()]:
        scalar = isinstance(value, str | bytes) or not isinstance(value, Iterable)
        values = [value] if scalar else list(value)  # lists, tuples, numpy arrays, ranges
        items += [(key, v) for v in values if v is not None]  # httpx spells True "true"
    return items


def read_rows(
    json: Callable[..., Any],
    path: str,
    params: Mapping[str, Any] | list[tuple[str, Any]],
    size: int,
    limit: int | None = None,
) -> dict[str, Any]:
    """Every row of a paged route ({data, count[, columns]}), or its first `limit`, `size` rows
    a request; the answer's shape with `data` all the rows read. `json(method, path,
    params=…)` makes one request (Client.json). A server whose page limit is below `size`
    (ISOSWEEP_MAX_PAGE_SIZE) refuses it naming `limit`, and the size is halved; a count that
    changes between pages (a running sweep's new rows) starts again, twice.

    Raises:
        ClientError: the count changed during all three reads.
    """
    for _ in range(3):
        rows: list[dict[str, Any]] = []
        count: int | None = None
        while True:
            want = size if limit is None else min(size, limit - len(rows))
            page, took = _page(json, path, params, len(rows), want)
            size = took if took < want else size
            if count is not None and page["count"] != count:
                break
            count = page["count"]
            rows += page["data"]
            full = len(rows) >= count or (limit is not None and len(rows) >= limit)
            if full or not page["data"]:
                return {**page, "data": rows}
    raise ClientError(
        f"the rows of {path} changed during every read (a running sweep): read again, "
        "or narrow the query (e.g. epoch=0)"
    )


def _page(json: Callable[..., Any], path: str, params: Any, offset: int, size: int) -> tuple:
    """One page and the page size that worked (halved while the server refuses `limit`)."""
    while True:
        if isinstance(params, Mapping):
            query: Any = {**params, "offset": offset, "limit": size}
        else:
            query = [*params, ("offset", offset), ("limit", size)]
        try:
            return json("GET", path, params=query), size
        except ApiError as exc:
            if exc.field != "limit" or size <= 1:
                raise
            size //= 2


def sse_events(lines: Iterable[str]) -> Iterable[tuple[str, Any]]:
    """(event, data) of a server-sent-events stream's lines (GET /sweeps/{id}/events): the
    `event:` name (default "message") and its `data:` lines joined and read as JSON (the API's
    NaN/±inf spellings stay strings, as in every JSON answer); comment lines (`:`) skipped."""
    import json

    name = "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
    if data:
        yield name, json.loads("\n".join(data))


def _is_finished(status: str) -> bool:
    return SweepStatus(status).is_finished()


# --- the paged routes: each wired here once, for the Client's methods and the CLI's commands ---


@dataclass(frozen=True)
class RowsQuery:
    """A GET of a paged route: its path under /api/v1, its query parameters (as `_params`
    gives them) and the route's largest page. `Client.page` reads its rows as sent,
    `Client.frame` as a DataFrame, `Client.save_csv` streams a metrics route's CSV."""

    path: str
    params: list[tuple[str, Any]]
    page_rows: int = TRIALS_PAGE_ROWS


def sweeps_query(*, status: str | None = None) -> RowsQuery:
    """GET /sweeps: every sweep (or those with `status`), newest first."""
    return RowsQuery("/sweeps", _params(status=status))


def trials_query(
    sweep_id: int, *, status: str | None = None, where: Mapping[str, Any] | None = None
) -> RowsQuery:
    """GET /sweeps/{id}/trials: a sweep's trials in expansion order."""
    return RowsQuery(f"/sweeps/{sweep_id}/trials", _params(where, status=status))


def metrics_query(
    sweep_id: int,
    *,
    metric: str | Iterable[str] | None = None,
    epoch: int | str | Iterable[int | str] | None = None,
    layer: int | Iterable[int] | None = None,
    where: Mapping[str, Any] | None = None,
    aggregate: bool = False,
    stat: str | None = None,
) -> RowsQuery:
    """GET /sweeps/{id}/metrics: a sweep's tidy rows (arguments as `Client.metrics`)."""
    params = _params(where, metric=metric, epoch=epoch, layer=layer, aggregate=aggregate,
                     stat=stat)  # fmt: skip
    return RowsQuery(f"/sweeps/{sweep_id}/metrics", params, METRICS_PAGE_ROWS)


def compare_query(
    sweeps: Iterable[int],
    *,
    metric: str | Iterable[str] | None = None,
    epoch: int | str | Iterable[int | str] | None = None,
    layer: int | Iterable[int] | None = None,
    where: Mapping[str, Any] | None = None,
    aggregate: bool = False,
    stat: str | None = None,
) -> RowsQuery:
    """GET /compare/metrics: several sweeps' tidy rows (arguments as `Client.compare`)."""
    params = _params(where, sweep=list(sweeps), metric=metric, epoch=epoch, layer=layer,
                     aggregate=aggregate, stat=stat)  # fmt: skip
    return RowsQuery("/compare/metrics", params, METRICS_PAGE_ROWS)


# --- the client -------------------------------------------------------------------------------


class Client:
    """An isosweep server's REST API (docs/api.md, docs/python.md).

    Args:
        url: the server (default ISOSWEEP_API_URL, else http://127.0.0.1:8000); with or
            without the /api/v1 suffix.
        token: the server's ISOSWEEP_API_TOKEN (default: this process's ISOSWEEP_API_TOKEN).
        timeout: seconds per request.
    """

    url_hint = "Client(url=…) or ISOSWEEP_API_URL"  # an unreachable server's error says so

    def __init__(self, url: str | None = None, *, token: str | None = None, timeout: float = 60.0):
        import httpx

        self.url = base_url(url)
        self._http = httpx.Client(
            base_url=self.url + PREFIX, headers=auth_headers(token), timeout=timeout
        )

    def __repr__(self) -> str:
        return f"isosweep.Client({self.url!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- requests

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        """Transport failures as ApiUnreachable, naming the server's URL."""
        import httpx

        try:
            yield
        except httpx.HTTPError as exc:
            raise unreachable(self.url, exc, where=self.url_hint) from None

    def request(self, method: str, path: str, *, ok: Iterable[int] = (), **kw: Any):
        """One request under /api/v1; an answer ≥ 400 (other than `ok`) raises ApiError."""
        with self._reaching():
            r = self._http.request(method, path, **kw)
        if r.status_code >= 400 and r.status_code not in ok:
            raise ApiError.from_response(r)
        return r

    def json(self, method: str, path: str, **kw: Any) -> Any:
        """One request under /api/v1 (as `request`), its answer's JSON as sent: NaN and ±inf
        stay the strings "NaN", "Infinity", "-Infinity"."""
        return self.request(method, path, **kw).json()

    def rows(
        self,
        path: str,
        params: Mapping[str, Any] | list[tuple[str, Any]] | None = None,
        *,
        limit: int | None = None,
        page_rows: int | None = None,
    ) -> dict[str, Any]:
        """A paged route's answer ({data, count[, columns]}, values as sent) with every row,
        or the first `limit`, read `page_rows` a request (default: the route's largest page,
        METRICS_PAGE_ROWS for a metrics route, TRIALS_PAGE_ROWS otherwise). `params` as
        `_params` takes them (a list value repeats its key, None leaves it out), or its list of
        pairs. See read_rows."""
        if page_rows is None:
            page_rows = METRICS_PAGE_ROWS if path.endswith("/metrics") else TRIALS_PAGE_ROWS
        query = params if isinstance(params, list) else _params(params)
        return read_rows(self.json, path, query, page_rows, limit)

    def download(self, path: str, sink: Any, *, params: Any = None) -> httpx.Response:
        """GET `path` streamed into `sink` (a binary file) chunk by chunk, e.g. a metrics
        route's CSV (format=csv); the response, for its headers (X-Total-Count)."""
        with self._reaching(), self._http.stream("GET", path, params=params) as r:
            if r.status_code >= 400:
                r.read()
                raise ApiError.from_response(r)
            for chunk in r.iter_bytes():
                sink.write(chunk)
            return r

    def page(
        self, query: RowsQuery, *, limit: int | None = None, page_rows: int | None = None
    ) -> dict[str, Any]:
        """A paged route's answer (`rows`) for `query`: every row, or the first `limit`, read
        `page_rows` a request (default: the route's largest page)."""
        return self.rows(query.path, query.params, limit=limit,
                         page_rows=page_rows or query.page_rows)  # fmt: skip

    def frame(self, query: RowsQuery) -> pd.DataFrame:
        """Every row of a metrics route (`metrics_query`, `compare_query`) as a DataFrame,
        NaN and ±inf as floats (decode_frame)."""
        import pandas as pd

        page = self.page(query)
        return decode_frame(pd.DataFrame(page["data"], columns=page["columns"]))

    def save_csv(self, query: RowsQuery, sink: Any, *, limit: int | None = None) -> httpx.Response:
        """A metrics route's CSV (format=csv; every row, or the first `limit`) streamed into
        `sink` (a binary file); the response, for its X-Total-Count header."""
        params = [*query.params, ("format", "csv"), *_params(limit=limit)]
        return self.download(query.path, sink, params=params)

    # --- sweeps

    def health(self) -> dict[str, Any]:
        """GET /healthz: {"status": "ok" | "degraded", "database", "ray", …} (a degraded
        server answers 503 with the same shape: returned, not raised)."""
        return self.json("GET", "/healthz", ok=(503,))

    def submit(
        self,
        spec: Mapping[str, Any] | str | Path,
        *,
        rerun: bool = False,
        wait: bool = False,
        poll_s: float = 1.0,
        progress: bool = True,
    ) -> dict[str, Any]:
        """Submit a sweep spec (a dict, YAML/JSON text, or a path); the sweep as the API
        describes it (id, status, counts, n_trials, progress, spec, …). With `wait`, the
        finished sweep (see `wait`)."""
        body, media = spec_body(spec, rerun=rerun)
        sweep = self.json("POST", "/sweeps", content=body, headers={"Content-Type": media})
        if wait:
            return self.wait(sweep["id"], poll_s=poll_s, progress=progress)
        return sweep

    def wait(
        self,
        sweep_id: int,
        *,
        poll_s: float = 1.0,
        progress: bool = True,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Follow the sweep until it is completed, failed or cancelled, and return it. With
        `progress`, the CLI's progress bar (trials done, epochs recorded, ETA) on stderr. The
        sweep's event stream (`events`) moves the bar; a server without one, one that refuses
        it (busy), or a stream that breaks is polled every `poll_s` seconds instead, and so is
        every wait with a `timeout_s`.

        Raises:
            TimeoutError: not finished after `timeout_s` seconds (the sweep runs on). An
                interrupt (KeyboardInterrupt) likewise leaves it running: cancel(id) stops it.
        """
        from api.cli.display import SweepBar  # rich only: the bar `isosweep submit` draws

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        followed = deadline is not None  # a stream has no deadline: poll instead
        with SweepBar(sweep_id, quiet=not progress) as bar:
            while True:
                sweep = self.sweep(sweep_id)
                bar.show_sweep(sweep)
                if _is_finished(sweep["status"]):
                    return sweep
                if not followed:
                    followed = True
                    final = self._follow(sweep_id, bar)
                    if final is not None:
                        return final
                    continue
                if deadline is not None and time.monotonic() + poll_s > deadline:
                    raise TimeoutError(
                        f"sweep {sweep_id} is still {sweep['status']} after {timeout_s} s "
                        "(it runs on; cancel it with Client.cancel)"
                    )
                time.sleep(poll_s)

    def _follow(self, sweep_id: int, bar: Any) -> dict[str, Any] | None:
        """The sweep's events shown on `bar` until its `end` event: the final sweep; None when
        the server has no event stream, refuses it, or the stream breaks."""
        try:
            for name, data in self.events(sweep_id):
                if name in ("progress", "end"):
                    bar.show_sweep(data)
                if name == "end":
                    return data
        except (ClientError, ValueError):  # an error answer, no answer, a line not JSON
            return None
        return None

    def events(self, sweep_id: int) -> Iterable[tuple[str, Any]]:
        """The sweep's live events (GET /sweeps/{id}/events; docs/api.md, "Live") as they come:
        ("progress", sweep) when it changes, ("trial", trial) for each trial that finishes,
        and ("end", sweep) last, when the sweep is completed, cancelled or failed. The read
        timeout is the client's: the server sends a keep-alive line every 15 s."""
        with self._reaching(), self._http.stream("GET", f"/sweeps/{sweep_id}/events") as r:
            if r.status_code >= 400:
                r.read()
                raise ApiError.from_response(r)
            yield from sse_events(r.iter_lines())

    def sweep(self, sweep_id: int) -> dict[str, Any]:
        """One sweep: status, counts by trial status, n_trials, progress, eta_s, spec, …"""
        return self.json("GET", f"/sweeps/{sweep_id}")

    def sweeps(self, *, status: str | None = None) -> list[dict[str, Any]]:
        """Every sweep (or those with `status`), newest first."""
        return self.page(sweeps_query(status=status))["data"]

    def cancel(self, sweep_id: int) -> dict[str, Any]:
        """Cancel a sweep: queued trials stop at once, running ones soon; stored results stay.
        Returns the sweep (still `running` until its runner has stopped)."""
        return self.json("POST", f"/sweeps/{sweep_id}/cancel")

    # --- external sweeps: the user's own training loop (isosweep.Monitor, docs/own-loop.md)

    def external_sweep(self, name: str, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Find the external sweep called `name`, or create it (spec {external: true, …})."""
        body = jsonfmt.dumps({"name": name, "config": dict(config or {})}, default=str)
        return self.json("POST", "/external/sweeps", content=body, headers=_JSON)

    def external_trial(
        self,
        sweep_id: int,
        run: str,
        *,
        depth: int,
        batch_size: int,
        config: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Find the external sweep's trial of run key `run`, or create it (running)."""
        body = {"run": run, "depth": depth, "batch_size": batch_size, "config": dict(config or {})}
        return self.json(
            "POST",
            f"/external/sweeps/{sweep_id}/trials",
            content=jsonfmt.dumps(body, default=str),
            headers=_JSON,
        )

    def external_record(self, trial_id: int, step: int, record: Mapping[str, Any]) -> dict:
        """Store one step's record of an external trial (numpy arrays and NaN/±inf welcome):
        {stored, step, last_step, diverged, cancel_requested, status}. The same step with the
        same record again stores nothing (stored: false); another record for a stored step is
        an ApiError 409, a step below the last stored one 422."""
        body = jsonfmt.dumps({"step": int(step), "record": dict(record)})
        return self.json(
            "POST", f"/external/trials/{trial_id}/records", content=body, headers=_JSON
        )

    def external_finish(self, trial_id: int) -> dict[str, Any]:
        """End an external trial (completed, or diverged): {trial, sweep}."""
        return self.json("POST", f"/external/trials/{trial_id}/finish")

    # --- results

    def trials(
        self, sweep_id: int, *, status: str | None = None, where: Mapping[str, Any] | None = None
    ) -> pd.DataFrame:
        """A sweep's trials in expansion order, one row each: trial_id, index, every config
        field as a column, status, attempts, epochs_done, epochs_total, last_epoch,
        diverged_epoch, results_from, error, started_at/finished_at (datetimes), and the last
        epoch's scalar metrics as `summary.<metric>` (floats, NaN/±inf included). `where`
        filters on config fields ({"depth": [2, 8]})."""
        import pandas as pd

        page = self.page(trials_query(sweep_id, status=status, where=where))
        frame = pd.DataFrame([_trial_row(t) for t in page["data"]])
        for name in ("started_at", "finished_at"):
            if name in frame:
                frame[name] = pd.to_datetime(frame[name], format="ISO8601", utc=True)
        return decode_frame(frame)

    def metrics(
        self,
        sweep_id: int,
        *,
        metric: str | Iterable[str] | None = None,
        epoch: int | str | Iterable[int] | None = None,
        layer: int | Iterable[int] | None = None,
        where: Mapping[str, Any] | None = None,
        aggregate: bool = False,
        stat: str | None = None,
    ) -> pd.DataFrame:
        """The sweep's tidy rows (docs/api.md, "Metrics"), every page of them: trial_id, the
        swept config fields, epoch, metric, layer (NaN for scalar metrics), value; with
        `aggregate`, pooled over seeds: mean, std, ci95, count, n_finite, and with `stat`
        "geomean" or "median" a column of that name. `epoch` may be "last" (each trial's
        highest stored epoch). Values are floats, NaN and ±inf included.

        Raises:
            ApiError: an unknown metric, field or value (named in .field), or a query over the
                server's ISOSWEEP_MAX_POINTS (narrow it with metric, epoch, layer or where).
        """
        return self.frame(metrics_query(sweep_id, metric=metric, epoch=epoch, layer=layer,
                                        where=where, aggregate=aggregate, stat=stat))  # fmt: skip

    def plot(
        self,
        sweep_id: int,
        kind: str,
        *,
        format: str | None = None,
        path: str | Path | None = None,
        where: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> bytes:
        """A figure of the sweep, drawn by the server (docs/plots.md): `kind` one of
        layer_profile, depth_scaling, training_curves, heatmap, theory_overlay, or of its search
        search_history, search_slice, parallel_coordinates, param_importances, halving_rungs;
        `params` the route's (metric, x, group_by, epoch, layer, trial; mode for the search
        kinds). PNG or SVG bytes (`format`, default from `path`'s suffix, else png), also
        written to `path` when given."""
        if format is None:
            format = "svg" if path is not None and Path(path).suffix.lower() == ".svg" else "png"
        query = _params(where, format=format, **params)
        image = self.request("GET", f"/sweeps/{sweep_id}/plots/{kind}", params=query).content
        if path is not None:
            Path(path).write_bytes(image)
        return image

    # --- comparing sweeps

    def compare(
        self,
        sweeps: Iterable[int],
        *,
        metric: str | Iterable[str] | None = None,
        epoch: int | str | Iterable[int] | None = None,
        layer: int | Iterable[int] | None = None,
        where: Mapping[str, Any] | None = None,
        aggregate: bool = False,
        stat: str | None = None,
    ) -> pd.DataFrame:
        """Several sweeps' tidy rows in one frame (docs/api.md, "Comparing sweeps"): sweep_id,
        sweep (the label: "sweep 3 (norm=batch)", the spec parameters that differ between
        them), trial_id, the config fields swept in any of them, epoch, metric, layer, value;
        with `aggregate`, pooled over seeds within each sweep. Arguments as `metrics`.

        Raises:
            ApiError: a sweep that does not exist (404), or as `metrics` (a metric, epoch or
                layer a sweep does not have names the sweep).
        """
        return self.frame(compare_query(sweeps, metric=metric, epoch=epoch, layer=layer,
                                        where=where, aggregate=aggregate, stat=stat))  # fmt: skip

    def compare_plot(
        self,
        sweeps: Iterable[int],
        kind: str,
        *,
        format: str | None = None,
        path: str | Path | None = None,
        where: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> bytes:
        """One figure of several sweeps, a line per sweep: `kind` one of layer_profile,
        depth_scaling, training_curves; `params` the route's (metric, x, group_by — default
        `sweep` —, epoch, layer, stat, band, nonfinite, xscale, yscale). PNG or SVG bytes, as
        `plot`, also written to `path` when given."""
        if format is None:
            format = "svg" if path is not None and Path(path).suffix.lower() == ".svg" else "png"
        query = _params(where, sweep=list(sweeps), format=format, **params)
        image = self.request("GET", f"/compare/plots/{kind}", params=query).content
        if path is not None:
            Path(path).write_bytes(image)
        return image


TRIAL_KEYS = ("status", "attempts", "epochs_done", "epochs_total", "last_epoch",
              "diverged_epoch", "results_from", "error", "started_at", "finished_at",
              "config_hash", "sweep_id")  # fmt: skip


def _trial_row(t: dict[str, Any]) -> dict[str, Any]:
    """A TrialPublic as one flat row: config fields bare (prefixed `config.` should one ever
    share a trial key's name), a model's parameters also as `model_params.<name>` (as metrics
    rows have them), the summary's metrics as `summary.<metric>`."""
    row: dict[str, Any] = {"trial_id": t["id"], "index": t["index"]}
    taken = {"trial_id", "index", *TRIAL_KEYS}
    row |= {(f"config.{k}" if k in taken else k): v for k, v in t["config"].items()}
    params = t["config"].get(param_columns.FIELD)
    if isinstance(params, dict):  # a registered model's parameters, one column each
        row |= {param_columns.column_of(k): param_columns.cell(v) for k, v in params.items()}
    row |= {k: t[k] for k in TRIAL_KEYS if k in t}
    row |= {f"summary.{k}": v for k, v in t["summary"].items()}
    return row
