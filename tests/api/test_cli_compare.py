"""`isosweep compare` run as the real command against a live server (as test_cli_client.py):
the table of several sweeps' rows with their labels, CSV, the figure, and its errors."""

from __future__ import annotations

import io
import os
import subprocess

import pandas as pd
import pytest
from api_support import value_of
from test_cli_client import ISOSWEEP, cli, failed_red, plain, run_trials, submitted

from service.config import METRICS

GRAD = METRICS.index("grad_norm")
SPEC = """\
name: {name}
parameters:
  depth: [2, 4]
  norm: {norm}
  width: 8
  batch_size: 4
  epochs: 2
seeds: 2
"""


@pytest.fixture
def database_url(sqlite_url):
    """The compare routes run on both backends in test_compare.py; the command on SQLite."""
    return sqlite_url


@pytest.fixture
def two(api):
    ids = []
    for name, norm in (("a", "batch"), ("b", "layer")):
        sweep = submitted(api, SPEC.format(name=name, norm=norm))
        run_trials(api, sweep["id"])
        ids.append(sweep["id"])
    return ids


def test_compare_table_labels_each_sweep(api, two):
    a, b = two
    r = cli(api, "compare", a, b, "--metric", "grad_norm", "--layer", "1", "--epoch", "0")
    assert r.returncode == 0, r.stderr
    text = plain(r.stdout)
    assert f"sweep {a} (norm=batch)" in text and f"sweep {b} (norm=layer)" in text
    assert "sweep_id" in text and text.count("grad_norm") == 8  # 2 sweeps × 2 depths × 2 seeds


def test_compare_csv_is_every_row(api, two, tmp_path):
    a, b = two
    path = tmp_path / "c.csv"
    r = cli(api, "compare", a, b, "--metric", "grad_norm", "--epoch", "0", "-o", path)
    assert r.returncode == 0, r.stderr
    frame = pd.read_csv(path)
    assert len(frame) == 2 * 2 * 2 * (2 + 4) // 2  # per sweep: seeds × (2 + 4) layers
    assert set(frame["sweep_id"]) == {a, b}
    for row in frame.itertuples():
        assert row.value == value_of(row.trial_id, 0, GRAD, row.layer)
    r = cli(api, "compare", a, b, "--metric", "grad_norm", "--epoch", "0", "--csv")
    assert pd.read_csv(io.StringIO(r.stdout)).equals(frame)


def test_compare_kind_writes_the_figure(api, two, tmp_path):
    a, b = two
    path = tmp_path / "fig.svg"
    r = cli(api, "compare", a, b, "--metric", "grad_norm", "--kind", "depth_scaling", "-o", path,
            "--stat", "median")  # fmt: skip
    assert r.returncode == 0, r.stderr
    svg = path.read_text()
    assert f"sweep {a} (norm=batch)" in svg and "median" in svg
    env = {**os.environ, "ISOSWEEP_API_URL": api.url}
    env.pop("ISOSWEEP_API_TOKEN", None)
    command = [str(ISOSWEEP), "compare", str(a), str(b), "--kind", "layer_profile"]
    r = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / f"compare-{a}-{b}-layer_profile.png").read_bytes().startswith(b"\x89PNG")


def test_compare_errors(api, two, tmp_path):
    a, b = two
    failed_red(cli(api, "compare", a, b, "--kind", "heatmap"), "kind", "depth_scaling")
    failed_red(cli(api, "compare", a, b, "--layer", "500"), "no trial has layer 500")
    failed_red(
        cli(api, "compare", a, b, "--where", "activaton=relu"),
        "--where activaton: unknown config field; did you mean 'activation'?",
    )
    r = cli(api, "compare", a, b, "-o", tmp_path / "fig.png")
    assert r.returncode == 2 and "add --kind" in plain(r.stderr)
    r = cli(api, "compare", a, b, "--kind", "depth_scaling", "--aggregate")
    assert r.returncode == 2 and "drop --kind" in plain(r.stderr)
