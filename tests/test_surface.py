"""The whole surface, tested together (issue 19): every spec in examples/ shrunk to CPU scale by
one override (tests/surface_support.py: `shrink`), plus a Sobol search, a TPE search with
successive halving, and every family unpacked, run by one real `isosweep serve` (API and runner,
SQLite, the registered model `wide_mlp` loaded), then every read the product offers on each
sweep: the sweep and its trials, metrics raw, filtered and pooled (mean, std, ci95 checked
against the raw rows), CSV and Parquet, every plot kind by default, grouped by each swept field
(model parameters as `model_params.<name>`) and pooled by each `stat`, trial spectra (their
eigenvalues give back the stored gaps) and trial plots, the dashboard's pages and every link on
them, the event stream, the CLI's status/results/plot/compare, each `isosweep.Client` method,
the comparison of sweeps, the pages in Chromium, and schemathesis against the populated server.

A cell is one (sweep × surface) test. Nothing may answer 5xx; where a read does not apply it
must be a 422 whose error names what and why. A failing cell's message gives the route, its
parameters, the status and the server's traceback.

ISOSWEEP_SURFACE_DB=path/to/surface.db reads a database a previous run populated (its
serve.log tells where) with a fresh server and no runner: the reads in a minute, the runs
skipped."""

from __future__ import annotations

import concurrent.futures
import io
import itertools
import json
import math
import os
import re
import subprocess
import threading
import time
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats
from support import isosweep_command, require
from surface_support import (
    Surface,
    SurfaceError,
    start_serve,
    stop_serve,
    sweeps_to_run,
    swept_fields,
)

from service.isometry import gap_from_eigenvalues
from service.plots import PLOT_KINDS

try:  # the search kinds (issue 22), where this tree has them
    from service.plots.search import SEARCH_PLOT_KINDS
except ImportError:  # pragma: no cover
    SEARCH_PLOT_KINDS = ()

pytestmark = [pytest.mark.slow, pytest.mark.ray]

SPECS = sweeps_to_run()
NAMES = list(SPECS)
STATS = ("mean", "geomean", "median")
FINAL = ("completed", "failed", "cancelled")
FINISHED_TRIALS = ("completed", "diverged", "stopped")
AGGREGATES = ["mean", "std", "ci95", "count", "n_finite"]
WAIT_S = 2400  # every sweep run, on a shared 2-core machine
SVG = b"<svg"
PNG = b"\x89PNG\r\n\x1a\n"
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def partner(name: str, stored: dict[str, int] | None = None) -> str:
    """The sweep each sweep is compared with: the next one in NAMES (that is stored)."""
    i = NAMES.index(name)
    later = [NAMES[(i + k) % len(NAMES)] for k in range(1, len(NAMES))]
    return next((n for n in later if stored is None or n in stored), later[0])


def num(v: Any) -> float:
    return NONFINITE[v] if isinstance(v, str) else float(v)


# --- the populated server -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def surface(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("surface")
    reuse = os.environ.get("ISOSWEEP_SURFACE_DB")
    served = start_serve(tmp, database=Path(reuse) if reuse else None, runner=not reuse)
    http = httpx.Client(base_url=f"{served.url}/api/v1", timeout=300)
    s = Surface(served, {}, SPECS, http)
    try:
        if reuse:
            rows = http.get("/sweeps", params={"limit": 1000}).json()["data"]
            by_name = {r["name"]: r["id"] for r in rows}  # newest first: the oldest stays
            s.ids = {
                n: by_name[spec["name"]] for n, spec in SPECS.items() if spec["name"] in by_name
            }
            s.ended |= set(s.ids)
        else:
            populate(s)
        yield s
    finally:
        http.close()
        stop_serve(served)
        print(f"\nsurface: server log {served.log}, database {tmp / 'surface.db'}")


def populate(s: Surface) -> None:
    """Submit every sweep (the first one's event stream followed live from its submission); the
    runner runs them in order while the reads of the first ones go on (`sid` waits for a sweep
    to end, recording any 5xx its route gave meanwhile)."""
    listener = None
    for name, spec in SPECS.items():
        r = s.http.post("/sweeps", json=spec)
        s.submitted[name] = {"status": r.status_code, **r.json()}
        if r.status_code == 201:
            s.ids[name] = r.json()["id"]
        if listener is None and name in s.ids:
            listener = threading.Thread(target=follow, args=(s, s.ids[name]), daemon=True)
            listener.start()
    s.listener = listener
    s.deadline = time.monotonic() + WAIT_S


def wait_for(s: Surface, name: str) -> None:
    """Until the sweep has ended (or the run's deadline), recording a 5xx of its route."""
    sweep_id = s.ids[name]
    while name not in s.ended and time.monotonic() < s.deadline:
        offset = s.served.log_size()
        r = s.http.get(f"/sweeps/{sweep_id}")
        if r.status_code >= 500:
            seen = s.polled_errors.setdefault(name, [])
            if not seen:  # the first, with its traceback
                seen.append(
                    f"GET /api/v1/sweeps/{sweep_id} → {r.status_code} while it ran:\n"
                    f"{s.served.tracebacks_since(offset)}"
                )
        elif r.json()["status"] in FINAL:
            s.ended.add(name)
            break
        time.sleep(0.5)


def follow(s: Surface, sweep_id: int) -> None:
    import isosweep

    with isosweep.Client(s.url, timeout=WAIT_S) as c:
        try:
            for event in c.events(sweep_id):
                s.live_events.append(event)
        except Exception as exc:  # reported by the test of the live stream
            s.live_events.append(("error", repr(exc)))


def sid(surface: Surface, name: str) -> int:
    """The sweep's id, once it has ended."""
    if name not in surface.ids:
        pytest.fail(f"{name} was not stored: {surface.submitted.get(name)}")
    wait_for(surface, name)
    return surface.ids[name]


@cache
def _trials(url: str, sweep_id: int) -> tuple[dict, ...]:
    r = httpx.get(f"{url}/api/v1/sweeps/{sweep_id}/trials", params={"limit": 1000}, timeout=120)
    assert r.status_code == 200, r.text
    return tuple(r.json()["data"])


def trials(surface: Surface, name: str) -> list[dict]:
    return list(_trials(surface.url, sid(surface, name)))


