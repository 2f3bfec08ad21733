"""service.cost: the operation count against counts done by hand, the throughput measured from
epoch times in a real SQLite store (packed members counted once), the budget's refusal and
`accept_cost`, and the ETA by the same model."""

from __future__ import annotations

import math

import pytest
from records import record

from service import cost
from service.config import TrialConfig
from service.errors import LimitExceeded
from service.settings import Settings
from service.spec import parse_spec
from service.store import Store


@pytest.fixture(autouse=True)
def _fresh_measurements():
    cost.forget_throughput()
    yield
    cost.forget_throughput()


@pytest.fixture
def store(sqlite_url):
    with Store(sqlite_url, settings=Settings(database_url=sqlite_url)) as s:
        yield s


def _spec(**kw):
    return parse_spec({"name": "cost", **kw})


def test_mlp_depth_3_width_4_by_hand():
    """digits (d_in 64, 10 classes), depth 3, width 4, batch 100, BatchNorm, 2 epochs."""
    c = TrialConfig(depth=3, width=4, batch_size=100, epochs=2, dataset="digits")
    s = cost.shape_of(c)
    m = 64 * 4 + 2 * 4 * 4 + 4 * 10  # W1, W2, W3, head: 256 + 32 + 40
    assert cost.macs_per_sample(s) == m == 328
    assert cost.stepped_samples(s) == 1400  # ⌊1437 / 100⌋ · 100: the short tail is dropped
    train = 6 * 328 * 1400
    assert cost.train_flops_per_epoch(s) == train == 2_755_200
    test_eval = 2 * 328 * 360
    probe = 6 * 328 * 100
    taps = 3 * 3 * 2 * (2 * 4 * 4 * 100)  # (linear, norm, act) × 3 blocks, twice, Q(100, 4)
    weights = 2 * 4 * 4 * 64 + 2 * (2 * 4 * 4 * 4) + 2 * 4 * 4 * 10  # W1, W2, W3, head
    record_ = test_eval + probe + taps + weights
    assert cost.record_flops(s) == record_ == 493_184
    assert cost.flops_per_epoch(c) == train + record_
    epoch0 = 2 * 328 * 1437  # 1437 ≤ epoch0_train_samples: the whole training set
    assert cost.trial_flops(s) == 2 * train + 3 * record_ + epoch0 == 7_932_624
    # norm none drops the norm taps; a 1000-sample subset steps on 1000
    s2 = cost.shape_of(TrialConfig(depth=3, width=4, norm="none", max_train_samples=1000))
    assert cost.record_flops(s2) == record_ - 3 * 2 * (2 * 4 * 4 * 100)
    assert cost.train_flops_per_epoch(s2) == 6 * 328 * 1000


def test_the_other_families_by_hand():
    cnn = TrialConfig(model="cnn", depth=2, width=4, kernel_size=3)
    assert cost.macs_per_sample(cost.shape_of(cnn)) == 8 * 8 * 9 * (1 * 4 + 4 * 4) + 4 * 10
    res = TrialConfig(model="resmlp", depth=2, width=4)
    assert cost.macs_per_sample(cost.shape_of(res)) == 64 * 4 + 2 * 16 + 40
    tf = TrialConfig(model="transformer", depth=1, width=8, heads=2, mlp_ratio=2)
    # 8 rows of 8 values: embed 8·8·8; per block 8·(4·64 + 2·8·16) + 2·8²·8; head 80
    assert cost.macs_per_sample(cost.shape_of(tf)) == 512 + 8 * (256 + 256) + 1024 + 80


@pytest.mark.parametrize("model", ["mlp", "resmlp", "transformer"])
def test_macs_are_the_weights_each_sample_multiplies(model):
    """M against the networks' own parameters: an MLP's multiply-adds are its weight entries;
    a transformer's are its Linear weights once per token plus the attention's 2·T²·d."""
    from workers.models import build

    torch = pytest.importorskip("torch")
    c = TrialConfig(model=model, depth=3, width=8, heads=2, mlp_ratio=2, norm="none")
    p = build(c).init_params(torch.Generator().manual_seed(0))
    weights = sum(v.numel() for k, v in p.items() if v.ndim == 2 and k != "pos")
    m = cost.macs_per_sample(cost.shape_of(c))
    if model == "transformer":
        t, d = 8, 8
        head = p["W_head"].numel()
        assert m == (weights - head) * t + 3 * 2 * t * t * d + head
    else:
        assert m == weights


def test_estimate_adds_trials_and_splits_them_over_the_host(monkeypatch):
    monkeypatch.setattr(cost.os, "cpu_count", lambda: 4)
    spec = _spec(parameters={"depth": [3], "width": 4, "epochs": 2}, seeds=6)
    e = cost.estimate_spec(spec)
    one = 7_932_624
    assert (e.trials, e.trial_epochs, e.records, e.flops) == (6, 12, 18, 6 * one)
    assert e.parallel == 4 and e.kind == "cpu" and "assumed 2 GFLOP/s per CPU" in e.text
    # 6 trials on 4 CPUs at 2e9 each: the work over 8e9 flop/s, but never under one trial alone
    assert e.seconds == pytest.approx(6 * one / (4 * 2e9))
    trials = [TrialConfig(depth=3, width=4, epochs=2, seed=i) for i in range(6)]
    two = cost.estimate(trials, cost.default_throughput("cpu"), {"cpu": 3.0})
    assert two.parallel == 1 and two.seconds == pytest.approx(6 * one / (3 * 2e9))


