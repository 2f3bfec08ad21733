"""Comparing a registered-model sweep (its trials carry a `model_params` document) with a built-in
one, and a sweep recorded at epoch 0 only with one trained for 2 epochs. The filed defects:
every compare read and plot of such a pair was a 500 (`TypeError: unhashable type: 'dict'`: the
compare frame carried the document as a dict, and no `model_params.<name>` columns), and the
layer profile of a 0-epoch and a 2-epoch sweep was a 422 ("several rows per layer on one line")
or drew the 2-epoch sweep alone. Records are hand-made (tests/records.py), so every value is
known: value_of(trial, epoch, metric, layer)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from records import record, value_of

from service import models
from service.config import METRICS
from service.plots import compare as compare_mod
from service.plots import layer_profile_series
from service.plots.compare import compare_frame, make_compare_plot
from service.spec import parse_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "registered_model"
DEPTH = 3
WIDE = [
    {"expansion": 1, "layer_norm": False},
    {"expansion": 4, "layer_norm": False},
    {"expansion": 4, "layer_norm": True},
]
GRAD, ACC = METRICS.index("grad_norm"), METRICS.index("test_acc")


@pytest.fixture
def registry(monkeypatch):
    """The example's wide_mlp registered in a fresh registry (its factory is never called)."""
    monkeypatch.setattr(models, "_REGISTRY", {})
    monkeypatch.setattr(models, "_loaded", True)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.delitem(sys.modules, "wide_mlp", raising=False)
    import wide_mlp  # noqa: F401  (registers itself)

    yield
    sys.modules.pop("wide_mlp", None)


def _sweep(store, epochs: int, **parameters) -> tuple[int, list]:
    base = {"depth": DEPTH, "width": 8, "batch_size": 4, "norm": "none", "epochs": epochs}
    spec = parse_spec({"name": "s", "parameters": {**base, **parameters}, "seeds": 2})
    sweep = store.create_sweep(spec)
    trials, _ = store.list_trials(sweep.id, limit=100)
    for t in trials:
        store.start_trial(t.id)
        store.write_records([(t.id, record(t.id, e, DEPTH)) for e in range(epochs + 1)])
        store.finish_trial(t.id, "completed")
    return sweep.id, trials


@pytest.fixture
def pair(registry, api):
    """A wide_mlp sweep over model_params (2 epochs) and a plain MLP sweep (0 epochs)."""
    wide, wide_trials = _sweep(api.store, 2, model="wide_mlp", model_params=WIDE)
    plain, plain_trials = _sweep(api.store, 0)
    return api, (wide, wide_trials), (plain, plain_trials)


def _point(trial) -> str:
    doc = trial.config["model_params"] or {}
    return f"{doc.get('expansion')}-{doc.get('layer_norm')}"


def test_the_compare_frame_carries_model_params_as_text_and_columns(pair):
    api, (wide, wide_trials), (plain, plain_trials) = pair
    frame = compare_frame(api.store, [wide, plain], metrics="test_acc", epoch="last")
    assert "model_params.expansion" in frame.columns
    assert "model_params.layer_norm" in frame.columns
    assert frame["model_params"].map(type).eq(str).all()  # canonical JSON text, hashable
    by_trial = frame.set_index("trial_id")
    for t in wide_trials:
        row = by_trial.loc[t.id]
        doc = t.config["model_params"]
        assert row["model_params.expansion"] == doc["expansion"]
        assert row["model_params.layer_norm"] == doc["layer_norm"]
        assert row["epoch"] == 2 and row["value"] == value_of(t.id, 2, ACC)
    for t in plain_trials:
        row = by_trial.loc[t.id]
        assert pd.isna(row["model_params.expansion"])
        assert row["epoch"] == 0 and row["value"] == value_of(t.id, 0, ACC)
    # pooled per sweep and per model-params point: mean of the two seeds' values
    agg = compare_frame(api.store, [wide, plain], metrics="test_acc", epoch="last", aggregate=True)
    assert len(agg) == len(WIDE) + 1 and (agg["count"] == 2).all()
    for sid, trials in ((wide, wide_trials), (plain, plain_trials)):
        points: dict[str, list[int]] = {}
        for t in trials:
            points.setdefault(_point(t), []).append(t.id)
        rows = agg[agg["sweep_id"] == sid]
        assert len(rows) == len(points)
        for ids in points.values():
            want = np.mean([value_of(i, 2 if sid == wide else 0, ACC) for i in ids])
            assert np.isclose(rows["mean"], want, rtol=0, atol=1e-9).sum() == 1