@cache
def _frame(url: str, sweep_id: int, aggregate: bool) -> tuple[pd.DataFrame, dict]:
    params = {"limit": 100_000, "aggregate": str(aggregate).lower()}
    r = httpx.get(f"{url}/api/v1/sweeps/{sweep_id}/metrics", params=params, timeout=300)
    if r.status_code != 200:
        raise SurfaceError(f"GET {r.request.url} → {r.status_code}\n{r.text[:1500]}")
    body = r.json()
    frame = pd.DataFrame(body["data"], columns=body["columns"])
    for c in ("value", *AGGREGATES[:3]):
        if c in frame:
            frame[c] = frame[c].map(num).astype("float64")
    return frame, {"count": body["count"], "total": r.headers.get("X-Total-Count")}


def frame(surface: Surface, name: str, aggregate: bool = False) -> pd.DataFrame:
    return _frame(surface.url, sid(surface, name), aggregate)[0].copy()


def parameters(name: str) -> dict[str, Any]:
    return SPECS[name]["parameters"]


def epochs_of(name: str) -> int:
    return parameters(name).get("epochs", 10)


def documents(name: str) -> list[str]:
    """The swept model parameters whose values are documents (a timm model's `model_args`):
    grouped and shown like any field, but no filter compares them (a 422 says so)."""
    points = parameters(name).get("model_params")
    if not isinstance(points, list):
        return []
    return [
        f
        for f in swept_fields(SPECS[name])
        if f.startswith("model_params.")
        and any(isinstance(p.get(f.split(".", 1)[1]), dict | list) for p in points)
    ]


def filter_fields(name: str) -> list[str]:
    """The swept fields a filter can select by (all but documents)."""
    return [f for f in swept_fields(SPECS[name]) if f not in documents(name)]


def grid_values(name: str, f: str) -> list[Any]:
    """The values a grid axis (or a model parameter's) takes in the spec; [] for sampled ones."""
    p = parameters(name)
    if f.startswith("model_params."):
        key = f.split(".", 1)[1]
        return list(dict.fromkeys(point[key] for point in p["model_params"] if key in point))
    v = p.get(f)
    return v if isinstance(v, list) else []


def config_value(trial: dict, f: str) -> Any:
    """The trial's value of a field as reads show it: a document parameter as its canonical
    JSON text (the tidy frame's model_params.<name> column, service.param_columns)."""
    if f.startswith("model_params."):
        v = trial["config"]["model_params"].get(f.split(".", 1)[1])
        return (
            json.dumps(v, sort_keys=True, separators=(",", ":"))
            if isinstance(v, dict | list)
            else v
        )
    return trial["config"][f]


def query_value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v)


def failures(found: list[str]) -> None:
    if found:
        pytest.fail(f"{len(found)} broken:\n\n" + "\n\n".join(found), pytrace=False)


def attempt(found: list[str], call, *args, **kw) -> Any:
    try:
        return call(*args, **kw)
    except SurfaceError as exc:
        found.append(str(exc))
    except AssertionError as exc:
        found.append(f"{exc}")
    return None


# --- the sweep, its trials ------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_the_sweep_runs_and_reads_back(surface, name):
    found: list[str] = list(surface.polled_errors.get(name, []))
    spec, answer = SPECS[name], surface.submitted.get(name, {})
    sweep = surface.get(f"/sweeps/{sid(surface, name)}").json()
    n = sweep["n_trials"]
    if answer:
        est = answer["estimate"]
        epochs = epochs_of(name)
        if (est["trials"], est["trial_epochs"]) != (n, n * epochs):
            found.append(
                f"estimate at submit: {est['trials']} trials, {est['trial_epochs']} "
                f"trial-epochs; the sweep has {n} × {epochs} epochs"
            )
        if est["records"] != n * (epochs + 1) or not est["seconds"] > 0:
            found.append(f"estimate at submit: {est}")
    if sweep["status"] != "completed" or sweep["counts"]["failed"]:
        found.append(f"status {sweep['status']}, counts {sweep['counts']}: {sweep['error']}")
    if sum(sweep["counts"].values()) != n:
        found.append(f"counts {sweep['counts']} do not add up to n_trials {n}")
    listed = surface.get("/sweeps", {"limit": 1000}).json()["data"]
    if sweep["id"] not in {s["id"] for s in listed}:
        found.append("not in GET /sweeps")
    if spec.get("early_stop") or (spec.get("search") or {}).get("kind") == "tpe":
        attempt(found, check_best, surface, name, sweep)
    failures(found)


def check_best(surface: Surface, name: str, sweep: dict) -> None:
    """`best` is the completed trial whose objective (at its last epoch) is the smallest."""
    spec = SPECS[name]
    goal = spec["search"] if spec["search"]["kind"] == "tpe" else spec["early_stop"]
    metric = goal.get("objective") or goal.get("metric")
    best = sweep.get("best")
    assert best, f"`best` missing from a sweep with {goal['kind']}: {sweep.get('best')}"
    rows = frame(surface, name)
    done = {t["id"] for t in trials(surface, name) if t["status"] == "completed"}
    last = rows[(rows.metric == metric) & rows.trial_id.isin(done)]
    last = last.sort_values("epoch").groupby("trial_id").tail(1)
    value = last.value.min() if goal.get("mode", "min") == "min" else last.value.max()
    assert best["trial_id"] in done and best["metric"] == metric, best
    assert math.isclose(num(best["value"]), value, rel_tol=1e-12), (best, value)


