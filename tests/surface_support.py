"""The whole-surface test's fixtures without pytest (tests/test_surface.py): every example spec
shrunk to CPU scale by one override (`shrink`), the few variants that cover what no example
does (a Sobol and a TPE search, unpacked twins of each family), and `isosweep serve` (API and
runner, SQLite) as a subprocess whose log holds the server's tracebacks."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from support import free_port, isosweep_command

from service.documents import load_yaml

ROOT = Path(__file__).resolve().parent.parent
REGISTERED = ROOT / "examples" / "registered_model"
EXAMPLE_FILES = {
    **{p.stem: p for p in sorted((ROOT / "examples").glob("*.yaml"))},
    "registered_model": REGISTERED / "spec.yaml",
}
SAMPLES = 192  # training samples of a trained trial, and of epoch 0's training pass
JACOBIAN_FAMILIES = ("mlp", "resmlp")  # TrialConfig refuses jacobian_samples for the others


def load_example(name: str) -> dict[str, Any]:
    """An example spec as the server reads it (YAML 1.2: `1e-3` is a number)."""
    return load_yaml(EXAMPLE_FILES[name].read_text(encoding="utf-8"))


def _small(width: int) -> int:
    return max(8, width // 4)


def shrink(spec: dict[str, Any]) -> dict[str, Any]:
    """THE CPU-scale override of an example: every grid axis keeps its first two values (the
    registered model's `model_params` axis all of its points: each varies another field),
    depth [2, 4] (a fixed depth at most 4), width and batch size a quarter (at least 8, so
    width = batch stays equal and width > batch stays so), at most 2 epochs recorded every
    epoch, 192 training samples, 2 seeds, a search of 3 points (Sobol: 2), spectra on, and
    2 Jacobian samples where the family measures them. What the example is about — its family,
    norms, activations, inits, datasets, search and early stopping — is unchanged."""
    s = copy.deepcopy(spec)
    p: dict[str, Any] = {}
    for k, v in s["parameters"].items():
        if k == "model_params":
            p[k] = v
        elif k == "depth":
            p[k] = [2, 4] if isinstance(v, list) else min(v, 4)
        elif k in ("width", "batch_size"):
            p[k] = [_small(w) for w in v[:2]] if isinstance(v, list) else _small(v)
        elif k == "epochs":
            p[k] = min(v, 2)
        elif k == "record_every":
            p[k] = 1
        else:
            p[k] = v[:2] if isinstance(v, list) else v
    p |= {"max_train_samples": SAMPLES, "epoch0_train_samples": SAMPLES, "spectra": True}
    if p.get("model", "mlp") in JACOBIAN_FAMILIES:
        p["jacobian_samples"] = 2
    s["parameters"] = p
    s["seeds"] = 2
    if s.get("search"):
        s["search"]["n"] = 2 if s["search"]["kind"] == "sobol" else 3
    return s


# Every family unpacked (pack: 1), side by side in one sweep: a `model` axis.
FAMILIES_UNPACKED = {
    "name": "families-unpacked",
    "description": "each family, one trial per Tune trial (pack: 1)",
    "parameters": {"model": ["mlp", "resmlp", "cnn", "transformer", "wide_mlp"], "depth": 2,
                   "width": 8, "batch_size": 8, "norm": "layer", "dataset": "digits",
                   "epochs": 1, "max_train_samples": SAMPLES, "epoch0_train_samples": SAMPLES,
                   "spectra": True},
    "seeds": 2,
    "pack": 1,
    "resources": {"cpu": 1, "gpu": 0},
}  # fmt: skip


def sweeps_to_run() -> dict[str, dict[str, Any]]:
    """Every example, shrunk, under its file's stem; then `lr_search-sobol` (its random search as
    Sobol), `lr-depth-trainability-tpe` (TPE with successive halving, as the spec's comment
    says), and `families-unpacked` (every family, pack: 1). The examples set no `pack`: they
    are packed automatically."""
    specs = {name: shrink(load_example(name)) for name in EXAMPLE_FILES}
    sobol = copy.deepcopy(specs["lr_search"])
    sobol["search"] = {**sobol["search"], "kind": "sobol", "n": 2}
    sobol["name"] += "-sobol"
    tpe = copy.deepcopy(specs["lr-depth-trainability"])
    tpe["search"] = {"kind": "tpe", "n": 3, "objective": "test_loss", "mode": "min", "seed": 0}
    tpe["name"] += "-tpe"
    specs |= {"lr_search-sobol": sobol, "lr-depth-trainability-tpe": tpe}
    specs["families-unpacked"] = copy.deepcopy(FAMILIES_UNPACKED)
    return specs


def families(spec: dict[str, Any]) -> set[str]:
    """The model families a sweep's trials belong to (a registered model: "registered")."""
    model = spec["parameters"].get("model", "mlp")
    builtin = ("mlp", "resmlp", "cnn", "transformer")
    models = model if isinstance(model, list) else [model]
    return {m if m in builtin else "registered" for m in models}