@pytest.mark.parametrize("aggregate", ["false", "true"])
def test_compare_metrics_of_a_registered_model_sweep(pair, aggregate):
    api, (wide, wide_trials), (plain, _) = pair
    params = {"sweep": [wide, plain], "metric": "test_acc", "epoch": "last", "aggregate": aggregate}
    r = api.get("/compare/metrics", params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["columns"][:2] == ["sweep_id", "sweep"]
    assert "model_params.expansion" in body["columns"]
    docs: dict[int, list[dict]] = {wide: [], plain: []}
    for row in body["data"]:  # the document decoded back to an object
        docs[row["sweep_id"]].append(row["model_params"])
    points = [{k: d[k] for k in ("expansion", "layer_norm")} for d in docs[wide]]
    want = [t.config["model_params"] for t in wide_trials] if aggregate == "false" else WIDE
    key = lambda d: (d["expansion"], d["layer_norm"])  # noqa: E731
    assert sorted(points, key=key) == sorted(
        ({k: d[k] for k in ("expansion", "layer_norm")} for d in want), key=key
    )
    assert all(d == {} for d in docs[plain])
    assert body["count"] == (len(wide_trials) + 2 if aggregate == "false" else len(WIDE) + 1)


def test_compare_metrics_csv_of_a_registered_model_sweep(pair):
    api, (wide, _), (plain, _) = pair
    params = {"sweep": [wide, plain], "metric": "test_acc", "format": "csv", "aggregate": "true",
              "epoch": "last"}  # fmt: skip
    r = api.get("/compare/metrics", params=params)
    assert r.status_code == 200, r.text
    frame = pd.read_csv(io.StringIO(r.text))
    assert list(frame.columns[:2]) == ["sweep_id", "sweep"]
    assert sorted(frame["model_params.expansion"].dropna()) == [1, 4, 4]
    assert (frame["count"] == 2).all()


@pytest.mark.parametrize("kind", ["layer_profile", "depth_scaling", "training_curves"])
def test_compare_plots_of_a_registered_model_sweep(pair, kind):
    api, (wide, _), (plain, _) = pair
    params = {"sweep": [wide, plain], "format": "svg", "metric": "grad_norm"}
    if kind == "depth_scaling":  # depth is fixed: a model parameter is the x axis
        params["x"] = "model_params.expansion"
    r = api.get(f"/compare/plots/{kind}", params=params)
    assert r.status_code == 200, r.text
    assert b"<svg" in r.content[:400]


def test_layer_profile_draws_each_sweep_at_its_own_last_epoch(pair, monkeypatch):
    api, (wide, wide_trials), (plain, plain_trials) = pair
    r = api.get(
        "/compare/plots/layer_profile",
        params={"sweep": [wide, plain], "metric": "grad_norm", "format": "svg"},
    )
    assert r.status_code == 200, r.text
    drawn: dict = {}

    def capture(kind, frame, **kw):
        drawn.update(kind=kind, frame=frame, **kw)
        return b""

    monkeypatch.setattr(compare_mod, "render", capture)
    for epoch in (None, "last"):
        make_compare_plot(api.store, [wide, plain], "layer_profile", metric="grad_norm",
                          epoch=epoch)  # fmt: skip
        lines = layer_profile_series(
            drawn["frame"], "grad_norm", group_by=drawn["group_by"], epoch=drawn["epoch"]
        )
        assert len(lines) == len(WIDE) + 1  # 3 model-params points, and the plain sweep
        expected = []
        for trials, e in ((wide_trials, 2), (plain_trials, 0)):
            points: dict[str, list[int]] = {}
            for t in trials:
                points.setdefault(_point(t), []).append(t.id)
            for ids in points.values():
                expected.append(
                    [np.mean([value_of(i, e, GRAD, ell) for i in ids]) for ell in (1, 2, 3)]
                )
        got = [list(line["mean"]) for line in lines.values()]
        for line in lines.values():
            assert list(line["x"]) == [1, 2, 3]
        assert np.allclose(sorted(got), sorted(expected), rtol=0, atol=1e-9)


def test_layer_profile_of_two_plain_sweeps_at_0_and_2_epochs(api, monkeypatch):
    one, t1 = _sweep(api.store, 0)
    two, t2 = _sweep(api.store, 2)
    r = api.get(
        "/compare/plots/layer_profile",
        params={"sweep": [one, two], "metric": "grad_norm", "format": "svg"},
    )
    assert r.status_code == 200, r.text
    drawn: dict = {}
    monkeypatch.setattr(
        compare_mod, "render", lambda kind, frame, **kw: drawn.update(frame=frame, **kw)
    )
    make_compare_plot(api.store, [one, two], "layer_profile", metric="grad_norm")
    lines = layer_profile_series(
        drawn["frame"], "grad_norm", group_by=drawn["group_by"], epoch=drawn["epoch"]
    )
    got = sorted(list(line["mean"]) for line in lines.values())
    want = sorted(
        [np.mean([value_of(t.id, e, GRAD, ell) for t in ts]) for ell in (1, 2, 3)]
        for ts, e in ((t1, 0), (t2, 2))
    )
    assert np.allclose(got, want, rtol=0, atol=1e-9)  # both sweeps, each at its last epoch
