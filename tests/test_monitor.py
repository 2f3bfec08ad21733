"""isosweep.Monitor (docs/own-loop.md): the user's own training loop records external trials,
in a local Store and on a live server (the external REST routes, api/routes/external.py): every
key probe returns (the per-tap metrics, the attention entropy, the update ratio between
records), the user's config as the trial's model_params (filters, group-bys), resume after a
restart, cancel and divergence (a resumed diverged run stops too)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

import isosweep
from api.app import create_app
from api.server import ServerThread
from service.errors import Conflict, InvalidInput
from service.settings import Settings
from service.spec import parse_spec
from service.store import Store
from service.store import external as ext

ROOT = Path(__file__).resolve().parents[1]
GAP = "isometry_gap/output"


def tiny(depth: int = 3, d: int = 8, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential()
    model.blocks = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.Tanh()) for _ in range(depth)]
    )
    model.head = torch.nn.Linear(d, 3)
    return model.double()


def batch(n: int = 6, d: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 3, (n,), generator=g)


def train_step(model: torch.nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor) -> float:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def history(store: Store, trial_id: int, metric: str) -> tuple[np.ndarray, np.ndarray]:
    return store.trial_history(trial_id, metric)


@pytest.fixture
def store(database_url):
    s = Store(database_url)
    yield s
    s.close()


# --- a local Store ----------------------------------------------------------------------------


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_each_record_is_the_probe_of_that_step_with_the_loss(store):
    model, (x, y) = tiny(), batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    m = isosweep.Monitor(model, x, y=y, store=store, sweep="own", config={"lr": 0.5})
    expected, losses, previous = [], [], None
    for step in range(0, 30, 10):
        for _ in range(10):
            loss = train_step(model, opt, x, y)
        # the same weights, and the update since the weights of the previous record
        expected.append(isosweep.probe(model, x, y=y, taps="blocks.{i}", previous=previous))
        previous = weights(model)
        losses.append(loss)
        assert m.record(step, loss=loss) is True
    epochs, gaps = history(store, m.trial_id, GAP)
    assert epochs.tolist() == [0, 10, 20] and gaps.shape == (3, 3)
    keys = ("rms", "grad_norm", "mean_cosine", "range_isometry_gap/output", "effective_rank",
            "stable_rank")  # fmt: skip
    for k, rec in enumerate(expected):  # float64 through JSON-free storage: bit for bit
        np.testing.assert_array_equal(gaps[k], rec[GAP])
        for key in keys:
            np.testing.assert_array_equal(history(store, m.trial_id, key)[1][k], rec[key])
    assert history(store, m.trial_id, "train_loss")[1].tolist() == losses
    assert m.dropped == ()  # every key probe gives is stored
    ratio = history(store, m.trial_id, "update_ratio")[1]  # ‖θ − θ_prev‖/‖θ_prev‖ per tap
    assert np.isnan(ratio[0]).all()  # the first record has no previous one
    np.testing.assert_array_equal(ratio[1:], [r["update_ratio"] for r in expected[1:]])
    head = history(store, m.trial_id, "head_update_ratio")[1]
    assert math.isnan(head[0]) and head[2] == expected[2]["head_update_ratio"] > 0
    assert m.finish() == "completed"
    info = store.get_sweep(m.sweep_id)
    assert info.status == "completed" and info.spec["external"] is True
    params = {"model": "external", "depth": 3, "model_params": [{"lr": 0.5}]}
    assert info.spec["parameters"] == params
    assert info.tags == ["external"]
    config = store.get_trial(m.trial_id).config
    assert config["model"] == "external" and config["model_params"] == {"lr": 0.5}


def test_a_tap_of_orthonormal_rows_has_gap_zero_and_rms_one(store):
    """Closed form: x = √d·Q with orthonormal rows, tapped through nn.Identity, has Gram d·I/d
    — every eigenvalue equal — so its isometry gap is 0 and its rms 1."""
    n, d = 4, 8
    g = torch.Generator().manual_seed(3)
    q, _ = torch.linalg.qr(torch.randn(d, n, dtype=torch.float64, generator=g))
    x = math.sqrt(d) * q.T  # (n, d), rows orthogonal with ‖x_i‖² = d
    model = torch.nn.Sequential()
    model.blocks = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(d, d).double())
    m = isosweep.Monitor(model, x, store=store, sweep="closed-form", taps="blocks.0")
    assert m.record(0, loss=1.5)
    _, gap = history(store, m.trial_id, GAP)
    _, rms = history(store, m.trial_id, "rms")
    _, cos = history(store, m.trial_id, "mean_cosine")
    assert abs(gap[0, 0]) < 1e-12 and abs(rms[0, 0] - 1) < 1e-12 and abs(cos[0, 0]) < 1e-12


def test_the_same_step_again_is_a_no_op_and_another_record_for_it_a_conflict(store):
    model, (x, y) = tiny(), batch()
    m = isosweep.Monitor(model, x, y=y, store=store, sweep="idem")
    assert m.record(0, loss=2.0)
    assert m.record(0, loss=2.0)  # weights unchanged: the same record, nothing written
    answer = ext.store_append(store, m.trial_id, {"epoch": 0, **_stored(store, m.trial_id, 0)})
    assert answer["stored"] is False and answer["last_step"] == 0
    with pytest.raises(Conflict, match=r"step 0 .* other values"):
        m.record(0, loss=2.5)
    assert history(store, m.trial_id, "train_loss")[1].tolist() == [2.0]


def _stored(store: Store, trial_id: int, step: int) -> dict[str, Any]:
    """The step's stored record, every metric of it (the 2-D arrays included)."""
    sweep_id = store.get_trial(trial_id).sweep_id
    frame = store.read_metrics(sweep_id, epoch=step, where=None)
    frame = frame[frame["trial_id"] == trial_id]
    out: dict[str, Any] = {}
    for metric, rows in frame.groupby("metric"):
        values = rows.sort_values("layer")["value"].to_numpy()
        out[str(metric)] = float(values[0]) if rows["layer"].isna().all() else values
    out.update({a.name: a.values for a in store.spectra(trial_id) if a.epoch == step})
    return out


