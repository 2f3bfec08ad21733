"""`isosweep` as a package: `import isosweep` stays light (no torch, no Ray) and exposes the
public API; `isosweep.Client` against live servers (uvicorn on a real port over a SQLite file,
and `isosweep serve` itself with a token), whose store the tests fill with hand-made records
(tests/records.py): DataFrames equal the known values, NaN/±inf come back as floats bit for bit,
specs go in as dicts, text or files, errors carry the server's field, plots are PNG/SVG."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from records import record, value_of
from support import free_port, isosweep_command

import isosweep
from api.app import create_app
from api.server import ServerThread
from isosweep import client as client_module
from service.config import CONFIG_FIELDS, LAYER_METRICS, METRICS, SCALAR_METRICS
from service.settings import Settings
from service.store import Store

ROOT = Path(__file__).resolve().parent.parent
INDEX = {m: i for i, m in enumerate(METRICS)}  # a metric's place in value_of
PNG = b"\x89PNG\r\n\x1a\n"
SPECIALS = {"train_loss": math.nan, "test_loss": math.inf, "test_acc": -math.inf}
GRAD_SPECIAL = [-math.inf, 0.1 + 0.2, math.nan]  # the odd trial's grad_norm, layers 1..3
SPEC = {
    "name": "client",
    "parameters": {"depth": [2, 3], "init": ["gaussian", "orthogonal"], "width": 8,
                   "batch_size": 4, "epochs": 1},
    "seeds": 2,
}  # fmt: skip
YAML = """\
name: from-text
parameters:
  depth: [2, 4]
  width: 8
  batch_size: 4
  epochs: 0
