"""Epoch records in the store, on SQLite and Postgres: bit-exact NaN/±inf, idempotent rewrites,
validation, the tidy frame and its filters, bounded reads, histories and the input Gram."""

import math

import numpy as np
import pandas as pd
import pytest
from records import bits, record
from sqlalchemy import func, select

from service.config import LAYER_METRICS, METRICS, SCALAR_METRICS
from service.errors import Conflict, InvalidInput, LimitExceeded, NotFound
from service.settings import Settings
from service.spec import parse_spec
from service.store import Store
from service.store.models import SqlArtifact, SqlMetric
from service.tidy import AGGREGATE_COLUMNS

# IEEE-754 specials, including a NaN with a payload and a negative NaN: bit patterns must survive.
SPECIALS = np.array(
    [
        math.nan,
        math.inf,
        -math.inf,
        np.frombuffer(np.uint64(0x7FF8_0000_0000_0001).tobytes(), "<f8")[0],
        np.frombuffer(np.uint64(0xFFF8_0000_0000_0000).tobytes(), "<f8")[0],
        -0.0,
        5e-324,  # the smallest subnormal
        1.7976931348623157e308,
    ]
)
DEPTH = len(SPECIALS)


@pytest.fixture
def store(database_url):
    with Store(database_url) as s:
        yield s


def _sweep(store, depths=(DEPTH,), seeds=2, epochs=3, norm="batch"):
    spec = parse_spec(
        {
            "name": "r",
            "parameters": {"depth": list(depths), "epochs": epochs, "norm": norm},
            "seeds": seeds,
        }
    )
    sweep = store.create_sweep(spec)
    return sweep, store.list_trials(sweep.id)[0]


def _rows(store):
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(SqlMetric)).scalar()


def test_nonfinite_values_round_trip_bit_exactly(store):
    _, trials = _sweep(store)
    t = trials[0].id
    rec = record(0, 0, DEPTH, train_loss=SPECIALS[3], test_acc=-math.inf)
    rec["isometry_gap/act"] = SPECIALS
    store.write_records([(t, rec)])
    epochs, act = store.trial_history(t, "isometry_gap/act")
    assert epochs.tolist() == [0] and act.shape == (1, DEPTH)
    assert (bits(act[0]) == bits(SPECIALS)).all()
    _, loss = store.trial_history(t, "train_loss")
    assert bits(loss).tolist() == [0x7FF8_0000_0000_0001]
    frame = store.read_metrics(trials[0].sweep_id, metrics=["isometry_gap/act", "test_acc"])
    act_rows = frame[frame.metric == "isometry_gap/act"]
    assert (bits(act_rows["value"].to_numpy()) == bits(SPECIALS)).all()
    assert frame[frame.metric == "test_acc"]["value"].tolist() == [-math.inf]
    assert store.get_trial(t).summary["test_acc"] == -math.inf


def test_writing_an_epoch_again_replaces_it(store):
    _, trials = _sweep(store)
    t = trials[0].id
    store.write_records([(t, record(0, e, DEPTH)) for e in range(3)])
    n = _rows(store)
    assert n == 3 * len(METRICS)
    store.write_records([(t, record(0, 1, DEPTH, scale=-1.0))])  # a retried epoch
    assert _rows(store) == n
    epochs, g = store.trial_history(t, "grad_norm")
    assert epochs.tolist() == [0, 1, 2]
    gn = METRICS.index("grad_norm")
    assert g[1].tolist() == (-(100 + 10 * gn + np.arange(1, 9))).tolist()
    assert g[2, 0] == 200 + 10 * gn + 1  # other epochs untouched
    # the same epoch twice in one batch: the later record wins, still one row per metric
    store.write_records([(t, record(0, 2, DEPTH, scale=2.0)), (t, record(0, 2, DEPTH, scale=3.0))])
    assert _rows(store) == n
    assert store.trial_history(t, "train_loss")[1][2] == 3.0 * 200
    smaller = {k: v for k, v in record(0, 2, DEPTH).items() if k != "grad_norm"}
    store.write_records([(t, smaller), (t, record(0, 2, DEPTH, scale=4.0))])
    assert _rows(store) == n  # the later, complete record decides what epoch 2 holds
    assert store.trial_history(t, "grad_norm")[1][2, 0] == 4.0 * (200 + 10 * gn + 1)