def test_a_new_monitor_resumes_the_run_after_a_restart(database_url):
    model, (x, y) = tiny(), batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = {"optimizer": {"name": "sgd", "lr": 0.1}, "depth": 3}
    with Store(database_url) as first:
        a = isosweep.Monitor(model, x, y=y, store=first, sweep="resume", config=config)
        for step in range(3):
            assert a.record(step, loss=train_step(model, opt, x, y))
    with Store(database_url) as second:  # a new process: a new Store and a new Monitor
        b = isosweep.Monitor(model, x, y=y, store=second, sweep="resume", config=config)
        assert (b.sweep_id, b.trial_id, b.last_step) == (a.sweep_id, a.trial_id, 2)
        assert b.record(3, loss=train_step(model, opt, x, y))
        assert b.finish() == "completed"
        assert history(second, b.trial_id, GAP)[0].tolist() == [0, 1, 2, 3]
        assert second.list_trials(b.sweep_id)[1] == 1
        spec = second.get_sweep(b.sweep_id).spec
        flat = {"optimizer.name": "sgd", "optimizer.lr": 0.1, "depth": 3}
        assert spec["parameters"]["model_params"] == [flat] and spec["runs"][b.run] == flat
        other = isosweep.Monitor(model, x, store=second, sweep="resume", config=config, run="s2")
        assert other.trial_id != b.trial_id and other.last_step is None


def test_a_step_going_backwards_is_refused_and_nothing_is_written(store):
    model, (x, y) = tiny(), batch()
    m = isosweep.Monitor(model, x, y=y, store=store, sweep="back")
    assert m.record(5, loss=1.0)
    with pytest.raises(InvalidInput, match="step 3 is below the last stored step 5"):
        m.record(3, loss=1.0)
    assert history(store, m.trial_id, GAP)[0].tolist() == [5]


def test_a_nan_loss_is_stored_as_divergence_and_stops_the_loop(store):
    model, (x, y) = tiny(), batch()
    m = isosweep.Monitor(model, x, y=y, store=store, sweep="nan")
    assert m.record(0, loss=1.0)
    assert m.record(1, loss=float("nan")) is False
    assert m.diverged and m.record(2, loss=1.0) is False  # stopped: nothing more is stored
    t = store.get_trial(m.trial_id)
    assert t.status == "diverged" and t.diverged_epoch == 1
    assert np.isnan(history(store, m.trial_id, "train_loss")[1][1])
    assert m.finish() == "diverged" and store.get_sweep(m.sweep_id).status == "completed"


