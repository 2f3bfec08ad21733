"""The sweep driver. Fast tests drive StoreCallback, CancelStopper and Heartbeat by hand (fake Tune
trials, a real store); the `ray` tests run real sweeps on a local Ray instance: every expected row
stored and equal to fit() run here, cancel, divergence, failures (retried unless no retry can
cure them)."""

from __future__ import annotations

import math
import pickle
import threading
import time

import numpy as np
import pytest
from expected_rows import expected_keys, row_keys
from records import bits, record, value_of
from support import TINY

from service.config import METRICS, SCALAR_METRICS, TrialConfig
from service.errors import InvalidInput, StorageError
from service.models import layer_metrics
from service.settings import Settings
from service.spec import parse_spec
from service.store import Store
from service.store.sweeps import LeaseLost
from workers import driver
from workers.callbacks import (
    CancelStopper,
    Heartbeat,
    StoreCallback,
    SweepControl,
    error_text,
    exception_line,
)
from workers.driver import new_progress, run_sweep
from workers.trainable import (
    ERROR_KEY,
    PARAM_KEY,
    TRIAL_KEY,
    deterministic_error,
    from_transport,
    to_transport,
)

RUNNER = "test-runner"


class FakeTrial:
    """What StoreCallback reads of a Tune trial."""

    def __init__(self, trial_id, error_file=None, num_failures=0):
        self.config = {PARAM_KEY: {"trial_id": trial_id, "config": {}}}
        self.error_file = error_file
        self.num_failures = num_failures


def tune_result(trial_id, rec):
    """A record as Tune hands it to callbacks: through pickle, with Tune's own keys added."""
    result = pickle.loads(pickle.dumps(to_transport(rec, trial_id=trial_id, device="cpu")))
    return {**result, "trial_id": "abc_00001", "time_this_iter_s": 0.1, "config": {}, "done": False}


@pytest.fixture
def store(sqlite_url):
    with Store(sqlite_url) as s:
        yield s


def claimed_sweep(store, *, depth=2, epochs=2, seeds=2, lease_s=60.0):
    spec = parse_spec(
        {
            "name": "d",
            "parameters": {"depth": depth, "epochs": epochs, "norm": "none"},
            "seeds": seeds,
        }
    )
    sweep = store.create_sweep(spec)
    assert store.claim_sweep(RUNNER, lease_s).id == sweep.id
    return sweep, store.runnable_trials(sweep.id)


def callback_for(store, sweep, trials, control=None, **kw):
    control = control or SweepControl()
    tracker = new_progress(store.get_sweep(sweep.id), trials)
    final = {t.id: t.config["epochs"] for t in trials}
    return StoreCallback(store, control, tracker, final_epochs=final, **kw), control


# --- transport --------------------------------------------------------------------------------


def test_transport_keeps_nonfinite_values_bit_exact_and_drops_tune_keys():
    rec = record(0, 3, 4, train_loss=math.nan, test_loss=-math.inf)
    rec["grad_norm"] = np.array([math.inf, -0.0, 5e-324, math.nan])
    rec["input_gram"] = np.array([[1.0, math.nan], [math.nan, 1.0]])
    back = from_transport(tune_result(7, rec))
    assert set(back) == set(rec)
    for key, value in rec.items():
        if isinstance(value, np.ndarray):
            assert back[key].dtype == np.float64 and back[key].shape == value.shape
            assert np.array_equal(back[key].view("<u8"), value.view("<u8")), key
        elif isinstance(value, float) and math.isnan(value):
            assert math.isnan(back[key])
        else:
            assert back[key] == value and type(back[key]) is type(value), key
    assert math.copysign(1, back["grad_norm"][1]) == -1  # -0.0 stays negative


def test_transport_names_the_trial_and_device_beside_tunes_trial_id():
    result = tune_result(7, record(0, 0, 2))
    assert result[TRIAL_KEY] == 7 and result["device"] == "cpu"
    assert result["trial_id"] == "abc_00001"  # Tune's own, which is why ours has another key


