"""Sampled spec parameters (service.sampling, service.spec): the inverse CDFs against their closed
forms, bounds over many draws, the distributions' laws (KS and χ² tests at fixed seeds), Sobol
balance, reproducibility, the grid × points × seeds product, errors naming the field, limits,
and a search submitted over HTTP whose trials are stored exactly as expanded."""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest
from scipy import stats

from service.config import TrialConfig, config_hash
from service.errors import InvalidInput, LimitExceeded
from service.sampling import (
    Choice,
    IntRange,
    LogUniform,
    Search,
    Uniform,
    draw,
    unit_points,
)
from service.settings import Settings
from service.spec import expand, parse_spec, swept_fields, swept_fields_of
from service.store import Store

LR_SEARCH = """
name: lr-search
parameters:
  depth: [5, 20]
  lr: {loguniform: [1.0e-4, 1.0e-1]}
  epochs: 3
seeds: 2
search: {kind: random, n: 8, seed: 7}
"""


def spec_with(parameters, search=None, seeds=1, **rest):
    data = {"name": "s", "parameters": parameters, "seeds": seeds, **rest}
    if search is not None:
        data["search"] = search
    return parse_spec(data)


def values(dist, n=4000, kind="random", seed=0):
    return [p["x"] for p in draw({"x": dist}, Search(kind=kind, n=n, seed=seed))]


# --- the inverse CDFs -------------------------------------------------------------------------


def test_inverse_cdfs_match_their_closed_forms():
    assert Uniform(2.0, 4.0).value(0.0) == 2.0
    assert Uniform(2.0, 4.0).value(0.25) == 2.5
    assert Uniform(2.0, 4.0).value(1.0) == 4.0
    lu = LogUniform(1e-4, 1.0)
    assert lu.value(0.5) == pytest.approx(1e-2, rel=1e-12)  # the geometric midpoint
    assert lu.value(0.25) == pytest.approx(1e-3, rel=1e-12)
    assert 1e-4 <= lu.value(0.0) <= 1e-4 * (1 + 1e-15) and lu.value(1.0) == 1.0
    r = IntRange(5, 20)  # 16 integers, each on an interval of u of width 1/16
    assert [r.value(k / 16) for k in range(16)] == list(range(5, 21))
    assert r.value(1 / 16 - 1e-12) == 5 and r.value(1 - 1e-16) == 20
    g = IntRange(1, 8, log=True)  # k on [ln k / ln 9, ln(k+1) / ln 9)
    for k in range(1, 9):
        lo, hi = math.log(k) / math.log(9), math.log(k + 1) / math.log(9)
        assert g.value(lo + 1e-9) == k and g.value(hi - 1e-9) == k
    assert g.value(1.0) == 8  # clipped: u = 1 is never drawn, but rounding stays inside
    c = Choice(("a", "b", "c"))
    assert [c.value(u) for u in (0.0, 0.33, 0.34, 0.66, 0.67, 0.999, 1.0)] == list("aabbccc")


@pytest.mark.parametrize("kind", ["random", "sobol"])
@pytest.mark.parametrize(
    "dist",
    [Uniform(-3.0, 5.0), LogUniform(1e-6, 1e2), IntRange(5, 20), IntRange(3, 1000, log=True)],
    ids=repr,
)
def test_every_draw_lies_within_the_bounds(dist, kind):
    xs = values(dist, n=4096, kind=kind)
    assert all(dist.a <= x <= dist.b for x in xs)
    want = int if isinstance(dist, IntRange) else float
    assert {type(x) for x in xs} == {want}  # Python numbers, not numpy scalars


# --- the laws ---------------------------------------------------------------------------------


def test_uniform_draws_pass_a_ks_test():
    xs = values(Uniform(-3.0, 5.0), n=4000, seed=1)
    assert stats.kstest(xs, stats.uniform(loc=-3, scale=8).cdf).pvalue > 1e-3