@pytest.mark.parametrize("name", NAMES)
def test_every_trial_reads_back_with_its_epochs(surface, name):
    found: list[str] = []
    every = trials(surface, name)
    sweep = surface.get(f"/sweeps/{sid(surface, name)}").json()
    if len(every) != sweep["n_trials"]:
        found.append(f"{len(every)} trials listed, n_trials {sweep['n_trials']}")
    stored = frame(surface, name).groupby("trial_id").epoch.agg(["max", "nunique"])
    for t in every:
        c, what = t["config"], f"trial {t['id']} ({t['status']})"
        if t["status"] not in FINISHED_TRIALS:
            found.append(f"{what}: not finished: {t['error']}")
            continue
        last, distinct = stored.loc[t["id"]] if t["id"] in stored.index else (None, 0)
        if t["last_epoch"] != last or t["records_done"] != distinct:
            found.append(
                f"{what}: last_epoch {t['last_epoch']}, records_done "
                f"{t['records_done']}; stored epochs up to {last}, {distinct} of them"
            )
        if t["status"] == "completed" and not (
            t["epochs_done"] == t["epochs_total"] == c["epochs"] and t["last_epoch"] == c["epochs"]
        ):
            found.append(
                f"{what}: epochs_done {t['epochs_done']}, epochs_total "
                f"{t['epochs_total']}, last_epoch {t['last_epoch']}, epochs {c['epochs']}"
            )
        if t["status"] == "stopped" and "successive halving" not in (t["error"] or ""):
            found.append(f"{what}: error {t['error']!r}")
    for t in (every[0], every[-1]):
        one = attempt(found, surface.get, f"/trials/{t['id']}")
        if one is not None and (one.json()["config"], one.json()["status"]) != (
            t["config"],
            t["status"],
        ):
            found.append(f"GET /trials/{t['id']} differs from its row in the list")
    for f in filter_fields(name):
        for v in grid_values(name, f)[:2] or [config_value(every[0], f)]:
            want = sum(config_value(t, f) == v for t in every)
            r = attempt(
                found,
                surface.get,
                f"/sweeps/{sid(surface, name)}/trials",
                {f: query_value(v), "limit": 1000},
            )
            if r is not None and r.json()["count"] != want:
                found.append(f"trials?{f}={v}: {r.json()['count']} trials, {want} have it")
    failures(found)


# --- metrics --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_metrics_raw_name_every_trial_and_its_swept_fields(surface, name):
    found: list[str] = []
    rows, meta = _frame(surface.url, sid(surface, name), False)
    every = {t["id"]: t for t in trials(surface, name)}
    if str(meta["count"]) != str(meta["total"]) or meta["count"] != len(rows):
        found.append(f"count {meta['count']}, X-Total-Count {meta['total']}, rows {len(rows)}")
    missing = set(every) - set(rows.trial_id)
    if missing:
        found.append(f"trials without rows: {sorted(missing)}")
    for f in swept_fields(SPECS[name]):
        if f not in rows.columns:
            found.append(f"no column {f!r} for the swept field (columns {list(rows.columns)})")
            continue
        bad = [
            tid
            for tid, v in zip(rows.trial_id, rows[f], strict=True)
            if v != config_value(every[tid], f)
        ]
        if bad:
            found.append(f"column {f}: {len(bad)} rows differ from their trial's config")
    scalar = rows.layer.isna()
    depth = rows.trial_id.map(lambda t: every[t]["config"]["depth"])
    outside = rows[~scalar & ((rows.layer < 1) | (rows.layer > depth))]
    if len(outside):
        found.append(f"{len(outside)} per-layer rows outside 1..depth: {outside.head(3)}")
    if rows.value.isna().all():
        found.append("every value is NaN")
    failures(found)


@pytest.mark.parametrize("name", NAMES)
def test_metrics_filtered_by_each_swept_field(surface, name):
    found: list[str] = []
    every = trials(surface, name)
    for f in filter_fields(name):
        for v in grid_values(name, f)[:2] or [config_value(every[0], f)]:
            want = {t["id"] for t in every if config_value(t, f) == v}
            params = {f: query_value(v), "metric": "test_acc", "limit": 100_000}
            r = attempt(found, surface.get, f"/sweeps/{sid(surface, name)}/metrics", params)
            if r is None:
                continue
            got = {row["trial_id"] for row in r.json()["data"]}
            if got != want:
                found.append(f"metrics?{f}={v}: trials {sorted(got)}, expected {sorted(want)}")
    for f in documents(name):  # refused, saying why and what selects one trial instead
        r = surface.get(f"/sweeps/{sid(surface, name)}/metrics", {f: "{}"}, ok=(422,))
        if "is a document" not in r.text or "trial" not in r.text:
            found.append(f"metrics?{f}={{}}: {r.text}")
    for t in every[:2]:  # one trial by its id
        r = attempt(found, surface.get, f"/sweeps/{sid(surface, name)}/metrics",
                    {"trial": t["id"], "metric": "test_acc"})  # fmt: skip
        if r is not None and {row["trial_id"] for row in r.json()["data"]} != {t["id"]}:
            found.append(f"metrics?trial={t['id']}: {r.text[:300]}")
    failures(found)


@pytest.mark.parametrize("name", NAMES)
def test_metrics_pooled_over_seeds_equal_the_raw_rows(surface, name):
    """mean, std (ddof 1), ci95 = t₀.₉₇₅,ₙ₋₁·std/√n, count and n_finite of each configuration,
    recomputed here from the raw rows."""
    try:
        pooled = frame(surface, name, aggregate=True)
    except SurfaceError as exc:
        pytest.fail(str(exc), pytrace=False)
    raw = frame(surface, name)
    assert set(AGGREGATES) <= set(pooled.columns), list(pooled.columns)
    keys = [c for c in pooled.columns if c not in AGGREGATES]
    assert "seed" not in keys and "trial_id" not in keys, keys
    assert set(keys) <= set(raw.columns), (keys, list(raw.columns))
    groups = key_texts(raw[keys].map(hashable))
    v = raw.value.to_numpy()
    mine = pd.DataFrame({"g": groups, "v": v, "finite": np.isfinite(v)}).groupby("g")
    expect = pd.DataFrame(
        {
            "count": mine.v.size(),
            "n_finite": mine.finite.sum(),
            "mean": mine.v.apply(lambda x: np.mean(x.to_numpy())),
            "std": mine.v.apply(lambda x: np.std(x.to_numpy(), ddof=1) if len(x) > 1 else np.nan),
        }
    )
    t = scipy_stats.t.ppf(0.975, np.maximum(expect["count"] - 1, 1))
    expect["ci95"] = np.where(
        expect["count"] > 1, t * expect["std"] / np.sqrt(expect["count"]), np.nan
    )
    pooled.index = key_texts(pooled[keys].map(hashable))
    assert len(pooled) == len(expect) and set(pooled.index) == set(expect.index)
    got = pooled.loc[expect.index]
    assert (got["count"].to_numpy() == expect["count"].to_numpy()).all()
    assert (got["n_finite"].to_numpy() == expect["n_finite"].to_numpy()).all()
    if (SPECS[name].get("search") or {}).get("kind") != "tpe":  # TPE: each seed its own study
        assert got["count"].min() == 2, "two seeds pooled"
    for c in ("mean", "std", "ci95"):
        a, b = got[c].to_numpy(), expect[c].to_numpy()
        both = np.isfinite(a) & np.isfinite(b)
        assert np.array_equal(np.isfinite(a), np.isfinite(b)), c
        np.testing.assert_allclose(a[both], b[both], rtol=1e-9, atol=1e-300, err_msg=c)