# --- error text -------------------------------------------------------------------------------

TUNE_ERROR_FILE = """Failure # 1 (occurred at 2026-01-01_10-00-00)
\x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=1, ip=127.0.0.1, repr=run_trial)
           ^^^^^^^^^^^^^^^^^^^^
  File "/x/function_trainable.py", line 249, in _trainable_func
    output = fn()
             ^^^^
  File "/x/workers/data.py", line 160, in _torchvision
    raise DataUnavailable(
service.errors.DataUnavailable: first attempt
Failure # 2 (occurred at 2026-01-01_10-00-05)
\x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=2, ip=127.0.0.1, repr=run_trial)
  File "/x/workers/data.py", line 160, in _torchvision
    raise DataUnavailable(
             ~~~~~~~~~~~~~~~^
service.errors.DataUnavailable: dataset 'mnist' is not available in /data
"""


def test_error_text_is_the_last_failure_with_a_summary_line(tmp_path):
    path = tmp_path / "error.txt"
    path.write_text(TUNE_ERROR_FILE)
    text = error_text(FakeTrial(1, error_file=str(path), num_failures=2))
    summary, trace = text.split("\n\n", 1)
    assert summary == "DataUnavailable: dataset 'mnist' is not available in /data"
    assert "first attempt" not in text and "Failure #" not in text
    assert "\x1b" not in text and "^^^" not in text and "~~~" not in text
    assert trace.startswith("ray::ImplicitFunc.train() (pid=2")
    assert trace.endswith(
        "service.errors.DataUnavailable: dataset 'mnist' is not available in /data"
    )


def test_error_text_without_a_file_says_so():
    assert "recorded no error text" in error_text(FakeTrial(1, error_file=None, num_failures=3))


def test_exception_line_joins_a_multiline_message():
    lines = ['  File "a.py", line 1, in f', "    g()", "ValueError: one", "two"]
    assert exception_line(lines) == "ValueError: one two"
    assert exception_line(["RuntimeError: alone"]) == "RuntimeError: alone"


# --- StoreCallback ----------------------------------------------------------------------------


def test_callback_writes_in_batches_and_completes(store):
    sweep, trials = claimed_sweep(store, depth=2, epochs=2)
    a = trials[0].id
    cb, _ = callback_for(store, sweep, trials, flush_records=2, flush_s=3600)
    seen = []
    cb.progress = lambda p: seen.append((p.event, p.epochs_done, p.trials_done))
    cb.on_trial_start(0, [], FakeTrial(a))
    assert store.get_trial(a).status == "running" and store.get_trial(a).attempts == 1
    cb.on_trial_result(0, [], FakeTrial(a), tune_result(a, record(0, 0, 2)))
    assert store.get_trial(a).records_done == 0  # buffered: one record is not a batch
    cb.on_trial_result(0, [], FakeTrial(a), tune_result(a, record(0, 1, 2)))
    assert store.get_trial(a).records_done == 2  # the batch of two went in one write
    cb.on_trial_result(0, [], FakeTrial(a), tune_result(a, record(0, 2, 2, train_loss=math.inf)))
    cb.on_trial_complete(0, [], FakeTrial(a))
    t = store.get_trial(a)
    assert (t.status, t.records_done, t.last_epoch, t.diverged_epoch) == ("completed", 3, 2, None)
    epochs, grad = store.trial_history(a, "grad_norm")
    assert epochs.tolist() == [0, 1, 2]
    assert np.array_equal(grad, np.stack([record(0, e, 2)["grad_norm"] for e in range(3)]))
    assert store.trial_history(a, "train_loss")[1].tolist() == [0.0, 100.0, math.inf]
    # 3 records of 2 trials × 3 epochs: one trial of two done, half the epochs
    assert seen[-1] == ("finish", 3, 1)
    assert [e for e, *_ in seen] == ["start", "record", "record", "record", "finish"]


