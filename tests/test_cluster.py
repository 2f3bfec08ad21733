"""isosweep on a real Ray cluster: a head started with `ray start` on loopback (token auth, one
token for the head and every client), then (1) `ray job submit … -- isosweep run SPEC
--database-url postgresql…` through Ray's own job CLI, and (2) the service's runner pointed at
the cluster through RAY_ADDRESS. Both check the rows in Postgres, then the head is stopped."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cluster_support import BIN, RayNode, ray_env
from expected_rows import expected_keys, row_keys
from support import isosweep_command

from service.spec import load_spec
from service.store import Store

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parent.parent
SPEC = "examples/init-depth-smoke.yaml"  # trials measured at initialization, seconds each


@pytest.fixture(scope="module")
def ray_head():
    head = RayNode(ray_env(), cpus=2)
    try:
        yield head
    finally:
        head.stop()


def _check_sweep_stored(url: str, sweep_id: int) -> None:
    with Store(url, migrate=False) as store:
        sweep = store.get_sweep(sweep_id)
        assert sweep.status == "completed", sweep
        trials, total = store.list_trials(sweep_id, limit=1000)
        assert total == load_spec(ROOT / SPEC).n_trials
        assert {t.status for t in trials} == {"completed"}
        keys = row_keys(store.read_metrics(sweep_id))
        assert len(keys) == len(set(keys)) and set(keys) == expected_keys(trials)


def test_ray_job_submit_runs_a_sweep_into_postgres(ray_head, postgres_url):
    result = subprocess.run(
        [
            str(BIN / "ray"),
            "job",
            "submit",
            "--address",
            ray_head.dashboard,
            "--working-dir",
            str(ROOT),
            "--",
            "isosweep",
            "run",
            SPEC,
            "--database-url",
            postgres_url,
            "--quiet",
        ],
        env=ray_head.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "succeeded" in log and "Connecting to existing Ray cluster" in log
    _check_sweep_stored(postgres_url, 1)


def test_runner_on_an_existing_cluster_through_ray_address(ray_head, postgres_url):
    with Store(postgres_url) as store:
        sweep = store.create_sweep(load_spec(ROOT / SPEC))
    result = subprocess.run(
        [*isosweep_command(), "runner", "--once", "--database-url", postgres_url],
        env={**ray_head.env, "RAY_ADDRESS": ray_head.address},
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "Connecting to existing Ray cluster" in log, log[-2000:]
    assert "Started a local Ray instance" not in log
    _check_sweep_stored(postgres_url, sweep.id)
