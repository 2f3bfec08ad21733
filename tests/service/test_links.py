"""Derived fields ({expr: …}, service.expressions) and linked axes (parameters.zip): expansion
counts, values, and one clear 422-class error for each way an expression can be wrong."""

from __future__ import annotations

import math

import pytest

from service.errors import InvalidInput, LimitExceeded
from service.expressions import evaluation_order, parse_expression
from service.search.tpe import cells, study_seed
from service.spec import expand, parse_spec, swept_fields, swept_fields_of


def spec(parameters: dict, **top) -> dict:
    # one epoch: at epochs 0 the training fields (lr, momentum, …) are reset, having no effect
    return {"name": "links", "parameters": {"epochs": 1, **parameters}, **top}


def refused(parameters: dict, **top) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        parse_spec(spec(parameters, **top))
    return info.value


def test_zip_times_grid_times_seeds():
    s = parse_spec(
        spec(
            {
                "depth": [2, 4, 8],
                "zip": [{"width": 16, "batch_size": 16}, {"width": 32, "batch_size": 32}],
                "activation": ["relu", "tanh"],
            },
            seeds=3,
        )
    )
    trials = expand(s)
    assert s.n_trials == len(trials) == 3 * 2 * 2 * 3
    assert {(t.width, t.batch_size) for t in trials} == {(16, 16), (32, 32)}  # never crossed
    # the seeds innermost, the linked axis after the axes, as written
    assert [(t.depth, t.activation, t.width, t.seed) for t in trials[:7]] == [
        (2, "relu", 16, 0),
        (2, "relu", 16, 1),
        (2, "relu", 16, 2),
        (2, "relu", 32, 0),
        (2, "relu", 32, 1),
        (2, "relu", 32, 2),
        (2, "tanh", 16, 0),
    ]
    assert swept_fields(s) == ["depth", "width", "batch_size", "activation", "seed"]


def test_several_linked_axes_are_each_an_axis_of_the_grid():
    groups = [
        [{"width": 16, "batch_size": 16}, {"width": 32, "batch_size": 32}],
        [
            {"lr": 0.1, "momentum": 0.0},
            {"lr": 0.01, "momentum": 0.9},
            {"lr": 0.001, "momentum": 0.5},
        ],
    ]
    s = parse_spec(spec({"zip": groups, "depth": [3, 5]}, seeds=2))
    trials = expand(s)
    assert len(trials) == s.n_trials == 2 * 2 * 3 * 2
    assert {(t.lr, t.momentum) for t in trials} == {(0.1, 0.0), (0.01, 0.9), (0.001, 0.5)}
    assert len({(t.depth, t.width, t.lr, t.seed) for t in trials}) == len(trials)


def test_derived_values_follow_the_fields_they_read():
    s = parse_spec(
        spec(
            {
                "model": "resmlp",
                "depth": [4, 16, 64],
                "residual_scale": {"expr": "1/sqrt(depth)"},
                "width": {"expr": "2*batch_size"},  # an int from ints
                "batch_size": [8, 12],
                "lr": {"expr": "min(0.1, 1/width)"},
            },
        )
    )
    trials = expand(s)
    assert len(trials) == 6
    for t in trials:
        assert t.residual_scale == 1 / math.sqrt(t.depth)
        assert t.width == 2 * t.batch_size and isinstance(t.width, int)
        assert t.lr == min(0.1, 1 / t.width)
    assert swept_fields(s) == ["depth", "residual_scale", "width", "batch_size", "lr", "seed"]
    # the stored spec gives the same swept fields without validation
    assert swept_fields_of(s.model_dump(mode="json")) == swept_fields(s)


def test_a_derived_field_of_fixed_fields_is_fixed_and_integral_floats_fit_int_fields():
    s = parse_spec(spec({"depth": [2, 3], "width": {"expr": "sqrt(64)"}}))
    assert {t.width for t in expand(s)} == {8}
    assert swept_fields(s) == ["depth", "seed"]  # constant: not a swept field


def test_derived_fields_that_read_derived_fields_are_ordered():
    s = parse_spec(
        spec({"batch_size": [16], "width": {"expr": "batch_size"}, "lr": {"expr": "1/width"}})
    )
    assert [(t.width, t.lr) for t in expand(s)] == [(16, 1 / 16)]