def hashable(v: Any) -> Any:
    """A cell as a group key: a document (model_params) as its canonical JSON."""
    return json.dumps(v, sort_keys=True) if isinstance(v, dict) else v


def key_texts(keys: pd.DataFrame) -> pd.Series:
    """One text per row naming its configuration point (a missing value — a scalar metric's
    layer, a model parameter another model lacks — spelled <NA>)."""
    cells = keys.fillna({"layer": 0}).astype(object)
    return cells.where(cells.notna(), "<NA>").map(str).agg("|".join, axis=1)


@pytest.mark.parametrize("name", NAMES)
def test_metrics_pooled_under_each_stat(surface, name):
    """`stat` on the metrics route: answered, the pooled column checked against the raw rows
    (geomean = exp mean ln v, median); never a refusal, never a 5xx."""
    found: list[str] = []
    raw = frame(surface, name)
    raw = raw[(raw.metric == "test_acc") & (raw.epoch == 0)]
    for stat in STATS:
        params = {"aggregate": "true", "stat": stat, "metric": "test_acc", "epoch": 0}
        r = attempt(
            found, surface.get, f"/sweeps/{sid(surface, name)}/metrics", params, may_refuse=True
        )
        if r is None:
            continue
        if r.status_code != 200:
            found.append(f"stat={stat}: {r.status_code} {r.text[:300]}")
            continue
        body = r.json()
        if stat not in body["columns"]:
            found.append(f"stat={stat}: no {stat} column in {body['columns']}")
            continue
        got = sorted(num(row[stat]) for row in body["data"])
        keys = [c for c in body["columns"] if c not in (*AGGREGATES, stat, "value")]
        pool = {
            "mean": np.mean,
            "median": np.median,
            "geomean": lambda x: float(np.exp(np.mean(np.log(x)))),
        }[stat]
        point = key_texts(raw[[k for k in keys if k in raw]].map(hashable))
        want = sorted(raw.value.groupby(point).agg(pool))
        if not np.allclose(got, want, rtol=1e-9):
            found.append(f"stat={stat}: {got[:4]} … ≠ {want[:4]} …")
    failures(found)


@pytest.mark.parametrize("name", NAMES)
def test_csv_and_parquet_downloads_equal_the_json(surface, name):
    found: list[str] = []
    base = f"/sweeps/{sid(surface, name)}/metrics"
    rows = frame(surface, name)
    for aggregate in (False, True):
        want = frame(surface, name, aggregate) if aggregate else rows
        params = {"format": "csv", "aggregate": str(aggregate).lower()}
        r = attempt(found, surface.get, base, params)
        if r is None:
            continue
        csv = pd.read_csv(io.StringIO(r.text))
        what = f"CSV{' aggregate' if aggregate else ''}"
        if list(csv.columns) != list(want.columns) or len(csv) != len(want):
            found.append(
                f"{what}: columns {list(csv.columns)} × {len(csv)} rows; JSON "
                f"{list(want.columns)} × {len(want)}"
            )
            continue
        col = "value" if not aggregate else "mean"
        if not np.array_equal(csv[col].to_numpy("float64"), want[col].to_numpy(), equal_nan=True):
            found.append(f"{what}: {col} differs from the JSON answer")
        for c in csv.columns:
            if c.startswith("model_params") and csv[c].dtype == object:
                bad = [x for x in csv[c] if not _is_json(x)]
                if bad:
                    found.append(f"{what}: column {c} is not JSON: {bad[0]!r}")
    last = attempt(found, surface.get, base, {"format": "csv", "epoch": "last"})
    if last is not None:
        lasts = pd.read_csv(io.StringIO(last.text))
        top = rows.groupby("trial_id").epoch.max()
        if not (lasts.groupby("trial_id").epoch.max() == top).all():
            found.append("CSV epoch=last: not each trial's last epoch")
    pq = attempt(found, surface.get, base, {"format": "parquet"})
    if pq is not None:
        table = pd.read_parquet(io.BytesIO(pq.content))
        if not np.array_equal(table.value.to_numpy(), rows.value.to_numpy(), equal_nan=True):
            found.append("Parquet: value differs from the JSON answer")
    failures(found)


def _is_json(text: Any) -> bool:
    try:
        json.loads(text)
    except (TypeError, ValueError):
        return False
    return True


# --- plots ----------------------------------------------------------------------------------------
def strict_kinds(name: str, group_by: str | None = None) -> set[str]:
    """The kinds that must draw (200) for this sweep: a layer profile always; training curves
    when it trains; depth scaling when depth is swept (and not the lines' variable too)."""
    p = parameters(name)
    kinds = {"layer_profile"}
    if epochs_of(name) > 0:
        kinds.add("training_curves")
    if isinstance(p.get("depth"), list) and group_by != "depth":
        kinds.add("depth_scaling")
    return kinds


def plot(
    surface: Surface, name: str, kind: str, strict: bool, fmt: str = "svg", **params: Any
) -> httpx.Response:
    """A plot of the sweep as an SVG, or as the chart's JSON (`fmt` json: the same series and
    checks as the figure, without drawing it — what the dashboard's charts read)."""
    r = surface.get(
        f"/sweeps/{sid(surface, name)}/plots/{kind}",
        {"format": fmt, **params},
        may_refuse=not strict,
    )
    if r.status_code == 200:
        if fmt == "json":
            chart = r.json()
            assert chart["kind"] == kind and chart["panels"], f"{kind} {params}: {r.text[:300]}"
        else:
            assert SVG in r.content[:400], f"{kind} {params}: not an SVG"
    return r


def family_blind(r: httpx.Response) -> bool:
    """A default that names a metric the sweep's family does not record."""
    return r.status_code == 422 and "does not record" in r.text


def refused_for_a_swept_field(r: httpx.Response, f: str) -> bool:
    """A 422 that calls a swept field unknown: a field the sweep varies must be usable."""
    return r.status_code == 422 and f in r.text and "unknown" in r.text