def swept_fields(spec: dict[str, Any]) -> list[str]:
    """The fields a sweep varies, as reads name them: grid axes, sampled parameters, and each
    model parameter that differs between the `model_params` points as `model_params.<name>`."""
    out = []
    for k, v in spec["parameters"].items():
        if k == "model_params":
            if not isinstance(v, list):
                continue
            names = sorted({n for point in v for n in point})
            out += [f"model_params.{n}" for n in names if len({repr(pt.get(n)) for pt in v}) > 1]
        elif isinstance(v, (list, dict)):
            out.append(k)
    return out


# --- the server -----------------------------------------------------------------------------


TRACEBACK = re.compile(
    r"Traceback \(most recent call last\):\n(?:[ \t].*\n|[A-Za-z_][\w.]*(?:Error|Exception)\b.*\n)*"
)


@dataclass
class Served:
    """`isosweep serve` (API + supervised runner) on a free port, its output in `log`."""

    url: str
    log: Path
    proc: subprocess.Popen
    env: dict[str, str] = field(default_factory=dict)

    def log_size(self) -> int:
        return self.log.stat().st_size

    def tracebacks_since(self, offset: int) -> str:
        """The server's log after `offset`, cut to the last frames of each distinct traceback
        (or its last 2000 characters when it has none): what a 5xx left behind."""
        with self.log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
        found = [_ours(m.group(0)) for m in TRACEBACK.finditer(text)]
        return "\n".join(dict.fromkeys(found))[-4000:] if found else text[-2000:]


def _ours(traceback: str) -> str:
    """A traceback cut to the project's own frames (file and source line) and the error."""
    lines, keep = traceback.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith('  File "') and str(ROOT) in line and "/.venv/" not in line:
            keep += lines[i : i + 2]
    return "\n".join([*keep[-12:], lines[-1]])