@pytest.mark.parametrize(
    ("parameters", "field", "words"),
    [
        (
            {"residual_scale": {"expr": "1/sqrt(dept)"}},
            "parameters.residual_scale",
            "did you mean 'depth'",
        ),
        ({"residual_scale": {"expr": "1/"}}, "parameters.residual_scale", "not an expression"),
        ({"residual_scale": {"expr": ""}}, "parameters.residual_scale", "non-empty string"),
        ({"residual_scale": {"expr": 3}}, "parameters.residual_scale", "non-empty string"),
        ({"residual_scale": {"expr": "x" * 201}}, "parameters.residual_scale", "at most 200"),
        (
            {"residual_scale": {"expr": "__import__('os').system('true')"}},
            "parameters.residual_scale",
            "allowed:",
        ),
        ({"residual_scale": {"expr": "depth.real"}}, "parameters.residual_scale", "attribute"),
        (
            {"residual_scale": {"expr": "depth if depth else 1"}},
            "parameters.residual_scale",
            "allowed:",
        ),
        ({"residual_scale": {"expr": "'a'"}}, "parameters.residual_scale", "not a number"),
        ({"residual_scale": {"expr": "sqrt(depth, 2)"}}, "parameters.residual_scale", "takes 1"),
        (
            {"residual_scale": {"expr": "residual_scale*2"}},
            "parameters.residual_scale",
            "reads itself",
        ),
        (
            {"width": {"expr": "batch_size"}, "batch_size": {"expr": "width + 0"}},
            "parameters.width",
            "cycle: width → batch_size → width",
        ),
        (
            {"depth": [4, 8], "residual_scale": {"expr": "1/(depth-4)"}},
            "parameters.residual_scale",
            "depth=4",
        ),
        (
            {"residual_scale": {"expr": "log(depth - depth)"}},
            "parameters.residual_scale",
            "log(0) is not defined",
        ),
        ({"width": {"expr": "9**9**9"}}, "parameters.width", "exponent"),
        ({"lr": {"expr": "(-1)**0.5"}}, "parameters.lr", "complex"),
        ({"width": {"expr": "depth/3"}, "depth": 4}, "parameters.width", "round("),
        ({"width": {"expr": "0 - depth"}}, "parameters.width", "greater than"),
        (
            {"residual_scale": {"expr": "activation"}, "activation": "relu"},
            "parameters.residual_scale",
            "'relu', not a number",
        ),
    ],
)
def test_each_expression_error_names_the_expression_and_field(parameters, field, words):
    err = refused({"model": "resmlp", **parameters})
    assert err.field == field
    assert words in err.message, err.message


@pytest.mark.parametrize(
    ("parameters", "field", "words"),
    [
        ({"zip": []}, "parameters.zip", "list of points"),
        ({"zip": {"width": 3}}, "parameters.zip", "list of points"),
        ({"zip": [{"width": 16}, {"depth": 3}]}, "parameters.zip[1]", "same fields"),
        ({"zip": [{"width": 16}, {"width": 16}]}, "parameters.zip", "repeat"),
        ({"zip": [{"width": 16}], "width": [8, 16]}, "parameters.zip", "set twice"),
        ({"zip": [[{"width": 16}], [{"width": 8}]]}, "parameters.zip", "set twice"),
        ({"zip": [{"widht": 16}]}, "parameters.zip[0].widht", "unknown field"),
        ({"zip": [{"seed": 1}]}, "parameters.zip[0].seed", "unknown field"),
        ({"zip": [{"width": [16, 32]}]}, "parameters.zip[0].width", "one value per point"),
        ({"zip": [{"width": -1}]}, "parameters.zip[0].width", "greater than"),
        ({"zip": [[{"width": 16}], []]}, "parameters.zip[1]", "at least one point"),
    ],
)
def test_each_linked_axis_error_names_the_point(parameters, field, words):
    err = refused(parameters)
    assert err.field == field, err.message
    assert words in err.message, err.message