@pytest.mark.parametrize("name", NAMES)
def test_every_plot_kind_with_its_defaults(surface, name):
    found: list[str] = []
    for kind in PLOT_KINDS:
        strict = kind in strict_kinds(name)
        r = attempt(found, plot, surface, name, kind, strict)
        if r is not None and family_blind(r):
            found.append(f"{kind}: the default metric is one the sweep does not record: {r.text}")
    for kind in SEARCH_PLOT_KINDS:  # a sweep without a search: a 422 saying so
        attempt(found, plot, surface, name, kind, False)
    png = attempt(found, surface.get, f"/sweeps/{sid(surface, name)}/plots/layer_profile")
    if png is not None and not png.content.startswith(PNG):
        found.append("layer_profile's default format is not PNG")
    failures(found)


def explicit_metric(kind: str) -> dict[str, str]:
    """A per-layer metric every family records, for the kinds that draw one (the defaults are
    tested above): grouping and pooling are then tested apart from the default's choice."""
    return {} if kind in ("training_curves", "theory_overlay") else {"metric": "grad_norm"}


@pytest.mark.parametrize("name", NAMES)
def test_every_plot_kind_grouped_by_each_swept_field(surface, name):
    """Every kind grouped by each swept field, as the chart's JSON (the figure's series and
    checks: the drawing itself is tested once per kind above); the layer profile's figure too."""
    found: list[str] = []
    fields = swept_fields(SPECS[name])
    for kind, f in itertools.product(PLOT_KINDS, fields):
        strict = kind in strict_kinds(name, group_by=f)
        r = attempt(found, plot, surface, name, kind, strict, "json", group_by=f,
                    **explicit_metric(kind))  # fmt: skip
        if r is not None and refused_for_a_swept_field(r, f):
            found.append(f"{kind}?group_by={f}: the swept field refused: {r.text}")
    for f in fields[:1]:
        attempt(found, plot, surface, name, "layer_profile", True, group_by=f, metric="grad_norm")
    failures(found)


@pytest.mark.parametrize("name", NAMES)
def test_every_plot_kind_pooled_by_each_stat(surface, name):
    """Every kind under each `stat`, as the chart's JSON; the layer profile's figure too."""
    found: list[str] = []
    for kind, stat in itertools.product(PLOT_KINDS, STATS):
        strict = kind in strict_kinds(name)
        attempt(found, plot, surface, name, kind, strict, "json", stat=stat,
                **explicit_metric(kind))  # fmt: skip
    for stat in STATS[1:]:
        attempt(found, plot, surface, name, "layer_profile", True, stat=stat, metric="grad_norm")
    failures(found)


# --- trials: spectra, trial plots -----------------------------------------------------------------
def gap_metric(spectrum: str) -> str:
    kind = spectrum.split("/", 1)[1]
    return "weight_isometry_gap" if kind == "weight" else f"isometry_gap/{kind}"


@pytest.mark.parametrize("name", NAMES)
def test_trial_spectra_give_back_the_stored_gaps(surface, name):
    """Each stored Gram spectrum's gap, log(mean λ) − mean(log λ), is the stored isometry gap
    of that layer (where it is finite and the spectrum resolved: λ_min/λ_max > 1e-8)."""
    found: list[str] = []
    rows = frame(surface, name)
    checked = 0
    done = [t for t in trials(surface, name) if t["status"] in FINISHED_TRIALS]
    for t in (done[0], done[-1]):
        r = attempt(found, surface.get, f"/trials/{t['id']}/spectra")
        if r is None:
            continue
        data = r.json()["data"]
        names = {d["name"] for d in data}
        if not any(n.startswith("spectrum/") for n in names):
            found.append(f"trial {t['id']}: no spectra stored (spectra: true): {sorted(names)}")
        model = t["config"]["model"]
        if model in ("mlp", "resmlp") and t["config"]["jacobian_samples"]:
            jac = [d for d in data if d["name"] == "jacobian_singular_values"]
            if not jac or jac[0]["shape"][0] != t["config"]["jacobian_samples"]:
                found.append(f"trial {t['id']}: Jacobian singular values {jac[:1]}")
        mine = rows[rows.trial_id == t["id"]]
        for d in data:
            if not d["name"].startswith("spectrum/"):
                continue
            gaps = mine[(mine.metric == gap_metric(d["name"])) & (mine.epoch == d["epoch"])]
            by_layer = dict(zip(gaps.layer, gaps.value, strict=True))
            for ell, row in enumerate(d["values"], start=1):
                lam = np.array([num(x) for x in row], dtype=float)
                lam = lam[~np.isnan(lam)]
                stored = by_layer.get(ell)
                if stored is None or not math.isfinite(stored) or lam.min() <= 1e-8 * lam.max():
                    continue
                mine_gap = gap_from_eigenvalues(lam)
                checked += 1
                if not math.isclose(mine_gap, stored, rel_tol=1e-5, abs_tol=1e-9):
                    found.append(
                        f"trial {t['id']} {d['name']} epoch {d['epoch']} layer {ell}: "
                        f"gap of the spectrum {mine_gap}, stored {stored}"
                    )
        for kind in ("spectrum", "jacobian_spectrum") if t is done[0] else ():
            strict = kind == "spectrum" or (model in ("mlp", "resmlp"))
            attempt(
                found,
                surface.get,
                f"/trials/{t['id']}/plots/{kind}",
                {"format": "svg"},
                may_refuse=not strict,
            )
    print(f"{name}: {checked} layer gaps checked against their spectra")
    failures(found)


# --- the dashboard (HTML) -------------------------------------------------------------------------
LINK = re.compile(r'(?:src|href)="([^"]+)"')


def page_links(html: str) -> list[str]:
    return list(dict.fromkeys(h.replace("&amp;", "&") for h in LINK.findall(html)))


