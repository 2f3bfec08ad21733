"""The one HTTP client both `isosweep.Client` and the CLI's REST commands use (isosweep/client.py,
api/cli/client.py), against scripted servers (httpx.MockTransport): the pager (`read_rows`: a
limit, a page size the server refuses, a count that changes under a read), `wait` following the
event stream and falling back to polling, and the CLI's `Api` turning what the client raises
into CommandErrors. The live-server tests are tests/test_client.py and tests/api/test_cli_*.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from support import free_port

from api.cli.client import Api
from api.cli.common import CommandError
from isosweep.client import PREFIX, ApiError, ApiUnreachable, Client, ClientError, read_rows
from service.status import SweepStatus, TrialStatus

# --- the pager ------------------------------------------------------------------------------------


class Rows:
    """A paged route of `total` rows whose page limit is `max_page` (a larger `limit` is refused
    naming the field, as the API does); `counts` the count each read reports, in order."""

    def __init__(self, total: int, max_page: int = 10**6, counts: list[int] | None = None):
        self.total, self.max_page, self.counts = total, max_page, list(counts or [])
        self.asked: list[tuple[int, int]] = []

    def json(self, method: str, path: str, *, params: Any) -> dict[str, Any]:
        query = dict(params) if isinstance(params, list) else params
        offset, limit = query["offset"], query["limit"]
        self.asked.append((offset, limit))
        if not 1 <= limit <= self.max_page:
            raise ApiError(f"limit: at most {self.max_page}", status=422, field="limit")
        count = self.counts.pop(0) if self.counts else self.total
        n = max(0, min(limit, count - offset))
        data = [{"i": offset + k} for k in range(n)]
        return {"data": data, "count": count, "columns": ["i"]}


def test_rows_up_to_a_limit_in_pages_the_server_takes():
    server = Rows(total=100, max_page=4)
    page = read_rows(server.json, "/x", {"metric": ["a"]}, size=10, limit=9)
    # 9 refused, halved to 4 (taken, and kept), then 4, then the 1 the limit leaves
    assert [limit for _, limit in server.asked] == [9, 4, 4, 1]
    assert [offset for offset, _ in server.asked] == [0, 0, 4, 8]
    assert [r["i"] for r in page["data"]] == list(range(9))
    assert page["count"] == 100 and page["columns"] == ["i"]


def test_every_row_without_a_limit_and_an_empty_route():
    server = Rows(total=23)
    page = read_rows(server.json, "/x", [("metric", "a")], size=10)
    assert server.asked == [(0, 10), (10, 10), (20, 10)]
    assert [r["i"] for r in page["data"]] == list(range(23))
    empty = Rows(total=0)
    assert read_rows(empty.json, "/x", {}, size=10)["data"] == [] and empty.asked == [(0, 10)]


def test_a_count_that_changes_under_a_read_starts_it_again():
    # first read: 20 rows, then 25 on its second page (a running sweep): read again, stable
    server = Rows(total=25, counts=[20, 25, 25, 25, 25])
    page = read_rows(server.json, "/x", {}, size=10)
    assert [r["i"] for r in page["data"]] == list(range(25)) and page["count"] == 25
    assert [offset for offset, _ in server.asked] == [0, 10, 0, 10, 20]
    moving = Rows(total=10**6, counts=[10, 20, 30, 40, 50, 60])
    with pytest.raises(ClientError, match="changed during every read"):
        read_rows(moving.json, "/x", {}, size=5)
    assert len(moving.asked) == 6  # three reads of two pages each, then no more


def test_a_limit_the_server_refuses_outright_is_its_error_not_a_loop():
    for limit in (0, -5):
        server = Rows(total=10)
        with pytest.raises(ApiError) as info:
            read_rows(server.json, "/x", {}, size=10, limit=limit)
        assert info.value.field == "limit" and server.asked == [(0, limit)]
    other = Rows(total=10)

    def refuses(method: str, path: str, *, params: Any) -> Any:
        other.asked.append(params)
        raise ApiError("metric: unknown", status=422, field="metric")

    with pytest.raises(ApiError, match="metric: unknown"):
        read_rows(refuses, "/x", {}, size=10)
    assert len(other.asked) == 1  # not halved: the error is not about the page size


# --- a scripted server ----------------------------------------------------------------------------


def sweep_json(status: str, done: int = 0) -> dict[str, Any]:
    counts = {s.value: 0 for s in TrialStatus}
    counts[TrialStatus.COMPLETED] = done
    counts[TrialStatus.QUEUED] = 4 - done
    return {"id": 1, "status": status, "counts": counts, "n_trials": 4,
            "progress": done / 4, "eta_s": None}  # fmt: skip


def sse(*events: tuple[str, Any]) -> bytes:
    lines = [": keep-alive\n\n"]
    lines += [f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events]
    return "".join(lines).encode()


class Server:
    """GET /sweeps/1 answers the next of `sweeps` (the last one again when they run out); GET
    /sweeps/1/events answers `events` (bytes: an event stream) or an error status."""

    def __init__(self, sweeps: list[dict], events: bytes | int):
        self.sweeps, self.events = list(sweeps), events
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix(PREFIX)
        self.paths.append(path)
        if path == "/sweeps/1":
            return httpx.Response(200, json=self.sweeps.pop(0) if len(self.sweeps) > 1 else
                                  self.sweeps[0])  # fmt: skip
        if path == "/sweeps/1/events":
            if isinstance(self.events, int):
                error = {"error": {"type": "busy", "message": "too many streams"}}
                return httpx.Response(self.events, json=error)
            return httpx.Response(200, content=self.events,
                                  headers={"Content-Type": "text/event-stream"})  # fmt: skip
        error = {"error": {"type": "invalid_input", "message": "depht: unknown query parameter",
                           "field": "depht"}}  # fmt: skip
        return httpx.Response(422, json=error)


def scripted(client: Client, server: Server) -> Client:
    client._http = httpx.Client(base_url=client.url + PREFIX, transport=httpx.MockTransport(server))
    return client


def test_wait_follows_the_event_stream_to_its_end():
    final = sweep_json(SweepStatus.COMPLETED, done=4)
    stream = sse(("progress", sweep_json(SweepStatus.RUNNING, 2)), ("trial", {"id": 7}),
                 ("end", final))  # fmt: skip
    server = Server([sweep_json(SweepStatus.RUNNING)], stream)
    with scripted(Client("http://scripted"), server) as c:
        assert c.wait(1, poll_s=3600, progress=False) == final  # no poll: an hour's sleep
    assert server.paths == ["/sweeps/1", "/sweeps/1/events"]


@pytest.mark.parametrize("events", [503, 404, b"event: progress\ndata: {not json\n\n", b""])
def test_wait_polls_when_the_stream_is_refused_broken_or_ends_early(events):
    running, done = sweep_json(SweepStatus.RUNNING, 1), sweep_json(SweepStatus.CANCELLED, 1)
    server = Server([running, running, done], events)
    with scripted(Client("http://scripted"), server) as c:
        assert c.wait(1, poll_s=0, progress=False) == done
    assert server.paths == ["/sweeps/1", "/sweeps/1/events", "/sweeps/1", "/sweeps/1"]


def test_wait_with_a_timeout_polls_and_gives_up():
    server = Server([sweep_json(SweepStatus.RUNNING)], sse())
    with scripted(Client("http://scripted"), server) as c, pytest.raises(TimeoutError):
        c.wait(1, poll_s=0.01, timeout_s=0.05, progress=False)
    assert "/sweeps/1/events" not in server.paths and len(server.paths) >= 2


# --- the CLI's layer ------------------------------------------------------------------------------


def test_the_clis_api_says_the_clients_errors_in_its_own_words():
    server = Server([sweep_json(SweepStatus.RUNNING)], 503)
    with pytest.raises(CommandError) as info, scripted(Api(None, where={"depht"}), server) as api:
        api.rows("/sweeps/1/metrics", {"depht": ["2"]})
    assert str(info.value).startswith("--where depht: unknown config field")
    assert "HTTP 422" in str(info.value)
    with pytest.raises(CommandError) as info, scripted(Api(None), server) as api:
        api.rows("/sweeps/1/metrics", {"depht": ["2"]})
    assert str(info.value).startswith("depht: unknown query parameter")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(CommandError) as info, Api(url) as api:
        api.sweep(1)
    assert f"cannot connect to the isosweep API at {url}" in str(info.value)
    assert "--api-url or ISOSWEEP_API_URL" in str(info.value)
    with pytest.raises(ApiUnreachable) as raw, Client(url) as c:
        c.sweep(1)
    assert "Client(url=…) or ISOSWEEP_API_URL" in str(raw.value)
    with pytest.raises(CommandError, match="no spec file"), Api(url) as api:
        api.submit("missing.yaml")  # a SpecError, before any request
