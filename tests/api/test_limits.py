"""The heavy-read bound through a live server: past max_heavy_reads the next heavy_read_queue
reads wait for a slot (first come, first served) and one more is a 503 with Retry-After, a
plot past plot_timeout_s a 504 whose work still lands in the cache, requests waiting on a plot
another one is drawing hold no slot and leave the light routes answering; and one default
metric per plot kind for the REST route and the dashboard."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from api_support import record, spec, submit, unit_gram

from api.app import create_app
from api.cache import sweep_version
from api.dashboard import views
from api.server import ServerThread
from service.plots import PLOT_KINDS
from service.plots.defaults import DEFAULT_METRIC, default_metric
from service.settings import Settings
from service.store import Store

pytestmark = pytest.mark.sqlite_only  # the bound is the process's, whatever the database


@pytest.fixture
def serve(sqlite_url):
    """serve(**settings) → (app, client of /api/v1); all stopped afterwards."""
    started: list[tuple[ServerThread, Store, httpx.Client]] = []

    def start(**overrides: Any) -> tuple[Any, httpx.Client]:
        settings = Settings(database_url=sqlite_url, **overrides)
        store = Store(sqlite_url, settings=settings)
        app = create_app(settings, store=store)
        server = ServerThread(app).start()
        client = httpx.Client(base_url=f"{server.url}/api/v1", timeout=60)
        started.append((server, store, client))
        return app, client

    yield start
    for server, store, client in started:
        client.close()
        server.stop()
        store.close()


class _Client:  # what api_support.submit needs
    def __init__(self, client: httpx.Client):
        self.post = client.post


def _finished_sweep(app: Any, client: httpx.Client, **parameters: Any) -> int:
    """A completed sweep with every epoch of every trial stored (its cache entries are final)."""
    store = app.state.store
    sweep = submit(_Client(client), spec("lim", seeds=2, **parameters))
    trials, _ = store.list_trials(sweep["id"])
    for t in trials:
        c = t.config
        store.start_trial(t.id)
        batch = []
        for e in range(c["epochs"] + 1):
            rec = record(t.id, e, c["depth"])
            if e == 0:
                rec["input_gram"] = unit_gram(c["batch_size"], c["seed"])
            if c["norm"] == "none":
                del rec["isometry_gap/norm"]  # a network without norm records no norm output
            batch.append((t.id, rec))
        store.write_records(batch)
        store.finish_trial(t.id, "completed")
    assert store.finish_sweep(sweep["id"]).status == "completed"
    return sweep["id"]


def _hold(heavy: Any) -> Any:
    """Take a heavy-read slot and keep it, as a streamed CSV does; returns its release."""
    _, release = asyncio.run(heavy.run_holding(lambda: None))
    return release


def _wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def test_a_heavy_read_past_the_limit_is_a_503_with_retry_after(serve):
    app, client = serve(max_heavy_reads=2, heavy_read_queue=0)
    sweep_id = _finished_sweep(app, client, depth=[2, 3])
    cached = client.get(f"/sweeps/{sweep_id}/plots/layer_profile")
    assert cached.status_code == 200
    heavy = app.state.heavy_reads  # made by the first heavy read
    held = [_hold(heavy) for _ in range(2)]  # two heavy reads running: the bound
    try:
        for path, params in [
            (f"/sweeps/{sweep_id}/plots/layer_profile", {"format": "svg"}),
            (f"/sweeps/{sweep_id}/metrics", {}),
            (f"/sweeps/{sweep_id}/metrics", {"format": "parquet"}),
        ]:
            r = client.get(path, params=params)
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"] == "2"
            assert "ISOSWEEP_MAX_HEAVY_READS" in r.json()["error"]["message"]
        # a cached answer costs no slot; nor do the light routes
        again = client.get(f"/sweeps/{sweep_id}/plots/layer_profile")
        assert again.status_code == 200 and again.content == cached.content
        assert client.get(f"/sweeps/{sweep_id}").status_code == 200
        assert client.get("/healthz").status_code == 200
        assert heavy.refused == 3
    finally:
        for release in held:
            release()
            release()  # idempotent
    assert heavy.admitted == 0
    r = client.get(f"/sweeps/{sweep_id}/plots/layer_profile", params={"format": "svg"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg")
    assert client.get(f"/sweeps/{sweep_id}/metrics").json()["count"] > 0


def test_heavy_reads_past_the_slots_wait_in_the_queue_and_only_past_it_get_503(serve):
    """One slot, held (as a streamed CSV holds it); a page's two charts and a CSV export, asked
    at once: the queue's three wait and are answered when the slot frees, in full; the next
    heavy read is refused at once."""
    app, client = serve(max_heavy_reads=1, heavy_read_queue=3)
    sweep_id = _finished_sweep(app, client, depth=[2, 3])
    assert client.get(f"/sweeps/{sweep_id}/metrics").status_code == 200  # makes the bound
    heavy = app.state.heavy_reads
    release = _hold(heavy)
    answers: dict[str, httpx.Response] = {}
    asked = {
        "layer_profile": (f"/sweeps/{sweep_id}/plots/layer_profile", {"format": "json"}),
        "heatmap": (f"/sweeps/{sweep_id}/plots/heatmap", {"format": "json"}),
        "csv": (f"/sweeps/{sweep_id}/metrics", {"seed": 1, "format": "csv"}),
    }

    def ask(name: str) -> None:
        path, params = asked[name]
        with httpx.Client(base_url=str(client.base_url), timeout=60) as c:
            answers[name] = c.get(path, params=params)

    waiting = [threading.Thread(target=ask, args=(name,)) for name in asked]
    try:
        for t in waiting:
            t.start()
        _wait_for(lambda: heavy.admitted == 4)  # the held slot and the three queued reads
        time.sleep(0.2)
        assert not answers  # they wait: nothing computes while the slot is held
        refused = client.get(f"/sweeps/{sweep_id}/plots/depth_scaling", params={"format": "json"})
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "2"
        assert "ISOSWEEP_HEAVY_READ_QUEUE" in refused.json()["error"]["message"]
        assert heavy.refused == 1
    finally:
        release()
        for t in waiting:
            t.join(60)
    assert {k: r.status_code for k, r in answers.items()} == dict.fromkeys(asked, 200)
    assert answers["layer_profile"].json()["kind"] == "layer_profile"
    assert answers["heatmap"].json()["kind"] == "heatmap"
    _wait_for(lambda: heavy.admitted == 0)  # the stream gave its slot back
    rows = client.get(f"/sweeps/{sweep_id}/metrics", params={"seed": 1, "limit": 1000}).json()
    csv = answers["csv"].text.splitlines()
    assert len(csv) == 1 + rows["count"] and csv[0].split(",") == rows["columns"]
    again = client.get(f"/sweeps/{sweep_id}/plots/depth_scaling", params={"format": "json"})
    assert again.status_code == 200


def test_a_client_gone_while_its_export_waits_leaves_no_slot_taken(serve):
    """CSV exports whose clients hang up while they wait in the queue: once the held slot
    frees, each is read, finds no one to stream to and gives its slot back; the bound is
    whole again and serves the next reads."""
    app, client = serve(max_heavy_reads=1, heavy_read_queue=4)
    sweep_id = _finished_sweep(app, client, depth=[2, 3])
    assert client.get(f"/sweeps/{sweep_id}/metrics").status_code == 200  # makes the bound
    heavy = app.state.heavy_reads
    release = _hold(heavy)
    base = str(client.base_url)

    def impatient(seed: int) -> None:
        with httpx.Client(base_url=base, timeout=0.5) as c, pytest.raises(httpx.ReadTimeout):
            c.get(f"/sweeps/{sweep_id}/metrics", params={"seed": seed, "format": "csv"})

    try:
        gone = [threading.Thread(target=impatient, args=(seed,)) for seed in (0, 1)]
        for t in gone:
            t.start()
        for t in gone:
            t.join(30)
        assert heavy.admitted == 3  # both still queued behind the held slot
    finally:
        release()
    _wait_for(lambda: heavy.admitted == 0)  # read, nothing sent, slots given back
    r = client.get(f"/sweeps/{sweep_id}/metrics", params={"seed": 0, "format": "csv"})
    assert r.status_code == 200 and r.text.startswith("trial_id,")
    _wait_for(lambda: heavy.admitted == 0)


def test_a_plot_past_the_time_limit_is_a_504_and_cached_for_the_retry(serve):
    app, client = serve(plot_timeout_s=0.001)  # no plot is drawn in a millisecond
    sweep_id = _finished_sweep(app, client, depth=[2, 3])
    r = client.get(f"/sweeps/{sweep_id}/plots/depth_scaling")
    assert r.status_code == 504
    message = r.json()["error"]["message"]
    assert "ISOSWEEP_PLOT_TIMEOUT_S" in message and "retry" in message
    heavy = app.state.heavy_reads
    _wait_for(lambda: heavy.admitted == 0)  # the drawing went on in the background
    retry = client.get(f"/sweeps/{sweep_id}/plots/depth_scaling")
    assert retry.status_code == 200 and retry.content.startswith(b"\x89PNG")
    assert client.get("/healthz").status_code == 200


def test_waiting_on_a_plot_in_flight_holds_no_slot_and_healthz_answers(serve):
    """45 requests for one plot that is being drawn: they wait for that drawing (the cache's
    single flight) without a heavy-read slot or a thread of the light routes' pool (40), so
    /healthz answers meanwhile, and all 45 get the one image."""
    app, client = serve(max_heavy_reads=1)
    sweep_id = _finished_sweep(app, client, depth=[2, 3])
    cache, store = app.state.cache, app.state.store
    version = sweep_version(store.get_sweep(sweep_id))
    # the route's key of GET /plots/layer_profile with no parameters (api/routes/plots.py)
    no_options = (None,) * 5  # stat, band, nonfinite, xscale, yscale
    asked = (
        "layer_profile",
        "isometry_gap/act",
        "png",
        None,
        None,
        None,
        None,
        None,
        (),
        no_options,
    )
    key = ("plot", sweep_id, version, asked)
    gate = threading.Event()
    image = b"\x89PNG the one drawing"
    drawing = threading.Thread(target=cache.get, args=(key, lambda: gate.wait(60) and image))
    drawing.start()
    _wait_for(lambda: key in cache._inflight)
    answers: list[httpx.Response] = []

    def ask() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=120) as c:
            answers.append(c.get(f"/sweeps/{sweep_id}/plots/layer_profile"))

    askers = [threading.Thread(target=ask) for _ in range(45)]
    try:
        hits = cache.hits
        for t in askers:
            t.start()
        _wait_for(lambda: cache.hits >= hits + 40)  # (at least) 40 of them wait on the flight
        health = client.get("/healthz", timeout=20)  # generous: it needs no drawing
        assert health.status_code == 200
        assert not answers  # the plot is still in flight
    finally:
        gate.set()
        drawing.join(60)
        for t in askers:
            t.join(120)
    assert [r.status_code for r in answers] == [200] * 45
    assert all(r.content == image for r in answers)


def test_one_default_metric_per_kind_for_rest_and_dashboard(serve):
    app, client = serve()
    sweep_id = _finished_sweep(app, client, depth=[2, 3], norm="none")
    stored = app.state.store.get_sweep(sweep_id).spec
    # a network without normalization records no isometry_gap/norm: its overlay draws act
    r = client.get(f"/sweeps/{sweep_id}/plots/theory_overlay")
    assert r.status_code == 200, r.text
    explicit = client.get(
        f"/sweeps/{sweep_id}/plots/theory_overlay", params={"metric": "isometry_gap/act"}
    )
    assert r.content == explicit.content
    swept = views.axes(stored)
    for kind in PLOT_KINDS:
        ours = views.default_plot(kind, swept, stored).get("metric")
        if ours is not None:  # training_curves: the dashboard leaves it to the route
            assert ours == default_metric(kind, stored), kind
    assert default_metric("theory_overlay", stored) == "isometry_gap/act"
    assert default_metric("theory_overlay", {"parameters": {}}) == "isometry_gap/norm"
    assert default_metric("theory_overlay") == DEFAULT_METRIC["theory_overlay"]
    assert set(DEFAULT_METRIC) == set(PLOT_KINDS)


# --- throttling of failed logins (api.limits.Throttle) -----------------------------------------


def test_failed_logins_are_throttled_per_address_with_retry_after(start_api):
    """The audit's case: 300 wrong guesses in a second, never a 429. Now the N-th failure from an
    address within the window is the last one compared: then 429 with Retry-After, even for the
    right token (nothing is compared while throttled)."""
    import httpx

    api = start_api(api_token="right-token", login_failures_per_address=5, login_window_s=600)
    same = {"Sec-Fetch-Site": "same-origin"}
    codes = [
        httpx.post(f"{api.url}/login", data={"token": f"guess-{i}"}, headers=same).status_code
        for i in range(8)
    ]
    assert codes == [401] * 5 + [429] * 3
    r = httpx.post(f"{api.url}/login", data={"token": "right-token"}, headers=same)
    assert r.status_code == 429 and "set-cookie" not in r.headers
    assert 1 <= int(r.headers["retry-after"]) <= 600
    assert "too many failed" in r.text
    # a wrong bearer token on the API counts (and is refused) the same way
    r = httpx.get(f"{api.url}/api/v1/sweeps", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "too_many_requests"


def test_the_throttle_counts_per_key_and_in_all_and_forgets_after_the_window():
    from api.limits import Throttle

    now = [1000.0]
    t = Throttle(per_key=3, total=5, window_s=10.0, clock=lambda: now[0])
    for _ in range(3):
        assert t.retry_after("a") is None
        t.failed("a")
    assert t.retry_after("a") == 10  # the oldest failure leaves the window in 10 s
    assert t.retry_after("b") is None
    t.failed("b")
    t.failed("b")
    assert t.retry_after("c") == 10  # 5 failures in all: every address waits
    now[0] += 4.0
    assert t.retry_after("c") == 6
    now[0] += 6.0  # the window has passed: all forgotten
    assert t.retry_after("a") is None and t.retry_after("c") is None
    t.failed("a")
    t.succeeded("a")  # a success clears the address's own failures
    assert t.retry_after("a") is None and len(t.failures("a")) == 0


def test_the_throttle_keeps_a_bounded_number_of_addresses():
    from api.limits import Throttle

    t = Throttle(per_key=2, total=10**9, window_s=60.0, max_keys=100)
    for i in range(1000):
        t.failed(f"10.0.{i // 256}.{i % 256}")
    assert t.keys() <= 100


def test_a_write_route_can_be_rate_limited_with_the_same_mechanism():
    """`rate_limited(name, per_key, total, window_s)`: a dependency any route can take; each
    request counts, and past the bound it is a 429 with Retry-After in the one error shape."""
    from fastapi import Depends, FastAPI
    from fastapi.testclient import TestClient

    from api.errors import install_error_handlers
    from api.limits import rate_limited

    app = FastAPI()
    install_error_handlers(app)

    @app.post("/things", dependencies=[Depends(rate_limited("things", 3, 100, 60.0))])
    def make() -> dict:
        return {"ok": True}

    with TestClient(app) as client:
        codes = [client.post("/things").status_code for _ in range(5)]
        assert codes == [200, 200, 200, 429, 429]
        r = client.post("/things")
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "too_many_requests"