def test_callback_flushes_by_age_on_step_end(store):
    sweep, trials = claimed_sweep(store)
    a = trials[0].id
    cb, _ = callback_for(store, sweep, trials, flush_records=1000, flush_s=0.0)
    cb.on_trial_start(0, [], FakeTrial(a))
    cb.on_trial_result(0, [], FakeTrial(a), tune_result(a, record(0, 0, 2)))
    assert store.get_trial(a).records_done == 0
    cb.on_step_end(0, [])
    assert store.get_trial(a).records_done == 1


def test_diverged_record_marks_the_trial_diverged(store):
    sweep, trials = claimed_sweep(store, epochs=5)
    a = trials[0].id
    cb, _ = callback_for(store, sweep, trials)
    cb.on_trial_start(0, [], FakeTrial(a))
    cb.on_trial_result(0, [], FakeTrial(a), tune_result(a, record(0, 0, 2)))
    bad = record(0, 1, 2, diverged=True, train_loss=math.nan)
    cb.on_trial_result(0, [], FakeTrial(a), tune_result(a, bad))
    cb.on_trial_complete(0, [], FakeTrial(a))
    t = store.get_trial(a)
    assert (t.status, t.diverged_epoch, t.last_epoch) == ("diverged", 1, 1)
    assert math.isnan(store.trial_history(a, "train_loss")[1][1])


def test_a_trial_that_stops_early_without_diverging_is_failed(store):
    sweep, trials = claimed_sweep(store, epochs=5)
    a = trials[0].id
    cb, _ = callback_for(store, sweep, trials)
    cb.on_trial_start(0, [], FakeTrial(a))
    cb.on_trial_result(0, [], FakeTrial(a), tune_result(a, record(0, 0, 2)))
    cb.on_trial_complete(0, [], FakeTrial(a))
    t = store.get_trial(a)
    assert t.status == "failed" and "epoch 0 of 5" in t.error


def test_retry_starts_a_new_attempt_then_failure_stores_the_error(store, tmp_path):
    sweep, trials = claimed_sweep(store, epochs=3)
    a = trials[0].id
    path = tmp_path / "error.txt"
    path.write_text(TUNE_ERROR_FILE)
    cb, _ = callback_for(store, sweep, trials, flush_records=1000)
    trial = FakeTrial(a, error_file=str(path), num_failures=1)
    cb.on_trial_start(0, [], trial)
    for e in (0, 1):
        cb.on_trial_result(0, [], trial, tune_result(a, record(0, e, 2)))
    cb.on_trial_recover(0, [], trial)  # flushes the first attempt's records
    assert store.get_trial(a).records_done == 2
    assert cb.tracker.status[a] == "queued"
    cb.on_trial_start(0, [], trial)
    t = store.get_trial(a)
    assert (t.attempts, t.records_done, t.status) == (2, 0, "running")
    cb.on_trial_result(0, [], trial, tune_result(a, record(0, 0, 2, scale=2.0)))
    trial.num_failures = 2
    cb.on_trial_error(0, [], trial)
    t = store.get_trial(a)
    assert t.status == "failed" and t.attempts == 2
    assert t.error.startswith("DataUnavailable: dataset 'mnist' is not available in /data\n\n")
    # the stored rows are the last attempt's alone: its epoch 0, not the first attempt's epoch 1
    assert store.trial_history(a, "train_loss")[0].tolist() == [0]
    head = value_of(0, 0, METRICS.index("head_grad_norm"))
    assert store.trial_history(a, "head_grad_norm")[1][0] == 2.0 * head