def test_loguniform_draws_are_uniform_in_log_space():
    a, b = 1e-5, 1e-1
    logs = np.log(values(LogUniform(a, b), n=4000, seed=2))
    span = math.log(b) - math.log(a)
    assert stats.kstest(logs, stats.uniform(loc=math.log(a), scale=span).cdf).pvalue > 1e-3
    # The mean of ln x is the midpoint, within 4 standard errors (sd of a uniform: span/√12).
    se = span / math.sqrt(12) / math.sqrt(len(logs))
    assert abs(logs.mean() - (math.log(a) + math.log(b)) / 2) < 4 * se
    # Not uniform in x: a linear KS test rejects it outright.
    assert stats.kstest(np.exp(logs), stats.uniform(loc=a, scale=b - a).cdf).pvalue < 1e-10


def test_int_reaches_both_endpoints_with_equal_frequencies():
    xs = values(IntRange(3, 7), n=5000, seed=3)
    counts = np.bincount(xs, minlength=8)[3:]
    assert set(xs) == {3, 4, 5, 6, 7} and counts.sum() == 5000
    assert stats.chisquare(counts).pvalue > 1e-3
    assert set(values(IntRange(0, 1), n=100, seed=4)) == {0, 1}


def test_log_int_has_the_log_spaced_masses():
    xs = values(IntRange(1, 8, log=True), n=8000, seed=5)
    counts = np.bincount(xs, minlength=9)[1:]
    assert counts.min() > 0  # 1 and 8 both reached
    masses = np.array([math.log((k + 1) / k) for k in range(1, 9)]) / math.log(9)
    assert stats.chisquare(counts, f_exp=masses * len(xs)).pvalue > 1e-3


def test_choice_reaches_every_value_equally():
    xs = values(Choice(("relu", "tanh", "sin")), n=3000, seed=6)
    counts = [xs.count(v) for v in ("relu", "tanh", "sin")]
    assert min(counts) > 0 and stats.chisquare(counts).pvalue > 1e-3


# --- Sobol ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 12345])
def test_sobol_points_put_one_point_in_each_of_n_intervals(seed):
    # Scrambled Sobol: the first 2^m points are a (0, m, 1)-net in every coordinate.
    u = unit_points(Search(kind="sobol", n=16, seed=seed), 1)[:, 0]
    assert sorted(np.floor(u * 16).astype(int)) == list(range(16))
    u3 = unit_points(Search(kind="sobol", n=32, seed=seed), 3)
    for j in range(3):
        assert sorted(np.floor(u3[:, j] * 32).astype(int)) == list(range(32))
    # Random points are not balanced: some interval holds two (seed-fixed, a certainty here).
    r = unit_points(Search(kind="random", n=16, seed=seed), 1)[:, 0]
    assert len(set(np.floor(r * 16).astype(int))) < 16


def test_a_sobol_lr_search_covers_each_decade_slice_once_per_depth():
    spec = spec_with(
        {"depth": [5, 20], "lr": {"loguniform": [1e-4, 1e-0]}, "epochs": 1},
        {"kind": "sobol", "n": 16, "seed": 3},
    )
    trials = expand(spec)
    assert len(trials) == spec.n_trials == 2 * 16
    for depth in (5, 20):
        lrs = [t.lr for t in trials if t.depth == depth]
        slots = sorted(math.floor((math.log10(lr) + 4) / 4 * 16) for lr in lrs)
        assert slots == list(range(16))  # sixteen quarter-decades, one lr in each
    int_spec = spec_with({"depth": {"int": [1, 16]}, "epochs": 0}, {"kind": "sobol", "n": 16})
    assert sorted(t.depth for t in expand(int_spec)) == list(range(1, 17))  # each exactly once


# --- reproducibility and the trial list -------------------------------------------------------


def configs_text(spec):
    return [json.dumps(t.to_dict(), sort_keys=True) for t in expand(spec)]


def test_the_same_spec_and_seed_give_byte_identical_trials():
    a, b = parse_spec(LR_SEARCH), parse_spec(LR_SEARCH)
    assert configs_text(a) == configs_text(b)
    # Key order does not matter (coordinates go to parameters alphabetically), nor the format.
    shuffled = {
        "search": {"seed": 7, "n": 8, "kind": "random"},
        "seeds": 2,
        "parameters": {"epochs": 3, "lr": {"loguniform": [1e-4, 0.1]}, "depth": [5, 20]},
        "name": "lr-search",
    }
    assert configs_text(parse_spec(json.dumps(shuffled))) == configs_text(a)
    # Nor storing and reading the spec back (as the store keeps it).
    stored = json.loads(json.dumps(a.model_dump(mode="json")))
    assert configs_text(parse_spec(stored)) == configs_text(a)


