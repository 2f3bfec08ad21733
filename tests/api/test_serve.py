"""`isosweep serve`: starts over a real port, answers, stops cleanly on SIGTERM/SIGINT, submits
the demo once; refuses to serve beyond loopback without a token unless told to serve open; its
runner child is started with the agreed command, restarted when it dies (healthz not ok
meanwhile), and always stopped, Ray's processes included; and the API process never imports
torch or Ray."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from support import TINY

from api.cli import serve, supervise
from api.cli.common import CommandError
from service.settings import Settings
from service.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo_spec_is_small_and_valid():
    spec = load_spec(serve.DEMO_SPEC)
    assert spec.name == "demo" and spec.n_trials == 3 * 2 * 3
    assert spec.parameters["dataset"] == "digits"  # ships with scikit-learn: no download
    assert spec.parameters["epochs"] == 10 and spec.parameters["depth"] == [2, 8, 32]


def test_runner_is_started_with_the_agreed_command(monkeypatch):
    seen = {}

    class FakePopen:
        pid = 4242

        def __init__(self, cmd, env=None, start_new_session=False, preexec_fn=None):
            seen["cmd"], seen["env"], seen["session"] = cmd, env, start_new_session
            seen["preexec"] = preexec_fn

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setenv("ISOSWEEP_RUNNER_LEASE_S", "30")
    url = "postgresql+psycopg://user:s3cret@db:5432/isosweep"
    supervisor = supervise.RunnerSupervisor(url)
    supervisor._spawn()  # the start, without the watch thread
    # The URL travels in the environment: a password on the command line shows in `ps`.
    assert seen["cmd"] == [sys.executable, "-m", "api.cli.main", "runner"]
    assert seen["env"]["ISOSWEEP_DATABASE_URL"] == url
    assert seen["env"]["ISOSWEEP_RUNNER_LEASE_S"] == "30"  # the rest of serve's environment
    assert seen["session"]  # its own session: Ray's processes can be found and stopped with it
    assert seen["preexec"] is not None  # the parent-death signal (Linux)
    assert seen["env"]["ISOSWEEP_SUPERVISOR_PID"] == str(os.getpid())
    status = supervisor.status()
    assert (status["state"], status["ok"], status["pid"]) == ("running", True, 4242)
    assert status["runner_id"] == f"{socket.gethostname()}:4242"  # workers.runner's default


def test_the_banner_hides_the_database_password(capsys):
    url = "postgresql+psycopg://user:s3cret@db:5432/isosweep"
    serve.announce(Settings(database_url=url), None)
    shown = capsys.readouterr().out
    assert "s3cret" not in shown
    assert "postgresql+psycopg://user:***@db:5432/isosweep" in shown


def _child(ignore_term: bool) -> subprocess.Popen:
    code = "import signal, sys, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_stop_runner_terminates_then_kills():
    assert supervise.terminate(_child(ignore_term=False), grace_s=10) == -signal.SIGTERM
    stubborn = _child(ignore_term=True)
    assert supervise.terminate(stubborn, grace_s=0.5) == -signal.SIGKILL
    assert stubborn.poll() is not None


def test_kill_session_leaves_no_process_of_the_session():
    """A session leader that dies leaves its children running (re-parented), as a SIGKILLed
    runner leaves Ray's; kill_session finds them through /proc and kills them."""
    code = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
        " for _ in range(2)]\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\ntime.sleep(60)\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    kids = [int(p) for p in leader.stdout.readline().split()]
    leader.kill()
    leader.wait()
    assert set(supervise.session_pids(leader.pid)) == set(kids)  # orphaned, alive
    assert set(supervise.kill_session(leader.pid)) == set(kids)
    assert supervise.session_pids(leader.pid) == []


CLAIM_AND_DIE = (
    "import os, socket, sys\n"
    "from service.store import Store\n"
    "store = Store(os.environ['ISOSWEEP_DATABASE_URL'])\n"
    "store.claim_sweep(f'{socket.gethostname()}:{os.getpid()}', 600.0)\n"
    "os._exit(3)\n"
)


