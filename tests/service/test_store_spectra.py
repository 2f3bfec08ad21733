"""Per-epoch spectra in the store, on SQLite and Postgres: bit-exact round trip of 2-D arrays,
idempotent rewrites that replace an epoch whole, validation, the read filters and their errors,
the bound, reuse by later sweeps, cascade and retries."""

import math

import numpy as np
import pytest
from records import bits, record
from sqlalchemy import func, select
from support import run_alembic

from service import config
from service.config import METRICS
from service.errors import InvalidInput, LimitExceeded, NotFound
from service.settings import Settings
from service.spec import parse_spec
from service.store import Store
from service.store.models import SqlMetric, SqlSpectrum

# an MLP's spectrum keys (with norm and jacobian_samples): what its records hold
SPECTRUM_KEYS = (
    "spectrum/linear",
    "spectrum/norm",
    "spectrum/act",
    "spectrum/weight",
    "jacobian_singular_values",
)

DEPTH, N, K, M = 3, 4, 2, 5
WEIRD = [math.nan, math.inf, -math.inf, -0.0, 5e-324]


@pytest.fixture
def store(database_url):
    with Store(database_url) as s:
        yield s


def _trials(store, seeds=1, epochs=3, **params):
    spec = parse_spec(
        {"name": "s", "parameters": {"depth": DEPTH, "epochs": epochs, **params}, "seeds": seeds}
    )
    sweep = store.create_sweep(spec)
    return store.list_trials(sweep.id)[0]


def arrays(epoch, scale=1.0):
    """Every spectrum key with values that say where they sit: 1000·key + 100·epoch + 10·row +
    column, the first row of spectrum/act holding the IEEE specials."""
    out = {}
    for i, key in enumerate(SPECTRUM_KEYS):
        rows, cols = (K, M) if key == "jacobian_singular_values" else (DEPTH, N)
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        out[key] = scale * (1000.0 * i + 100 * epoch + 10 * r + c)
    out["spectrum/act"][0, :4] = WEIRD[:4]
    return out


def _count(store, table=SqlSpectrum):
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar()


def test_round_trip_is_bit_exact_and_ordered(store):
    t = _trials(store)[0].id
    store.write_records([(t, {**record(0, e, DEPTH), **arrays(e)}) for e in (0, 1)])
    got = store.spectra(t)
    assert [(s.name, s.epoch) for s in got] == [(k, e) for k in SPECTRUM_KEYS for e in (0, 1)]
    for s in got:
        want = arrays(s.epoch)[s.name]
        assert s.values.dtype == np.float64 and s.values.shape == want.shape
        assert (bits(s.values) == bits(want)).all() and s.layer is None
    assert _count(store, SqlMetric) == 2 * len(METRICS)  # the spectra are not metrics


def test_filters_name_epoch_last_and_layer(store):
    t = _trials(store)[0].id
    store.write_records([(t, {**record(0, e, DEPTH), **arrays(e)}) for e in (0, 2)])
    (s,) = store.spectra(t, name="spectrum/norm", epoch=2)
    np.testing.assert_array_equal(s.values, arrays(2)["spectrum/norm"])
    last = store.spectra(t, epoch="last")
    assert {s.epoch for s in last} == {2} and len(last) == len(SPECTRUM_KEYS)
    by_layer = store.spectra(t, epoch=0, layer=3)
    assert [s.name for s in by_layer] == [k for k in SPECTRUM_KEYS if k.startswith("spectrum/")]
    for s in by_layer:
        assert s.layer == 3 and s.values.shape == (1, N)
        np.testing.assert_array_equal(s.values[0], arrays(0)[s.name][2])


def test_last_is_per_name(store):
    """A name stored at fewer epochs has its own last epoch."""
    t = _trials(store)[0].id
    early = arrays(0)
    store.write_records([(t, {**record(0, 0, DEPTH), **early})])
    store.write_records([(t, {**record(0, 1, DEPTH), "spectrum/act": arrays(1)["spectrum/act"]})])
    last = {s.name: s.epoch for s in store.spectra(t, epoch="last")}
    assert last == {k: (1 if k == "spectrum/act" else 0) for k in SPECTRUM_KEYS}


def test_bad_reads_name_the_field_and_the_allowed_values(store):
    t = _trials(store)[0].id
    with pytest.raises(NotFound):
        store.spectra(10**6)
    assert store.spectra(t) == []  # nothing stored (spectra off): nothing returned
    with pytest.raises(InvalidInput) as exc:
        store.spectra(t, epoch=0)
    assert exc.value.field == "epoch" and "no spectra stored" in exc.value.message
    store.write_records([(t, {**record(0, e, DEPTH), **arrays(e)}) for e in (0, 3)])
    cases = [
        (dict(name="spectrum/lin"), "name", list(config.SPECTRUM_KEYS)),
        (dict(epoch=1), "epoch", ["0", "3"]),
        (dict(epoch=-1), "epoch", None),
        (dict(epoch="first"), "epoch", None),
        (dict(layer=0), "layer", None),
        (dict(layer=DEPTH + 1), "layer", None),
        (dict(layer=1.5), "layer", None),
        (dict(name="jacobian_singular_values", layer=1), "layer", None),
    ]
    for kwargs, field, allowed in cases:
        with pytest.raises(InvalidInput) as exc:
            store.spectra(t, **kwargs)
        assert exc.value.field == field, kwargs
        assert exc.value.allowed == allowed, kwargs


