"""The lease under a slow Ray start: three runner processes on one database (SQLite file, and
Postgres), a lease of 4 s and a Ray start made 2 leases slower than it is. The claimer must hold
the sweep from the claim on: one claim, every trial attempted once (by the store's `attempts`,
and by the trial processes themselves), every row stored once, and nothing left running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from expected_rows import expected_keys, row_keys
from support import TINY, session_pids

from service.spec import parse_spec
from service.store import Store

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 4.0
RAY_DELAY_S = 2 * LEASE_S  # added to Ray's real start-up

# Imported by the runners and by their Ray workers (on PYTHONPATH): each trial process appends
# a line as it enters the trainable, and each runner a line per claim it wins.
PROBE = textwrap.dedent(
    """
    import os
    from workers import trainable

    def note(line):
        with open(os.environ["LEASE_PROBE_LOG"], "a") as f:
            f.write(line + "\\n")

    def run_trial(config):
        for tid, _ in trainable.members_of(config[trainable.PARAM_KEY]):  # one, or a pack's
            note(f"trial {tid} {os.getpid()}")
        return trainable.run_trial(config)
    """
)

# A runner (what `isosweep runner` runs) with a slow first Ray start and the probes in place.
RUNNER = textwrap.dedent(
    """
    import logging, sys, time
    import ray
    import lease_probe
    import workers.driver, workers.runner
    from service.store import Store

    url, runner_id, lease_s, delay_s = sys.argv[1:]
    workers.driver.run_trial = lease_probe.run_trial
    real_init = workers.runner.init_ray

    def slow_init(*args, **kw):
        if not ray.is_initialized():
            time.sleep(float(delay_s))
        return real_init(*args, **kw)

    workers.runner.init_ray = slow_init
    store = Store(url)
    real_claim = store.claim_sweep

    def claim(*args, **kw):
        got = real_claim(*args, **kw)
        if got is not None:
            lease_probe.note(f"claim {got.id} {runner_id}")
        return got

    store.claim_sweep = claim
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    runner = workers.runner.Runner(
        store, runner_id=runner_id, lease_s=float(lease_s), poll_s=0.2, num_cpus=1, num_gpus=0
    )
    runner.run_forever()
    """
)


def start(url: str, name: str, tmp_path: Path) -> subprocess.Popen:
    (tmp_path / "lease_probe.py").write_text(PROBE)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "LEASE_PROBE_LOG": str(tmp_path / "probe.log"),
    }
    cmd = [sys.executable, "-c", RUNNER, url, name, str(LEASE_S), str(RAY_DELAY_S)]
    with (tmp_path / f"{name}.log").open("w") as log:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop_all(procs: list[subprocess.Popen]) -> tuple[list[int | None], list[int]]:
    """SIGTERM every runner (a clean stop), give their sessions 15 s to empty, then SIGKILL
    what is left. Returns the exit codes and the processes that had to be killed."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(60))
        except subprocess.TimeoutExpired:
            codes.append(None)
    deadline = time.monotonic() + 15
    while any(session_pids(p.pid) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for p in procs for pid in session_pids(p.pid)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for p in procs:
        p.wait()
    return codes, left


@pytest.mark.ray
@pytest.mark.slow
def test_a_slow_ray_start_never_lets_two_runners_hold_a_sweep(database_url, tmp_path):
    store = Store(database_url)
    spec = {"name": "lease", "parameters": {"depth": 2, "epochs": 1, **TINY}, "seeds": 2}
    sweep = store.create_sweep(parse_spec(spec))
    names = ["r1", "r2", "r3"]
    procs = [start(database_url, n, tmp_path) for n in names]
    try:
        deadline = time.monotonic() + 300
        while store.get_sweep(sweep.id).status in ("queued", "running"):
            assert time.monotonic() < deadline, "the sweep did not finish within 300 s"
            time.sleep(0.5)
    finally:
        codes, left = stop_all(procs)
    logs = {n: (tmp_path / f"{n}.log").read_text()[-3000:] for n in names}
    assert codes == [0, 0, 0], logs
    assert left == []  # no Ray process outlives its runner

    lines = [line.split() for line in (tmp_path / "probe.log").read_text().splitlines()]
    claims = [(int(w[1]), w[2]) for w in lines if w[0] == "claim"]
    assert len(claims) == 1 and claims[0][0] == sweep.id, claims  # held by one runner only
    info = store.get_sweep(sweep.id)
    assert (info.status, info.runner_id) == ("completed", claims[0][1])
    trials, _ = store.list_trials(sweep.id)
    assert [(t.status, t.attempts) for t in trials] == [("completed", 1)] * 2
    entered = Counter(int(w[1]) for w in lines if w[0] == "trial")  # by the trial processes
    assert entered == {t.id: 1 for t in trials}, entered
    keys = row_keys(store.read_metrics(sweep.id))
    assert len(keys) == len(set(keys)) and set(keys) == expected_keys(trials)
    store.close()


# --- the lease-lost message: only when another holder is real ---------------------------------


def _hold_until_it_stops(runner, store, sweep_id: int, then) -> tuple:
    """Claim the sweep as `runner`, hold it (runner.hold: its heartbeat every lease/3), call
    `then()` while it is held, and wait until the heartbeat has seen the change (its thread
    ends, or 40 intervals pass); the control after."""
    from workers.callbacks import SweepControl

    since = time.monotonic()
    assert store.claim_sweep(runner.runner_id, runner.lease_s).id == sweep_id
    control = SweepControl()
    with runner.hold(sweep_id, control, since=since) as beat:
        then()
        deadline = time.monotonic() + 40 * runner.lease_s / 3
        while beat.thread.is_alive() and not control.lost.is_set():
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
    return control


def _sweep(store, name: str):
    spec = {"name": name, "parameters": {"depth": 2, "epochs": 1, **TINY}}
    return store.create_sweep(parse_spec(spec))


def test_a_finished_sweep_is_not_reported_as_held_by_another_runner(database_url, caplog):
    """The audit's case (a 1 s lease on Postgres): right after its runner finished the sweep, the
    heartbeat, which still ran, found it no longer running under this runner and logged "the
    lease is lost (another runner holds it now)" — no other runner held it."""
    import logging

    from workers.runner import Runner

    with Store(database_url) as store, caplog.at_level(logging.INFO, "isosweep"):
        sweep = _sweep(store, "finished")
        runner = Runner(store, runner_id="me", lease_s=0.3)

        def finish():
            store.request_cancel(sweep.id)
            store.finish_sweep(sweep.id)  # what the end of its run does

        control = _hold_until_it_stops(runner, store, sweep.id, finish)
        assert "another runner" not in caplog.text and "lease is lost" not in caplog.text
        assert not control.lost.is_set()
        assert store.get_sweep(sweep.id).status == "cancelled"


def test_a_lease_lost_to_another_runner_names_it(database_url, caplog):
    import logging

    from workers.runner import Runner

    with Store(database_url) as store, caplog.at_level(logging.INFO, "isosweep"):
        sweep = _sweep(store, "taken")
        runner = Runner(store, runner_id="me", lease_s=0.3)

        def take_over():  # its lease ran out (a stall), and another runner claimed the sweep
            store.release_sweep(sweep.id, "me")
            assert store.claim_sweep("intruder", 60.0).id == sweep.id

        control = _hold_until_it_stops(runner, store, sweep.id, take_over)
        assert control.lost.is_set()
        assert "the lease is lost (runner intruder holds it now)" in caplog.text

        caplog.clear()
        other = _sweep(store, "released")
        store.request_cancel(sweep.id)
        store.finish_sweep(sweep.id)
        control = _hold_until_it_stops(
            runner, store, other.id, lambda: store.release_sweep(other.id, "me")
        )
        assert control.lost.is_set()  # not ours any more, but nobody else's either: said so
        assert "another runner" not in caplog.text and "intruder" not in caplog.text
        assert "no runner holds it" in caplog.text