def test_a_resumed_monitor_of_a_diverged_run_stops_at_once(store):
    """The run diverged, the process restarted with the same config: record() returns False
    (the stop flag a loop already handles), not a 409, and stores nothing."""
    model, (x, y) = tiny(), batch()
    a = isosweep.Monitor(model, x, y=y, store=store, sweep="nan-again")
    assert a.record(0, loss=1.0) and a.record(1, loss=math.inf) is False
    b = isosweep.Monitor(model, x, y=y, store=store, sweep="nan-again")
    assert (b.trial_id, b.diverged, b.stopped) == (a.trial_id, True, True)
    assert b.record(2, loss=0.5) is False
    assert history(store, b.trial_id, "train_loss")[0].tolist() == [0, 1]
    assert b.finish() == "diverged"


def test_attention_taps_store_the_entropy_per_layer_and_head(store):
    """Zero query and key maps: uniform attention over T = 5 tokens, entropy log 5 in both
    heads (the per-head table is a 2-D array of the spectra table)."""
    torch.manual_seed(2)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(layer, torch.nn.Flatten(), torch.nn.Linear(40, 3)).double()
    with torch.no_grad():
        layer.self_attn.in_proj_weight[:16].zero_()
        layer.self_attn.in_proj_bias[:16].zero_()
    x = torch.randn(4, 5, 8, dtype=torch.float64)
    m = isosweep.Monitor(model, x, store=store, sweep="attn", taps=["0.self_attn", "0"])
    assert m.record(0, loss=1.0)
    ent = history(store, m.trial_id, "attention_entropy")[1][0]
    assert ent[0] == pytest.approx(math.log(5), rel=1e-12) and math.isnan(ent[1])
    (heads,) = store.spectra(m.trial_id, name="attention_entropy_heads")
    assert heads.values.shape == (2, 2)
    np.testing.assert_allclose(heads.values[0], math.log(5), rtol=1e-12)
    assert m.record(0, loss=1.0)  # the same step again, 2-D array included: stores nothing


def test_bad_input_is_named(store):
    model, (x, y) = tiny(), batch()
    with pytest.raises(InvalidInput, match=r"blokcs\.0"):
        isosweep.Monitor(model, x, store=store, sweep="bad", taps="blokcs.{i}")
    with pytest.raises(InvalidInput, match="exactly one of client"):
        isosweep.Monitor(model, x, sweep="bad")
    m = isosweep.Monitor(model, x, y=y, store=store, sweep="bad")
    with pytest.raises(InvalidInput, match="not 'a b'") as e:
        m.record(0, loss=1.0, **{"a b": 0.1})
    assert "train_loss" in e.value.allowed and e.value.field == "a b"
    with pytest.raises(InvalidInput, match="integer"):
        m.record(-1, loss=1.0)
    with pytest.raises(InvalidInput, match="a number"):
        m.record(0, loss="low")
    store.create_sweep(parse_spec({"name": "runs-here", "parameters": {"depth": 2, "epochs": 0}}))
    with pytest.raises(Conflict, match="not an external sweep"):
        isosweep.Monitor(model, x, store=store, sweep="runs-here")


def test_a_submitted_spec_cannot_use_the_external_model(store):
    spec = parse_spec({"name": "x", "parameters": {"model": "external", "norm": "none"}})
    with pytest.raises(InvalidInput, match="own training loop") as e:
        store.create_sweep(spec)
    assert e.value.field == "parameters.model" and store.list_sweeps()[1] == 0


def test_the_runner_never_claims_an_external_sweep_and_still_claims_the_others(store):
    model, (x, _) = tiny(), batch()
    m = isosweep.Monitor(model, x, store=store, sweep="mine")
    assert m.record(0)
    assert store.claim_sweep("runner-1", 60.0) is None
    assert store.claim_sweep("runner-1", 60.0, sweep_id=m.sweep_id) is None
    queued = store.create_sweep(parse_spec({"name": "q", "parameters": {"depth": 2, "epochs": 0}}))
    claimed = store.claim_sweep("runner-1", 60.0)
    assert claimed is not None and claimed.id == queued.id
    assert store.get_sweep(m.sweep_id).status == "running"