def test_limits_hold_for_linked_and_derived_fields():
    with pytest.raises(LimitExceeded) as info:
        parse_spec(spec({"zip": [{"depth": 4}, {"depth": 10**6}]}))
    assert info.value.field == "parameters.depth"
    with pytest.raises(LimitExceeded) as info:
        parse_spec(spec({"depth": [4, 8], "width": {"expr": "depth * 10**6"}}))
    assert info.value.field == "parameters.width"
    with pytest.raises(LimitExceeded):  # the trial count counts the linked axes
        parse_spec(
            spec({"zip": [{"width": w} for w in range(1, 1001)], "depth": list(range(1, 201))})
        )


def test_early_stop_rungs_are_checked_against_derived_epochs():
    body = spec(
        {"depth": [2, 4], "epochs": {"expr": "depth"}, "lr": [0.1, 0.01]},
        early_stop={"kind": "successive_halving", "metric": "train_loss", "grace_epochs": 3},
    )
    with pytest.raises(InvalidInput) as info:
        parse_spec(body)
    assert info.value.field == "early_stop.grace_epochs"


def test_tpe_cells_include_linked_axes_and_studies_seed_apart():
    body = spec(
        {
            "zip": [{"width": 16, "batch_size": 16}, {"width": 32, "batch_size": 32}],
            "lr": {"loguniform": [1e-4, 1e-1]},
            "weight_decay": {"expr": "lr / 10"},
        },
        seeds=2,
        search={"kind": "tpe", "n": 4, "objective": "train_loss", "seed": 7},
    )
    s = parse_spec(body)
    keys = [k for k, _ in cells(s)]
    assert len(keys) == 4 and len(set(keys)) == 4
    assert len({study_seed(7, k) for k in keys}) == 4  # different start-up points per study
    assert study_seed(7, keys[0]) == study_seed(7, keys[0])  # and the same on a resume


def test_tpe_studies_of_different_cells_ask_different_start_up_points():
    """Four studies of one sweep (2 cells × 2 seeds): their random start-up asks differ (they
    were equal when every study seeded its sampler from search.seed alone)."""
    from service.search.tpe import Studies

    body = spec(
        {
            "zip": [{"width": 16}, {"width": 32}],
            "lr": {"loguniform": [1e-4, 1e-1]},
            "weight_decay": {"expr": "lr/10"},
        },
        seeds=2,
        search={"kind": "tpe", "n": 3, "objective": "train_loss", "seed": 0},
    )
    s = parse_spec(body)
    studies = Studies.rebuild(s, [], {})
    firsts: dict[str, list[float]] = {}
    for _ in range(8):
        asked = studies.ask()
        assert asked is not None
        assert asked.config.weight_decay == pytest.approx(asked.config.lr / 10, rel=1e-15)
        firsts.setdefault(asked.cell, []).append(asked.config.lr)
    assert len(firsts) == 4
    assert len({tuple(v) for v in firsts.values()}) == 4
    # a rebuilt search asks the same first points
    again = Studies.rebuild(s, [], {})
    assert again.ask().config.lr == firsts[next(iter(firsts))][0]


def test_the_evaluator_is_python_arithmetic_on_the_parsed_tree():
    e = parse_expression("2**-1 + round(2.5) - abs(-3) * max(1, 2, 3) / exp(0)", where="x")
    assert e.evaluate({}, where="x") == 0.5 + 2 - 9.0
    assert e.names == frozenset()
    e = parse_expression("-width + +depth", where="x")
    assert e.names == {"width", "depth"}
    assert e.evaluate({"width": 3, "depth": 5}, where="x") == 2
    assert evaluation_order(
        {"a": parse_expression("b", where=""), "b": parse_expression("1", where="")}, where="p"
    ) == ["b", "a"]


def test_swept_values_list_what_each_swept_field_takes():
    from service.spec import swept_values

    s = parse_spec(
        spec(
            {
                "model": "resmlp",
                "depth": [4, 16],
                "residual_scale": {"expr": "1/sqrt(depth)"},
                "zip": [{"width": 8, "batch_size": 8}, {"width": 16, "batch_size": 16}],
                "lr": {"loguniform": [1e-3, 1e-1]},
            },
            seeds=2,
            search={"kind": "random", "n": 2, "seed": 1},
        )
    )
    assert swept_values(s) == {
        "depth": [4, 16],
        "residual_scale": [0.5, 0.25],
        "width": [8, 16],
        "batch_size": [8, 16],
        "lr": None,  # drawn
        "seed": [0, 1],
    }