def test_a_deterministic_error_fails_the_trial_with_its_whole_message(store):
    sweep, trials = claimed_sweep(store, epochs=3)
    a = trials[0].id
    cb, _ = callback_for(store, sweep, trials)
    trial = FakeTrial(a)
    long = "x" * 5000  # a long message is kept whole, not cut to a summary
    try:
        raise InvalidInput(f"too big {long}", field="batch_size")
    except InvalidInput as exc:
        text = deterministic_error(exc)
    assert text.startswith(f"InvalidInput: batch_size: too big {long}\n\nTraceback")
    cb.on_trial_start(0, [], trial)
    cb.on_trial_result(0, [], trial, tune_result(a, record(0, 0, 2)))
    cb.on_trial_result(0, [], trial, {TRIAL_KEY: a, "device": "cpu", ERROR_KEY: text})
    cb.on_trial_complete(0, [], trial)  # the trainable returned: Tune saw no error, no retry
    t = store.get_trial(a)
    assert (t.status, t.attempts, t.error, t.last_epoch) == ("failed", 1, text, 0)
    assert cb.tracker.status[a] == "failed"


def test_after_the_lease_is_lost_nothing_is_written(store):
    sweep, trials = claimed_sweep(store)
    a = trials[0].id
    cb, control = callback_for(store, sweep, trials)
    cb.on_trial_start(0, [], FakeTrial(a))
    control.lost.set()
    cb.on_trial_result(0, [], FakeTrial(a), tune_result(a, record(0, 0, 2)))
    cb.on_trial_complete(0, [], FakeTrial(a))
    t = store.get_trial(a)
    assert (t.status, t.records_done, t.last_epoch) == ("running", 0, None)


def test_a_runner_whose_sweep_was_taken_over_writes_nothing(database_url):
    """Before its heartbeat has noticed: the store fences every write of a runner_id, and the
    first one refused marks the lease lost."""
    with Store(database_url) as store:
        sweep, trials = claimed_sweep(store, lease_s=0.05)
        a, b = trials[0].id, trials[1].id
        store.start_trial(b)  # started before the takeover, by this runner
        cb, control = callback_for(store, sweep, trials, runner_id=RUNNER)
        cb.on_trial_start(0, [], FakeTrial(a))
        cb.on_trial_result(0, [], FakeTrial(a), tune_result(a, record(0, 0, 2)))  # buffered
        time.sleep(0.1)
        assert store.claim_sweep("other", 60.0).id == sweep.id  # the lease ran out: taken over
        cb.on_trial_result(0, [], FakeTrial(a), tune_result(a, record(0, 1, 2)))
        cb.on_trial_complete(0, [], FakeTrial(a))  # flushes: refused
        assert control.lost.is_set()
        cb.on_trial_start(0, [], FakeTrial(b))
        t = store.get_trial(a)  # requeued by the claim, and nothing of this runner's since
        assert (t.status, t.attempts, t.records_done, t.last_epoch) == ("queued", 1, 0, None)
        assert store.get_trial(b).attempts == 1
        assert store.get_sweep(sweep.id).runner_id == "other"


def test_unfenced_and_fenced_writes_of_the_holder_go_through(store):
    _, trials = claimed_sweep(store)
    a = trials[0].id
    store.start_trial(a, runner_id=RUNNER)
    store.write_records([(a, record(0, 0, 2))], runner_id=RUNNER)
    with pytest.raises(LeaseLost, match="no longer held by runner intruder"):
        store.write_records([(a, record(0, 1, 2))], runner_id="intruder")
    assert store.get_trial(a).records_done == 1  # the refused batch wrote nothing


def test_a_trial_cancelled_while_queued_is_skipped(store):
    sweep, trials = claimed_sweep(store)
    a = trials[0].id
    cb, _ = callback_for(store, sweep, trials)
    store.request_cancel(sweep.id)  # queued trials become cancelled at once
    cb.on_trial_start(0, [], FakeTrial(a))
    cb.on_trial_result(0, [], FakeTrial(a), tune_result(a, record(0, 0, 2)))
    cb.on_trial_complete(0, [], FakeTrial(a))
    t = store.get_trial(a)
    assert (t.status, t.attempts, t.last_epoch) == ("cancelled", 0, None)