# --- the loop's own scalars: loop/<name> ------------------------------------------------------

# a learning-rate schedule with values that do not round-trip by accident
LRS = [3e-4, 3e-4 * 0.9, 1 / 3, 2.5e-5 / 7]


def _lr_run(store: Store, sweep: str = "schedule") -> isosweep.Monitor:
    """Five records with a learning rate and a clip fraction per step (a numpy float32 and a 0-d
    tensor among them), the last lr NaN: stored, and no divergence."""
    model, (x, y) = tiny(), batch()
    m = isosweep.Monitor(model, x, y=y, store=store, sweep=sweep)
    clips = [np.float32(0.25), torch.tensor(0.5, dtype=torch.float64), 0, 1, 0.75]
    for step, (lr, clip) in enumerate(zip([*LRS, math.nan], clips, strict=True)):
        assert m.record(step * 10, loss=1.0, lr=lr, clip_frac=clip) is True
    return m


def test_a_loops_own_scalars_are_stored_as_loop_metrics_and_read_back_exactly(store):
    m = _lr_run(store)
    steps, lrs = history(store, m.trial_id, "loop/lr")
    assert steps.tolist() == [0, 10, 20, 30, 40] and lrs.shape == (5,)
    assert lrs[:4].tolist() == LRS and math.isnan(lrs[4])  # exact: float64 both ways
    clips = history(store, m.trial_id, "loop/clip_frac")[1].tolist()
    assert clips == [float(np.float32(0.25)), 0.5, 0.0, 1.0, 0.75]
    t = store.get_trial(m.trial_id)  # a NaN learning rate is stored, and is no divergence
    assert (t.status, t.diverged_epoch, m.diverged) == ("running", None, False)
    frame = store.read_metrics(m.sweep_id, metrics="loop/lr")  # a scalar in the tidy frame
    assert frame["metric"].tolist() == ["loop/lr"] * 5 and frame["layer"].isna().all()
    assert frame["value"].tolist()[:4] == LRS and frame["epoch"].tolist() == [0, 10, 20, 30, 40]
    everything = store.read_metrics(m.sweep_id, metrics=None, epoch=[10])  # all: theirs too
    mine = everything[everything["metric"].str.startswith("loop/")]
    assert sorted(mine["metric"]) == ["loop/clip_frac", "loop/lr"] and mine["layer"].isna().all()
    assert mine.loc[mine["metric"] == "loop/lr", "value"].tolist() == [LRS[1]]
    assert len(store.read_metrics(m.sweep_id, metrics=["loop/lr", GAP], layers=[1])) == 5 + 5
    assert m.last_record is not None and m.last_record["loop/clip_frac"] == 0.75
    assert m.finish() == "completed"


def test_a_loop_scalars_name_and_value_are_checked_naming_the_key(store):
    model, (x, y) = tiny(), batch()
    m = isosweep.Monitor(model, x, y=y, store=store, sweep="names")
    longest = "a" * 59  # loop/ + 59 = the metric column's 64 characters
    for bad in ("a b", "a" * 60, "1st", "loop/x", "lr-max", ""):
        with pytest.raises(InvalidInput, match="a scalar's name") as e:
            m.record(0, loss=1.0, **{bad: 0.1})
        assert e.value.field == bad
    with pytest.raises(InvalidInput, match="give 'loop/x' as 'x'"):
        m.record(0, **{"loop/x": 0.1})
    for value in ("fast", None, True, [0.1], torch.ones(2)):
        with pytest.raises(InvalidInput, match="lr: a number") as e:
            m.record(0, loss=1.0, lr=value)
        assert e.value.field == "lr"
    assert history(store, m.trial_id, "train_loss")[0].tolist() == []  # nothing was stored
    assert m.record(0, loss=1.0, **{longest: 2.0, "opt.beta_2": 0.999, "_n": 7})
    assert history(store, m.trial_id, f"loop/{longest}")[1].tolist() == [2.0]
    assert history(store, m.trial_id, "loop/opt.beta_2")[1].tolist() == [0.999]
    with pytest.raises(InvalidInput, match="loop/<name>") as e:  # straight to the store
        ext.store_append(store, m.trial_id, {"epoch": 1, "loop/a b": 1.0})
    assert e.value.field == "record.loop/a b"