def _finish(store, trial_id, times):
    store.start_trial(trial_id)
    recs = [(trial_id, record(0, e, 3, epoch_time_s=t)) for e, t in enumerate(times)]
    store.write_records(recs)
    store.finish_trial(trial_id, "completed")


def test_throughput_from_stored_epoch_times(store):
    spec = _spec(parameters={"depth": 3, "width": 4, "epochs": 2}, seeds=3)
    sweep = store.create_sweep(spec)
    assert sweep.estimate.throughput_source.startswith("an assumed")
    store.claim_sweep("r", 60)
    ids = [t.id for t in store.list_trials(sweep.id)[0]]
    train = 2_755_200
    _finish(store, ids[0], [0.0, 0.5, 1.5])  # epoch 0 (no training) is not a measurement
    _finish(store, ids[1], [0.0, 1.0, math.nan])  # a non-finite time is skipped
    cost.forget_throughput()
    with store._read() as s:
        got = cost.measure_throughput(s, "cpu")
    assert got.measured and (got.epochs, got.trials) == (3, 2)
    assert got.flops_per_s == pytest.approx(3 * train / 3.0)
    assert "measured 2.76 MFLOP/s per CPU (3 epochs of 2 trials)" in got.source
    with store._read() as s:
        assert not cost.measure_throughput(s, "gpu").measured  # no GPU sweep: the default
    # the ETA of the running sweep: its last trial, nothing recorded, at the measured rate
    eta = store.get_sweep(sweep.id).eta_s
    assert eta == pytest.approx(7_932_624 / got.flops_per_s)


def test_packed_members_share_one_epoch_time():
    shape = cost.shape_of(TrialConfig(depth=3, width=4, epochs=2))
    f = cost.train_flops_per_epoch(shape)
    epochs = [(i, 1, 1, 2.0, shape, 1.0) for i in range(3)]
    got = cost.throughput_of_epochs(epochs, "cpu")  # one pack of 3: 3 epochs' work in 2 s
    assert got.flops_per_s == pytest.approx(3 * f / 2.0)
    two_cpus = cost.throughput_of_epochs([(4, 2, 1, 2.0, shape, 2.0)], "cpu")
    assert two_cpus.flops_per_s == pytest.approx(f / 4.0)  # per CPU
    assert not cost.throughput_of_epochs([(5, 1, 1, 0.0, shape, 1.0)], "cpu").measured


def test_over_the_budget_is_refused_unless_accepted(sqlite_url, monkeypatch):
    monkeypatch.setattr(cost.os, "cpu_count", lambda: 1)
    settings = Settings(database_url=sqlite_url, max_sweep_hours=1e-4)  # 0.36 s
    params = {"depth": 3, "width": 4, "epochs": 100}  # 100 × 3.2e6 flop at 2e9: ~0.16 s each
    with Store(sqlite_url, settings=settings) as store:
        with pytest.raises(LimitExceeded) as exc:
            store.create_sweep(_spec(parameters=params, seeds=3))
        err = exc.value
        assert err.field == "budget" and "accept_cost: true" in err.message
        assert "ISOSWEEP_MAX_SWEEP_HOURS" in err.message and "3 trials" in err.message
        assert store.list_sweeps()[1] == 0  # nothing written
        ok = store.create_sweep(_spec(parameters=params, seeds=3, accept_cost=True))
        assert ok.estimate.seconds > 0.36 and ok.spec["accept_cost"] is True
        assert store.create_sweep(_spec(parameters=params, seeds=1)).estimate.seconds < 0.36
        # trials whose results are stored cost nothing: a reused sweep is under any budget
        for t in store.list_trials(ok.id)[0]:
            store.claim_sweep("r", 60)
            _finish(store, t.id, [0.0] * 101)
        again = store.create_sweep(_spec(parameters=params, seeds=3))
        assert again.estimate.trials == 0 and again.estimate.seconds == 0


def test_the_eta_follows_the_remaining_epochs(store, monkeypatch):
    monkeypatch.setattr(cost.os, "cpu_count", lambda: 1)
    sweep = store.create_sweep(_spec(parameters={"depth": 3, "width": 4, "epochs": 2}, seeds=2))
    assert sweep.eta_s is None  # queued
    store.claim_sweep("r", 60)
    one = 7_932_624
    assert store.get_sweep(sweep.id).eta_s == pytest.approx(2 * one / 2e9)
    t = store.list_trials(sweep.id)[0][0].id
    store.start_trial(t)
    store.write_records([(t, record(0, 0, 3, epoch_time_s=0.0))])  # epoch 0 recorded
    s = cost.shape_of(TrialConfig(depth=3, width=4, epochs=2))
    left = one + 2 * cost.train_flops_per_epoch(s) + 2 * cost.record_flops(s)
    assert store.get_sweep(sweep.id).eta_s == pytest.approx(left / 2e9)
    totals = store.list_sweeps()[0][0].estimate
    assert totals.trials == 2 and totals.flops == 2 * one  # the estimate stays the whole sweep


def test_durations_and_rates_read_at_a_glance():
    assert cost.format_duration(4680) == "1.3 h" and cost.format_duration(42) == "42 s"
    assert cost.format_duration(3 * 86400) == "3 days" and cost.format_duration(90) == "1.5 min"
    assert cost.format_rate(3.1e9) == "3.1 GFLOP/s"