def test_another_seed_or_kind_gives_other_trials():
    base = parse_spec(LR_SEARCH)
    other = parse_spec(LR_SEARCH.replace("seed: 7", "seed: 8"))
    sobol = parse_spec(LR_SEARCH.replace("kind: random", "kind: sobol"))
    lrs = [{t.lr for t in expand(s)} for s in (base, other, sobol)]
    assert all(len(x) == 8 for x in lrs)
    assert not lrs[0] & lrs[1] and not lrs[0] & lrs[2]


def test_sampled_floats_keep_full_precision_through_json():
    trials = expand(parse_spec(LR_SEARCH))
    for t in trials:
        assert type(t.lr) is float
        back = TrialConfig(**json.loads(json.dumps(t.to_dict())))
        assert back.lr == t.lr and config_hash(back) == config_hash(t)
    assert any(len(repr(t.lr)) > 12 for t in trials)  # not rounded to a few digits


def test_points_are_crossed_with_the_grid_and_the_seeds():
    spec = parse_spec(LR_SEARCH)
    trials = expand(spec)
    assert spec.n_trials == len(trials) == 2 * 8 * 2  # grid cells × n × seeds
    lrs = list(dict.fromkeys(t.lr for t in trials))
    expected = [(d, lr, s) for d in (5, 20) for lr in lrs for s in (0, 1)]
    assert [(t.depth, t.lr, t.seed) for t in trials] == expected  # the same 8 lrs per depth
    assert {t.epochs for t in trials} == {3}
    assert swept_fields(spec) == ["depth", "lr", "seed"]
    assert swept_fields_of(spec.model_dump(mode="json")) == ["depth", "lr", "seed"]
    assert spec.axes == {"depth": [5, 20]} and spec.fixed == {"epochs": 3}
    assert spec.sampled == {"lr": LogUniform(1e-4, 0.1)}


def test_several_distributions_and_a_choice_that_repeats_points():
    spec = spec_with(
        {
            "init_gain": {"uniform": [0.5, 2]},
            "width": {"int": [8, 64], "log": True},
            "activation": {"choice": ["tanh", "relu"]},
            "norm": ["batch", "layer"],
            "epochs": 0,
        },
        {"kind": "random", "n": 50, "seed": 0},
        seeds=[3, 9],
    )
    trials = expand(spec)
    assert spec.n_trials == len(trials) == 2 * 50 * 2
    assert {t.activation for t in trials} == {"tanh", "relu"}
    assert all(0.5 <= t.init_gain <= 2 and 8 <= t.width <= 64 for t in trials)
    assert spec.parameters["init_gain"] == {"uniform": [0.5, 2.0]}  # normalized
    assert spec.parameters["width"] == {"int": [8, 64], "log": True}
    # A search over a choice alone draws values with repeats: equal configs are dropped.
    few = spec_with(
        {"activation": {"choice": ["tanh", "relu"]}, "epochs": 0}, {"kind": "random", "n": 8}
    )
    assert few.n_trials == 8 and sorted(t.activation for t in expand(few)) == ["relu", "tanh"]


# --- errors and limits ------------------------------------------------------------------------

SEARCH = {"kind": "random", "n": 4}
LOG_LR = {"loguniform": [1e-4, 1e-1]}


