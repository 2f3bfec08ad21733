"""TPE search through Optuna's ask/tell (service/search/tpe.py), without training: a cheap
synthetic objective, TPE against random search, and a study rebuilt from "stored" trials."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from service import sampling
from service.errors import InvalidInput
from service.search.tpe import Studies, cells, objective_value
from service.spec import expand, parse_spec

pytest.importorskip("optuna")

K = 40  # trials per search
SEEDS = range(10)


def spec_of(kind: str, seed: int, n: int = K, **extra):
    search = {"kind": kind, "n": n, "seed": seed}
    if kind == "tpe":
        search |= {"objective": "test_loss", "mode": "min"}
    return parse_spec(
        {
            "name": "synthetic",
            "parameters": {
                "lr": {"loguniform": [1e-5, 1.0]},
                "momentum": {"uniform": [0.0, 0.99]},
                "epochs": 1,
                **extra,
            },
            "search": search,
        }
    )


def f(config) -> float:
    """A bowl in (log10 lr, momentum) with its minimum 0 at lr = 1e-2, momentum = 0.3."""
    return (math.log10(config["lr"]) + 2.0) ** 2 + 4.0 * (config["momentum"] - 0.3) ** 2


def run_tpe(spec, objective=f):
    studies = Studies.rebuild(spec, [], {})
    values, tid = [], 0
    while (asked := studies.ask()) is not None:
        tid += 1
        studies.bind(asked, tid)
        v = objective(asked.config.to_dict())
        studies.tell(tid, "completed", v)
        values.append(v)
    return values


def test_tpe_beats_random_on_average():
    best_tpe, best_random = [], []
    for seed in SEEDS:
        best_tpe.append(min(run_tpe(spec_of("tpe", seed))))
        best_random.append(min(f(c.to_dict()) for c in expand(spec_of("random", seed))))
    tpe, rnd = float(np.mean(best_tpe)), float(np.mean(best_random))
    print(f"mean best after {K} trials over {len(SEEDS)} seeds: tpe {tpe:.4f}, random {rnd:.4f}")
    # measured: tpe 0.0070, random 0.0415 (wins 9 of 10 seeds)
    assert tpe < 0.5 * rnd
    # and not by luck of one seed: TPE wins on most seeds
    assert sum(a < b for a, b in zip(best_tpe, best_random, strict=True)) >= 8


def test_same_seed_same_asks():
    assert run_tpe(spec_of("tpe", 3, n=15)) == run_tpe(spec_of("tpe", 3, n=15))
    assert run_tpe(spec_of("tpe", 3, n=15)) != run_tpe(spec_of("tpe", 4, n=15))


def stored(tid, index, config, status):
    return SimpleNamespace(id=tid, index=index, config=config, status=status)


def test_rebuilt_study_asks_what_the_uninterrupted_one_asks():
    """Kill after 14 asks (12 told, 2 running), rebuild from the stored trials, tell the two
    when they finish: the asks that follow equal the uninterrupted search's."""
    spec = spec_of("tpe", 1, n=20)
    whole = Studies.rebuild(spec, [], {})
    configs = []
    for tid in range(1, 21):
        a = whole.ask()
        whole.bind(a, tid)
        configs.append(a.config.to_dict())
        if tid > 2:
            whole.tell(tid - 2, "completed", f(configs[tid - 3]))  # two in flight
    # the state at the 14th ask: 1..12 told, 13 and 14 running
    trials = [stored(i + 1, i, configs[i], "completed" if i < 12 else "running") for i in range(14)]
    values = {i + 1: f(configs[i]) for i in range(12)}
    again = Studies.rebuild(spec, trials, values)
    assert again.owed() == 6 and again.outstanding == 2
    assert len(again.studies[next(iter(again.studies))].study.trials) == 14
    # an uninterrupted replay to the same point
    replay = Studies.rebuild(spec, [], {})
    for tid in range(1, 15):
        a = replay.ask()
        replay.bind(a, tid)
        if tid > 2:
            replay.tell(tid - 2, "completed", f(configs[tid - 3]))
    for tid in range(15, 21):
        for s in (again, replay):
            s.tell(tid - 2, "completed", f(configs[tid - 3]))
        a, b = again.ask(), replay.ask()
        assert a.config == b.config
        again.bind(a, tid)
        replay.bind(b, tid)
    assert again.ask() is None and again.owed() == 0


