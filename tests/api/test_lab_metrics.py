"""A lab's registered per-tap metric (isosweep.register_metric, service.metric_names) through
the store and the API: a trial with tap_metrics stores it per layer beside effective_rank and
stable_rank, the metrics and plot routes read it by name, a sweep without tap_metrics says it
does not record it, and an unknown name is refused with a "did you mean" that knows the lab's
names. On SQLite and Postgres."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from service import metric_names
from service.config import TrialConfig
from workers.train import fit


@pytest.fixture
def lab(monkeypatch):
    monkeypatch.setattr(metric_names, "_LAB", {})
    metric_names.register_lab_metric("frobenius", lambda H: float(torch.linalg.norm(H)))


def _run(api, tap_metrics: bool) -> tuple[int, list[dict]]:
    """A one-trial sweep of a tiny MLP, its records from a real fit written through the store."""
    params = {"depth": 2, "width": 8, "batch_size": 8, "epochs": 1, "max_train_samples": 16,
              "tap_metrics": tap_metrics}  # fmt: skip
    sweep = api.post("/sweeps", json={"name": f"lab-{tap_metrics}", "parameters": params}).json()
    store = api.store
    store.claim_sweep("test-runner", 600.0, sweep_id=sweep["id"])
    (t,) = store.list_trials(sweep["id"])[0]
    records = list(fit(TrialConfig(**t.config)))
    store.start_trial(t.id)
    store.write_records([(t.id, r) for r in records])
    store.finish_trial(t.id, "completed")
    store.finish_sweep(sweep["id"])
    return sweep["id"], records


def test_a_lab_metric_is_stored_read_and_plotted_by_name(api, lab):
    sid, records = _run(api, tap_metrics=True)
    r = api.get(f"/sweeps/{sid}/metrics", params={"metric": ["frobenius", "effective_rank"]})
    assert r.status_code == 200, r.text
    rows = r.json()["data"]
    for name in ("frobenius", "effective_rank"):
        for epoch in (0, 1):
            got = sorted((row["layer"], row["value"]) for row in rows
                         if row["metric"] == name and row["epoch"] == epoch)  # fmt: skip
            np.testing.assert_array_equal([v for _, v in got], records[epoch][name])
    plot = api.get(f"/sweeps/{sid}/plots/layer_profile", params={"metric": "frobenius"})
    assert plot.status_code == 200 and plot.content[:4] == b"\x89PNG"
    ratio = api.get(f"/sweeps/{sid}/metrics", params={"metric": "update_ratio", "epoch": 1})
    values = [row["value"] for row in ratio.json()["data"]]
    assert len(values) == 2 and all(v > 0 for v in values)


def test_a_sweep_without_tap_metrics_does_not_record_them_and_typos_are_named(api, lab):
    sid, records = _run(api, tap_metrics=False)
    assert "frobenius" not in records[0] and "effective_rank" not in records[0]
    r = api.get(f"/sweeps/{sid}/metrics", params={"metric": "frobenius"})
    assert r.status_code == 422 and "does not record 'frobenius'" in r.json()["error"]["message"]
    typo = api.get(f"/sweeps/{sid}/metrics", params={"metric": "frobenuis"})
    assert typo.status_code == 422
    error = typo.json()["error"]
    assert error["field"] == "metric" and "did you mean 'frobenius'?" in error["message"]