seeds: 3
"""


# --- the package ------------------------------------------------------------------------------


def _python(code: str, cwd: Path) -> str:
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_import_isosweep_loads_neither_torch_nor_ray(tmp_path):
    """From another directory (the installed package, not the checkout's cwd): the client, the
    store, the theory and the plots without torch or Ray."""
    out = _python(
        "import sys, isosweep\n"
        "isosweep.Client, isosweep.ApiError, isosweep.Store, isosweep.TrialConfig\n"
        "b = isosweep.isometry_strength('relu')\n"
        "isosweep.render, isosweep.make_plot, isosweep.mean_field_gaps\n"
        "print(sorted({'torch', 'ray'} & set(sys.modules)), repr(b), isosweep.__file__)\n",
        tmp_path,
    )
    loaded, beta, where = out.split()[0], out.split()[-2], out.split()[-1]
    assert loaded == "[]", out
    assert float(beta) == pytest.approx((3 * math.pi - 4) / (2 * math.pi - 2), rel=1e-13)
    assert Path(where) == ROOT / "isosweep" / "__init__.py"


@pytest.mark.slow
def test_every_public_name_resolves_and_fit_is_the_workers_one(tmp_path):
    out = _python(
        "import sys, isosweep\n"
        "assert 'torch' not in sys.modules\n"
        "values = {n: getattr(isosweep, n) for n in isosweep.__all__}\n"
        "import workers.train, workers.driver, service.store\n"
        "assert values['fit'] is workers.train.fit and 'torch' in sys.modules\n"
        "assert values['run_sweep'] is workers.driver.run_sweep\n"
        "assert values['Store'] is service.store.Store\n"
        "assert set(dir(isosweep)) >= set(isosweep.__all__)\n"
        "try:\n    isosweep.no_such_name\nexcept AttributeError as e:\n    print(e)\n",
        tmp_path,
    )
    assert "no attribute 'no_such_name'" in out


def test_all_lists_exactly_the_eager_and_lazy_names():
    eager = {"ApiError", "ApiUnreachable", "Client", "ClientError", "InvalidInput"}
    eager |= {"IsosweepError", "SpecError", "__version__"}
    assert set(isosweep.__all__) == eager | set(isosweep._LAZY)
    assert len(isosweep.__all__) == len(set(isosweep.__all__))


def test_page_sizes_are_the_routes():
    from api.routes.metrics import MAX_JSON_ROWS

    assert client_module.METRICS_PAGE_ROWS == MAX_JSON_ROWS
    assert Settings.model_fields["max_page_size"].default == client_module.TRIALS_PAGE_ROWS


def test_decode_frame_decodes_numeric_columns_and_leaves_strings():
    frame = pd.DataFrame(
        {
            "value": [1.5, "Infinity", None, "-Infinity", "NaN"],
            "all_nan": ["NaN"] * 5,  # e.g. the std of single seeds
            "init": ["NaN", "relu", "Infinity", "x", "y"],  # a genuine string column
            "flag": [True, False, True, True, False],
            "n": [1, 2, 3, 4, 5],
        }
    )
    out = client_module.decode_frame(frame)
    assert out["value"].dtype == np.float64 and out["all_nan"].dtype == np.float64
    got = out["value"].to_numpy()
    assert got[0] == 1.5 and got[1] == math.inf and got[3] == -math.inf
    assert math.isnan(got[2]) and math.isnan(got[4]) and out["all_nan"].isna().all()
    assert out["init"].tolist() == ["NaN", "relu", "Infinity", "x", "y"]
    assert out["flag"].dtype == bool and out["n"].tolist() == [1, 2, 3, 4, 5]


def test_query_parameters_repeat_lists_and_drop_none():
    got = client_module._params(
        {"depth": np.array([2, 8]), "init": "orthogonal", "bias": True},
        metric="grad_norm", epoch=None, layer=range(1, 3), aggregate=False,
    )  # fmt: skip
    assert got == [("metric", "grad_norm"), ("layer", 1), ("layer", 2), ("aggregate", False),
                   ("depth", 2), ("depth", 8), ("init", "orthogonal"), ("bias", True)]  # fmt: skip
    assert str(httpx.QueryParams(got[3:4] + got[-1:])) == "aggregate=false&bias=true"


def test_spec_body_reads_dicts_text_and_files(tmp_path):
    body, media = client_module.spec_body(SPEC, rerun=True)
    assert media == "application/json" and json.loads(body) == {**SPEC, "rerun": True}
    numpy_spec = {**SPEC, "parameters": {**SPEC["parameters"], "depth": np.arange(2, 4)}}
    body, _ = client_module.spec_body(numpy_spec)
    assert json.loads(body)["parameters"]["depth"] == [2, 3]
    assert client_module.spec_body(YAML) == (YAML.encode(), "application/yaml")
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SPEC))
    assert client_module.spec_body(str(path)) == (path.read_bytes(), "application/json")
    body, media = client_module.spec_body(path.with_suffix(".json"), rerun=True)
    assert json.loads(body)["rerun"] is True and media == "application/json"
    with pytest.raises(isosweep.SpecError, match=r"no spec file 'missing\.yaml'"):
        client_module.spec_body("missing.yaml")
    with pytest.raises(isosweep.SpecError, match="cannot read"):
        client_module.spec_body(tmp_path / "absent.yaml")
    with pytest.raises(isosweep.SpecError, match="a sweep spec is a mapping"):
        client_module.spec_body("- a\n- list\n", rerun=True)
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(isosweep.SpecError, match="is not UTF-8 text"):
        client_module.spec_body(tmp_path / "bin.yaml")


def test_an_unreachable_server_is_named():
    url = f"http://127.0.0.1:{free_port()}"
    with isosweep.Client(url, token="") as c, pytest.raises(isosweep.ApiUnreachable) as info:
        c.health()
    assert f"cannot connect to the isosweep API at {url}" in str(info.value)
    assert "isosweep serve" in str(info.value)


# --- a live server, filled by hand --------------------------------------------------------------


class Live:
    def __init__(self, url: str, store: Store):
        self.url, self.store = url, store


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """uvicorn on a free loopback port over a fresh SQLite file; the store it serves."""
    url = f"sqlite:///{tmp_path_factory.mktemp('client') / 'isosweep.db'}"
    # the module's records are hand-made (tests/records.py: an epoch_time_s of thousands of
    # seconds), so the throughput the cost estimate measures from them is no runner's: no budget
    settings = Settings(database_url=url, api_token=None, max_sweep_hours=1e9)
    store = Store(url, settings=settings)
    server = ServerThread(create_app(settings, store=store)).start()
    yield Live(server.url, store)
    server.stop()
    store.close()


@pytest.fixture(scope="module")
def client(live):
    with isosweep.Client(live.url, token="") as c:
        yield c


_widths = iter(range(20, 1000))


def fresh(name: str) -> dict[str, Any]:
    """A 6-trial spec no other sweep of the module shares (its own width): nothing reused."""
    params = {"depth": [2, 4], "width": next(_widths), "batch_size": 4, "epochs": 0}
    return {"name": name, "parameters": params, "seeds": 3}


def run_all(store: Store, sweep_id: int, *, odd: int | None = None) -> list[Any]:
    """Claim the sweep, store epochs 0..E of every trial (trial `odd`'s last epoch with
    SPECIALS and GRAD_SPECIAL), finish them and the sweep; the trials (TrialInfo)."""
    store.claim_sweep("test-runner", 600.0, sweep_id=sweep_id)
    trials = store.list_trials(sweep_id, limit=1000)[0]
    for t in trials:
        store.start_trial(t.id)
        E, depth = t.config["epochs"], t.config["depth"]
        batch = [(t.id, record(t.id, e, depth)) for e in range(E)]
        last = record(t.id, E, depth)
        if t.id == odd:
            last |= {**SPECIALS, "grad_norm": np.array(GRAD_SPECIAL)}
        store.write_records([*batch, (t.id, last)])
        store.finish_trial(t.id, "completed")
    store.finish_sweep(sweep_id)
    return trials


@pytest.fixture(scope="module")
def filled(client, live):
    """SPEC submitted through the client and run by hand: depth 3, gaussian, seed 1 holds the
    non-finite values at its last epoch."""
    sweep = client.submit(SPEC)
    ids = live.store.list_trials(sweep["id"], limit=1000)[0]
    odd = next(
        t.id
        for t in ids
        if (t.config["depth"], t.config["init"], t.config["seed"]) == (3, "gaussian", 1)
    )
    trials = run_all(live.store, sweep["id"], odd=odd)
    return sweep["id"], trials, odd


def expected_value(trial_id: int, epoch: int, metric: str, layer: int, odd: int) -> float:
    if trial_id == odd and epoch == 1:
        if metric in SPECIALS:
            return SPECIALS[metric]
        if metric == "grad_norm":
            return GRAD_SPECIAL[layer - 1]
    return value_of(trial_id, epoch, INDEX[metric], layer)


def same(a: float, b: float) -> bool:
    """Equal as floats, bit for bit, NaN equal to NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return np.float64(a).tobytes() == np.float64(b).tobytes()


def test_health_of_the_live_server(client):
    h = client.health()
    assert h["status"] == "ok" and h["database"]["backend"] == "sqlite"


def test_trials_frame_flattens_configs_and_decodes_the_summary(client, filled):
    sweep_id, trials, odd = filled
    frame = client.trials(sweep_id)
    assert frame["trial_id"].tolist() == [t.id for t in trials]  # expansion order
    assert frame["index"].tolist() == list(range(8))
    assert set(CONFIG_FIELDS) <= set(frame.columns)
    for t, row in zip(trials, frame.itertuples(index=False), strict=True):
        for field in ("depth", "init", "seed", "width", "epochs"):
            assert getattr(row, field) == t.config[field]
    assert (frame["status"] == "completed").all() and (frame["last_epoch"] == 1).all()
    assert isinstance(frame["finished_at"].dtype, pd.DatetimeTZDtype)
    for m in SCALAR_METRICS:
        col = frame[f"summary.{m}"]
        assert col.dtype == np.float64, m
        for tid, got in zip(frame["trial_id"], col, strict=True):
            assert same(got, expected_value(tid, 1, m, 0, odd)), (m, tid, got)
    filtered = client.trials(sweep_id, where={"depth": np.array([3]), "init": ("orthogonal",)})
    assert set(filtered["depth"]) == {3} and set(filtered["init"]) == {"orthogonal"}
    assert len(filtered) == 2


def test_metrics_frame_equals_the_stored_values(client, filled):
    sweep_id, trials, odd = filled
    frame = client.metrics(sweep_id)
    assert list(frame.columns) == [
        "trial_id", "depth", "init", "seed", "epoch", "metric", "layer", "value"
    ]  # fmt: skip
    per_trial = [len(SCALAR_METRICS) + len(LAYER_METRICS) * t.config["depth"] for t in trials]
    assert len(frame) == 2 * sum(per_trial)  # epochs 0 and 1
    assert frame["value"].dtype == np.float64 and frame["layer"].dtype == np.float64
    config = {t.id: t.config for t in trials}
    for row in frame.itertuples(index=False):
        c = config[row.trial_id]
        assert (row.depth, row.init, row.seed) == (c["depth"], c["init"], c["seed"])
        layer = 0 if math.isnan(row.layer) else int(row.layer)
        assert (layer == 0) == (row.metric in SCALAR_METRICS)
        want = expected_value(row.trial_id, row.epoch, row.metric, layer, odd)
        assert same(row.value, want), (row, want)


def test_nonfinite_values_round_trip_into_float_columns(client, filled):
    sweep_id, _, odd = filled
    frame = client.metrics(sweep_id, metric=["grad_norm", *SPECIALS], epoch="last",
                           where={"depth": 3, "init": "gaussian", "seed": 1})  # fmt: skip
    assert set(frame["trial_id"]) == {odd} and frame["value"].dtype == np.float64
    for m, v in SPECIALS.items():
        assert same(_scalar(frame, m), v), m
    grads = frame[frame["metric"] == "grad_norm"].sort_values("layer")
    assert grads["layer"].tolist() == [1.0, 2.0, 3.0]
    values = grads["value"].to_numpy()
    assert values[0] == -math.inf and math.isnan(values[2])
    assert values[1].tobytes() == np.float64(0.1 + 0.2).tobytes()  # bit-exact


def _scalar(frame: pd.DataFrame, metric: str) -> float:
    (value,) = frame.loc[frame["metric"] == metric, "value"]
    return value


def test_aggregate_pools_seeds_with_nonfinite_means(client, filled):
    """Seeds 0 and 1 of (depth 3, gaussian): a NaN mean where one seed is NaN, ±inf where one
    is ±inf (a finite number plus ±inf), the mean of the two values elsewhere."""
    sweep_id, trials, odd = filled
    frame = client.metrics(
        sweep_id, metric=["train_loss", "test_loss", "test_acc", "train_acc"], epoch=1,
        where={"depth": 3, "init": "gaussian"}, aggregate=True,
    )  # fmt: skip
    for col in ("mean", "std", "ci95"):
        assert frame[col].dtype == np.float64, col
    mean = dict(zip(frame["metric"], frame["mean"], strict=True))
    assert math.isnan(mean["train_loss"])
    assert mean["test_loss"] == math.inf and mean["test_acc"] == -math.inf
    seeds = [t.id for t in trials if (t.config["depth"], t.config["init"]) == (3, "gaussian")]
    assert odd in seeds and len(seeds) == 2
    pooled = np.mean([value_of(i, 1, INDEX["train_acc"]) for i in seeds])
    assert mean["train_acc"] == pytest.approx(pooled, rel=1e-15)
    n_finite = dict(zip(frame["metric"], frame["n_finite"], strict=True))
    assert n_finite == {"train_loss": 1, "test_loss": 1, "test_acc": 1, "train_acc": 2}


def test_metrics_page_through_every_row(client, filled, monkeypatch):
    """Small pages and an over-limit page size (halved until the route takes it) give the same
    frame as one page."""
    sweep_id, _, _ = filled
    whole = client.metrics(sweep_id, metric=["grad_norm", "test_acc"])
    monkeypatch.setattr(client_module, "METRICS_PAGE_ROWS", 7)
    paged = client.metrics(sweep_id, metric=["grad_norm", "test_acc"])
    pd.testing.assert_frame_equal(paged, whole)
    assert len(whole) > 7 * 5
    monkeypatch.setattr(client_module, "METRICS_PAGE_ROWS", 250_000)  # over MAX_JSON_ROWS
    pd.testing.assert_frame_equal(client.metrics(sweep_id, metric=["grad_norm", "test_acc"]), whole)
    whole = client.trials(sweep_id)
    for size in (3, 5000):  # 5000: over ISOSWEEP_MAX_PAGE_SIZE (1000), halved to 625
        monkeypatch.setattr(client_module, "TRIALS_PAGE_ROWS", size)
        pd.testing.assert_frame_equal(client.trials(sweep_id), whole)
    assert whole["index"].tolist() == list(range(8))


def test_an_empty_selection_is_an_empty_frame_with_the_columns(client, filled):
    sweep_id, _, _ = filled
    frame = client.metrics(sweep_id, where={"depth": 2, "init": "xavier"})
    assert frame.empty and "value" in frame.columns


def test_submit_from_dict_yaml_text_and_paths(client, live, tmp_path):
    s = client.submit(SPEC)  # as `filled` did: its stored results are reused
    assert (s["name"], s["n_trials"], s["status"]) == ("client", 8, "completed")
    assert s["counts"]["completed"] == 8 and live.store.get_sweep(s["id"]).spec["seeds"] == 2
    t = client.submit(YAML)
    assert (t["name"], t["n_trials"]) == ("from-text", 6)
    assert live.store.get_sweep(t["id"]).spec["parameters"]["depth"] == [2, 4]
    path = tmp_path / "spec.yaml"
    path.write_text(YAML.replace("from-text", "from-file"))
    for given in (path, str(path)):
        assert client.submit(given)["name"] == "from-file"
    json_path = tmp_path / "spec.json"
    json_path.write_text(json.dumps({**SPEC, "name": "from-json"}))
    r = client.submit(json_path, rerun=True)
    assert r["name"] == "from-json" and r["spec"]["rerun"] is True
    assert client.sweep(r["id"])["id"] == r["id"]
    names = [x["name"] for x in client.sweeps()]
    assert names[:5] == ["from-json", "from-file", "from-file", "from-text", "client"]
    assert {x["status"] for x in client.sweeps(status="queued")} == {"queued"}


def test_cancel_and_wait(client, live):
    queued = client.submit(YAML)
    cancelled = client.cancel(queued["id"])
    assert cancelled["status"] == "cancelled" and cancelled["cancel_requested"]
    assert client.wait(queued["id"], progress=False)["status"] == "cancelled"  # at once
    running = client.submit(YAML)
    with pytest.raises(TimeoutError, match=f"sweep {running['id']} is still queued"):
        client.wait(running["id"], poll_s=0.05, timeout_s=0.2, progress=False)


def test_wait_follows_the_sweep_to_its_end(client, live, capsys):
    sweep = client.submit(fresh("followed"))
    assert sweep["status"] == "queued"
    done = threading.Event()

    def runner() -> None:
        time.sleep(0.3)
        run_all(live.store, sweep["id"])
        done.set()

    thread = threading.Thread(target=runner)
    thread.start()
    finished = client.wait(sweep["id"], poll_s=0.05)
    thread.join()
    assert done.is_set() and finished["status"] == "completed"
    assert finished["counts"]["completed"] == 6 and finished["progress"] == 1.0
    assert f"sweep {sweep['id']}" in capsys.readouterr().err  # the progress bar


def test_submit_wait_returns_the_finished_sweep(client, live):
    """submit(wait=True) while a runner (here: a thread writing through the store) runs it."""
    name = "waited"

    def runner() -> None:
        for _ in range(400):
            queued = live.store.list_sweeps(status="queued", limit=100)[0]
            mine = [s for s in queued if s.name == name]
            if mine:
                run_all(live.store, mine[0].id)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=runner)
    thread.start()
    finished = client.submit(fresh(name), wait=True, progress=False, poll_s=0.05)
    thread.join()
    assert (finished["name"], finished["status"]) == (name, "completed")
    assert finished["counts"]["completed"] == finished["n_trials"] == 6


