"""`isosweep submit | status | cancel | results | plot` run as the real command (a subprocess of
the installed entry point) against a live server whose store the tests fill by hand: what lands
in the store, what is printed, the files written, exit codes, and errors in red naming the field
or the URL."""

from __future__ import annotations

import io
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from api_support import record

ISOSWEEP = Path(sys.executable).with_name("isosweep")
RED = "\x1b[1;31m"  # rich's bold red, what common.fail prints "error:" in
SPEC = """\
name: cli-sweep
tags: [cli]
parameters:
  depth: [2, 4]
  init: [gaussian, orthogonal]
  width: 8
  batch_size: 4
  epochs: 2
seeds: 2
"""


@pytest.fixture
def database_url(sqlite_url):
    """The REST routes are covered on both backends by test_rest.py; the client on SQLite."""
    return sqlite_url


def cli(api, *args, token=None, url=None, timeout=60):
    env = {**os.environ, "ISOSWEEP_API_URL": url or api.url, "COLUMNS": "200"}
    env.pop("ISOSWEEP_API_TOKEN", None)
    env |= {"ISOSWEEP_API_TOKEN": token} if token else {}
    env |= {"FORCE_COLOR": "1", "TERM": "xterm"}  # rich colours even into a pipe
    return subprocess.run(
        [str(ISOSWEEP), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout
    )


def plain(text):
    """Without the colour codes."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def failed_red(r, *says):
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith(RED + "error:"), r.stderr
    for s in says:
        assert s in plain(r.stderr), r.stderr


def spec_file(tmp_path, text=SPEC, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def submitted(api, text=SPEC):
    r = api.post("/sweeps", content=text, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    return r.json()


def run_trials(api, sweep_id, statuses=None, last=None):
    """Start every trial, store epochs 0..E (api_support.record, `last` overrides on trial k's
    final epoch), finish each with statuses[k] (default completed), then the sweep."""
    trials = api.store.list_trials(sweep_id, limit=1000)[0]
    for k, t in enumerate(trials):
        api.store.start_trial(t.id)
        E = t.config["epochs"]
        extra = (last or {}).get(k, {})
        batch = [
            (t.id, record(t.id, e, t.config["depth"], **(extra if e == E else {})))
            for e in range(E + 1)
        ]
        api.store.write_records(batch)
        status = (statuses or {}).get(k, "completed")
        api.store.finish_trial(t.id, status, error="boom" if status == "failed" else None)
    api.store.finish_sweep(sweep_id)
    return trials


# --- submit -----------------------------------------------------------------------------------


def test_submit_creates_the_sweep_and_its_trials(api, tmp_path):
    r = cli(api, "submit", spec_file(tmp_path))
    assert r.returncode == 0, r.stderr
    (sweep,), total = api.store.list_sweeps()
    assert total == 1 and sweep.name == "cli-sweep" and sweep.tags == ["cli"]
    assert f"sweep {sweep.id} (cli-sweep): 8 trials" in plain(r.stdout)
    assert f"{api.url}/sweeps/{sweep.id}" in r.stdout
    trials, n = api.store.list_trials(sweep.id)
    got = sorted((t.config["depth"], t.config["init"], t.config["seed"]) for t in trials)
    want = sorted((d, i, s) for d in (2, 4) for i in ("gaussian", "orthogonal") for s in (0, 1))
    assert n == 8 and got == want
    assert {(t.config["width"], t.config["batch_size"], t.config["epochs"]) for t in trials} == {
        (8, 4, 2)
    }
    assert {t.status for t in trials} == {"queued"} and sweep.spec["rerun"] is False


def test_submit_json_with_rerun(api, tmp_path):
    path = spec_file(tmp_path, '{"name": "j", "parameters": {"depth": 3}, "seeds": 1}', "s.json")
    r = cli(api, "submit", path, "--rerun")
    assert r.returncode == 0, r.stderr
    (sweep,), _ = api.store.list_sweeps()
    assert sweep.spec["rerun"] is True and sweep.n_trials == 1


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (SPEC.replace("depth: [2, 4]", "depth: [0, 4]"), "parameters.depth"),
        (SPEC.replace("init:", "inti:"), "parameters.inti"),
        (SPEC.replace("name: cli-sweep\n", ""), "name"),
    ],
)
def test_submit_a_bad_spec_fails_red_naming_the_field(api, tmp_path, text, says):
    failed_red(cli(api, "submit", spec_file(tmp_path, text)), says, "HTTP 422")
    assert api.store.list_sweeps()[1] == 0


def test_submit_a_missing_file_fails_red(api, tmp_path):
    failed_red(cli(api, "submit", tmp_path / "nope.yaml"), "nope.yaml")


@pytest.mark.parametrize(("outcome", "code"), [("completed", 0), ("failed", 1), ("cancelled", 2)])
def test_submit_wait_follows_the_sweep_to_its_end(api, tmp_path, outcome, code):
    def finish_when_stored():
        deadline = time.monotonic() + 30
        while api.store.list_sweeps()[1] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        (sweep,), _ = api.store.list_sweeps()
        time.sleep(0.5)  # let the command poll the running sweep at least once
        if outcome == "cancelled":
            api.store.request_cancel(sweep.id)  # a queued sweep is cancelled at once
        else:
            run_trials(api, sweep.id, statuses={0: outcome})

    worker = threading.Thread(target=finish_when_stored)
    worker.start()
    r = cli(api, "submit", spec_file(tmp_path), "--wait", "--poll-s", "0.2")
    worker.join()
    assert r.returncode == code, r.stdout + r.stderr
    (sweep,), _ = api.store.list_sweeps()
    assert sweep.status == outcome
    out = plain(r.stdout)
    assert f"sweep {sweep.id}: {outcome}" in out
    if outcome != "cancelled":
        assert "trials 8/8" in plain(r.stderr) and "epochs 100%" in plain(r.stderr)


# --- status and cancel ------------------------------------------------------------------------


def test_status_lists_sweeps_and_one_sweeps_trials(api):
    done = submitted(api)
    trials = run_trials(api, done["id"], statuses={3: "failed"}, last={1: {"train_loss": math.inf}})
    queued = submitted(api, SPEC.replace("cli-sweep", "waiting"))
    r = cli(api, "status")
    assert r.returncode == 0, r.stderr
    out = plain(r.stdout)
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()[:1].isdigit()}
    assert "waiting" in lines[str(queued["id"])] and "queued" in lines[str(queued["id"])]
    mine = lines[str(done["id"])]
    assert "cli-sweep" in mine and "failed" in mine and "8/8" in mine
    assert "7 completed, 1 failed" in mine and "100%" in mine

    r = cli(api, "status", done["id"])
    out = plain(r.stdout)
    assert r.returncode == 0 and "8: 7 completed, 1 failed" in out and "1 of 8 trials failed" in out
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()}
    second = rows[str(trials[1].id)]  # trial id, depth, init, seed, status, epoch, losses …
    assert second[1:7] == ["2", "gaussian", "1", "completed", "2/2", "inf"]
    assert "boom" in " ".join(rows[str(trials[3].id)])

    r = cli(api, "status", done["id"], "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout) == api.get(f"/sweeps/{done['id']}").json()


def test_status_of_a_missing_sweep_fails_red(api):
    failed_red(cli(api, "status", 999), "no sweep with id 999", "HTTP 404")


def test_cancel_flips_the_flag(api):
    queued = submitted(api)
    r = cli(api, "cancel", queued["id"])
    assert r.returncode == 0 and f"sweep {queued['id']}: cancelled" in plain(r.stdout)
    info = api.store.get_sweep(queued["id"])
    assert info.cancel_requested and info.status == "cancelled"

    running = submitted(api)
    api.store.claim_sweep("r", 60.0)
    r = cli(api, "cancel", running["id"])
    assert r.returncode == 0 and "cancel requested" in r.stdout
    info = api.store.get_sweep(running["id"])
    assert info.cancel_requested and info.status == "running"  # its runner finishes it


def test_a_wrong_or_missing_token_is_refused_in_red(start_api):
    api = start_api(api_token="s3cret")
    headers = {"Content-Type": "application/yaml", "Authorization": "Bearer s3cret"}
    s = api.post("/sweeps", content=SPEC, headers=headers).json()
    failed_red(cli(api, "cancel", s["id"], token="wrong"), "HTTP 401", "ISOSWEEP_API_TOKEN")
    failed_red(cli(api, "cancel", s["id"]), "HTTP 401")
    assert not api.store.get_sweep(s["id"]).cancel_requested
    assert cli(api, "cancel", s["id"], token="s3cret").returncode == 0
    assert api.store.get_sweep(s["id"]).cancel_requested
    failed_red(cli(api, "status"), "HTTP 401")  # reads need the token too
    assert cli(api, "status", token="s3cret").returncode == 0


def test_an_unreachable_server_is_named_in_red(api):
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    failed_red(cli(api, "status", url=url), f"cannot connect to the isosweep API at {url}")
    failed_red(cli(api, "status", "--api-url", url), url)


@pytest.mark.parametrize("name", ["[/x]", "[red]x", "[bold]a[/bold] \\[b]"])
def test_an_error_message_is_printed_as_plain_text_not_markup(name):
    env = {**os.environ, "COLUMNS": "200", "FORCE_COLOR": "1", "TERM": "xterm"}
    r = subprocess.run(
        [str(ISOSWEEP), "theory", name], env=env, capture_output=True, text=True, timeout=60
    )
    failed_red(r, f"unknown activation {name!r}")
    assert "Traceback" not in r.stderr and "MarkupError" not in r.stderr


def test_a_servers_message_is_printed_as_given(api):
    s = submitted(api)
    r = cli(api, "results", s["id"], "--where", "[red]x=1")
    failed_red(r, "unknown config field", "[red]x", "HTTP 422")
    assert "\\[" not in r.stderr  # nothing escaped for rich


# --- results ----------------------------------------------------------------------------------

NONFINITE = {0: {"train_loss": math.inf, "test_loss": math.nan}, 2: {"test_acc": -math.inf}}


def stored_frame(api, sweep_id, **kw):
    keys = ["trial_id", "epoch", "metric", "layer"]
    frame = api.store.read_metrics(sweep_id, **kw)
    return frame.sort_values([k for k in keys if k in frame]).reset_index(drop=True)


def same(csv_frame, stored, sort):
    got = csv_frame.sort_values(sort).reset_index(drop=True)
    want = stored.sort_values(sort).reset_index(drop=True)
    assert list(got.columns) == list(want.columns)
    for c in want.columns:
        if pd.api.types.is_numeric_dtype(want[c]) and not pd.api.types.is_bool_dtype(want[c]):
            # NaN == NaN here; a nullable integer (layer) reads back as float with NaN
            np.testing.assert_array_equal(
                got[c].to_numpy(float, na_value=np.nan), want[c].to_numpy(float, na_value=np.nan)
            )
        else:
            assert got[c].astype(str).tolist() == want[c].astype(str).tolist(), c


def test_results_csv_is_every_stored_value_nan_and_inf_included(api, tmp_path):
    s = submitted(api)
    run_trials(api, s["id"], last=NONFINITE)
    r = cli(api, "results", s["id"], "--csv")
    assert r.returncode == 0, r.stderr
    frame = pd.read_csv(io.StringIO(r.stdout))
    stored = stored_frame(api, s["id"])
    same(frame, stored, ["trial_id", "epoch", "metric", "layer"])
    values = frame["value"].to_numpy()
    assert np.isposinf(values).sum() == 1 and np.isneginf(values).sum() == 1
    assert np.isnan(values).sum() == 1

    out = tmp_path / "grad.csv"
    args = ["--metric", "grad_norm", "--layer", "1", "--epoch", "last", "--where", "depth=4"]
    r = cli(api, "results", s["id"], *args, "--aggregate", "-o", out)
    assert r.returncode == 0, r.stderr
    pooled = pd.read_csv(out)
    want = api.store.read_metrics(
        s["id"], metrics=["grad_norm"], layers=[1], epoch="last", where={"depth": 4},
        aggregate=True,
    )  # fmt: skip
    same(pooled, want, ["init"])
    assert set(pooled["depth"]) == {4} and set(pooled["count"]) == {2}


def test_results_table_and_json(api):
    s = submitted(api)
    trials = run_trials(api, s["id"], last=NONFINITE)
    r = cli(api, "results", s["id"], "--metric", "train_loss", "--epoch", "last")
    assert r.returncode == 0, r.stderr
    out = plain(r.stdout)
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()}
    assert len(rows) == 8 and rows[str(trials[0].id)][-1] == "inf"
    assert rows[str(trials[1].id)][-1] == str(1000 * trials[1].id + 200)

    r = cli(api, "results", s["id"], "--metric", "test_loss", "--json", "--where", "seed=0")
    page = json.loads(r.stdout)
    assert page["count"] == 4 * 3 and len(page["data"]) == 12
    assert [row["value"] for row in page["data"] if row["trial_id"] == trials[0].id][-1] == "NaN"

    r = cli(api, "results", s["id"], "--limit", "5")
    assert "5 of" in plain(r.stdout) and "rows" in plain(r.stdout)


@pytest.mark.parametrize(
    ("limit", "pages"),
    [(None, "max"), (25_000, [10_000, 10_000, 5_000]), (7, [7])],
)
def test_results_json_pages_every_row_in_the_routes_largest_pages(limit, pages):
    """Each page makes the server read the sweep's frame again: without --limit, few pages."""
    from api.cli.client import fetch_rows
    from api.routes.metrics import MAX_JSON_ROWS

    total = 2 * MAX_JSON_ROWS + 123
    asked = []

    class Server:
        def json(self, method, path, params):
            asked.append(params["limit"])
            n = max(min(params["limit"], total - params["offset"]), 0)
            return {"data": [{"i": params["offset"] + k} for k in range(n)], "count": total,
                    "columns": ["i"]}  # fmt: skip

    page = fetch_rows(Server(), 1, {"metric": []}, limit)
    if pages == "max":
        assert asked == [MAX_JSON_ROWS] * 3 and len(page["data"]) == total
    else:
        assert asked == pages and len(page["data"]) == limit
    assert [r["i"] for r in page["data"]] == list(range(len(page["data"])))
    assert page["count"] == total and page["columns"] == ["i"]


def test_results_errors(api):
    s = submitted(api)
    failed_red(cli(api, "results", s["id"], "--where", "dpth=2"), "dpth", "HTTP 422")
    failed_red(cli(api, "results", s["id"], "--metric", "loss"), "metric", "train_loss")
    r = cli(api, "results", s["id"], "--where", "depth")
    assert r.returncode == 2 and "key=value" in plain(r.stderr)


# --- plot -------------------------------------------------------------------------------------


def test_plot_writes_png_and_svg(api, tmp_path):
    s = submitted(api)
    run_trials(api, s["id"])
    png = tmp_path / "grad.png"
    r = cli(api, "plot", s["id"], "depth_scaling", "--group-by", "init", "--layer", "1", "-o", png)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(png) as im:
        im.load()  # decodes the whole image
        assert im.width > 100 and im.height > 100
    svg = tmp_path / "profile.svg"  # the format follows the file name
    r = cli(api, "plot", s["id"], "layer_profile", "--metric", "isometry_gap/act", "-o", svg)
    assert r.returncode == 0, r.stderr
    assert b"<svg" in svg.read_bytes()[:1000]
    r = subprocess.run(
        [str(ISOSWEEP), "plot", str(s["id"]), "training_curves"],
        cwd=tmp_path, env={**os.environ, "ISOSWEEP_API_URL": api.url}, capture_output=True,
    )  # fmt: skip
    assert r.returncode == 0
    assert (tmp_path / f"sweep-{s['id']}-training_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_errors_are_the_servers_message(api, tmp_path):
    s = submitted(api)
    failed_red(cli(api, "plot", s["id"], "pie", "-o", tmp_path / "x.png"), "depth_scaling")
    failed_red(
        cli(api, "plot", s["id"], "layer_profile", "--layer", "1", "-o", tmp_path / "x.png"),
        "layer",
        "HTTP 422",
    )
    assert not (tmp_path / "x.png").exists()
