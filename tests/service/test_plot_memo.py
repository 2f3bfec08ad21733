"""service.plots.memo: a figure drawn from the same frame with the same arguments is drawn
once; any difference in a cell, a column, the row order or an argument draws anew; errors and
unhashable frames are never kept; the memo stays within its bytes."""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
import pytest

from service.errors import InvalidInput
from service.plots import memo, render


def frame() -> pd.DataFrame:
    rows = []
    for trial, (init, depth) in enumerate(
        [("gaussian", 2), ("gaussian", 4), ("orthogonal", 2), ("orthogonal", 4)], start=1
    ):
        for layer in range(1, depth + 1):
            rows.append(dict(trial_id=trial, sweep_id=1, epoch=0, layer=layer,
                             metric="grad_norm", value=float(trial * layer), depth=depth,
                             init=init, seed=0))  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture(autouse=True)
def empty_memo():
    memo.clear()
    yield
    memo.clear()


def counted(monkeypatch) -> list[str]:
    """The kinds actually drawn from now on (memo.drawn's misses call the drawing)."""
    import service.plots as plots

    drawn: list[str] = []
    real = plots._draw

    def spy(kind, *a):
        drawn.append(kind)
        return real(kind, *a)

    monkeypatch.setattr(plots, "_draw", spy)
    return drawn


def test_the_same_frame_and_arguments_draw_once(monkeypatch):
    drawn = counted(monkeypatch)
    first = render("layer_profile", frame(), metric="grad_norm", fmt="svg", group_by="init")
    again = render("layer_profile", frame(), metric="grad_norm", fmt="svg", group_by="init")
    assert again is first and drawn == ["layer_profile"]


@pytest.mark.parametrize(
    "change",
    [
        lambda f: f.assign(value=f.value.where(f.index != 3, f.value + 1e-12)),  # one cell
        lambda f: f.assign(init=f.init.replace("orthogonal", "Orthogonal")),  # one label
        lambda f: f.iloc[::-1],  # the row order
        lambda f: f.iloc[:-1],  # a row fewer
        lambda f: f.assign(width=8),  # a column more
        lambda f: f.rename(columns={"init": "norm"}),  # a column's name
        lambda f: f.astype({"value": np.float32}),  # a dtype
    ],
    ids=["cell", "label", "order", "row", "column", "name", "dtype"],
)
def test_any_change_of_the_frame_draws_anew(monkeypatch, change):
    drawn = counted(monkeypatch)
    base = frame()
    render("layer_profile", base, metric="grad_norm", fmt="svg", group_by="init")
    changed = change(base.copy())
    assert memo.key_of(changed, "x") != memo.key_of(base, "x")
    # a renamed column the kind needs is refused: that is a draw too
    with contextlib.suppress(InvalidInput):
        render("layer_profile", changed, metric="grad_norm", fmt="svg", group_by="init")
    assert len(drawn) == 2


@pytest.mark.parametrize(
    "args",
    [
        dict(metric="grad_norm", fmt="png", group_by="init"),
        dict(metric="grad_norm", fmt="json", group_by="init"),
        dict(metric="grad_norm", fmt="svg", group_by="depth"),
        dict(metric="grad_norm", fmt="svg", group_by="init", stat="median"),
        dict(metric="grad_norm", fmt="svg", group_by="init", title="another title"),
    ],
)
def test_any_other_argument_draws_anew(monkeypatch, args):
    drawn = counted(monkeypatch)
    f = frame()
    first = render("layer_profile", f, metric="grad_norm", fmt="svg", group_by="init")
    other = render("layer_profile", f, **args)
    assert len(drawn) == 2 and other != first


def test_a_refusal_is_not_kept(monkeypatch):
    drawn = counted(monkeypatch)
    hits = memo.cache.hits
    for _ in range(2):
        with pytest.raises(InvalidInput, match="stat"):
            render("layer_profile", frame(), metric="grad_norm", fmt="svg", stat="mode")
    assert len(drawn) == 2 and memo.cache.hits == hits and not memo.cache._entries


def test_a_frame_that_cannot_be_hashed_draws_each_time(monkeypatch):
    f = frame()
    monkeypatch.setattr(pd.util, "hash_pandas_object", _refuse)
    drawn = counted(monkeypatch)
    assert memo.key_of(f, "x") is None
    a = render("layer_profile", f, metric="grad_norm", fmt="png")
    b = render("layer_profile", f, metric="grad_norm", fmt="png")
    assert a == b and a is not b and len(drawn) == 2


def _refuse(*args, **kwargs):
    raise TypeError("unhashable type: 'dict'")


def test_bypassed_draws_every_time(monkeypatch):
    drawn = counted(monkeypatch)
    with memo.bypassed():
        render("layer_profile", frame(), metric="grad_norm", fmt="svg")
        render("layer_profile", frame(), metric="grad_norm", fmt="svg")
    assert len(drawn) == 2


def test_the_memo_keeps_within_its_bytes(monkeypatch):
    first = render("layer_profile", frame(), metric="grad_norm", fmt="svg")
    monkeypatch.setattr(memo.cache, "max_bytes", 2 * len(first) + 1)
    for depth_offset in range(5):
        f = frame().assign(value=lambda d, k=depth_offset: d.value + k)
        render("layer_profile", f, metric="grad_norm", fmt="svg")
    kept = [value for _, _, value in memo.cache._entries.values()]
    assert 1 <= len(kept) <= 2 and memo.cache._bytes == sum(map(len, kept)) <= memo.cache.max_bytes