def test_progress_counts_the_whole_sweep_and_estimates_time_left(store):
    sweep, trials = claimed_sweep(store, epochs=3, seeds=3)  # 3 trials × 4 records
    first = trials[0].id
    store.start_trial(first)
    store.write_records([(first, record(0, e, 2)) for e in range(4)])
    store.finish_trial(first, "completed")
    p = new_progress(store.get_sweep(sweep.id), store.runnable_trials(sweep.id))
    assert (p.trials_total, p.trials_done, p.epochs_total, p.epochs_done) == (3, 1, 8, 0)
    assert p.eta_s is None  # nothing done by this run yet: no pace to go by
    p.status[trials[1].id], p.done[trials[1].id] = "running", 2
    p.started_s -= 10.0  # ten seconds in, 2 of 8 records: 30 s to go at that pace
    assert p.epochs_done == 2 and p.eta_s == pytest.approx(30.0, rel=0.01)
    assert p.counts == {"completed": 1, "running": 1, "queued": 1}


# --- CancelStopper, Heartbeat -----------------------------------------------------------------


def test_stopper_stops_all_on_cancel_and_one_trial_on_divergence(store):
    sweep, _ = claimed_sweep(store)
    control = SweepControl()
    stopper = CancelStopper(store, sweep.id, control, poll_s=0.0)
    assert not stopper.stop_all()
    store.request_cancel(sweep.id)
    assert stopper.stop_all() and control.cancel.is_set()
    assert stopper("abc", {"diverged": True}) and not stopper("abc", {"diverged": False})


def test_stopper_reads_the_flag_at_most_every_poll_interval(store):
    sweep, _ = claimed_sweep(store)
    stopper = CancelStopper(store, sweep.id, SweepControl(), poll_s=3600.0)
    assert not stopper.stop_all()  # the first call reads the flag
    store.request_cancel(sweep.id)
    assert not stopper.stop_all()  # within the interval: not read again


def test_stopper_stops_all_when_the_runner_stops(store):
    sweep, _ = claimed_sweep(store)
    stop = threading.Event()
    stopper = CancelStopper(store, sweep.id, SweepControl(stop), poll_s=3600.0)
    assert not stopper.stop_all()
    stop.set()
    assert stopper.stop_all()


def test_heartbeat_extends_the_lease(store):
    sweep, _ = claimed_sweep(store, lease_s=1.5)
    control = SweepControl()
    with Heartbeat(store, sweep.id, RUNNER, 0.1, control, lease_s=1.5):
        time.sleep(2.0)  # past the claimed lease: only the heartbeat keeps it
        assert store.claim_sweep("intruder", 60.0) is None
    assert not control.lost.is_set()


def test_heartbeat_notices_another_runner_took_over(store):
    sweep, _ = claimed_sweep(store, lease_s=0.05)
    time.sleep(0.1)
    assert store.claim_sweep("other", 60.0).id == sweep.id  # the lease ran out
    control = SweepControl()
    with Heartbeat(store, sweep.id, RUNNER, 0.05, control):
        assert control.lost.wait(10.0)


def test_heartbeat_gives_up_once_the_lease_has_run_out_unextended(store, monkeypatch):
    """The store unreachable (every heartbeat fails): once a whole lease has passed since the
    last extension, another runner may hold the sweep, so the run must stop writing."""
    sweep, _ = claimed_sweep(store, lease_s=0.6)
    calls = []

    def unreachable(sweep_id, runner_id):
        calls.append(time.monotonic())
        raise StorageError("the database is unreachable")

    monkeypatch.setattr(store, "heartbeat", unreachable)
    control = SweepControl()
    start = time.monotonic()
    with Heartbeat(store, sweep.id, RUNNER, 0.2, control, lease_s=0.6, since=start):
        assert control.lost.wait(10.0)
        lost_after = time.monotonic() - start
    assert lost_after >= 0.6  # not before the lease ran out…
    assert len(calls) >= 3  # …and it kept trying until then


