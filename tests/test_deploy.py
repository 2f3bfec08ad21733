"""docker-compose.yml and the Dockerfile: valid against the compose schema (no Docker engine
here), every isosweep command and ISOSWEEP_* variable they use exists in the project, and every
`isosweep serve` has what it needs to start (a token beyond loopback)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from api.cli import serve
from api.cli.main import build_parser
from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _commands(service: dict) -> list[list[str]]:
    """The isosweep command lines a service runs (inside `sh -c` scripts too)."""
    cmd = service.get("command")
    if cmd is None:
        return []
    text = cmd if isinstance(cmd, str) else shlex.join(cmd)
    if isinstance(cmd, list) and cmd[:2] == ["sh", "-c"]:
        text = cmd[2]
    found = []
    for part in re.split(r"&&|;|\|\|", text):
        words = shlex.split(part)
        if words and words[0] == "exec":
            words = words[1:]
        if words and words[0] == "isosweep":
            found.append(words[1:])
    return found


def test_compose_file_validates_against_the_compose_schema():
    exe = Path(sys.executable).parent / "check-jsonschema"
    result = subprocess.run(
        [str(exe), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_has_the_required_services():
    services = _compose()["services"]
    assert set(services) == {"postgres", "ray-head", "ray-worker", "api"}
    pg = services["postgres"]
    assert "healthcheck" in pg and any("/var/lib/postgresql/data" in v for v in pg["volumes"])
    assert services["api"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    # published ports bind to loopback unless told otherwise
    for name in ("api", "ray-head"):
        for port in services[name].get("ports", []):
            assert port.startswith("${ISOSWEEP_PUBLISH_HOST:-127.0.0.1}:"), port
    # the worker reserves a GPU with the compose device syntax and is scalable (no fixed name)
    worker = services["ray-worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and "container_name" not in worker
    assert "ports" not in worker


def test_every_isosweep_command_parses():
    parser = build_parser()
    services = _compose()["services"]
    commands = [c for s in services.values() for c in _commands(s)]
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd_line = next(line for line in dockerfile.splitlines() if line.startswith("CMD "))
    commands.append(json.loads(cmd_line[4:])[1:])
    assert {c[0] for c in commands} >= {"runner", "serve"}
    for argv in commands:
        args = parser.parse_args(argv)  # exits (SystemExit) on an unknown command or option
        assert callable(args.func)


def test_every_isosweep_variable_is_a_setting():
    text = COMPOSE.read_text() + (ROOT / "Dockerfile").read_text()
    names = set(re.findall(r"\bISOSWEEP_([A-Z_]+)\b", text)) - {"PUBLISH_HOST"}
    fields = {f.upper() for f in Settings.model_fields}
    assert names and names <= fields, names - fields


def unexported(value: str) -> str:
    """A compose value as interpolated with no variable exported: `${V:-d}` is d, `${V}` empty,
    and `${V:?msg}` a stand-in: compose refuses to start without V, so V is set when it runs."""

    def one(m: re.Match) -> str:
        name, op, rest = m.group(1), m.group(2), m.group(3)
        if op in (":?", "?"):
            return f"<{name}>"
        return rest if op in (":-", "-") else ""

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}", one, value)


def test_unexported_interpolation():
    assert unexported("${A:-x}/${B}") == "x/" and unexported("${C:?set C, e.g. 1}") == "<C>"


def test_every_serve_has_what_it_needs_to_start(monkeypatch):
    """`isosweep serve` beyond loopback refuses to start without a token (or allow_open): a
    service serving 0.0.0.0 in its container must be given one."""
    parser = build_parser()
    served = 0
    for service in _compose()["services"].values():
        for argv in (c for c in _commands(service) if c[0] == "serve"):
            for var in [v for v in os.environ if v.startswith("ISOSWEEP_")]:
                monkeypatch.delenv(var)
            for var, value in service.get("environment", {}).items():
                monkeypatch.setenv(var, unexported(str(value)))
            args = parser.parse_args(argv)
            given = {"host": args.host, "allow_open": args.allow_open}
            serve.check_open(Settings(**{k: v for k, v in given.items() if v is not None}))
            served += 1
    assert served, "no service runs isosweep serve"


PROJECT_IMAGE = "isosweep:latest"
RAY_SERVICES = ("ray-head", "ray-worker", "api")  # every Ray node and client


def test_every_service_of_the_project_image_can_build_it():
    """A service that names the project's image without a `build` makes `docker compose up` pull
    it from a registry on a machine that has not built it yet, and fail (docker/compose#8805):
    each has the same build, under the same tag (or a pull policy that builds)."""
    services = _compose()["services"]
    ours = {n: s for n, s in services.items() if "build" in s or s.get("image") == PROJECT_IMAGE}
    assert set(ours) >= set(RAY_SERVICES)
    builds = set()
    for name, service in ours.items():
        assert service.get("image") == PROJECT_IMAGE, name
        assert "build" in service, f"{name} runs {PROJECT_IMAGE} but cannot build it"
        # "always" would try the registry first; these build when the image is not there
        assert service.get("pull_policy", "missing") in ("missing", "if_not_present", "build")
        builds.add(json.dumps(service["build"], sort_keys=True))
    assert len(builds) == 1, builds  # one image: the same build everywhere
    assert services["postgres"]["image"] != PROJECT_IMAGE and "build" not in services["postgres"]


def test_ray_auth_is_the_same_everywhere():
    """One mode and one token for every Ray node and client: the same RAY_AUTH_TOKEN value
    (one variable, required) and RAY_AUTH_MODE=token in each service."""
    services = _compose()["services"]
    envs = {name: services[name]["environment"] for name in RAY_SERVICES}
    assert {name: env.get("RAY_AUTH_MODE") for name, env in envs.items()} == dict.fromkeys(
        RAY_SERVICES, "token"
    )
    tokens = {str(env["RAY_AUTH_TOKEN"]) for env in envs.values()}
    assert len(tokens) == 1, tokens
    (token,) = tokens
    assert re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", token) == ["RAY_AUTH_TOKEN"], token
    assert unexported(token) == "<RAY_AUTH_TOKEN>"  # compose refuses to start without it