def test_error_answers_raise_api_error_naming_the_field(client, filled):
    sweep_id, _, _ = filled
    with pytest.raises(isosweep.ApiError) as info:
        client.submit({"name": "bad", "parameters": {"depth": 0}})
    e = info.value
    assert (e.status, e.type, e.field) == (422, "invalid_input", "parameters.depth")
    assert "HTTP 422" in str(e) and isinstance(e, isosweep.IsosweepError)
    with pytest.raises(isosweep.ApiError) as info:
        client.metrics(sweep_id, metric="grad_nrom")
    assert info.value.status == 422 and info.value.field == "metric"
    with pytest.raises(isosweep.ApiError) as info:
        client.metrics(sweep_id, where={"depht": 2})
    assert info.value.status == 422 and "depht" in info.value.message
    with pytest.raises(isosweep.ApiError) as info:
        client.sweep(10**6)
    assert (info.value.status, info.value.type) == (404, "not_found")
    with pytest.raises(isosweep.ApiError) as info:
        client.plot(sweep_id, "pie_chart")
    assert info.value.status == 404 and "depth_scaling" in info.value.message


def test_plot_returns_png_and_svg_and_writes_files(client, filled, tmp_path):
    sweep_id, _, _ = filled
    image = client.plot(sweep_id, "depth_scaling", metric="grad_norm", layer=1, epoch=0,
                        group_by="init")  # fmt: skip
    assert image.startswith(PNG) and len(image) > 1000
    path = tmp_path / "grad.svg"
    svg = client.plot(sweep_id, "layer_profile", metric="grad_norm", epoch="last",
                      where={"depth": 3}, path=path)  # fmt: skip
    assert path.read_bytes() == svg and b"<svg" in svg[:2000]
    png_path = tmp_path / "curves.png"
    out = client.plot(sweep_id, "training_curves", metric=["train_loss"], path=str(png_path))
    assert out.startswith(PNG) and png_path.read_bytes() == out