def test_heartbeat_keeps_the_lease_through_a_blip(store, monkeypatch):
    sweep, _ = claimed_sweep(store, lease_s=1.5)
    real, fails = store.heartbeat, [1, 1]

    def flaky(sweep_id, runner_id):
        if fails:
            fails.pop()
            raise StorageError("a blip")
        return real(sweep_id, runner_id)

    monkeypatch.setattr(store, "heartbeat", flaky)
    control = SweepControl()
    with Heartbeat(store, sweep.id, RUNNER, 0.5, control, lease_s=1.5):
        time.sleep(2.5)  # two failed beats, then good ones, past the claimed lease
        assert store.claim_sweep("intruder", 60.0) is None
    assert not control.lost.is_set() and not fails


def test_run_sweep_with_nothing_to_run_finishes_without_ray(store, monkeypatch):
    sweep, trials = claimed_sweep(store, epochs=0, seeds=1)
    store.start_trial(trials[0].id)
    store.write_records([(trials[0].id, record(0, 0, 2))])
    store.finish_trial(trials[0].id, "completed")

    def no_ray(*args, **kwargs):
        pytest.fail("run_sweep started Ray with nothing to run")

    monkeypatch.setattr(driver, "init_ray", no_ray)
    info = run_sweep(store, sweep.id, runner_id=RUNNER)
    assert info.status == "completed" and info.progress == 1.0


# --- real Ray (the session's local instance: ray_local in conftest.py) --------------------------


def run_spec(store, spec: dict, **kw):
    sweep = store.create_sweep(parse_spec(spec))
    assert store.claim_sweep(RUNNER, 60.0).id == sweep.id
    return run_sweep(store, sweep.id, runner_id=RUNNER, **kw)


def stored_keys(store, sweep_id):
    frame = store.read_metrics(sweep_id)
    return frame, set(row_keys(frame))


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_end_to_end_stores_every_row_and_matches_fit(database_url, ray_local, monkeypatch):
    from workers.train import fit

    handed = []  # what the trials were given: no database URL, by design
    real_suggest = driver.TrialSource.suggest

    def suggest(self, trial_id):
        got = real_suggest(self, trial_id)
        if isinstance(got, dict):
            handed.append(got[PARAM_KEY])
        return got

    monkeypatch.setattr(driver.TrialSource, "suggest", suggest)
    devices = {}
    with Store(database_url) as store:
        spec = {
            "name": "e2e",
            "parameters": {
                "depth": [2, 3],
                "init": ["gaussian", "orthogonal"],
                "epochs": 2,
                **TINY,
            },
            "seeds": 2,
            "pack": 1,  # each trial alone: fit()'s numbers bit for bit (packs: test_packed*.py)
        }
        info = run_spec(store, spec, progress=lambda p: devices.update(p.devices))
        assert info.status == "completed" and info.progress == 1.0
        assert info.counts["completed"] == 8 and info.finished_at is not None
        trials, _ = store.list_trials(info.id)
        assert {(t.status, t.attempts, t.records_done) for t in trials} == {("completed", 1, 3)}
        frame, keys = stored_keys(store, info.id)
        assert len(frame) == len(keys)  # no row twice
        assert keys == expected_keys(trials)
        assert devices == {t.id: "cpu" for t in trials}
        assert sorted(p["trial_id"] for p in handed) == sorted(t.id for t in trials)
        for p in handed:
            assert set(p) == {"trial_id", "config", "data_dir"}
            assert store.url not in repr(p) and "sqlite" not in repr(p)
        # the numbers are fit()'s own: the same config and seed on one CPU thread, bit for bit
        t = trials[-1]
        fitted = list(fit(t.config))
        for rec in fitted:
            for m in (*SCALAR_METRICS, *layer_metrics(TrialConfig(**t.config))):
                if m == "epoch_time_s":
                    continue
                epochs, values = store.trial_history(t.id, m)
                stored = values[list(epochs).index(rec["epoch"])]
                assert np.array_equal(bits(stored), bits(rec[m])), (m, rec["epoch"])
        assert fitted[0]["epoch"] == 0  # the record that carries the input Gram
        assert np.array_equal(bits(store.input_gram(t.id)), bits(fitted[0]["input_gram"]))