def test_a_rewritten_epoch_loses_metrics_it_no_longer_has(store):
    _, trials = _sweep(store)
    t = trials[0].id
    store.write_records([(t, record(0, 0, DEPTH))])
    smaller = {k: v for k, v in record(0, 0, DEPTH).items() if k != "isometry_gap/norm"}
    store.write_records([(t, smaller)])
    assert store.trial_history(t, "isometry_gap/norm")[0].size == 0
    assert _rows(store) == len(METRICS) - 1


def test_bad_records_write_nothing(store):
    _, trials = _sweep(store)
    t = trials[0].id
    good = (t, record(0, 0, DEPTH))
    cases = [
        ({**record(0, 1, DEPTH), "isometry_gap/lin": 1.0}, "record.isometry_gap/lin"),
        ({**record(0, 1, DEPTH), "grad_norm": np.ones(DEPTH + 1)}, "record.grad_norm"),
        ({**record(0, 1, DEPTH), "train_loss": "low"}, "record.train_loss"),
        ({**record(0, 1, DEPTH), "train_loss": None}, "record.train_loss"),
        ({**record(0, 1, DEPTH), "epoch": 4}, "record.epoch"),  # the trial has epochs 0..3
        ({k: v for k, v in record(0, 1, DEPTH).items() if k != "epoch"}, "record.epoch"),
        ({**record(0, 1, DEPTH), "input_gram": np.ones((2, 3))}, "record.input_gram"),
    ]
    for rec, field in cases:
        with pytest.raises(InvalidInput) as exc:
            store.write_records([good, (t, rec)])
        assert exc.value.field == field
    assert _rows(store) == 0
    with pytest.raises(InvalidInput) as exc:
        store.write_records([(t, {**record(0, 1, DEPTH), "loss": 1.0})])
    assert "train_loss" in exc.value.allowed
    with pytest.raises(NotFound):
        store.write_records([good, (10**6, record(0, 0, DEPTH))])
    assert _rows(store) == 0


def test_records_update_progress_divergence_and_summary(store):
    _, trials = _sweep(store, epochs=6)
    t = trials[0].id
    store.start_trial(t)
    store.write_records([(t, record(0, 0, DEPTH)), (t, record(0, 1, DEPTH))])
    info = store.get_trial(t)
    assert (info.records_done, info.records_total, info.last_epoch) == (2, 7, 1)
    assert info.summary["train_loss"] == 100.0 and set(info.summary) == {
        "train_loss",
        "train_acc",
        "test_loss",
        "test_acc",
        "epoch_time_s",
        "head_grad_norm",
        "head_weight_isometry_gap",
        "head_update_ratio",
    }
    store.write_records([(t, record(0, 2, DEPTH, diverged=True, train_loss=math.nan))])
    info = store.get_trial(t)
    assert info.diverged_epoch == 2 and math.isnan(info.summary["train_loss"])
    store.write_records([(t, record(0, 0, DEPTH))])  # an older epoch leaves the summary alone
    assert store.get_trial(t).last_epoch == 2


def test_reused_trials_cannot_be_written(store):
    _, trials = _sweep(store, seeds=1)
    store.write_records([(trials[0].id, record(0, 0, DEPTH))])
    store.finish_trial(trials[0].id, "completed")
    _, again = _sweep(store, seeds=1)
    with pytest.raises(Conflict):
        store.write_records([(again[0].id, record(0, 0, DEPTH))])


def test_input_gram_round_trip(store):
    _, trials = _sweep(store)
    gram = np.array([[1.0, 0.5, -0.25], [0.5, 1.0, math.inf], [-0.25, math.inf, 1.0]])
    assert store.input_gram(trials[0].id) is None
    store.write_records([(trials[0].id, record(0, 0, DEPTH, input_gram=gram))])
    got = store.input_gram(trials[0].id)
    assert got.shape == (3, 3) and (bits(got) == bits(gram)).all()
    with pytest.raises(NotFound):
        store.input_gram(10**6)