# --- `isosweep serve` with a token ----------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`isosweep serve --no-runner` on a free port with ISOSWEEP_API_TOKEN set."""
    tmp = tmp_path_factory.mktemp("served")
    port = free_port()
    env = {**os.environ, "ISOSWEEP_API_TOKEN": "s3cret", "COLUMNS": "200"}
    cmd = [*isosweep_command(), "serve", "--no-runner", "--port", str(port),
           "--database-url", f"sqlite:///{tmp / 'serve.db'}"]  # fmt: skip
    with open(tmp / "serve.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, (tmp / "serve.log").read_text()
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "serve did not answer within 90 s"
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(30)


def test_a_wrong_or_missing_token_raises_401(served):
    with isosweep.Client(served, token="wrong") as c, pytest.raises(isosweep.ApiError) as info:
        c.submit(YAML)
    e = info.value
    assert (e.status, e.type) == (401, "unauthorized") and "ISOSWEEP_API_TOKEN" in str(e)
    with isosweep.Client(served, token="") as c, pytest.raises(isosweep.ApiError) as info:
        c.submit(YAML)
    assert info.value.status == 401
    with isosweep.Client(served, token="s3cret") as c:
        s = c.submit(YAML)
        assert c.sweep(s["id"])["name"] == "from-text"
        assert c.cancel(s["id"])["status"] == "cancelled"


def test_url_and_token_default_from_the_environment(served, monkeypatch):
    monkeypatch.setenv("ISOSWEEP_API_URL", served + "/api/v1/")  # either spelling of the base
    monkeypatch.setenv("ISOSWEEP_API_TOKEN", "s3cret")
    with isosweep.Client() as c:
        assert c.url == served
        assert c.submit(SPEC)["n_trials"] == 8
        assert c.health()["status"] == "ok"


# --- docs/python.md, cell by cell ---------------------------------------------------------------


def doc_cells() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "python.md").read_text(), re.S)


