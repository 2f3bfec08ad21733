"""A client generated from the live server's /openapi.json by openapi-python-client (a dev
dependency; docs/api.md, "The OpenAPI document") works end to end against that server: it
generates without a warning, submits a typed spec with a sampled parameter (and a YAML one as a
file), gets a 422 as a typed error naming the field, waits for the sweep, reads typed metric rows
(NaN and ±inf as the NonFinite enum, epochs as numbers or "last"), downloads PNG and SVG plots
and reads a finished sweep's event stream.

The server is uvicorn on a real port over a fresh SQLite file (tests/api/conftest.py); the
runner is a thread that claims the sweep and writes hand-made records through the Store
(tests/records.py), so every value read back is known exactly."""

from __future__ import annotations

import importlib
import io
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from records import record, value_of

from service.config import METRICS

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent  # openapi-python-client and the ruff it formats code with
PACKAGE = "isosweep_generated"
INDEX = {m: i for i, m in enumerate(METRICS)}
# The generator reads responses as JSON, text/* or application/octet-stream and request bodies
# as JSON, forms or octet-stream: its documented override maps the API's own media types on
# those (docs/api.md, "The OpenAPI document").
CONFIG = """\
content_type_overrides:
  image/png: application/octet-stream
  image/svg+xml: application/octet-stream
  application/yaml: application/octet-stream
"""
YAML = b"""\
name: from-yaml
parameters: {depth: 2, width: 8, batch_size: 4, epochs: 1}
seeds: 1
"""


@pytest.fixture
def database_url(sqlite_url):
    """The routes are covered on both backends by test_rest.py; the generated client on SQLite."""
    return sqlite_url