def check_page(
    surface: Surface, path: str, found: list[str], *, strict_images: bool, png: bool = False
) -> str:
    """A dashboard page (200) and every API link on it: no 5xx; downloads 200; figures 200 when
    `strict_images` (the page's default figure), else 200 or a 422 naming why — but not a
    figure the page itself proposes that is refused as a metric or field the sweep lacks."""
    web = httpx.Client(base_url=surface.url, timeout=300)
    try:
        offset = surface.served.log_size()
        r = web.get(path)
        if r.status_code != 200:
            found.append(
                f"GET {path} → {r.status_code}\n{r.text[:800]}\n"
                f"{surface.served.tracebacks_since(offset) if r.status_code >= 500 else ''}"
            )
            return ""
        # a link another page showed (its CSV downloads, the trials) was checked there
        links = [k for k in page_links(r.text) if k.startswith("/api/") and k not in surface.links]
        surface.links.update(links)
        charts = {k.replace("format=json", "") for k in links if "format=json" in k}
        for link in links:
            figure = "/plots/" in link  # the page's charts (JSON) and figures (SVG, PNG)
            if figure and "format=png" in link and not png:
                continue  # the same figure again as PNG: drawn once, on the sweep's own page
            drawn = link.replace("format=svg", "").replace("format=png", "")
            if figure and not strict_images and drawn in charts and "format=json" not in link:
                continue  # the chart's JSON is read: its figure is drawn on the sweep's page
            strict = strict_images or not figure
            got = attempt(found, surface.get, link.removeprefix("/api/v1"), may_refuse=not strict)
            if (
                got is not None
                and figure
                and got.status_code == 422
                and (family_blind(got) or "did you mean" in got.text)
            ):
                found.append(f"{path}: its own default figure {link} is refused: {got.text}")
        return r.text
    finally:
        web.close()


@pytest.mark.parametrize("name", NAMES)
def test_the_dashboards_sweep_trial_and_compare_pages(surface, name):
    found: list[str] = []
    s = sid(surface, name)
    html = check_page(surface, f"/sweeps/{s}", found, strict_images=True, png=True)
    kinds = re.findall(rf'href="(/sweeps/{s}\?kind=[^"]*)"', html)
    for link in dict.fromkeys(k.replace("&amp;", "&") for k in kinds):
        check_page(surface, link, found, strict_images=False)
    check_page(surface, f"/trials/{trials(surface, name)[0]['id']}", found, strict_images=True)
    other = sid(surface, partner(name, surface.ids))
    check_page(surface, f"/compare?sweep={s}&sweep={other}", found, strict_images=False)
    failures(found)


SEARCHES = [n for n in NAMES if SPECS[n].get("search")]


@pytest.mark.parametrize("name", SEARCHES)
def test_the_dashboard_shows_a_searchs_sampled_values_and_best(surface, name):
    found: list[str] = []
    html = check_page(surface, f"/sweeps/{sid(surface, name)}", found, strict_images=True)
    header = re.search(r"<thead>(.*?)</thead>", html, re.S)
    sampled = [k for k, v in parameters(name).items() if isinstance(v, dict)]
    for k in sampled:
        if not header or f">{k}<" not in re.sub(r"\s*[▲▼]", "", header.group(1)):
            found.append(f"the trials table has no column for the sampled {k!r}")
    spec = SPECS[name]
    if (spec.get("early_stop") or spec["search"]["kind"] == "tpe") and "best" not in html:
        found.append("the sweep page does not show `best`")
    failures(found)