@pytest.mark.slow
def test_a_dying_runner_is_restarted_with_back_off_and_its_sweep_released(sqlite_url):
    """A runner that claims a sweep (as host:pid, with a 10-minute lease) and dies at once: the
    supervisor releases the sweep, reports it restarting, and starts it again later each time."""
    from service.store import Store

    with Store(sqlite_url) as store:
        spec = {"name": "held", "parameters": {"depth": 2, "epochs": 1, **TINY}}
        sweep = store.create_sweep(parse_spec(spec))
        sup = supervise.RunnerSupervisor(
            sqlite_url, store=store, command=[sys.executable, "-c", CLAIM_AND_DIE],
            backoff_s=0.3, max_backoff_s=1.2, stable_s=3600.0, grace_s=5.0,
        )  # fmt: skip
        seen, released = [], []
        try:
            sup.start()
            deadline = time.monotonic() + 60
            while len(seen) < 4 and time.monotonic() < deadline:
                st = sup.status()
                if st["state"] == "restarting" and st["restarts"] not in [r for r, _ in seen]:
                    seen.append((st["restarts"], st["next_start_in_s"]))
                    released.append(released_before_restart(store, sweep.id, sup))
                time.sleep(0.01)
        finally:
            sup.stop()
        assert [delay for _, delay in seen] == [0.3, 0.6, 1.2, 1.2]  # doubled, capped
        assert released == [True] * 4  # each time, before the next runner started
        final = sup.status()
        assert (final["state"], final["ok"], final["last_exit_code"]) == ("stopped", False, 3)
        assert store.get_sweep(sweep.id).status == "queued"


def released_before_restart(store, sweep_id: int, sup) -> bool:
    """Whether the sweep is back in the queue, unheld, before the supervisor starts again."""
    while sup.status()["state"] == "restarting":
        info = store.get_sweep(sweep_id)
        if (info.status, info.runner_id) == ("queued", None):
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("localhost", True), ("::1", True),
     ("[::1]", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
     ("lab.example.org", False), ("", False)],
)  # fmt: skip
def test_loopback_addresses(host, loopback):
    assert serve.is_loopback(host) is loopback


def test_serving_beyond_loopback_needs_a_token_or_allow_open():
    serve.check_open(Settings(host="127.0.0.1"))  # loopback: no token needed
    serve.check_open(Settings(host="0.0.0.0", api_token="t0ken"))
    serve.check_open(Settings(host="0.0.0.0", allow_open=True))
    with pytest.raises(CommandError, match=r"ISOSWEEP_API_TOKEN.*--allow-open"):
        serve.check_open(Settings(host="0.0.0.0"))
    with pytest.raises(CommandError, match=r"refusing to serve 10\.1\.2\.3 without a token"):
        serve.check_open(Settings(host="10.1.2.3", api_token=""))  # "" is no token


def test_serve_on_an_open_address_without_a_token_refuses_to_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ISOSWEEP_API_TOKEN",
           "ISOSWEEP_ALLOW_OPEN")}  # fmt: skip
    cmd = [sys.executable, "-m", "api.cli.main", "serve", "--no-runner", "--host", "0.0.0.0"]
    cmd += ["--port", str(free_port()), "--database-url", f"sqlite:///{tmp_path / 'o.db'}"]
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("serve started on 0.0.0.0 with no token")
    assert r.returncode != 0 and "refusing to serve 0.0.0.0 without a token" in r.stderr
    assert not (tmp_path / "o.db").exists()  # refused before anything was opened


def test_a_taken_port_fails_before_anything_starts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(CommandError, match="--port"):
            serve.check_port_free("127.0.0.1", s.getsockname()[1])


def _serve(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "api.cli.main",
        "serve",
        "--no-runner",
        "--port",
        str(port),
        "--database-url",
        f"sqlite:///{tmp_path / 'serve.db'}",
        *extra,
    ]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"{base}/api/v1/healthz", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("serve did not answer within 60 s")


@pytest.mark.slow
def test_serve_answers_and_stops_cleanly(tmp_path):
    proc, base = _serve(tmp_path, "--demo")
    health = httpx.get(f"{base}/api/v1/healthz").json()
    assert health["status"] == "ok" and health["database"]["backend"] == "sqlite"
    sweeps = httpx.get(f"{base}/api/v1/sweeps").json()
    assert [s["name"] for s in sweeps["data"]] == ["demo"]
    assert httpx.get(f"{base}/").status_code == 200 and httpx.get(f"{base}/docs").status_code == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    output = proc.stdout.read()
    assert f"{base}/" in output and "submitted the demo sweep" in output

    proc, base = _serve(tmp_path, "--demo")  # again: the demo is not submitted twice
    assert httpx.get(f"{base}/api/v1/sweeps").json()["count"] == 1
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert "already submitted" in proc.stdout.read()


def _serve_with_runner(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "api.cli.main", "serve", "--port", str(port)]
    cmd += ["--database-url", f"sqlite:///{tmp_path / 'serve.db'}"]
    env = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}/api/v1"