def test_a_loop_scalar_draws_as_training_curves_and_one_a_sweep_lacks_is_refused(store):
    import json

    from service.plots.stored import make_plot

    m = _lr_run(store, "curves")
    chart = json.loads(make_plot(store, m.sweep_id, "training_curves", metric="loop/lr",
                                 fmt="json"))  # fmt: skip
    (series,) = [s for panel in chart["panels"] for s in panel["series"]]
    assert series["x"] == [0, 10, 20, 30, 40] and series["y"] == [*LRS, "NaN"]
    assert "loop/lr" in chart["panels"][0]["y"]["label"]
    assert (
        make_plot(store, m.sweep_id, "training_curves", metric=["train_loss", "loop/lr"])[:4]
        == b"\x89PNG"
    )
    with pytest.raises(InvalidInput, match="does not record 'loop/momentum'") as e:
        store.read_metrics(m.sweep_id, metrics="loop/momentum")
    assert e.value.field == "metric" and {"loop/lr", "loop/clip_frac"} <= set(e.value.allowed)
    with pytest.raises(InvalidInput, match="does not record 'loop/momentum'"):
        make_plot(store, m.sweep_id, "training_curves", metric="loop/momentum")
    with pytest.raises(InvalidInput, match="unknown metric 'loop/a b'"):
        store.read_metrics(m.sweep_id, metrics="loop/a b")
    normal = store.create_sweep(
        parse_spec({"name": "runs-here", "parameters": {"depth": 2, "epochs": 0}})
    )
    with pytest.raises(InvalidInput, match="does not record 'loop/lr'"):
        store.read_metrics(normal.id, metrics="loop/lr")


# --- a live server ----------------------------------------------------------------------------


@pytest.fixture
def live(database_url):
    settings = Settings(database_url=database_url, api_token=None)
    store = Store(database_url, settings=settings)
    server = ServerThread(create_app(settings, store=store)).start()
    yield server.url, store
    server.stop()
    store.close()


@pytest.mark.slow
def test_records_through_a_server_are_read_like_any_sweep(live):
    url, _ = live
    model, (x, y) = tiny(), batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with isosweep.Client(url, token="") as c:
        m = isosweep.Monitor(model, x, y=y, client=c, sweep="served", config={"lr": 0.5})
        expected = []
        for step in (0, 1, 2):
            loss = train_step(model, opt, x, y)
            reference = isosweep.probe(model, x, y=y, taps="blocks.{i}")
            expected.append(reference[GAP])
            if step == 0:
                first_rms = reference["rms"]
            reference_ranks = reference["effective_rank"]
            assert m.record(step, loss=loss)
        assert m.finish() == "completed"
        gaps = c.metrics(m.sweep_id, metric=GAP)
        table = gaps.pivot(index="epoch", columns="layer", values="value").to_numpy()
        np.testing.assert_array_equal(table, np.stack(expected))  # JSON floats round-trip
        trials = c.trials(m.sweep_id)
        assert trials["model"].tolist() == ["external"] and trials["status"][0] == "completed"
        sweep = c.sweep(m.sweep_id)
        assert sweep["spec"]["external"] is True and sweep["status"] == "completed"
        assert c.plot(m.sweep_id, "layer_profile", metric=GAP).startswith(b"\x89PNG")
        rms = c.compare([m.sweep_id], metric="rms", epoch=0)  # beside an isosweep-run sweep:
        assert len(rms) == 3  # test_the_own_loop_doc_runs_cell_by_cell, with its runner
        np.testing.assert_array_equal(rms.sort_values("layer")["value"].to_numpy(), first_rms)
        ranks = c.metrics(m.sweep_id, metric="effective_rank", epoch=2)
        np.testing.assert_array_equal(ranks.sort_values("layer")["value"], reference_ranks)
        page = httpx.get(f"{url}/sweeps/{m.sweep_id}")
        assert page.status_code == 200 and "external" in page.text