@pytest.mark.ray
@pytest.mark.slow
def test_cancel_stops_running_trials_and_keeps_what_was_stored(sqlite_url, ray_local):
    epochs = 300  # far longer than the test waits
    with Store(sqlite_url) as store:
        spec = {"name": "cancel", "parameters": {"depth": 4, "epochs": epochs, **TINY}, "seeds": 3}
        spec["pack"] = 1  # the third trial waits for a slot (packs: test_packed_runner.py)
        sweep = store.create_sweep(parse_spec(spec))
        assert store.claim_sweep(RUNNER, 60.0).id == sweep.id
        snapshot = {}

        def cancel_when_recording():
            while True:
                trials, _ = store.list_trials(sweep.id)
                if any(t.records_done >= 3 for t in trials):
                    snapshot["frame"] = store.read_metrics(sweep.id)
                    store.request_cancel(sweep.id)
                    return
                time.sleep(0.1)

        canceller = threading.Thread(target=cancel_when_recording, daemon=True)
        canceller.start()
        info = run_sweep(store, sweep.id, runner_id=RUNNER)
        canceller.join(1.0)
        assert info.status == "cancelled" and info.cancel_requested
        trials, _ = store.list_trials(sweep.id)
        assert {t.status for t in trials} == {"cancelled"}
        assert trials[2].attempts == 0  # the third trial was still queued: never started
        frame = store.read_metrics(sweep.id)
        for t in trials:
            stored = sorted(set(frame.epoch[frame.trial_id == t.id]))
            assert stored == list(range(len(stored)))  # a prefix 0..k of the epochs, no gap
            assert len(stored) < epochs + 1  # stopped, not run to the end
            rows = frame[frame.trial_id == t.id]
            per_epoch = rows.groupby("epoch").size()
            per_layer = len(layer_metrics(TrialConfig(**t.config)))
            depth = TrialConfig(**t.config).depth
            assert set(per_epoch) <= {len(SCALAR_METRICS) + depth * per_layer}  # whole epochs
        # what was stored before the cancel is still there, unchanged
        before = snapshot["frame"].set_index(["trial_id", "epoch", "metric", "layer"]).value
        after = frame.set_index(["trial_id", "epoch", "metric", "layer"]).value
        assert len(before) > 0
        assert np.array_equal(after.loc[before.index].to_numpy(), before.to_numpy(), equal_nan=True)


BIG_BATCH = 4096  # more than the digits training set holds


@pytest.fixture(scope="module")
def mixed_sweep(tmp_path_factory, ray_local):
    """One sweep of four trials: a healthy one, a diverging one (lr 1e6), and two whose batch
    (4096) exceeds the digits training set: fit() raises InvalidInput, which no retry cures,
    although max_failures allows two."""
    root = tmp_path_factory.mktemp("mixed")
    settings = Settings(database_url=f"sqlite:///{root / 'db.sqlite'}", data_dir=root / "empty")
    store = Store(settings.database_url, settings=settings)
    spec = {
        "name": "mixed",
        "parameters": {
            "lr": [0.01, 1e6],
            "dataset": "digits",
            "batch_size": [32, BIG_BATCH],
            "depth": 3,
            "width": 16,
            "norm": "none",
            "init_gain": 2.0,
            "epochs": 3,
        },
        "seeds": 1,
        "max_failures": 2,
    }
    info = run_spec(store, spec)
    trials = {(t.config["lr"], t.config["batch_size"]): t for t in store.list_trials(info.id)[0]}
    yield store, info, trials
    store.close()