def _health(base: str) -> tuple[int, dict]:
    try:
        r = httpx.get(f"{base}/healthz", timeout=5)
    except httpx.TransportError:
        return 0, {}
    return r.status_code, r.json()


def _until(what: str, condition, timeout_s: float = 120.0, proc=None):
    deadline = time.monotonic() + timeout_s
    while True:
        if (got := condition()) is not None:
            return got
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"serve exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def ray_processes(sid: int) -> list[str]:
    """The names of the live processes of session `sid` (the runner's) that are Ray's."""
    names = []
    for pid in supervise.session_pids(sid):
        try:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(k in name for k in ("raylet", "gcs_server", "ray::", "ray/", "dashboard")):
            names.append(name[:80])
    return names


@pytest.mark.ray
@pytest.mark.slow
def test_serve_restarts_a_killed_runner_and_leaves_no_ray_process(tmp_path):
    proc, base = _serve_with_runner(tmp_path)
    first: dict = {}
    again: dict = {}
    try:
        spec = {"name": "long", "parameters": {"depth": 2, "epochs": 400, **TINY}}
        sweep = _until("the API", lambda: _post(base, spec), proc=proc)
        first = _until("the runner to run the sweep", lambda: _driving(base, sweep), proc=proc)
        before = ray_processes(first["pid"])
        assert any("raylet" in n for n in before), before  # Ray's processes are in its session
        os.kill(first["pid"], signal.SIGKILL)

        # not ok while it is down: the dead runner is reported, never "ok"
        down = _until("healthz to report the dead runner", lambda: _down(base), proc=proc)
        assert down["runner"]["state"] == "restarting"
        assert down["runner"]["last_exit_code"] == -signal.SIGKILL
        again = _until("the restart", lambda: _restarted(base, first["pid"]), proc=proc)
        assert again["restarts"] == 1 and again["pid"] != first["pid"]
        assert supervise.session_pids(first["pid"]) == []  # nothing of the dead one is left
        # its sweep was released: the new runner resumes it well within the 60 s lease
        resumed = _until("the resume", lambda: _driving(base, sweep), 45, proc=proc)
        assert resumed["runner_id"] == again["runner_id"]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    log = (tmp_path / "serve.log").read_text()
    assert code == 0, log[-3000:]
    assert "exited with code -9; restarting it" in log
    for pid in (first["pid"], again["pid"]):  # serve stopped: no runner process is left
        assert supervise.session_pids(pid) == [], ray_processes(pid)


def _post(base: str, spec: dict) -> dict | None:
    try:
        return httpx.post(f"{base}/sweeps", json=spec, timeout=10).json()
    except httpx.TransportError:
        return None


def _driving(base: str, sweep: dict) -> dict | None:
    """The runner's health once it holds the sweep and its trial has recorded an epoch."""
    code, health = _health(base)
    info = httpx.get(f"{base}/sweeps/{sweep['id']}", timeout=5).json()
    runner = health.get("runner") or {}
    mine = code == 200 and info["runner_id"] == runner.get("runner_id")
    return runner if mine and info["progress"] > 0 else None


def _down(base: str) -> dict | None:
    code, health = _health(base)
    return health if code == 503 and health["status"] == "degraded" else None


def _restarted(base: str, old_pid: int) -> dict | None:
    code, health = _health(base)
    runner = health.get("runner") or {}
    return runner if code == 200 and runner.get("pid") not in (None, old_pid) else None


NO_TORCH = textwrap.dedent(
    """
    import sys, httpx, numpy as np
    import api.app
    assert "torch" not in sys.modules and "ray" not in sys.modules, "at import"
    from api.server import ServerThread
    from service.settings import Settings
    from service.store import Store
    from service.config import LAYER_METRICS, METRICS

    url = "sqlite:///" + sys.argv[1]
    store = Store(url, settings=Settings(database_url=url))
    with ServerThread(api.app.create_app(Settings(database_url=url), store=store)) as s:
        c = httpx.Client(base_url=s.url + "/api/v1", timeout=60)
        sweep = c.post("/sweeps", json={"name": "t", "parameters": {"depth": 2, "epochs": 0,
                       "batch_size": 4, "norm": "layer", "order": "act_norm"}}).json()
        (t,) = c.get(f"/sweeps/{sweep['id']}/trials").json()["data"]
        rec = {m: (np.ones(2) if m in LAYER_METRICS else 1.0) for m in METRICS}
        store.write_records([(t["id"], {**rec, "epoch": 0, "input_gram": np.eye(4)})])
        for path in ("/theory/activations/tanh", "/theory/activations",
                     f"/sweeps/{sweep['id']}/plots/theory_overlay",
                     f"/sweeps/{sweep['id']}/plots/layer_profile?format=svg",
                     f"/sweeps/{sweep['id']}/metrics?format=parquet", "/healthz"):
            assert c.get(path).status_code == 200, path
    assert "torch" not in sys.modules and "ray" not in sys.modules, "after serving"
    print("clean")
    """
)