@pytest.mark.slow
def test_two_runs_configs_are_model_params_to_filter_and_group_by(live):
    """Two runs of one sweep with configs {lr: 1e-3} and {lr: 1e-2} (and a nested name): the
    trials' model_params, read by `model_params.<name>` filters — a dotted one included — and a
    plot's group_by, through the server."""
    url, _ = live
    (x, y) = batch()
    with isosweep.Client(url, token="") as c:
        sweep = None
        for lr in (1e-3, 1e-2):
            model = tiny()
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            config = {"lr": lr, "optimizer": {"name": "sgd"}}
            m = isosweep.Monitor(model, x, y=y, client=c, sweep="two-lrs", config=config)
            sweep = m.sweep_id if sweep is None else sweep
            assert m.sweep_id == sweep
            for step in range(3):
                assert m.record(step, loss=train_step(model, opt, x, y))
            m.finish()
        trials = c.trials(sweep)
        assert sorted(trials["model_params.lr"]) == [1e-3, 1e-2]
        fast = c.metrics(sweep, metric="train_loss", where={"model_params.lr": 0.01})
        mine = trials.loc[trials["model_params.lr"] == 1e-2, "trial_id"].tolist()
        assert fast["trial_id"].unique().tolist() == mine and len(fast) == 3
        assert set(fast["model_params.lr"]) == {0.01}
        nested = c.metrics(sweep, metric="train_loss", where={"model_params.optimizer.name": "sgd"})
        assert len(nested) == 6  # a dotted name: one member of the document, on every backend
        none = c.metrics(sweep, metric="train_loss", where={"model_params.lr": 0.5})
        assert len(none) == 0
        chart = c.plot(sweep, "training_curves", metric="train_loss",
                       group_by="model_params.lr", format="json")  # fmt: skip
        labels = [str(series.get("label", series.get("name"))) for series in _series(chart)]
        assert len(labels) == 2 and any("0.001" in t for t in labels), labels
        assert c.plot(sweep, "layer_profile", metric=GAP, group_by="model_params.lr")[:4] == (
            b"\x89PNG"
        )


def _series(chart: bytes) -> list[dict[str, Any]]:
    import json

    body = json.loads(chart)
    return body.get("series") or [s for panel in body.get("panels", []) for s in panel["series"]]


@pytest.mark.slow
def test_a_run_resumes_through_the_server_after_a_restart(live):
    """A new process: a new Client and Monitor with the same config find the trial, continue
    after its last step; a diverged run resumed stops at once (False, no 409)."""
    url, _ = live
    model, (x, y) = tiny(), batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with isosweep.Client(url, token="") as c:
        a = isosweep.Monitor(model, x, y=y, client=c, sweep="served-resume", config={"k": 1})
        for step in range(3):
            assert a.record(step, loss=train_step(model, opt, x, y))
    with isosweep.Client(url, token="") as c:  # the user's process restarted
        b = isosweep.Monitor(model, x, y=y, client=c, sweep="served-resume", config={"k": 1})
        assert (b.sweep_id, b.trial_id, b.last_step) == (a.sweep_id, a.trial_id, 2)
        assert b.record(b.last_step + 1, loss=train_step(model, opt, x, y))
        assert b.record(4, loss=math.nan) is False and b.diverged
        again = isosweep.Monitor(model, x, y=y, client=c, sweep="served-resume", config={"k": 1})
        assert again.record(5, loss=1.0) is False and again.stopped
        assert again.finish() == "diverged"
        epochs = c.metrics(b.sweep_id, metric="train_loss")["epoch"].tolist()
        assert epochs == [0, 1, 2, 3, 4]
        ratio = c.metrics(b.sweep_id, metric="update_ratio", layer=1)
        # NaN at each process's first record: the previous weights went with the process
        nan = ratio.sort_values("epoch")["value"].isna().tolist()
        assert nan == [True, False, False, True, False]


@pytest.mark.slow
def test_a_cancel_from_the_server_stops_the_loop(live):
    url, _ = live
    model, (x, y) = tiny(), batch()
    with isosweep.Client(url, token="") as c:
        m = isosweep.Monitor(model, x, y=y, client=c, sweep="to-cancel")
        assert m.record(0, loss=1.0) is True
        assert c.cancel(m.sweep_id)["cancel_requested"] is True
        assert m.record(1, loss=0.9) is False and m.cancelled  # seen by the next record
        assert m.record(2, loss=0.8) is False
        assert m.finish() == "cancelled"
        assert c.sweep(m.sweep_id)["status"] == "cancelled"
        assert c.metrics(m.sweep_id, metric="train_loss")["value"].tolist() == [1.0, 0.9]
        with pytest.raises(isosweep.ApiError) as e:
            isosweep.Monitor(model, x, client=c, sweep="to-cancel")
        assert e.value.status == 409


