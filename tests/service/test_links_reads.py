"""Derived and linked fields where sweeps are read: columns and filters of the tidy frame, plot
lines (a field determined by the x axis and the other keys splits no line), the dashboard's
axes, the planned trials of a TPE search — on a store of hand-made records (no torch)."""

from __future__ import annotations

import math

import matplotlib
import pytest
from records import record

from service.plots import stored
from service.plots.select import line_keys
from service.spec import determined_fields, parse_spec
from service.store import Store
from service.store.sweeps import planned_trials

matplotlib.use("Agg")

LINKED = [{"width": 8, "batch_size": 8}, {"width": 16, "batch_size": 16}]


@pytest.fixture
def store(sqlite_url):
    with Store(sqlite_url) as s:
        yield s


@pytest.fixture
def sweep(store):
    """resmlp at depths 2 and 4 with residual_scale = 1/√depth, a linked width = batch size
    axis, two activations and two seeds: 16 trials, epochs 0 and 1 recorded."""
    spec = parse_spec(
        {
            "name": "links",
            "parameters": {
                "model": "resmlp",
                "epochs": 1,
                "depth": [2, 4],
                "residual_scale": {"expr": "1/sqrt(depth)"},
                "zip": LINKED,
                "activation": ["relu", "tanh"],
            },
            "seeds": 2,
        }
    )
    sweep = store.create_sweep(spec)
    trials, _ = store.list_trials(sweep.id, limit=100)
    batch = []
    for t in trials:
        batch += [(t.id, record(t.id, e, t.config["depth"])) for e in (0, 1)]
    store.write_records(batch)
    return sweep


def test_derived_and_linked_fields_are_columns_and_filters(store, sweep):
    frame = store.read_metrics(sweep.id, metrics="train_loss")
    assert {"depth", "residual_scale", "width", "batch_size", "activation", "seed"} <= set(frame)
    assert (frame["residual_scale"] == 1 / frame["depth"].map(math.sqrt)).all()
    assert (frame["width"] == frame["batch_size"]).all()
    some = store.read_metrics(sweep.id, metrics="train_loss", where={"residual_scale": 0.5})
    assert set(some["depth"]) == {4} and len(some) == len(frame) // 2
    linked = store.read_metrics(sweep.id, metrics="train_loss", where={"batch_size": 16})
    assert set(linked["width"]) == {16}


def test_the_fields_a_plot_line_need_not_tell_apart(store, sweep):
    spec = store.get_sweep(sweep.id).spec
    assert determined_fields(spec) == ["residual_scale", "batch_size"]
    # x or group_by on a tied field keeps it, and its linked partner goes instead
    assert determined_fields(spec, keep=("batch_size", None)) == ["residual_scale", "width"]
    assert determined_fields(spec, keep=("residual_scale",)) == ["batch_size"]
    # a linked axis none of whose fields names its points alone keeps them all
    both = [{"width": 8, "depth": 2}, {"width": 8, "depth": 3}, {"width": 16, "depth": 2}]
    loose = parse_spec({"name": "z", "parameters": {"epochs": 1, "zip": both}})
    assert determined_fields(loose.model_dump(mode="json")) == []


def test_depth_scaling_draws_one_line_per_activation_and_width(store, sweep, monkeypatch):
    """The frame a depth_scaling plot draws has no residual_scale or batch_size column: its
    lines are activation × width (4), not × the 2 residual scales the depths give."""
    drawn = {}

    def spy(kind, frame, **kw):
        drawn["columns"] = set(frame.columns)
        drawn["lines"] = line_keys(frame, kw["group_by"], exclude=(kw["x"] or "depth",))
        return b"\x89PNG"

    monkeypatch.setattr(stored, "render", spy)
    stored.make_plot(
        store, sweep.id, "depth_scaling", metric="grad_norm", layer=1, group_by="activation"
    )
    assert "residual_scale" not in drawn["columns"] and "batch_size" not in drawn["columns"]
    assert drawn["lines"] == ["activation", "width"]
    monkeypatch.undo()
    png = stored.make_plot(
        store, sweep.id, "depth_scaling", metric="grad_norm", layer=1, group_by="activation"
    )
    assert png.startswith(b"\x89PNG")


def test_the_dashboard_and_tpe_see_linked_and_derived_fields(store, sweep):
    from api.dashboard import views

    axes = views.axes(store.get_sweep(sweep.id).spec)
    assert axes == {
        "depth": [2, 4],
        "residual_scale": [1 / math.sqrt(2), 0.5],
        "width": [8, 16],
        "batch_size": [8, 16],
        "activation": ["relu", "tanh"],
        "seed": [0, 1],
    }
    tpe = parse_spec(
        {
            "name": "t",
            "parameters": {"epochs": 1, "zip": LINKED, "lr": {"loguniform": [1e-3, 1e-1]}},
            "seeds": 3,
            "search": {"kind": "tpe", "n": 5, "objective": "train_loss"},
        }
    )
    assert planned_trials(tpe.model_dump(mode="json")) == 5 * 2 * 3