def serve_env() -> dict[str, str]:
    """The environment of the server, its runner and the CLI: the registered model importable
    (docs/models.md), one torch thread per trial."""
    path = os.pathsep.join(p for p in (str(REGISTERED), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ISOSWEEP_MODEL_MODULES": "wide_mlp"}
    env |= {"OMP_NUM_THREADS": "1", "COLUMNS": "200", "NO_COLOR": "1"}
    for name in ("ISOSWEEP_API_TOKEN", "ISOSWEEP_API_URL", "ISOSWEEP_DATABASE_URL"):
        env.pop(name, None)
    return env


# Limits just above the shrunk sweeps' sizes: whatever the schema fuzzer submits stays tiny.
LIMITS = {
    "ISOSWEEP_MAX_TRIALS_PER_SWEEP": "64",
    "ISOSWEEP_MAX_DEPTH": "8",
    "ISOSWEEP_MAX_WIDTH": "100",  # TrialConfig's default (timm reads no width: it keeps it)
    "ISOSWEEP_MAX_BATCH_SIZE": "64",
    "ISOSWEEP_MAX_EPOCHS": "2",
}


def start_serve(
    tmp: Path, *, database: Path | None = None, runner: bool = True, timeout_s: float = 180
) -> Served:
    """`isosweep serve` on a free port over `database` (default tmp/surface.db), with its runner
    unless `runner` is false; returns once /healthz answers 200."""
    port = free_port()
    env = serve_env() | LIMITS
    env["ISOSWEEP_API_URL"] = f"http://127.0.0.1:{port}"  # for the CLI run with this env
    log = tmp / "serve.log"
    database = database or tmp / "surface.db"
    cmd = [*isosweep_command(), "serve", "--port", str(port), "--database-url",
           f"sqlite:///{database}", *([] if runner else ["--no-runner"])]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    served = Served(f"http://127.0.0.1:{port}", log, proc, env)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{served.url}/api/v1/healthz", timeout=2).status_code == 200:
                return served
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            stop_serve(served)
            raise RuntimeError(f"serve did not answer within {timeout_s} s")
        time.sleep(0.3)


def stop_serve(served: Served) -> None:
    """SIGTERM (serve stops its runner and that runner's Ray), SIGKILL after 40 s."""
    served.proc.terminate()
    try:
        served.proc.wait(40)
    except subprocess.TimeoutExpired:
        served.proc.kill()
        served.proc.wait(10)


# --- reading the surface ------------------------------------------------------------------------


class SurfaceError(AssertionError):
    """A read that broke: the route, its parameters, the status and the server's traceback."""


@dataclass
class Surface:
    """The populated server: its sweeps by name (`ids`), their specs, and checked reads."""

    served: Served
    ids: dict[str, int]
    specs: dict[str, dict[str, Any]]
    http: httpx.Client
    submitted: dict[str, dict[str, Any]] = field(default_factory=dict)  # the 201 answers
    polled_errors: dict[str, list[str]] = field(default_factory=dict)  # 5xx while waiting
    live_events: list[tuple[str, Any]] = field(default_factory=list)
    ended: set[str] = field(default_factory=set)  # the sweeps seen finished
    deadline: float = float("inf")  # monotonic time by which every sweep must have ended
    listener: Any = None  # the thread following the first sweep's events
    links: set[str] = field(default_factory=set)  # the dashboard's API links checked so far

    @property
    def url(self) -> str:
        return self.served.url

    def request(
        self,
        method: str,
        path: str,
        params: Any = None,
        *,
        ok: tuple[int, ...] = (200,),
        may_refuse: bool = False,
        **kw: Any,
    ) -> httpx.Response:
        """One request; a 5xx, or any status outside `ok` (with `may_refuse`: outside `ok` and a
        422 whose error names a field and says why), raises SurfaceError with what to fix."""
        offset = self.served.log_size()
        for wait_s in (2, 5, 10, 20, 0):  # a busy server's 503 and a slow plot's 504: retried
            r = self.http.request(method, path, params=params, **kw)
            if r.status_code not in (503, 504) or not wait_s:
                break
            time.sleep(wait_s)
        if r.status_code in ok:
            return r
        if may_refuse and r.status_code == 422 and refusal_says_why(r):
            return r
        where = f"{method} {r.request.url}"
        body = r.text[:1500]
        if r.status_code >= 500:
            raise SurfaceError(f"{where} → {r.status_code}\n{body}\n--- server ---\n"
                               f"{self.served.tracebacks_since(offset)}")  # fmt: skip
        raise SurfaceError(f"{where} → {r.status_code}, expected {ok}\n{body}")

    def get(self, path: str, params: Any = None, **kw: Any) -> httpx.Response:
        return self.request("GET", path, params, **kw)


def refusal_says_why(r: httpx.Response) -> bool:
    """A 422 in the API's error shape with a message that names what was refused."""
    try:
        error = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return (
        error.get("type") in ("invalid_input", "limit_exceeded")
        and bool(error.get("field"))
        and len(error["message"]) > 10
    )


def error_of(r: httpx.Response) -> dict[str, Any]:
    return r.json()["error"] if r.status_code >= 400 else {}