# --- the event stream -----------------------------------------------------------------------------
def events_of(surface: Surface, sweep_id: int) -> list[tuple[str, Any, str]]:
    out = []
    with httpx.stream("GET", f"{surface.url}/api/v1/sweeps/{sweep_id}/events", timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        event, ident, data = "message", "", []
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("id:"):
                ident = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                data.append(line.split(":", 1)[1].strip())
            elif not line and data:
                out.append((event, json.loads("\n".join(data)), ident))
                event, ident, data = "message", "", []
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_event_stream_of_a_finished_sweep(surface, name):
    s = sid(surface, name)
    got = events_of(surface, s)
    sweep = surface.get(f"/sweeps/{s}").json()
    assert [e[0] for e in got] == ["progress", "end"], [e[0] for e in got]
    assert [e[2] for e in got] == ["1", "2"]
    end = got[-1][1]
    assert (end["id"], end["status"], end["counts"]) == (s, sweep["status"], sweep["counts"])


def test_the_live_event_stream_of_the_first_sweep(surface):
    """Followed from its submission: progress first and never backwards, one `trial` event per
    trial, `end` last with the final sweep."""
    if not surface.submitted:
        pytest.skip("ISOSWEEP_SURFACE_DB: the sweeps ran earlier")
    sid(surface, NAMES[0])
    if surface.listener is not None:
        surface.listener.join(30)  # the stream ends with the sweep
    events = surface.live_events
    assert events and ("error" not in {e for e, _ in events}), events[-3:]
    kinds = [e for e, _ in events]
    assert kinds[0] == "progress" and kinds[-1] == "end" and kinds.count("end") == 1, kinds
    progress = [d["progress"] for e, d in events if e == "progress"]
    assert progress == sorted(progress)
    first = NAMES[0]
    ids = sorted(d["id"] for e, d in events if e == "trial")
    assert ids == sorted(t["id"] for t in trials(surface, first))
    assert events[-1][1]["status"] == surface.get(f"/sweeps/{sid(surface, first)}").json()["status"]


# --- the CLI --------------------------------------------------------------------------------------
def cli(surface: Surface, *args: Any, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*isosweep_command(), *map(str, args)],
        env=surface.served.env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def cli_runs(surface: Surface, name: str, out: Path) -> dict[str, subprocess.CompletedProcess]:
    s, other = sid(surface, name), sid(surface, partner(name, surface.ids))
    commands = {
        "status": ("status", s),
        "status --json": ("status", s, "--json"),
        "results --csv": ("results", s, "--csv", "-o", out / "rows.csv"),
        "results --aggregate --json": ("results", s, "--aggregate", "--json"),
        "results --metric test_acc --epoch last": (
            "results",
            s,
            "--metric",
            "test_acc",
            "--epoch",
            "last",
        ),
        "plot layer_profile": ("plot", s, "layer_profile", "-o", out / "profile.svg"),
        "compare": ("compare", s, other, "--metric", "test_acc", "--epoch", "last"),
        "compare --kind layer_profile": (
            "compare",
            s,
            other,
            "--kind",
            "layer_profile",
            "--metric",
            "grad_norm",
            "-o",
            out / "compare.svg",
        ),
    }
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = {k: pool.submit(cli, surface, *a, cwd=out) for k, a in commands.items()}
        return {k: f.result() for k, f in futures.items()}


@pytest.mark.parametrize("name", NAMES)
def test_the_cli_status_results_plot_and_compare(surface, name, tmp_path):
    found: list[str] = []
    runs = cli_runs(surface, name, tmp_path)
    for what, run in runs.items():
        if run.returncode != 0:
            found.append(f"isosweep {what} → exit {run.returncode}\n{run.stderr[-1500:]}")
    every = trials(surface, name)
    if runs["status"].returncode == 0:
        table = runs["status"].stdout
        epochs = epochs_of(name)
        done = [t for t in every if t["status"] == "completed"]
        if done and f"{epochs}/{epochs}" not in table:
            found.append(f"isosweep status: no completed trial reads {epochs}/{epochs}")
        header = table.split("\n", 3)[:3]
        for k, v in parameters(name).items():
            if isinstance(v, dict) and k != "model_params" and not re.search(rf"\b{k}\b", table):
                found.append(f"isosweep status: no column for the sampled {k!r}: {header}")
    if runs["status --json"].returncode == 0:
        listed = json.loads(runs["status --json"].stdout)
        n = len(listed["trials"]["data"]) if "trials" in listed else listed.get("n_trials")
        if n != len(every):
            found.append(f"isosweep status --json: {n} trials, the sweep has {len(every)}")
    if runs["results --csv"].returncode == 0:
        csv = pd.read_csv(tmp_path / "rows.csv")
        if len(csv) != len(frame(surface, name)):
            found.append(
                f"isosweep results --csv: {len(csv)} rows, REST {len(frame(surface, name))}"
            )
    for what, file in (
        ("plot layer_profile", "profile.svg"),
        ("compare --kind layer_profile", "compare.svg"),
    ):
        path = tmp_path / file
        if runs[what].returncode == 0 and not (path.is_file() and SVG in path.read_bytes()[:400]):
            found.append(f"isosweep {what}: no SVG written")
    failures(found)


def test_the_cli_lists_every_sweep(surface):
    run = cli(surface, "status")
    assert run.returncode == 0, run.stderr
    for name in surface.ids:
        assert SPECS[name]["name"][:20] in run.stdout, (name, run.stdout[-2000:])


# --- the Python client ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_each_client_method(surface, name):
    import isosweep

    found: list[str] = []
    s, other = sid(surface, name), sid(surface, partner(name, surface.ids))
    every = trials(surface, name)
    fields = swept_fields(SPECS[name])

    def call(what: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except isosweep.ApiError as exc:
            found.append(f"Client.{what}: {exc.status} {exc}")
        except Exception as exc:
            found.append(f"Client.{what}: {type(exc).__name__}: {exc}")
        return None

    with isosweep.Client(surface.url, timeout=300) as c:
        health = call("health", c.health)
        if health is not None and health.get("status") != "ok":
            found.append(f"Client.health: {health}")
        sweep = call("sweep", c.sweep, s)
        listed = call("sweeps", c.sweeps) or []
        if s not in {x["id"] for x in listed}:
            found.append("Client.sweeps: the sweep is missing")
        waited = call("wait", c.wait, s, progress=False, timeout_s=30)
        if sweep and waited and waited["status"] != sweep["status"]:
            found.append(f"Client.wait: {waited['status']} ≠ {sweep['status']}")
        table = call("trials", c.trials, s)
        if table is not None:
            if len(table) != len(every):
                found.append(f"Client.trials: {len(table)} rows for {len(every)} trials")
            gone = [f for f in fields if f not in table.columns]
            if gone:
                found.append(f"Client.trials: no column for {gone}")
        rows = call("metrics", c.metrics, s)
        if rows is not None and len(rows) != len(frame(surface, name)):
            found.append(f"Client.metrics: {len(rows)} rows, REST {len(frame(surface, name))}")
        pooled = call("metrics(aggregate=True)", c.metrics, s, aggregate=True)
        if pooled is not None and not set(AGGREGATES) <= set(pooled.columns):
            found.append(f"Client.metrics(aggregate=True): columns {list(pooled.columns)}")
        for f in filter_fields(name):
            v = (grid_values(name, f) or [config_value(every[0], f)])[0]
            part = call(
                f"metrics(where={{{f!r}: {v!r}}})", c.metrics, s, metric="test_acc", where={f: v}
            )
            want = {t["id"] for t in every if config_value(t, f) == v}
            if part is not None and set(part.trial_id) != want:
                found.append(
                    f"Client.metrics(where={{{f!r}: {v!r}}}): trials "
                    f"{sorted(set(part.trial_id))}, expected {sorted(want)}"
                )
        image = call("plot", c.plot, s, "layer_profile")
        if image is not None and not image.startswith(PNG):
            found.append("Client.plot: not a PNG")
        both = call("compare", c.compare, [s, other], metric="test_acc", epoch="last")
        if both is not None and set(both.sweep_id) != {s, other}:
            found.append(f"Client.compare: sweeps {set(both.sweep_id)}")
        image = call(
            "compare_plot",
            c.compare_plot,
            [s, other],
            "layer_profile",
            metric="grad_norm",
            format="svg",
        )
        if image is not None and SVG not in image[:400]:
            found.append("Client.compare_plot: not an SVG")
        events = call("events", lambda: list(c.events(s)))
        if events is not None and [e for e, _ in events] != ["progress", "end"]:
            found.append(f"Client.events: {[e for e, _ in events]}")
        spec = SPECS[name]
        if not spec.get("early_stop") and not spec.get("rerun"):  # all of it is stored
            again = call("submit", c.submit, spec)
            if again is not None:
                counts = again["counts"]
                if again["status"] != "completed" or counts["queued"] or counts["running"]:
                    found.append(
                        f"Client.submit of the same spec: not reused: {again['status']} {counts}"
                    )
                try:
                    c.cancel(again["id"])
                except isosweep.ApiError as exc:
                    if exc.status != 409:
                        found.append(f"Client.cancel of a finished sweep: {exc.status} {exc}")
    failures(found)


# --- comparing sweeps -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_comparing_the_sweep_with_another(surface, name):
    found: list[str] = []
    partner_name = partner(name, surface.ids)
    s, other = sid(surface, name), sid(surface, partner_name)
    both = {"sweep": [s, other]}
    for aggregate in ("false", "true"):
        r = attempt(
            found,
            surface.get,
            "/compare/metrics",
            {**both, "metric": "test_acc", "epoch": "last", "aggregate": aggregate},
        )
        if r is not None:
            body = r.json()
            if body["columns"][:2] != ["sweep_id", "sweep"] or not body["count"]:
                found.append(f"compare/metrics: columns {body['columns']}, count {body['count']}")
    csv = attempt(
        found, surface.get, "/compare/metrics", {**both, "metric": "test_acc", "format": "csv"}
    )
    if csv is not None and not csv.text.startswith("sweep_id,sweep"):
        found.append(f"compare CSV: {csv.text[:200]}")
    line_kinds = ("layer_profile", "depth_scaling", "training_curves")
    for kind in PLOT_KINDS:
        metric = {"metric": "grad_norm"} if kind in ("layer_profile", "depth_scaling") else {}
        strict = kind == "layer_profile" or (
            kind == "training_curves" and min(epochs_of(name), epochs_of(partner_name)) > 0
        )
        fmt = "svg" if kind == "layer_profile" else "json"  # a figure drawn, the rest charts
        r = attempt(
            found,
            surface.get,
            f"/compare/plots/{kind}",
            {**both, "format": fmt, **metric},
            may_refuse=not strict,
        )
        if r is not None and kind not in line_kinds and r.status_code != 422:
            found.append(f"compare/plots/{kind}: {r.status_code}, a 422 naming kind expected")
        for f in swept_fields(SPECS[name]) if kind in line_kinds else ():
            attempt(
                found,
                surface.get,
                f"/compare/plots/{kind}",
                {**both, "format": "json", "group_by": f, **metric},
                may_refuse=True,
            )
    failures(found)


# --- the pages in Chromium ------------------------------------------------------------------------
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        if require("ISOSWEEP_REQUIRE_BROWSER"):
            pytest.fail(f"ISOSWEEP_REQUIRE_BROWSER=1 but no Chromium at {CHROMIUM}")
        pytest.skip(f"Chromium not found at {CHROMIUM} (`make browser`)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run"],
        )
        yield b
        b.close()


# The page's figures settled: every image loaded or failed, every chart drawn or its refusal
# shown under it (dashboard.js: figure[data-chart] gets data-drawn, or .plot-error says why).
SETTLED = """() => [...document.querySelectorAll("img[data-plot]")].every((i) => i.complete)
    && [...document.querySelectorAll("figure[data-chart]")].every((f) => f.dataset.drawn
        || !f.querySelector(".plot-error").hidden)"""
BROKEN = """() => [
    [...document.querySelectorAll("img[data-plot]")]
        .filter((i) => i.naturalWidth === 0).map((i) => i.getAttribute("src")),
    [...document.querySelectorAll("figure[data-chart]")].filter((f) => !f.dataset.drawn)
        .map((f) => `${f.dataset.chart}: ${f.querySelector(".plot-error").textContent}`)]"""


def visit(
    browser, surface: Surface, path: str, found: list[str], shots: Path, *, strict: bool = False
) -> None:
    """A page in Chromium: no script error, no 5xx, every figure drawn — or, unless `strict`,
    refused with the API's reason shown under it."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"script error: {e}"))
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 500 else None)
    try:
        page.goto(surface.url + path, wait_until="load", timeout=120_000)
        page.wait_for_function(SETTLED, timeout=120_000)
        images, charts = page.evaluate(BROKEN)
        if images:
            errors.append(f"images not drawn: {images}")
        if charts and (strict or any("cannot reach" in c for c in charts)):
            errors.append(f"charts not drawn: {charts}")
        page.screenshot(path=str(shots / (re.sub(r"\W+", "_", path).strip("_") + ".png")))
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        context.close()
    found += [f"{path} in Chromium: {e}" for e in errors]


@pytest.mark.browser
@pytest.mark.parametrize("name", NAMES)
def test_the_pages_in_chromium(surface, browser, name, artifacts_dir):
    shots = artifacts_dir / "surface"
    shots.mkdir(exist_ok=True)
    found: list[str] = []
    s, other = sid(surface, name), sid(surface, partner(name, surface.ids))
    visit(browser, surface, f"/sweeps/{s}", found, shots, strict=True)
    visit(browser, surface, f"/trials/{trials(surface, name)[0]['id']}", found, shots)
    visit(browser, surface, f"/compare?sweep={s}&sweep={other}", found, shots)
    failures(found)


# --- schemathesis against the populated server ----------------------------------------------------
EVENTS = "/api/v1/sweeps/{sweep_id}/events"


@pytest.fixture(scope="module")
def document(surface):
    import schemathesis

    return schemathesis.openapi.from_url(f"{surface.url}/openapi.json").exclude(path=EVENTS)


def cancel_new_sweeps(surface: Surface) -> None:
    """A sweep the fuzzer submitted is cancelled: the runner stays free for nothing."""
    ours = set(surface.ids.values())
    for row in surface.http.get("/sweeps", params={"limit": 1000}).json()["data"]:
        if row["id"] not in ours and row["status"] in ("queued", "running"):
            surface.http.post(f"/sweeps/{row['id']}/cancel")


def fuzz_checks() -> list:
    """tests/api/test_fuzz.py's checks: no 5xx, and answers as the document says."""
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    return [not_a_server_error, status_code_conformance, content_type_conformance,
            response_headers_conformance, response_schema_conformance]  # fmt: skip


def test_schemathesis_finds_no_server_error_on_the_populated_server(surface, document):
    """Every operation, a few generated cases each (ids of stored sweeps and trials among the
    values), checked as the empty-store fuzzing checks (tests/api/test_fuzz.py)."""
    from hypothesis import HealthCheck, given, settings

    found: list[str] = []
    for result in document.get_all_operations():
        operation = result.ok()

        @settings(max_examples=6, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(case=operation.as_strategy())
        def run(case):
            case.call_and_validate(checks=fuzz_checks(), timeout=120)

        try:
            run()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # schemathesis' FailureGroup is a BaseExceptionGroup
            found.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:3000]}")
        cancel_new_sweeps(surface)
    failures(found)


def test_schemathesis_stateful_on_the_populated_server(surface, document):
    """Sequences along the document's links (a submitted sweep's id into its reads, …)."""
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    checks = fuzz_checks()

    class Machine(document.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case):
            return {"timeout": 120}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=checks)

    try:
        run_state_machine_as_test(Machine, settings=settings(
            max_examples=15, stateful_step_count=6, deadline=None, derandomize=True,
            database=None, suppress_health_check=list(HealthCheck)))  # fmt: skip
    finally:
        cancel_new_sweeps(surface)