@pytest.fixture
def generated(api, tmp_path):
    """The client package generated from the live /openapi.json, imported."""
    (tmp_path / "config.yaml").write_text(CONFIG)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    r = subprocess.run(
        [str(BIN / "openapi-python-client"), "generate", "--url", f"{api.url}/openapi.json",
         "--meta", "none", "--output-path", str(tmp_path / PACKAGE),
         "--config", str(tmp_path / "config.yaml")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "WARNING" not in out and "Unable" not in out, out  # every operation and schema
    assert "ruff is not in PATH" not in out, out
    work_around_unset_import(tmp_path / PACKAGE)
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def work_around_unset_import(package: Path) -> list[str]:
    """openapi-python-client 0.29.1 annotates a required body of several media types (POST
    /sweeps: JSON or YAML) `| Unset` without importing Unset (its issue #1451): add the import
    where a module uses the name without it. A no-op once the generator is fixed."""
    patched = []
    for path in (package / "api").rglob("*.py"):
        text = path.read_text()
        line = next((x for x in text.splitlines() if x.startswith("from ...types import ")), "")
        if "| Unset" in text and line and "Unset" not in line.split(" import ", 1)[1].split(", "):
            path.write_text(text.replace(line, line + ", Unset", 1))
            patched.append(path.name)
    return patched


def run_sweep(store, sweep_id: int, odd: dict) -> None:
    """The runner's part: claim the sweep, store epochs 0..E of each trial (the first trial's
    last epoch with `odd` values), finish the trials and the sweep."""
    store.claim_sweep("generated-test-runner", 600.0, sweep_id=sweep_id)
    for k, t in enumerate(store.list_trials(sweep_id, limit=1000)[0]):
        store.start_trial(t.id)
        E, depth = t.config["epochs"], t.config["depth"]
        batch = [(t.id, record(t.id, e, depth, **(odd if k == 0 and e == E else {})))
                 for e in range(E + 1)]  # fmt: skip
        store.write_records(batch)
        store.finish_trial(t.id, "completed")
    store.finish_sweep(sweep_id)


def test_a_generated_client_submits_waits_reads_metrics_and_downloads_plots(api, generated):
    from isosweep_generated import Client
    from isosweep_generated.api.metrics import read_metrics
    from isosweep_generated.api.plots import read_plot
    from isosweep_generated.api.sweeps import create_sweep, read_sweep, read_trials, sweep_events
    from isosweep_generated.models import (
        ErrorPublic,
        LogUniform,
        MetricsPublic,
        NonFinite,
        ReadMetricsMetricType0Item,
        ReadPlotFormat,
        ReadPlotKind,
        Search,
        SearchKind,
        SweepPublic,
        SweepSpec,
        SweepSpecParameters,
        TrialsPublic,
    )
    from isosweep_generated.types import File

    client = Client(base_url=api.url, raise_on_unexpected_status=True, timeout=None)

    # --- submit: typed JSON with a sampled parameter, YAML as a file, a typed 422 ----------
    params = SweepSpecParameters(
        depth=[2, 3], width=8, batch_size=4, epochs=1, lr=LogUniform(loguniform=[1e-3, 1e-1])
    )
    spec = SweepSpec(
        name="generated", parameters=params, seeds=1, search=Search(kind=SearchKind.RANDOM, n=2)
    )
    sweep = create_sweep.sync(client=client, body=spec)
    assert isinstance(sweep, SweepPublic), sweep
    assert sweep.n_trials == 2 * 2 and sweep.status == "queued"
    from_yaml = create_sweep.sync(
        client=client, body=File(payload=io.BytesIO(YAML), mime_type="application/yaml")
    )
    assert isinstance(from_yaml, SweepPublic) and from_yaml.name == "from-yaml"
    bad = SweepSpec(name="bad", parameters=SweepSpecParameters(lr=LogUniform(loguniform=[0, 1])),
                    search=Search(kind=SearchKind.RANDOM, n=2))  # fmt: skip
    refused = create_sweep.sync_detailed(client=client, body=bad)
    assert refused.status_code == 422 and isinstance(refused.parsed, ErrorPublic)
    assert refused.parsed.error.field == "parameters.lr.loguniform[0]", refused.parsed

    # --- wait: the runner stores the trials while the client polls --------------------------
    odd = {"train_loss": math.nan, "test_loss": math.inf, "test_acc": -math.inf}
    runner = threading.Thread(target=run_sweep, args=(api.store, sweep.id, odd))
    runner.start()
    seen = []
    deadline = time.monotonic() + 120  # a hung server fails here instead of hanging the suite
    while time.monotonic() < deadline:
        now = read_sweep.sync(sweep.id, client=client)
        assert isinstance(now, SweepPublic)
        seen.append(now.status)
        if now.status in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.05)
    runner.join()
    assert seen[-1] == "completed" and now.progress == 1.0, seen
    trials = read_trials.sync(sweep.id, client=client)
    assert isinstance(trials, TrialsPublic) and trials.count == 4
    lrs = {t.config["lr"] for t in trials.data}
    assert len(lrs) == 2 and all(1e-3 <= lr <= 1e-1 for lr in lrs)  # the sampled points
    first = trials.data[0].id

    # --- read metrics: typed rows, values exact, NaN/±inf as NonFinite ----------------------
    for epoch in ([1], ["last"]):
        page = read_metrics.sync(
            sweep.id, client=client, metric=[ReadMetricsMetricType0Item("train_loss"),
                                             ReadMetricsMetricType0Item("test_loss")],
            epoch=epoch,
        )  # fmt: skip
        assert isinstance(page, MetricsPublic) and page.count == 8, page
        for row in page.data:
            assert row.epoch == 1 and row.layer is None
            assert {"depth", "lr"} <= set(row.additional_keys)
            if row.trial_id == first:
                want = NonFinite.NAN if row.metric == "train_loss" else NonFinite.INFINITY
                assert row.value == want, row
            else:
                assert row.value == value_of(row.trial_id, 1, INDEX[str(row.metric)]), row
    grads = read_metrics.sync(
        sweep.id, client=client, metric=[ReadMetricsMetricType0Item("grad_norm")], epoch=[0],
        layer=[2], aggregate=True,
    )  # fmt: skip
    assert isinstance(grads, MetricsPublic) and grads.count == 4  # depth × sampled lr, seeds pooled
    for row in grads.data:
        assert row.count == 1 and row.n_finite == 1 and row.layer == 2
        assert isinstance(row.mean, float)

    # --- download plots: bytes of the declared media types ----------------------------------
    png = read_plot.sync(sweep.id, ReadPlotKind.DEPTH_SCALING, client=client)
    assert isinstance(png, File) and png.payload.read().startswith(b"\x89PNG\r\n\x1a\n")
    svg = read_plot.sync(
        sweep.id, ReadPlotKind.TRAINING_CURVES, client=client, format_=ReadPlotFormat.SVG
    )
    assert isinstance(svg, File) and b"<svg" in svg.payload.read()

    # --- the event stream of a finished sweep: one text answer, ending with `end` -----------
    text = sweep_events.sync(sweep.id, client=client)
    assert isinstance(text, str) and text.startswith("id: 1\nevent: progress\n")
    assert "\nevent: end\n" in text
