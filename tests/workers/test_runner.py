"""The runner loop and the `run`/`runner` commands: claims in priority order, a clean stop that a
later runner resumes, a runner SIGKILLed mid-sweep (with its Ray processes) and restarted, and the
CLI driven as a user runs it."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from expected_rows import expected_keys, row_keys
from resume_support import assert_resumed_exactly, kill_and_resume, wait_until
from support import TINY, isosweep_command

from service.spec import parse_spec
from service.store import Store
from workers.runner import Runner

ROOT = Path(__file__).resolve().parents[2]


def isosweep(*args, timeout=300):
    """The CLI as a user runs it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [*isosweep_command(), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


# --- the CLI --------------------------------------------------------------------------------------


def test_run_rejects_an_invalid_spec_naming_the_field(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nparameters:\n  depth: [4, -3]\n  activation: relu\n")
    db = tmp_path / "db.sqlite"
    result = isosweep("run", str(spec), "--database-url", f"sqlite:///{db}")
    assert result.returncode == 1
    assert "parameters.depth[1]" in result.stderr and "greater than or equal to 1" in result.stderr
    with Store(f"sqlite:///{db}") as store:
        assert store.list_sweeps()[1] == 0  # nothing was stored


def test_run_of_a_missing_file_fails_clearly(tmp_path):
    result = isosweep("run", str(tmp_path / "nope.yaml"), "--database-url", "sqlite://")
    assert result.returncode == 1 and "spec: cannot read" in result.stderr


def test_runner_once_with_nothing_queued_exits_at_once(tmp_path):
    result = isosweep("runner", "--once", "--database-url", f"sqlite:///{tmp_path / 'db.sqlite'}")
    assert result.returncode == 0, result.stderr
    assert "runner " in result.stderr and "lease 60s" in result.stderr


@pytest.mark.ray
@pytest.mark.slow
def test_run_stores_the_rows_then_reuses_them(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        "name: tiny\nparameters:\n  depth: [2, 3]\n  width: 16\n  batch_size: 32\n"
        "  dataset: digits\n  epochs: 1\nseeds: 1\n"
    )
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first = isosweep("run", str(spec), "--database-url", url)
    assert first.returncode == 0, first.stderr
    assert "sweep 1 (tiny): 2 trials" in first.stdout and "sweep 1: completed" in first.stdout
    with Store(url) as store:
        trials, _ = store.list_trials(1)
        assert {t.status for t in trials} == {"completed"}
        keys = row_keys(store.read_metrics(1))
        assert len(keys) == len(set(keys)) and set(keys) == expected_keys(trials)
    again = isosweep("run", str(spec), "--database-url", url, "--quiet")
    assert again.returncode == 0, again.stderr
    assert "sweep 2: completed" in again.stdout and "completed*" in again.stdout
    with Store(url) as store:
        reused, _ = store.list_trials(2)
        assert [t.results_from for t in reused] == [t.id for t in trials]


# --- the Runner in this process ---------------------------------------------------------------


def submit(store, name, *, priority=0, epochs=1, seeds=1, depth=2, pack=1):
    spec = {
        "name": name,
        "parameters": {"depth": depth, "epochs": epochs, **TINY},
        "seeds": seeds,
        "priority": priority,
        "pack": pack,  # trials alone, finishing one by one (packs: test_packed_runner.py)
    }
    return store.create_sweep(parse_spec(spec))


def test_run_once_of_one_sweep_never_claims_another(sqlite_url):
    """`isosweep run`'s claim: that sweep or nothing (no Ray is started when nothing is claimed)."""
    with Store(sqlite_url) as store:
        ahead = submit(store, "ahead", priority=5)
        held = submit(store, "held")
        assert store.claim_sweep("other", 60, sweep_id=held.id).id == held.id
        runner = Runner(store, runner_id="me")
        assert runner.run_once(held.id) is None  # another runner drives it
        assert runner.run_once(held.id + 100) is None  # no such sweep: nothing to claim
        assert not runner.started_ray
        left = store.get_sweep(ahead.id)  # queued ahead of it, and not taken
        assert (left.status, left.runner_id) == ("queued", None)
        assert store.get_sweep(held.id).runner_id == "other"


def test_the_lease_is_held_while_ray_starts(sqlite_url, monkeypatch):
    """Ray's start-up (here 3 leases long) comes after the claim: the heartbeat must already
    run, or another runner takes the sweep over meanwhile and both run its trials."""
    with Store(sqlite_url) as store:
        sweep = submit(store, "slow-ray")
        runner = Runner(store, runner_id="first", lease_s=0.6)
        seen = {}

        def slow_ray_start():
            time.sleep(1.8)
            seen["intruder"] = store.claim_sweep("intruder", 60.0)
            seen["holder"] = store.get_sweep(sweep.id).runner_id
            store.request_cancel(sweep.id)  # so that the run needs no Ray

        monkeypatch.setattr(runner, "start_ray", slow_ray_start)
        info = runner.run_once()
        assert seen == {"intruder": None, "holder": "first"}
        assert (info.status, info.runner_id) == ("cancelled", "first")


@pytest.mark.ray
@pytest.mark.slow
def test_runner_takes_sweeps_by_priority_then_age(sqlite_url, ray_local):
    with Store(sqlite_url) as store:
        old = submit(store, "old")
        urgent = submit(store, "urgent", priority=5)
        young = submit(store, "young")
        Runner(store, runner_id="r1", poll_s=0.1).run_forever(until_idle=True)
        infos = [store.get_sweep(s.id) for s in (urgent, old, young)]
        assert [i.status for i in infos] == ["completed"] * 3
        assert [i.runner_id for i in infos] == ["r1"] * 3
        starts = [i.started_at for i in infos]
        assert starts == sorted(starts) and len(set(starts)) == 3


@pytest.mark.ray
@pytest.mark.slow
def test_a_stopped_runner_releases_the_sweep_to_the_next_one(sqlite_url, ray_local):
    with Store(sqlite_url) as store:
        sweep = submit(store, "stop", epochs=60, seeds=2, depth=3)
        first = Runner(store, runner_id="first", lease_s=1.0, poll_s=0.1)

        def stop_when_recording():
            wait_until(lambda: store.get_sweep(sweep.id).progress > 0, 120, "records")
            first.stop()

        threading.Thread(target=stop_when_recording, daemon=True).start()
        first.run_forever()
        left = store.get_sweep(sweep.id)
        # released at once: back in the queue, its cut trials queued again
        assert (left.status, left.runner_id, left.cancel_requested) == ("queued", None, False)
        before = store.list_trials(sweep.id)[0]
        cut = [t for t in before if t.status == "queued" and t.attempts == 1]
        # flushed, and cut short (a trial started just before the stop may have no record yet)
        assert cut and all(t.records_done < 61 for t in cut) and any(t.records_done for t in cut)
        assert {t.status for t in before} <= {"queued", "completed"}
        done = Runner(store, runner_id="second", poll_s=0.1).run_once()  # no lease to wait out
        assert (done.id, done.status, done.runner_id) == (sweep.id, "completed", "second")
        trials, _ = store.list_trials(sweep.id)
        assert {t.status for t in trials} == {"completed"}
        was = {t.id: t for t in before}
        for t in trials:  # the cut trials ran again from the start, the finished ones did not
            assert t.attempts == was[t.id].attempts + (was[t.id].status == "queued")
        keys = row_keys(store.read_metrics(sweep.id))
        assert len(keys) == len(set(keys)) and set(keys) == expected_keys(trials)


# --- a runner killed outright ------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_runner_killed_mid_sweep_is_resumed_without_rerunning_or_duplicating(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    sweep = submit(store, "crash", epochs=8, seeds=8, depth=3)  # 8 trials of 9 records each

    def some_but_not_all():
        trials, _ = store.list_trials(sweep.id)
        done = sum(t.status == "completed" for t in trials)
        return done >= 2 and done < len(trials) - 1

    resumed = kill_and_resume(
        store, sweep.id, tmp_path, some_but_not_all, "some trials to complete"
    )
    before, after = resumed.before, resumed.after
    assert 2 <= len(resumed.completed) < len(before) - 1
    assert_resumed_exactly(store, sweep.id, resumed)  # same attempt, same start and end
    for i, b in before.items():
        if b.status == "running":  # interrupted by the kill: run again from the start
            assert after[i].attempts == b.attempts + 1
    store.close()


# --- the runner's loop beat (what `isosweep serve` restarts a stuck runner by) -----------------


def test_the_loop_beat_touches_its_file_at_most_every_interval(tmp_path):
    from workers.runner import LoopBeat

    path = tmp_path / "beat"
    beat = LoopBeat(path, min_interval_s=3600.0)
    beat()
    first = path.stat().st_mtime_ns
    os.utime(path, ns=(0, 0))
    beat()  # within the interval: not written again
    assert path.stat().st_mtime_ns == 0 and beat.count == 1
    LoopBeat(path, min_interval_s=0.0)()
    assert path.stat().st_mtime_ns >= first
    LoopBeat(None)()  # no file (not under serve): nothing to do
    assert LoopBeat.from_env({}).path is None
    assert LoopBeat.from_env({"ISOSWEEP_RUNNER_BEAT": str(path)}).path == path


def test_the_beat_comes_from_the_driver_loop_not_from_a_thread(sqlite_url, monkeypatch):
    """Every step of the driver's loop (Tune asks the stopper, which asks the control) beats; a
    loop that is stuck beats no more, while the lease's heartbeat thread goes on — so a stuck
    runner is told apart from a busy one."""
    import workers.runner

    with Store(sqlite_url) as store:
        submit(store, "stuck")
        beats: list[float] = []
        runner = Runner(store, runner_id="me", lease_s=0.3, beat=lambda: beats.append(1.0))
        monkeypatch.setattr(runner, "start_ray", lambda: None)
        heartbeats: list[int] = []
        real_heartbeat = store.heartbeat
        monkeypatch.setattr(
            store, "heartbeat", lambda *a: heartbeats.append(1) or real_heartbeat(*a)
        )
        seen = {}

        def stuck_run(store_, sweep_id, *, control, **kw):
            for _ in range(5):
                control.halted()  # five steps of the loop
            seen["stepping"] = len(beats)
            hb = len(heartbeats)
            deadline = time.monotonic() + 30
            while len(heartbeats) < hb + 3 and time.monotonic() < deadline:
                time.sleep(0.05)  # stuck: no step, while the heartbeat thread beats on
            seen["stuck"], seen["heartbeats"] = len(beats), len(heartbeats) - hb
            store_.request_cancel(sweep_id)
            return store_.finish_sweep(sweep_id)

        monkeypatch.setattr(workers.runner, "run_sweep", stuck_run)
        assert runner.run_once().status == "cancelled"
    assert seen["stepping"] >= 5  # each step beat (and the claim before them)
    assert seen["stuck"] == seen["stepping"]  # the stuck loop did not
    assert seen["heartbeats"] >= 3  # though the lease's thread went on


def test_the_watchdog_stops_a_runner_whose_supervisor_is_gone():
    """ISOSWEEP_SUPERVISOR_PID names the supervisor; once this process's parent is another (the
    supervisor died, the runner re-parented), stop() is called, and the runner's session killed
    if it is still alive after the grace. No supervisor named: no watchdog."""
    from workers.runner import SUPERVISOR_ENV, watch_supervisor

    assert watch_supervisor(lambda: None, {}) is None
    stopped, killed = threading.Event(), threading.Event()
    thread = watch_supervisor(
        stopped.set, {SUPERVISOR_ENV: str(os.getppid())}, poll_s=0.05, grace_s=0.0,
        kill=killed.set,
    )  # fmt: skip
    assert thread is not None and not stopped.wait(0.3)  # its parent is the one named: no stop
    gone = watch_supervisor(
        stopped.set, {SUPERVISOR_ENV: str(os.getppid() + 1)}, poll_s=0.05, grace_s=0.0,
        kill=killed.set,
    )  # fmt: skip
    assert gone is not None
    assert stopped.wait(30) and killed.wait(30)