def _filled(store):
    """Depths 2 and 3, seeds 0 and 1, epochs 0..2; value = f(epoch, metric, layer) + seed."""
    sweep, trials = _sweep(store, depths=(2, 3), epochs=2)
    batch = []
    for t in trials:
        d, seed = t.config["depth"], t.config["seed"]
        for e in range(3):
            rec = record(0, e, d)
            batch.append((t.id, {k: (v + seed if k in METRICS else v) for k, v in rec.items()}))
    store.write_records(batch)
    return sweep, trials


def test_tidy_frame_columns_and_values(store):
    sweep, trials = _filled(store)
    frame = store.read_metrics(sweep.id)
    assert list(frame.columns) == [
        "trial_id",
        "depth",
        "seed",
        "epoch",
        "metric",
        "layer",
        "value",
    ]
    assert frame["layer"].dtype == pd.Int64Dtype()
    # each trial: 3 epochs × (scalars + per-layer metrics × depth values)
    per_epoch = [len(SCALAR_METRICS) + len(LAYER_METRICS) * t.config["depth"] for t in trials]
    assert len(frame) == 3 * sum(per_epoch)
    gn = METRICS.index("grad_norm")
    row = frame[(frame.trial_id == trials[3].id) & (frame.metric == "grad_norm")]
    row = row[(row.epoch == 2) & (row.layer == 3)]
    assert row[["depth", "seed"]].values.tolist() == [[3, 1]]
    assert row["value"].tolist() == [200 + 10 * gn + 3 + 1]
    scalars = frame[frame.metric == "train_acc"]
    assert scalars["layer"].isna().all() and len(scalars) == 4 * 3
    assert frame["trial_id"].is_monotonic_increasing


def test_filters_epoch_layers_where_and_last(store):
    sweep, trials = _filled(store)
    f = store.read_metrics(sweep.id, metrics=["grad_norm", "train_loss"], epoch=[0, 2], layers=2)
    assert set(f.epoch) == {0, 2}
    assert set(f.metric) == {"grad_norm", "train_loss"}
    assert set(f.layer.dropna()) == {2}
    assert len(f) == 4 * 2 * 2  # trials × epochs × (one layer + one scalar)
    last = store.read_metrics(sweep.id, metrics="train_loss", epoch="last", where={"depth": 3})
    assert last["epoch"].tolist() == [2, 2] and last["depth"].tolist() == [3, 3]
    # rewriting an earlier epoch: last_epoch stays the highest stored
    store.write_records([(trials[0].id, record(0, 0, 2))])
    lone = store.read_metrics(sweep.id, metrics="train_loss", epoch="last", where={"seed": 0})
    assert sorted(lone["epoch"].tolist()) == [2, 2]
    # a trial that stopped early (a new attempt that diverged after epoch 1): its own last epoch,
    # not the sweep's highest, nor the epoch 2 of the attempt it replaced
    early = trials[0]
    assert early.config["seed"] == 0
    store.start_trial(early.id)
    store.write_records([(early.id, record(0, e, early.config["depth"])) for e in (0, 1)])
    store.finish_trial(early.id, "diverged")
    lone = store.read_metrics(sweep.id, metrics="train_loss", epoch="last", where={"seed": 0})
    by_trial = dict(zip(lone["trial_id"], lone["epoch"], strict=True))
    others = {t.id: 2 for t in trials if t.config["seed"] == 0 and t.id != early.id}
    assert by_trial == {early.id: 1, **others}
    value = lone.loc[lone["trial_id"] == early.id, "value"].item()
    assert value == record(0, 1, early.config["depth"])["train_loss"]  # this attempt's epoch 1