@pytest.mark.slow
def test_the_api_process_never_imports_torch_or_ray(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(tmp_path / "t.db")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.strip() == "clean", r.stdout + r.stderr


def test_importing_the_cli_imports_neither_torch_nor_ray():
    code = (
        "import sys; from api.cli.main import build_parser; build_parser(); "
        "import api.cli.serve; "
        "assert 'torch' not in sys.modules and 'ray' not in sys.modules, "
        "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray'))[:5]"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# --- runners bound to their service -------------------------------------------------------------

# A fake runner: beats (as the real runner's loop does, LoopBeat) `beats` times, then sleeps —
# stuck — ignoring SIGTERM when told to (a runner that does not stop when asked).
FAKE_RUNNER = (
    "import os, pathlib, signal, sys, time\n"
    "if sys.argv[2] == 'deaf':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "beat = pathlib.Path(os.environ['ISOSWEEP_RUNNER_BEAT'])\n"
    "n = int(sys.argv[1])\n"
    "while n != 0:\n"
    "    beat.touch(); time.sleep(0.1); n -= 1\n"
    "time.sleep(600)\n"
)


def fake_runner(beats: int, deaf: bool = False) -> list[str]:
    return [sys.executable, "-c", FAKE_RUNNER, str(beats), "deaf" if deaf else "hears"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_stuck_runner_is_restarted(sqlite_url):
    """A runner whose loop stops beating for longer than stall_s is ended (SIGTERM, then SIGKILL:
    this one ignores SIGTERM) and restarted, its sweeps released like a dead one's."""
    sup = supervise.RunnerSupervisor(
        sqlite_url, command=fake_runner(beats=3, deaf=True), backoff_s=0.1, stall_s=1.0,
        grace_s=1.0, check_s=0.05,
    )  # fmt: skip
    try:
        sup.start()
        first = sup.status()["pid"]
        again = _until("the restart of the stuck runner", lambda: _new_pid(sup, first), 60)
        assert sup.status()["restarts"] >= 1 and sup.status()["last_exit_code"] == -9
        assert not _alive(first)
    finally:
        sup.stop()
    assert not _alive(again)


def test_a_runner_that_keeps_beating_is_left_alone(sqlite_url):
    sup = supervise.RunnerSupervisor(
        sqlite_url, command=fake_runner(beats=-1), backoff_s=0.1, stall_s=1.0, check_s=0.05
    )
    try:
        sup.start()
        first = sup.status()["pid"]
        beat = sup.beat_path
        _until("twenty beats", lambda: _beats_seen(beat, 20), 60)
        assert sup.status()["restarts"] == 0 and sup.status()["pid"] == first
    finally:
        sup.stop()


def _new_pid(sup, old: int) -> int | None:
    st = sup.status()
    return st["pid"] if st["state"] == "running" and st["pid"] not in (None, old) else None


def _beats_seen(path: Path, n: int, seen: list = []) -> bool | None:  # noqa: B006
    mtime = path.stat().st_mtime_ns if path.exists() else None
    if mtime is not None and (not seen or seen[-1] != mtime):
        seen.append(mtime)
    return True if len(seen) >= n else None


# A serve stand-in: a supervisor of a fake runner, in a process the test can SIGKILL.
SUPERVISING = (
    "import sys, time\n"
    "from api.cli import supervise\n"
    "sup = supervise.RunnerSupervisor(sys.argv[1], state_dir=sys.argv[2],\n"
    "    command=[sys.executable, '-c', sys.argv[3], '-1', sys.argv[4]])\n"
    "sup.start()\n"
    "print(sup.status()['pid'], flush=True)\n"
    "time.sleep(600)\n"
)


def _supervising(url: str, state: Path, deaf: bool) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SUPERVISING, url, str(state), FAKE_RUNNER,
         "deaf" if deaf else "hears"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    pid = int(proc.stdout.readline())
    _until("the fake runner's first beat", lambda: next(state.glob("runner-*.beat"), None), 30)
    return proc, pid  # it beats after its signal set-up: it is deaf now, if it is to be


def test_a_runner_dies_with_the_serve_that_started_it(sqlite_url, tmp_path):
    """SIGKILL of serve used to orphan its runner (it kept its lease and ran the sweep). Now the
    runner gets a parent-death signal (SIGTERM, Linux) when its supervisor dies."""
    serve_proc, runner = _supervising(sqlite_url, tmp_path, deaf=False)
    assert _alive(runner)
    serve_proc.kill()
    serve_proc.wait()
    _until("the orphan to die", lambda: True if not _alive(runner) else None, 30)


def test_a_restarted_serve_ends_the_runner_a_previous_one_left(sqlite_url, tmp_path):
    """A runner that outlived its serve (here: one that ignores the parent-death SIGTERM) is
    found by the next supervisor of the same database and data directory (its pid file), and
    ended — with its session — before the new runner starts; its sweeps are released."""
    from service.store import Store

    serve_proc, orphan = _supervising(sqlite_url, tmp_path, deaf=True)
    serve_proc.kill()
    serve_proc.wait()
    assert _alive(orphan)  # deaf to SIGTERM: still there
    with Store(sqlite_url) as store:
        spec = {"name": "orphaned", "parameters": {"depth": 2, "epochs": 1, **TINY}}
        sweep = store.create_sweep(parse_spec(spec))
        assert store.claim_sweep(supervise.runner_id_of(orphan), 600.0).id == sweep.id
        other = supervise.RunnerSupervisor(
            sqlite_url + "-another", state_dir=tmp_path, command=fake_runner(-1)
        )  # another database: its pid file is another one, and the orphan is not its own
        other.start()
        assert _alive(orphan)
        other.stop()
        sup = supervise.RunnerSupervisor(
            sqlite_url, store=store, state_dir=tmp_path, command=fake_runner(-1), grace_s=1.0
        )
        try:
            sup.start()
            assert not _alive(orphan) and supervise.session_pids(orphan) == []
            assert _alive(sup.status()["pid"])
            info = store.get_sweep(sweep.id)
            assert (info.status, info.runner_id) == ("queued", None)  # released at once
        finally:
            sup.stop()
        assert not list(tmp_path.glob("runner-*.json"))  # stopped cleanly: no pid file left


def _runners_of(url: str) -> list[int]:
    """Live `isosweep runner` processes whose database is `url`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not _alive(int(entry.name)):
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"runner" in cmd
            and b"api.cli.main" in cmd
            and f"ISOSWEEP_DATABASE_URL={url}".encode() in env
        ):
            found.append(int(entry.name))
    return found


@pytest.mark.ray
@pytest.mark.slow
def test_sigkill_of_serve_then_a_restart_leaves_one_runner_and_finishes_the_sweep_once(tmp_path):
    """The audit's case: serve SIGKILLed mid-sweep; the orphan kept its lease and ran the sweep,
    the restarted serve said "ok" and its own runner sat idle beside it. Now exactly one runner
    of this database is alive after the restart, and the sweep is finished once, every trial
    attempted as often as it was cut and every row stored once."""
    from service.store import Store

    url = f"sqlite:///{tmp_path / 'serve.db'}"
    proc, base = _serve_with_runner(tmp_path)
    try:
        spec = {"name": "cut", "parameters": {"depth": 2, "epochs": 60, **TINY}, "seeds": 2}
        sweep = _until("the API", lambda: _post(base, spec), proc=proc)
        first = _until("the runner to run the sweep", lambda: _driving(base, sweep), proc=proc)
    finally:
        proc.kill()  # SIGKILL: no cleanup of its own
        proc.wait()
    proc, base = _serve_with_runner(tmp_path)
    try:
        done = _until("the sweep to finish", lambda: _completed(base, sweep), 300, proc=proc)
        runners = _runners_of(url)
        health = _health(base)[1]
        assert runners == [health["runner"]["pid"]], (runners, first["pid"])
        assert not _alive(first["pid"])
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0
    assert _runners_of(url) == []
    with Store(url) as store:
        trials, total = store.list_trials(sweep["id"], limit=100)
        assert total == 2 and all(t.status == "completed" for t in trials)
        assert all(t.epochs_done == 60 for t in trials)
        frame = store.read_metrics(sweep["id"], metrics="train_loss")
        assert len(frame) == 2 * 61 and not frame.duplicated(["trial_id", "epoch"]).any()
    assert done["finished_at"] is not None


def _completed(base: str, sweep: dict) -> dict | None:
    try:
        info = httpx.get(f"{base}/sweeps/{sweep['id']}", timeout=5).json()
    except httpx.TransportError:
        return None
    return info if info["status"] == "completed" else None
