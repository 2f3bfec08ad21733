"""A registered model's parameters as a first-class axis (service/param_columns.py, docs/models.md
"Model parameters as an axis"): a sweep over `model_params` reads as one column per parameter —
filtered (`where`, on SQLite and Postgres), grouped, pooled over seeds and drawn — and carries
the whole document as canonical JSON text. The filed defect: every pooled read of such a sweep
raised `TypeError: unhashable type: 'dict'`, and no filter or group-by took a parameter.

Records are hand-made (no torch): trial t's rms at epoch e, layer ℓ is 1000·t + 100·e + ℓ, its
train_loss 1000·t + 100·e, so every pooled value has a closed form."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict

from service import models
from service.errors import InvalidInput
from service.plots.pooling import pool_seeds
from service.plots.series import (
    depth_scaling_series,
    layer_profile_series,
    training_curves_series,
)
from service.spec import parse_spec
from service.store import Store
from service.tidy import aggregate_over_seeds

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "registered_model"
DEPTH = 3


class ProbeParams(BaseModel):
    """A params class with a float, a list and an optional text parameter."""

    model_config = ConfigDict(extra="forbid")
    scale: float = 1.0
    sizes: list[int] = [1]
    tag: str | None = None


@pytest.fixture
def registry(monkeypatch):
    """wide_mlp (the example's params class) and probe_net registered in a fresh registry."""
    monkeypatch.setattr(models, "_REGISTRY", {})
    monkeypatch.setattr(models, "_loaded", True)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.delitem(sys.modules, "wide_mlp", raising=False)
    import wide_mlp  # registers itself (its factory is never called here)

    models.register_model("probe_net", wide_mlp.build, params=ProbeParams)
    yield
    sys.modules.pop("wide_mlp", None)


def value(trial_id: int, epoch: int, layer: int = 0) -> float:
    return 1000.0 * trial_id + 100.0 * epoch + layer


def _records(trial_id: int, epochs: int = 1) -> list[tuple[int, dict]]:
    layers = np.arange(1, DEPTH + 1)
    return [
        (
            trial_id,
            {
                "epoch": e,
                "diverged": False,
                "train_loss": value(trial_id, e),
                "rms": value(trial_id, e) + layers.astype(float),
            },
        )
        for e in range(epochs + 1)
    ]


def _sweep(store: Store, model: str, axis: list[dict], seeds: int = 2) -> tuple[int, list]:
    spec = parse_spec(
        {
            "name": model,
            "parameters": {
                "model": model,
                "model_params": axis,
                "depth": DEPTH,
                "width": 8,
                "norm": "none",
                "epochs": 1,
            },
            "seeds": seeds,
        }
    )
    sweep = store.create_sweep(spec)
    trials, _ = store.list_trials(sweep.id, limit=100)
    for t in trials:
        store.start_trial(t.id)
        store.write_records(_records(t.id))
        store.finish_trial(t.id, "completed")
    return sweep.id, trials


WIDE = [
    {"expansion": 1, "layer_norm": False},
    {"expansion": 4, "layer_norm": False},
    {"expansion": 4, "layer_norm": True},
]


@pytest.fixture
def wide(registry, database_url):
    with Store(database_url) as store:
        sweep_id, trials = _sweep(store, "wide_mlp", WIDE)
        yield store, sweep_id, trials


def test_each_model_parameter_is_a_column_and_the_document_is_json_text(wide):
    store, sweep_id, trials = wide
    frame = store.read_metrics(sweep_id, metrics="rms", epoch=0, layers=[1])
    assert list(frame.columns) == [
        "trial_id",
        "model_params",
        "model_params.expansion",
        "model_params.activation",
        "model_params.layer_norm",
        "seed",
        "epoch",
        "metric",
        "layer",
        "value",
    ]
    assert frame["model_params.expansion"].dtype == np.int64
    assert frame["model_params.layer_norm"].dtype == bool
    by_trial = {t.id: t.config["model_params"] for t in trials}
    for _, row in frame.iterrows():
        params = by_trial[row["trial_id"]]
        assert json.loads(row["model_params"]) == params  # defaults filled in (activation)
        assert row["model_params.expansion"] == params["expansion"]
        assert row["model_params.layer_norm"] == params["layer_norm"]
        assert row["value"] == value(row["trial_id"], 0, 1)
    assert set(frame["model_params.activation"]) == {"relu"}


def test_pooling_over_seeds_gives_one_row_per_parameter_point(wide):
    """The filed 500: aggregate=True raised TypeError (unhashable dict). Each point pools its two
    seeds: the mean of trial ids t and t + 1 is 1000·(t + ½) + 100·e + ℓ."""
    store, sweep_id, trials = wide
    agg = store.read_metrics(sweep_id, metrics="rms", aggregate=True)
    assert len(agg) == 3 * 2 * DEPTH  # points × epochs × layers
    assert (agg["count"] == 2).all()
    first = {json.dumps(t.config["model_params"], sort_keys=True): t.id for t in trials[::2]}
    for _, row in agg.iterrows():
        doc = json.dumps(json.loads(row["model_params"]), sort_keys=True)
        t = first[doc]
        expected = value(t, row["epoch"], row["layer"]) + value(t + 1, row["epoch"], row["layer"])
        assert row["mean"] == expected / 2
        assert row["std"] == pytest.approx(1000 / np.sqrt(2), rel=1e-12)
    raw = store.read_metrics(sweep_id, metrics="rms")
    pooled = pool_seeds(raw.drop(columns=["trial_id"]), stat="median")
    assert len(pooled) == len(agg) and (pooled["count"] == 2).all()
    assert len(aggregate_over_seeds(raw)) == len(agg)


@pytest.mark.parametrize(
    ("where", "points"),
    [
        ({"model_params.expansion": 4}, [1, 2]),
        ({"model_params.expansion": "4"}, [1, 2]),  # query text, validated as the int field
        ({"model_params.expansion": [1, 4]}, [0, 1, 2]),
        ({"model_params.layer_norm": False}, [0, 1]),
        ({"model_params.layer_norm": "true"}, [2]),
        ({"model_params.activation": "relu", "model_params.expansion": 1}, [0]),
        ({"model_params.activation": "tanh"}, []),
        ({"model_params.expansion": []}, []),
    ],
)
def test_where_filters_on_a_model_parameter(wide, where, points):
    store, sweep_id, trials = wide
    want = {t.id for t in trials if t.index // 2 in points}
    frame = store.read_metrics(sweep_id, metrics="train_loss", where=where)
    assert set(frame["trial_id"]) == want
    listed, total = store.list_trials(sweep_id, where=where)
    assert {t.id for t in listed} == want and total == len(want)


def test_float_list_and_null_parameters_filter_and_group_exactly(registry, database_url):
    axis = [{"scale": 0.1, "sizes": [1, 2]}, {"scale": 1e-05, "tag": "a"}, {"scale": 2.0}]
    with Store(database_url) as store:
        sweep_id, trials = _sweep(store, "probe_net", axis, seeds=1)
        ids = [t.id for t in trials]
        for scale, tid in zip((0.1, 1e-05, 2.0), ids, strict=True):
            where = {"model_params.scale": scale}
            assert set(
                store.read_metrics(sweep_id, metrics="train_loss", where=where).trial_id
            ) == {tid}
        none = store.read_metrics(sweep_id, metrics="train_loss", where={"model_params.tag": None})
        assert set(none["trial_id"]) == {ids[0], ids[2]}  # JSON null, not a missing key
        frame = store.read_metrics(sweep_id, metrics="train_loss", epoch=0)
        assert frame["model_params.scale"].tolist() == [0.1, 1e-05, 2.0]
        assert frame["model_params.sizes"].tolist() == ["[1,2]", "[1]", "[1]"]  # JSON text
        tags = frame["model_params.tag"]
        assert tags.isna().tolist() == [True, False, True] and tags[1] == "a"
        assert len(store.read_metrics(sweep_id, metrics="train_loss", aggregate=True)) == 3 * 2
        with pytest.raises(InvalidInput, match="compares one value"):
            store.read_metrics(sweep_id, where={"model_params.sizes": [[1, 2]]})


def test_a_misspelt_or_mistyped_model_parameter_is_named_with_the_closest(wide):
    store, sweep_id, _ = wide
    with pytest.raises(InvalidInput) as exc:
        store.read_metrics(sweep_id, where={"model_params.expansoin": 4})
    assert exc.value.field == "where.model_params.expansoin"
    assert "did you mean 'model_params.expansion'?" in exc.value.message
    assert exc.value.suggestion == "model_params.expansion"
    with pytest.raises(InvalidInput, match=r"did you mean 'model_params\.expansion'") as exc:
        store.read_metrics(sweep_id, where={"expansion": 4})  # the parameter without its prefix
    assert exc.value.field == "where.expansion"
    with pytest.raises(InvalidInput, match="valid integer") as exc:
        store.read_metrics(sweep_id, where={"model_params.expansion": "wide"})
    assert exc.value.field == "where.model_params.expansion"
    with pytest.raises(InvalidInput, match=r"model_params\.<name>"):
        store.list_trials(sweep_id, where={"model_params": {"expansion": 4}})


def test_a_misspelt_parameter_in_a_spec_gets_the_closest_field(registry):
    with pytest.raises(InvalidInput, match="did you mean 'expansion'"):
        parse_spec(
            {"name": "x", "parameters": {"model": "wide_mlp", "model_params": {"expanson": 2}}}
        )


def test_plots_group_pool_and_draw_by_a_model_parameter(wide):
    store, sweep_id, trials = wide
    frame = store.read_metrics(sweep_id, metrics=["rms", "train_loss"])
    lines = depth_scaling_series(
        frame, "rms", x="model_params.expansion", group_by="model_params.layer_norm", layer=1
    )
    assert lines.by == ["model_params.layer_norm"]
    assert set(lines) == {"False", "True"}
    t0, t2, t4 = (t.id for t in trials[::2])
    off = lines["False"]
    assert off["x"].tolist() == [1, 4]
    assert off["mean"].tolist() == [value(t0 + 0.5, 1, 1), value(t2 + 0.5, 1, 1)]
    assert lines["True"]["mean"].tolist() == [value(t4 + 0.5, 1, 1)]
    # by default every varying parameter tells lines apart (never two points pooled as one)
    curves = training_curves_series(frame, "train_loss")
    assert curves.by == ["model_params.expansion", "model_params.layer_norm"]
    assert len(curves) == 3
    profile = layer_profile_series(frame, "rms", group_by="model_params.expansion")
    assert profile.by[0] == "model_params.expansion" and len(profile) == 3
    with pytest.raises(InvalidInput, match=r"did you mean 'model_params\.expansion'"):
        training_curves_series(frame, "train_loss", group_by="model_params.expansoin")


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("depth_scaling", {"x": "model_params.expansion"}),
        ("training_curves", {}),
        ("training_curves", {"group_by": "model_params.layer_norm"}),
        ("layer_profile", {"group_by": "model_params.expansion"}),
        ("heatmap", {"x": "model_params.expansion", "group_by": "model_params.layer_norm"}),
        ("heatmap", {}),  # its default axes: the two parameters the entries vary
    ],
)
def test_every_plot_kind_draws_a_model_parameter_sweep(wide, kind, options):
    from service.plots.stored import make_plot

    store, sweep_id, _ = wide
    metric = "train_loss" if kind == "training_curves" else "rms"
    png = make_plot(store, sweep_id, kind, metric=metric, **options)
    assert png.startswith(b"\x89PNG")


def test_a_trials_own_plot_reads_that_trial_alone(wide):
    """Trials that differ only in model_params and share a seed: the per-trial view must not
    pool them (its filters include the trial's parameters)."""
    from service.plots.stored import _one_trial

    store, sweep_id, trials = wide
    for t in trials:
        where = _one_trial(store, sweep_id, t.id, {})
        assert set(store.read_metrics(sweep_id, metrics="train_loss", where=where).trial_id) == {
            t.id
        }


def test_csv_writes_the_document_as_json(wide):
    from api.tables import csv_chunks, json_rows

    store, sweep_id, trials = wide
    frame = store.read_metrics(sweep_id, metrics="train_loss", epoch=0)
    text = b"".join(csv_chunks(frame)).decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [json.loads(r["model_params"]) for r in rows] == [
        t.config["model_params"] for t in trials
    ]
    assert [r["model_params.expansion"] for r in rows] == ["1", "1", "4", "4", "4", "4"]
    assert json_rows(frame)[0]["model_params.layer_norm"] is False