@pytest.mark.ray
@pytest.mark.slow
def test_diverged_trial_is_marked_with_its_epoch_and_nothing_after(mixed_sweep):
    store, _, trials = mixed_sweep
    t = trials[(1e6, 32)]
    assert t.status == "diverged" and t.attempts == 1
    assert t.diverged_epoch == 1 and t.last_epoch == 1  # no record after the divergence
    epochs, loss = store.trial_history(t.id, "train_loss")
    assert epochs.tolist() == [0, 1]
    assert math.isfinite(loss[0]) and not math.isfinite(loss[1])
    healthy = trials[(0.01, 32)]
    assert healthy.status == "completed" and healthy.last_epoch == 3


@pytest.mark.ray
@pytest.mark.slow
def test_a_deterministic_failure_is_not_retried_and_its_message_is_whole(mixed_sweep):
    from workers.train import fit

    _, info, trials = mixed_sweep
    with pytest.raises(InvalidInput) as raised:  # the same error, raised here
        next(fit({**trials[(0.01, BIG_BATCH)].config, "epochs": 0}))
    reason = f"InvalidInput: {raised.value}"
    assert reason.startswith(f"InvalidInput: batch_size: {BIG_BATCH} exceeds the ")
    failed = set()
    for lr in (0.01, 1e6):
        t = trials[(lr, BIG_BATCH)]
        assert t.status == "failed"
        assert t.attempts == 1  # not retried, though max_failures = 2
        assert t.error.split("\n\n", 1)[0] == reason  # the whole message, then the traceback
        assert "Traceback" in t.error and "workers/train.py" in t.error
        assert t.last_epoch is None
        failed.add(t.id)
    assert info.status == "failed" and info.error.startswith("2 of 4 trials failed; the first, ")
    assert info.error in {f"2 of 4 trials failed; the first, trial {i}: {reason}" for i in failed}
    assert info.counts == {
        "queued": 0, "running": 0, "completed": 1, "diverged": 1, "failed": 2, "cancelled": 0,
        "stopped": 0,
    }  # fmt: skip


@pytest.mark.ray
@pytest.mark.slow
def test_a_crash_that_is_not_deterministic_is_retried(sqlite_url, ray_local, monkeypatch, tmp_path):
    crashed = tmp_path / "crashed"  # on the driver's disk, which the local workers share

    def crash_once(config):  # pickled by value into the trial's worker
        from workers.trainable import run_trial

        if not crashed.exists():
            crashed.touch()
            raise RuntimeError("a worker lost mid-trial")
        run_trial(config)

    monkeypatch.setattr(driver, "run_trial", crash_once)
    with Store(sqlite_url) as store:
        spec = {"name": "flaky", "parameters": {"depth": 2, "epochs": 1, **TINY}, "seeds": 1}
        info = run_spec(store, {**spec, "max_failures": 1})
        assert crashed.exists() and info.status == "completed" and info.error is None
        (t,), _ = store.list_trials(info.id)
        assert (t.status, t.attempts, t.last_epoch, t.error) == ("completed", 2, 1, None)


@pytest.mark.ray
@pytest.mark.slow
def test_trials_asking_more_than_the_local_instance_has_fail_at_once(sqlite_url, ray_local):
    with Store(sqlite_url) as store:
        spec = {"name": "big", "parameters": {"depth": 2, "epochs": 1, **TINY}, "seeds": 2}
        info = run_spec(store, {**spec, "resources": {"cpu": 1, "gpu": 0.5}})
        assert info.status == "failed" and info.counts["failed"] == 2
        trials, _ = store.list_trials(info.id)
        for t in trials:
            assert t.error.startswith("resources.gpu: a trial needs 0.5 GPU, but the local Ray")
            assert t.attempts == 0 and t.last_epoch is None