@pytest.mark.slow
def test_the_routes_answer_409_and_422(live):
    url, _ = live
    api = f"{url}/api/v1"
    with httpx.Client(base_url=api) as h:
        sweep = h.post("/external/sweeps", json={"name": "raw", "config": {"a": {"b": 1}}})
        assert sweep.status_code == 200
        assert sweep.json()["spec"]["parameters"]["model_params"] == [{"a.b": 1}]
        assert h.post("/external/sweeps", json={"name": "raw"}).json()["id"] == sweep.json()["id"]
        trial = h.post(f"/external/sweeps/{sweep.json()['id']}/trials",
                       json={"run": "r", "depth": 2, "batch_size": 4}).json()  # fmt: skip
        path = f"/external/trials/{trial['id']}/records"
        body = {"step": 3, "record": {"train_loss": 1.0, GAP: [0.5, "Infinity"]}}
        first = h.post(path, json=body)
        assert first.status_code == 200 and first.json()["stored"] is True
        again = h.post(path, json=body)
        assert again.status_code == 200 and again.json()["stored"] is False
        other = h.post(path, json={"step": 3, "record": {"train_loss": 2.0}})
        assert other.status_code == 409 and "step 3" in other.json()["error"]["message"]
        back = h.post(path, json={"step": 1, "record": {"train_loss": 1.0}})
        assert back.status_code == 422 and back.json()["error"]["field"] == "step"
        wrong = h.post(path, json={"step": 4, "record": {GAP: [0.5]}})
        assert wrong.status_code == 422 and "(2,)" in wrong.json()["error"]["message"]
        unknown = h.post(path, json={"step": 4, "record": {"lr": 0.1}})
        assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "record.lr"
        nan = h.post(path, json={"step": 5, "record": {"train_loss": "NaN"}})
        assert nan.status_code == 200 and nan.json()["diverged"] is True
        assert nan.json()["status"] == "diverged"
        late = h.post(path, json={"step": 6, "record": {"train_loss": 1.0}})
        assert late.status_code == 409
        normal = h.post("/sweeps", json={"name": "n", "parameters": {"depth": 2, "epochs": 0}})
        t = h.get(f"/sweeps/{normal.json()['id']}/trials").json()["data"][0]
        refused = h.post(f"/external/trials/{t['id']}/records", json=body)
        assert refused.status_code == 409 and "not an external sweep" in refused.text
        assert h.post("/external/trials/99999/records", json=body).status_code == 404


@pytest.mark.slow
def test_a_loops_own_scalars_through_a_server(live):
    """lr= through Client and the records route: read back exactly by Client.metrics, compare
    and the training_curves plot; a NaN one is no divergence; a bad or missing name a 422."""
    url, _ = live
    model, (x, y) = tiny(), batch()
    with isosweep.Client(url, token="") as c:
        m = isosweep.Monitor(model, x, y=y, client=c, sweep="served-lr")
        for step, lr in enumerate(LRS):
            assert m.record(step, loss=1.0, lr=lr)
        with pytest.raises(InvalidInput, match="give 'loop/lr' as 'lr'"):  # before sending
            m.record(9, loss=1.0, **{"loop/lr": 0.1})
        rows = c.metrics(m.sweep_id, metric="loop/lr")
        assert rows["value"].tolist() == LRS and rows["epoch"].tolist() == [0, 1, 2, 3]
        assert rows["layer"].isna().all()
        both = c.compare([m.sweep_id], metric=["loop/lr", "train_loss"], epoch=3)
        assert both.loc[both["metric"] == "loop/lr", "value"].tolist() == [LRS[3]]
        chart = c.plot(m.sweep_id, "training_curves", metric="loop/lr", format="json")
        assert [s["y"] for s in _series(chart)] == [LRS]
        with pytest.raises(isosweep.ApiError) as e:
            c.metrics(m.sweep_id, metric="loop/momentum")
        assert e.value.status == 422 and e.value.field == "metric"
        assert "loop/lr" in e.value.allowed
        with pytest.raises(isosweep.ApiError) as e:
            c.plot(m.sweep_id, "training_curves", metric="loop/momentum")
        assert e.value.status == 422
        with pytest.raises(isosweep.ApiError) as e:
            c.metrics(m.sweep_id, metric="loop/a b")
        assert e.value.status == 422
        path = f"{url}/api/v1/external/trials/{m.trial_id}/records"
        nan = httpx.post(path, json={"step": 4, "record": {"train_loss": 1.0, "loop/lr": "NaN"}})
        assert nan.status_code == 200 and nan.json()["diverged"] is False
        bad = httpx.post(path, json={"step": 5, "record": {"loop/a b": 1.0}})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "record.loop/a b"
        assert m.finish() == "completed"