def test_aggregate_over_seeds(store):
    sweep, _ = _filled(store)
    agg = store.read_metrics(sweep.id, metrics="train_loss", epoch=1, aggregate=True)
    assert list(agg.columns) == ["depth", "epoch", "metric", "layer", *AGGREGATE_COLUMNS]
    base = 100 + 10 * METRICS.index("train_loss")  # value_of(0, epoch 1, train_loss)
    assert agg["mean"].tolist() == [base + 0.5, base + 0.5]  # seeds add 0 and 1
    assert agg["std"].tolist() == pytest.approx([math.sqrt(0.5)] * 2)
    assert agg["count"].tolist() == [2, 2]


def test_bad_read_arguments(store):
    sweep, trials = _filled(store)
    with pytest.raises(InvalidInput) as exc:
        store.read_metrics(sweep.id, metrics=["grad"])
    assert exc.value.field == "metrics" and "grad_norm" in exc.value.allowed
    for kw, field in [
        ({"epoch": "first"}, "epoch"),
        ({"epoch": -1}, "epoch"),
        ({"layers": 0}, "layers"),
        ({"where": {"wdth": 1}}, "where.wdth"),
        ({"max_points": 0}, "max_points"),
    ]:
        with pytest.raises(InvalidInput) as exc:
            store.read_metrics(sweep.id, **kw)
        assert exc.value.field == field
    with pytest.raises(NotFound):
        store.read_metrics(10**6)
    with pytest.raises(InvalidInput):
        store.trial_history(trials[0].id, "loss")


def test_reads_are_bounded_before_decoding(database_url):
    with Store(database_url, settings=Settings(max_points=8)) as store:
        sweep, trials = _filled(store)
        grad = {"metrics": "grad_norm", "epoch": 0}  # 2+2+3+3 = 10 values
        with pytest.raises(LimitExceeded) as exc:
            store.read_metrics(sweep.id, **grad)
        assert exc.value.field == "max_points" and "layers" in exc.value.message
        assert "10 values" in exc.value.message
        assert len(store.read_metrics(sweep.id, **grad, max_points=10)) == 10
        assert len(store.read_metrics(sweep.id, **grad, layers=1)) == 4
        assert store.trial_history(trials[0].id, "grad_norm")[1].shape == (3, 2)  # 6 values
        with pytest.raises(LimitExceeded):
            store.trial_history(trials[3].id, "grad_norm")  # 3 epochs × 3 layers = 9


def test_history_shapes(store):
    _, trials = _sweep(store, epochs=2)
    t = trials[0].id
    empty_e, empty_v = store.trial_history(t, "grad_norm")
    assert empty_e.shape == (0,) and empty_v.shape == (0, DEPTH)
    store.write_records([(t, record(0, e, DEPTH)) for e in (2, 0, 1)])
    epochs, v = store.trial_history(t, "grad_norm")
    assert epochs.tolist() == [0, 1, 2] and v.shape == (3, DEPTH)
    assert v[:, 0].tolist() == [e * 100 + 10 * METRICS.index("grad_norm") + 1 for e in range(3)]
    assert store.trial_history(t, "test_loss")[1].shape == (3,)


def test_artifacts_are_stored_once_per_trial(store):
    _, trials = _sweep(store)
    t = trials[0].id
    for scale in (1.0, 2.0):
        store.write_records([(t, record(0, 0, DEPTH, input_gram=scale * np.eye(2)))])
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(SqlArtifact)).scalar() == 1
    assert store.input_gram(t).tolist() == [[2.0, 0.0], [0.0, 2.0]]


def test_empty_frames_keep_their_columns_and_types(store):
    sweep, _ = _sweep(store, depths=(2, 3))
    frame = store.read_metrics(sweep.id)
    assert frame.empty
    assert list(frame.columns) == ["trial_id", "depth", "seed", "epoch", "metric", "layer", "value"]
    assert frame["depth"].dtype == "int64" and frame["layer"].dtype == pd.Int64Dtype()
    agg = store.read_metrics(sweep.id, aggregate=True)
    assert agg.empty and list(agg.columns)[-5:] == list(AGGREGATE_COLUMNS)