@pytest.mark.parametrize(
    ("parameters", "search", "field", "says"),
    [
        ({"lr": LOG_LR}, None, "parameters.lr", "add `search: {kind: random, n: …}`"),
        ({"lr": [0.1, 0.01]}, SEARCH, "search", "no parameter is one"),
        ({"lr": {"uniform": [-1, 1]}}, SEARCH, "parameters.lr.uniform[0]", "greater than 0"),
        ({"lr": {"loguniform": [0.1, 0.01]}}, SEARCH, "parameters.lr.loguniform", "a < b"),
        ({"lr": {"uniform": [0.1, 0.1]}}, SEARCH, "parameters.lr.uniform", "a < b"),
        (
            {"gain_exponent": {"loguniform": [0, 1]}},
            SEARCH,
            "parameters.gain_exponent.loguniform",
            "a > 0",
        ),
        (
            {"momentum": {"uniform": [0, 1]}},
            SEARCH,
            "parameters.momentum.uniform[1]",
            "less than 1",
        ),
        ({"lr": {"uniform": [0.1, math.inf]}}, SEARCH, "parameters.lr.uniform[1]", "finite"),
        ({"lr": {"uniform": [0.1]}}, SEARCH, "parameters.lr.uniform", "two numbers"),
        ({"lr": {"uniform": [True, 1]}}, SEARCH, "parameters.lr.uniform", "two numbers"),
        ({"depth": {"uniform": [5, 20]}}, SEARCH, "parameters.depth.uniform[0]", "{int: [a, b]}"),
        ({"depth": {"int": [5, 20.5]}}, SEARCH, "parameters.depth.int", "two integers"),
        (
            {"depth": {"int": [0, 20]}},
            SEARCH,
            "parameters.depth.int[0]",
            "greater than or equal to 1",
        ),
        ({"depth": {"int": [20, 5]}}, SEARCH, "parameters.depth.int", "a < b"),
        ({"width": {"int": [0, 4]}}, SEARCH, "parameters.width.int[0]", "greater than or equal"),
        ({"epochs": {"int": [0, 4], "log": True}}, SEARCH, "parameters.epochs.int", "a ≥ 1"),
        ({"depth": {"int": [1, 4], "log": "yes"}}, SEARCH, "parameters.depth.log", "true or false"),
        ({"depth": {"int": [1, 4], "step": 2}}, SEARCH, "parameters.depth.step", "unknown key"),
        (
            {"lr": {"loguniform": [1e-3, 1], "log": True}},
            SEARCH,
            "parameters.lr.log",
            "unknown key",
        ),
        ({"lr": {"normal": [0, 1]}}, SEARCH, "parameters.lr", "{loguniform: [a, b]}"),
        ({"activation": {"choice": []}}, SEARCH, "parameters.activation.choice", "non-empty"),
        (
            {"activation": {"choice": ["relu", "reluu"]}},
            SEARCH,
            "parameters.activation.choice[1]",
            "tanh",
        ),
        (
            {"activation": {"choice": ["relu", "relu"]}},
            SEARCH,
            "parameters.activation.choice",
            "repeat",
        ),
        ({"seed": {"int": [0, 9]}}, SEARCH, "parameters.seed", "seeds"),
        ({"lr": LOG_LR}, {"kind": "sobol", "n": 10}, "search.n", "power of 2"),
        ({"lr": LOG_LR}, {"kind": "grid", "n": 4}, "search.kind", "'random' or 'sobol'"),
        ({"lr": LOG_LR}, {"kind": "random", "n": 0}, "search.n", "greater than or equal to 1"),
        ({"lr": LOG_LR}, {"kind": "random"}, "search.n", "required"),
        ({"lr": LOG_LR}, {"kind": "random", "n": 4, "seed": -1}, "search.seed", "greater than"),
        ({"lr": LOG_LR}, {"kind": "random", "n": 4, "sed": 1}, "search.sed", "unknown field"),
    ],
)
def test_bad_distributions_and_searches_name_the_field(parameters, search, field, says):
    with pytest.raises(InvalidInput) as exc:
        spec_with(parameters, search)
    assert exc.value.field == field
    assert says in exc.value.message
    assert not isinstance(exc.value, LimitExceeded)


def test_a_dict_for_model_params_is_its_value_never_a_distribution():
    """model_params is a document: {int: [1, 2]} is a registered model's parameter `int`, so a
    search has nothing to sample, and without one the built-in MLP refuses model_params."""
    with pytest.raises(InvalidInput) as exc:
        spec_with({"model_params": {"int": [1, 2]}}, SEARCH)
    assert exc.value.field == "search"
    with pytest.raises(InvalidInput) as exc:
        spec_with({"model_params": {"int": [1, 2]}}, None)
    assert "takes no model_params" in exc.value.message