def test_failures_and_stops_are_not_scores():
    spec = spec_of("tpe", 0, n=3)
    trials = [stored(1, 0, {"lr": 0.01, "momentum": 0.3, "seed": 0}, s) for s in ["diverged"]]
    trials += [stored(2, 1, {"lr": 0.02, "momentum": 0.3, "seed": 0}, "stopped")]
    trials += [stored(3, 2, {"lr": 0.03, "momentum": 0.3, "seed": 0}, "completed")]
    s = Studies.rebuild(spec, trials, {1: -100.0, 3: 0.5})
    (study,) = s.studies.values()
    states = [t.state.name for t in study.study.trials]
    assert states == ["FAIL", "PRUNED", "COMPLETE"]
    assert s.best()[0][1] == 0.5
    assert s.owed() == 0


def test_one_study_per_grid_cell_and_seed():
    spec = parse_spec(
        {
            "name": "cells",
            "parameters": {"lr": {"loguniform": [1e-4, 1e-1]}, "depth": [2, 4], "epochs": 1},
            "seeds": 2,
            "search": {"kind": "tpe", "n": 3, "objective": "test_loss"},
        }
    )
    assert spec.n_trials == 12 and expand(spec) == []
    assert len(cells(spec)) == 4
    configs = []
    s = Studies.rebuild(spec, [], {})
    while (a := s.ask()) is not None:
        s.bind(a, len(configs) + 1)
        configs.append(a.config)
        s.tell(len(configs), "completed", 1.0)
    assert len(configs) == 12
    assert sorted((c.depth, c.seed) for c in configs) == sorted(
        [(d, sd) for d in (2, 4) for sd in (0, 1)] * 3
    )
    assert all(1e-4 <= c.lr <= 1e-1 for c in configs)


def test_objective_value_epochs():
    search = spec_of("tpe", 0).search
    ep, v = np.array([0, 1, 2, 3]), np.array([4.0, 3.0, 2.0, 1.0])
    assert objective_value(ep, v, search) == 1.0
    assert objective_value(ep, v, search.model_copy(update={"epoch": 2})) == 2.0
    assert objective_value(np.array([]), np.array([]), search) is None


@pytest.mark.parametrize(
    ("search", "field"),
    [
        ({"kind": "tpe", "n": 3, "objective": "nope"}, "search.objective"),
        ({"kind": "tpe", "n": 3, "objective": "rms"}, "search.layer"),
        ({"kind": "tpe", "n": 3, "objective": "test_loss", "epoch": 9}, "search.epoch"),
        ({"kind": "tpe", "n": 0, "objective": "test_loss"}, "search.n"),
    ],
)
def test_bad_tpe_specs_name_the_field(search, field):
    with pytest.raises(InvalidInput) as e:
        parse_spec(
            {
                "name": "x",
                "parameters": {"lr": {"loguniform": [1e-3, 1]}, "epochs": 2},
                "search": search,
            }
        )
    assert e.value.field == field


def test_distributions_map_to_optuna():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from service.search.tpe import optuna_distribution

    assert optuna_distribution(sampling.LogUniform(1e-3, 1.0)) == FloatDistribution(
        1e-3, 1.0, log=True
    )
    assert optuna_distribution(sampling.Uniform(0, 1)) == FloatDistribution(0, 1)
    assert optuna_distribution(sampling.IntRange(1, 8, log=True)) == IntDistribution(1, 8, log=True)
    assert optuna_distribution(sampling.Choice(("relu", "tanh"))) == CategoricalDistribution(
        ["relu", "tanh"]
    )