def test_the_python_doc_runs_cell_by_cell(live, monkeypatch, tmp_path, capsys):
    """Every Python block of docs/python.md in order, as notebook cells, against the live
    server; a thread stands in for the runner, storing hand-made records of the doc's sweep."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setenv("ISOSWEEP_API_URL", live.url)
    monkeypatch.delenv("ISOSWEEP_API_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    stop = threading.Event()

    def runner() -> None:
        while not stop.wait(0.05):
            for s in live.store.list_sweeps(status="queued", limit=100)[0]:
                if s.name == "bn-linear-depth":
                    run_all(live.store, s.id)

    thread = threading.Thread(target=runner)
    thread.start()
    env: dict[str, Any] = {}
    try:
        for i, cell in enumerate(doc_cells()):
            exec(compile(cell, f"docs/python.md cell {i}", "exec"), env)
    finally:
        stop.set()
        thread.join()
        env["c"].close()
    assert env["sweep"]["status"] == "completed" and env["sweep"]["n_trials"] == 24
    grads = env["grads"]
    assert len(grads) == 8 and grads["mean"].dtype == np.float64  # 4 depths × 2 inits
    assert env["png"].startswith(PNG) and (tmp_path / "grad-depth.png").read_bytes() == env["png"]
    assert "422 metric" in capsys.readouterr().out


def test_a_trial_row_carries_each_model_parameter_as_its_own_column():
    from isosweep.client import _trial_row

    t = {
        "id": 7,
        "index": 0,
        "config": {"model": "wide_mlp", "model_params": {"expansion": 4, "sizes": [1, 2]}},
        "summary": {"train_loss": 0.5},
        "status": "completed",
    }
    row = _trial_row(t)
    assert row["model_params"] == {"expansion": 4, "sizes": [1, 2]}
    assert row["model_params.expansion"] == 4
    assert row["model_params.sizes"] == "[1,2]"  # a list parameter as its canonical JSON text
    assert row["summary.train_loss"] == 0.5