def test_rewriting_an_epoch_replaces_it_whole(store):
    t = _trials(store)[0].id
    store.write_records([(t, {**record(0, e, DEPTH), **arrays(e)}) for e in (0, 1)])
    assert _count(store) == 2 * len(SPECTRUM_KEYS)
    store.write_records([(t, {**record(0, 1, DEPTH), **arrays(1, scale=-1.0)})])  # a retry
    assert _count(store) == 2 * len(SPECTRUM_KEYS)
    (s,) = store.spectra(t, name="spectrum/linear", epoch=1)
    np.testing.assert_array_equal(s.values, -arrays(1)["spectrum/linear"])
    (s,) = store.spectra(t, name="spectrum/linear", epoch=0)  # other epochs untouched
    np.testing.assert_array_equal(s.values, arrays(0)["spectrum/linear"])
    # epoch 1 rewritten without spectra: its arrays go, epoch 0's stay
    store.write_records([(t, record(0, 1, DEPTH))])
    assert {s.epoch for s in store.spectra(t)} == {0}
    # the same epoch twice in one batch: the later record decides
    smaller = {**record(0, 0, DEPTH), "jacobian_singular_values": arrays(0)["spectrum/act"]}
    store.write_records([(t, {**record(0, 0, DEPTH), **arrays(0)}), (t, smaller)])
    (s,) = store.spectra(t)
    assert s.name == "jacobian_singular_values" and s.values.shape == (DEPTH, N)


def test_bad_arrays_write_nothing(store):
    t = _trials(store)[0].id
    good = (t, {**record(0, 0, DEPTH), **arrays(0)})
    cases = [
        ("spectrum/act", np.ones((DEPTH + 1, N))),  # not one row per layer
        ("spectrum/weight", np.ones(DEPTH)),  # 1-D
        ("jacobian_singular_values", np.ones((0, M))),  # empty
        ("jacobian_singular_values", [["a", "b"]]),
    ]
    for key, value in cases:
        with pytest.raises(InvalidInput) as exc:
            store.write_records([good, (t, {**record(0, 1, DEPTH), key: value})])
        assert exc.value.field == f"record.{key}"
    assert _count(store) == 0 and _count(store, SqlMetric) == 0
    with pytest.raises(InvalidInput) as exc:
        store.write_records([(t, {**record(0, 1, DEPTH), "spectrum/gram": np.ones((3, 3))})])
    assert set(SPECTRUM_KEYS) <= set(exc.value.allowed)


def test_the_bound_counts_before_reading(database_url):
    with Store(database_url, settings=Settings(max_points=2 * DEPTH * N)) as store:
        t = _trials(store)[0].id
        store.write_records([(t, {**record(0, e, DEPTH), **arrays(e)}) for e in (0, 1)])
        assert len(store.spectra(t, name="spectrum/act")) == 2  # 2 · L · n values: at the limit
        assert len(store.spectra(t, name="jacobian_singular_values")) == 2  # 2 · k · m = 20
        with pytest.raises(LimitExceeded) as exc:
            store.spectra(t, epoch=0)  # 4 · L · n + k · m = 58 values
        assert exc.value.field == "max_points"
        assert len(store.spectra(t, epoch=0, layer=1)) == 4  # one row each: 16 values


def test_reused_trials_read_the_original_and_retries_start_over(store):
    (first,) = _trials(store)
    store.start_trial(first.id)
    store.write_records([(first.id, {**record(0, 0, DEPTH), **arrays(0)})])
    store.finish_trial(first.id, "completed")
    (again,) = _trials(store)  # same config: reuses the stored results
    assert store.get_trial(again.id).results_from == first.id
    got = store.spectra(again.id, name="spectrum/weight")
    np.testing.assert_array_equal(got[0].values, arrays(0)["spectrum/weight"])
    (other,) = _trials(store, epochs=4)
    store.start_trial(other.id)
    store.write_records([(other.id, {**record(0, 0, DEPTH), **arrays(0)})])
    store.start_trial(other.id)  # a retry: the earlier attempt's arrays go with its metrics
    assert store.spectra(other.id) == []


def test_deleting_a_sweep_cascades(store):
    t = _trials(store)[0]
    store.write_records([(t.id, {**record(0, 0, DEPTH), **arrays(0)})])
    with store.engine.begin() as conn:  # the engine turns SQLite's foreign keys on
        conn.exec_driver_sql(f"DELETE FROM sweeps WHERE id = {t.sweep_id}")
    assert _count(store) == 0


def test_migration_0003_adds_and_removes_only_the_spectra_table(database_url):
    from sqlalchemy import create_engine, inspect

    Store(database_url).close()  # at head
    engine = create_engine(database_url)
    try:
        # later migrations add tables of their own (0006: login sessions)
        run_alembic(database_url, "downgrade", "0003")
        before = set(inspect(engine).get_table_names())
        assert "spectra" in before
        run_alembic(database_url, "downgrade", "0002")
        assert set(inspect(engine).get_table_names()) == before - {"spectra"}
    finally:
        engine.dispose()
    with Store(database_url) as store:  # upgrades again
        t = _trials(store)[0].id
        store.write_records([(t, {**record(0, 0, DEPTH), **arrays(0)})])
        assert len(store.spectra(t)) == len(SPECTRUM_KEYS)
