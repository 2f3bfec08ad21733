# isosweep — the two commands: `make run` and `make test`. Each installs what it needs from nothing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Loopback-only Ray, and one auth mode for every Ray client we start (see README, "Ray").
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
# Bytecode caches on where the environment turns them off (PYTHONDONTWRITEBYTECODE=1 on this
# machine): otherwise every Python process the tests start (Ray workers, the CLI, `isosweep
# serve`) compiles the project's modules again, and every pytest worker rewrites the tests'
# asserts again. __pycache__/ is ignored by git.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-fast lint format bench browser clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Headless Chromium from Debian, for the dashboard's browser test.
browser:
	@command -v chromium >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

run: $(STAMP)  ## the service on SQLite + local Ray, with a demo sweep; prints the dashboard URL
	$(VENV)/bin/isosweep serve --demo

# pytest-xdist: one module a worker at a time (module fixtures built once), longest first
# (tests/conftest.py); PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: lint browser  ## lint and types, then the whole suite
	$(PY) -m pytest $(XDIST)

test-fast: $(STAMP)  ## seconds: no training runs, no Ray, no browser
	$(PY) -m pytest $(XDIST) -m "not slow and not ray and not browser"

lint: $(STAMP)  ## ruff (lint and format) on everything, mypy on service/ and api/
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache artifacts