def test_the_trial_limit_counts_the_sampled_points():
    settings = Settings(max_trials_per_sweep=40)
    data = {"name": "s", "parameters": {"depth": [5, 20], "lr": LOG_LR}, "seeds": 2}
    ok = parse_spec({**data, "search": {"kind": "random", "n": 10}}, settings=settings)
    assert len(expand(ok)) == 40
    with pytest.raises(LimitExceeded) as exc:
        parse_spec({**data, "search": {"kind": "random", "n": 11}}, settings=settings)
    assert exc.value.field == "parameters"
    assert "44 trials (2 depth × 11 sampled points × 2 seeds)" in exc.value.message
    assert "ISOSWEEP_MAX_TRIALS_PER_SWEEP" in exc.value.message


def test_field_limits_apply_to_a_distributions_upper_bound():
    settings = Settings(max_depth=100)
    parse_spec(
        {"name": "s", "parameters": {"depth": {"int": [5, 100]}}, "search": SEARCH},
        settings=settings,
    )
    for depth in ({"int": [5, 101]}, {"choice": [5, 101]}):
        with pytest.raises(LimitExceeded) as exc:
            parse_spec(
                {"name": "s", "parameters": {"depth": depth}, "search": SEARCH}, settings=settings
            )
        assert exc.value.field == "parameters.depth" and "ISOSWEEP_MAX_DEPTH" in exc.value.message


def test_a_sampled_combination_that_no_trial_allows_names_the_trial():
    # Each value is valid alone; heads must divide width for a transformer.
    with pytest.raises(InvalidInput) as exc:
        spec_with(
            {"model": "transformer", "width": 64, "heads": {"choice": [3, 4]}, "epochs": 0},
            {"kind": "sobol", "n": 8},
        )
    assert exc.value.field == "parameters" and "heads=3" in exc.value.message


# --- over HTTP --------------------------------------------------------------------------------


def test_a_search_submitted_over_http_stores_the_expanded_trials(sqlite_url):
    from api.app import create_app  # the API's import is heavy: this test alone pays for it
    from api.server import ServerThread

    settings = Settings(database_url=sqlite_url)
    store = Store(sqlite_url, settings=settings)
    try:
        with (
            ServerThread(create_app(settings, store=store)) as server,
            httpx.Client(base_url=f"{server.url}/api/v1", timeout=60) as client,
        ):
            r = client.post(
                "/sweeps", content=LR_SEARCH, headers={"Content-Type": "application/yaml"}
            )
            assert r.status_code == 201, r.text
            sweep = r.json()
            assert sweep["n_trials"] == 32
            assert sweep["spec"]["search"] == {"kind": "random", "n": 8, "seed": 7}
            assert sweep["spec"]["parameters"]["lr"] == {"loguniform": [1e-4, 0.1]}
            page = client.get(f"/sweeps/{sweep['id']}/trials", params={"limit": 100})
            stored = [t["config"] for t in page.json()["data"]]
            bad = client.post("/sweeps", json={"name": "x", "parameters": {"lr": LOG_LR}})
    finally:
        store.close()
    expected = [t.to_dict() for t in expand(parse_spec(LR_SEARCH))]
    key = lambda c: json.dumps(c, sort_keys=True)  # noqa: E731
    assert sorted(map(key, stored)) == sorted(map(key, expected))  # floats exactly equal
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "parameters.lr"


def test_the_schema_describes_the_forms_a_spec_accepts():
    jsonschema = pytest.importorskip("jsonschema")
    from service.sampling import distribution_schema

    schema = distribution_schema({"type": "string"})
    for form in (
        {"uniform": [0.5, 2]},
        {"loguniform": [1e-4, 1e-1]},
        {"int": [5, 20]},
        {"int": [1, 64], "log": True},
        {"choice": ["relu", "tanh"]},
    ):
        jsonschema.validate(form, schema)
    for bad in ({"uniform": [1]}, {"int": [1, 2], "step": 1}, {"choice": []}, {"normal": [0, 1]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