# --- docs/own-loop.md, cell by cell -----------------------------------------------------------

OWN_LOOP = ROOT / "docs" / "own-loop.md"


def _cells() -> list[str]:
    return re.findall(r"```python\n(.*?)```", OWN_LOOP.read_text(), re.S)


@pytest.fixture
def served(tmp_path, monkeypatch):
    """`isosweep serve` with its runner, its configured modules the registered model and the
    guide's metric cell as the lab's module (docs/own-loop.md: the server knows the name)."""
    import surface_support

    (tmp_path / "lab_metrics.py").write_text(_cells()[1])
    base = surface_support.serve_env

    def env() -> dict[str, str]:
        out = base()
        out["PYTHONPATH"] = os.pathsep.join([str(tmp_path), out["PYTHONPATH"]])
        out["ISOSWEEP_MODEL_MODULES"] = f"{out['ISOSWEEP_MODEL_MODULES']},lab_metrics"
        return out

    monkeypatch.setattr(surface_support, "serve_env", env)
    served = surface_support.start_serve(tmp_path)
    yield served, f"sqlite:///{tmp_path / 'surface.db'}"
    surface_support.stop_serve(served)


@pytest.mark.slow
@pytest.mark.ray
def test_the_own_loop_doc_runs_cell_by_cell(served, monkeypatch):
    """The guide as notebook cells against a server whose runner runs its isosweep sweep: the
    Monitor'd run and the sweep compared on the guide's own metric, both real records."""
    from service import metric_names

    server, database_url = served
    monkeypatch.setenv("ISOSWEEP_API_URL", server.url)
    monkeypatch.delenv("ISOSWEEP_API_TOKEN", raising=False)
    monkeypatch.setattr(metric_names, "_LAB", {})  # the cell's registration stays in this test
    cells = _cells()
    assert len(cells) == 5
    env: dict[str, Any] = {}
    try:
        for i, cell in enumerate(cells):
            exec(compile(cell, f"docs/own-loop.md cell {i}", "exec"), env)
    finally:
        if "client" in env:
            env["client"].close()
    monitor, reference, both = env["monitor"], env["reference"], env["both"]
    assert env["status"] == "completed" and reference["status"] == "completed"
    assert sorted(env["gaps"]["epoch"].unique()) == [0, 10, 20, 30]
    lrs = env["lrs"].sort_values("epoch")  # the guide's cosine schedule, as its loop passed it
    assert lrs["epoch"].tolist() == [0, 10, 20, 30] and lrs["layer"].isna().all()
    cosine = [3e-3 * (1 + math.cos(math.pi * t / 31)) / 2 for t in (0, 10, 20, 30)]
    assert lrs["value"].tolist() == pytest.approx(cosine, rel=1e-9)
    assert lrs["value"].iloc[0] == 3e-3 and monitor.last_record["loop/lr"] == lrs["value"].iloc[-1]
    assert {"token_isometry_gap", "norm_spread", "effective_rank"} <= set(monitor.last_record)
    # the guide's metric at each block of both sweeps, from two real runs
    assert sorted(set(both["sweep_id"])) == sorted([monitor.sweep_id, reference["id"]])
    assert sorted(both["layer"]) == [1, 1, 2, 2]
    assert (both["value"] >= 1).all() and np.isfinite(both["value"]).all()
    with Store(database_url) as store:
        mine = store.get_trial(monitor.trial_id).config["model_params"]
        assert mine["optimizer.lr"] == 3e-3 and mine["d_model"] == 32
        (ref_trial,) = store.list_trials(reference["id"])[0]
        _, spread = store.trial_history(ref_trial.id, "norm_spread")
        assert spread.shape == (3, 2) and (spread >= 1).all()  # epochs 0..2, in fit's records
