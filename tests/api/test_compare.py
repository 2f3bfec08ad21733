"""Comparing sweeps over real HTTP (SQLite and Postgres): `GET /compare/metrics` stacks the
sweeps' tidy rows with `sweep_id` and a `sweep` label naming what differs between their specs,
and `GET /compare/plots/{kind}` draws one line per sweep with the plots' pooling options. Every
value is the hand-made record's (tests/records.value_of), so the expected numbers are exact."""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest
from api_support import fill, record, spec, submit, value_of

from service.config import METRICS
from service.plots import depth_scaling_series
from service.plots.compare import compare_frame, differing_fields, sweep_labels

GRAD = METRICS.index("grad_norm")


def _two(api, a=None, b=None):
    """Two filled sweeps: norm batch vs layer (and whatever `a`, `b` add), depths 2 and 4."""
    one = submit(api, spec("one", depth=[2, 4], norm="batch", **(a or {})))
    two = submit(api, spec("two", depth=[2, 4], norm="layer", **(b or {})))
    return one, two, fill(api, one["id"]), fill(api, two["id"])


def test_compare_metrics_stacks_the_sweeps_with_their_labels(api):
    one, two, t1, t2 = _two(api)
    r = api.get(
        "/compare/metrics",
        params={"sweep": [one["id"], two["id"]], "metric": "grad_norm", "epoch": 0, "layer": 1},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["columns"] == [
        "sweep_id", "sweep", "trial_id", "depth", "seed", "epoch", "metric", "layer", "value",
    ]  # fmt: skip
    assert body["count"] == 8  # 2 sweeps × 2 depths × 2 seeds, one value each
    labels = {row["sweep_id"]: row["sweep"] for row in body["data"]}
    assert labels == {
        one["id"]: f"sweep {one['id']} (norm=batch)",
        two["id"]: f"sweep {two['id']} (norm=layer)",
    }
    for row in body["data"]:
        assert row["value"] == value_of(row["trial_id"], 0, GRAD, 1)
    trials = {t["id"] for t in t1} | {t["id"] for t in t2}
    assert {row["trial_id"] for row in body["data"]} == trials


def test_a_field_swept_in_one_sweep_is_a_column_with_each_trials_value(api):
    one, two, _, _ = _two(api, a={"activation": ["relu", "tanh"]}, b={"activation": "tanh"})
    r = api.get(
        "/compare/metrics",
        params={"sweep": [one["id"], two["id"]], "metric": "train_loss", "epoch": "last"},
    )
    assert r.status_code == 200, r.text
    frame = pd.DataFrame(r.json()["data"])
    assert list(frame.columns[:5]) == ["sweep_id", "sweep", "trial_id", "depth", "activation"]
    by_sweep = frame.groupby("sweep_id")["activation"].unique()
    assert sorted(by_sweep[one["id"]]) == ["relu", "tanh"]
    assert list(by_sweep[two["id"]]) == ["tanh"]  # its fixed value, from the trials' configs
    assert set(frame["sweep"]) == {
        f"sweep {one['id']} (norm=batch)",
        f"sweep {two['id']} (norm=layer)",
    }
    assert (frame["epoch"] == 2).all() and len(frame) == 2 * 2 * 2 + 2 * 2


def test_compare_aggregate_pools_seeds_within_each_sweep(api):
    one, two, _, _ = _two(api)
    r = api.get(
        "/compare/metrics",
        params={"sweep": [one["id"], two["id"]], "metric": "grad_norm", "epoch": 0, "layer": 2,
                "aggregate": "true", "depth": 4},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    rows = r.json()["data"]
    assert len(rows) == 2  # one point per sweep: depth 4, layer 2, two seeds pooled
    for row in rows:
        ids = [t.id for t in api.store.list_trials(row["sweep_id"], where={"depth": 4})[0]]
        want = [value_of(t, 0, GRAD, 2) for t in ids]
        assert row["count"] == 2 and math.isclose(row["mean"], float(np.mean(want)))
        assert math.isclose(row["std"], float(np.std(want, ddof=1)))


def test_compare_csv_and_parquet_hold_the_same_rows(api):
    one, two, _, _ = _two(api)
    params = {"sweep": [one["id"], two["id"]], "metric": "test_acc", "epoch": 1}
    j = pd.DataFrame(api.get("/compare/metrics", params=params).json()["data"])
    c = pd.read_csv(
        io.StringIO(api.get("/compare/metrics", params={**params, "format": "csv"}).text)
    )
    p = pd.read_parquet(
        io.BytesIO(api.get("/compare/metrics", params={**params, "format": "parquet"}).content)
    )
    assert len(j) == len(c) == len(p) == 8
    assert list(c["sweep"]) == list(j["sweep"]) == list(p["sweep"])
    assert np.array_equal(c["value"].to_numpy(), p["value"].to_numpy())


def test_labels_name_only_the_fixed_fields_that_differ():
    a = {"parameters": {"depth": [2, 4], "norm": "batch", "lr": 0.1, "width": 8}}
    b = {"parameters": {"depth": [2, 8], "norm": "layer", "width": 8}}  # lr: the default
    c = {"parameters": {"depth": 3, "norm": "batch", "lr": 0.1, "width": 8}}
    assert differing_fields({1: a, 2: b}) == ["norm", "lr"]  # depth is swept: an axis
    labels = sweep_labels({1: a, 2: b})
    assert labels[1] == "sweep 1 (norm=batch, lr=0.1)"
    assert labels[2].startswith("sweep 2 (norm=layer, lr=") and labels[2] != labels[1]
    assert sweep_labels({1: a, 3: a}) == {1: "sweep 1", 3: "sweep 3"}  # nothing differs
    assert differing_fields({1: a, 3: c}) == []  # depth swept in one of them: a column


def test_the_compared_lines_are_pooled_as_asked(api):
    """The series the compare figure draws: one line per sweep, the geometric mean of the seeds
    by default for a gradient norm against depth, the median when asked."""
    one, two, _, _ = _two(api)
    frame = compare_frame(
        api.store, [one["id"], two["id"]], metrics="grad_norm", epoch=[0], layers=[1]
    ).drop(columns="sweep_id")
    for stat, pool in (("geomean", lambda v: math.exp(np.mean(np.log(v)))),
                       ("median", np.median)):  # fmt: skip
        lines = depth_scaling_series(frame, "grad_norm", group_by="sweep", layer=1, stat=stat)
        assert list(lines) == [f"sweep {one['id']} (norm=batch)", f"sweep {two['id']} (norm=layer)"]
        for label, line in lines.items():
            sid = one["id"] if label.startswith(f"sweep {one['id']} ") else two["id"]
            for d, m in zip(line["x"], line["mean"], strict=True):
                ids = [t.id for t in api.store.list_trials(sid, where={"depth": int(d)})[0]]
                assert math.isclose(m, pool([value_of(t, 0, GRAD, 1) for t in ids]))


@pytest.mark.parametrize("kind", ["depth_scaling", "layer_profile", "training_curves"])
def test_compare_plot_draws_a_line_per_sweep(api, kind):
    one, two, _, _ = _two(api)
    params = {"sweep": [one["id"], two["id"]], "format": "svg"}
    r = api.get(f"/compare/plots/{kind}", params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("image/svg+xml")
    svg = r.text
    for label in (f"sweep {one['id']} (norm=batch)", f"sweep {two['id']} (norm=layer)"):
        assert label in svg  # matplotlib keeps each text as a comment beside its glyphs
    png = api.get(f"/compare/plots/{kind}", params={**params, "format": "png"})
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")


def test_compare_plot_options_change_the_figure(api):
    one, two, _, _ = _two(api)
    base = {"sweep": [one["id"], two["id"]], "format": "svg", "metric": "grad_norm"}
    geo = api.get("/compare/plots/depth_scaling", params=base).text
    med = api.get("/compare/plots/depth_scaling", params={**base, "stat": "median"}).text
    assert "geometric mean" in geo and "median" in med and "geometric mean" not in med
    lin = api.get("/compare/plots/depth_scaling", params={**base, "yscale": "linear"})
    assert lin.status_code == 200


@pytest.mark.parametrize(
    ("path", "params", "field", "says"),
    [
        ("/compare/plots/heatmap", {}, "kind", "layer_profile, depth_scaling, training_curves"),
        ("/compare/plots/depth_scaling", {"stat": "mena"}, "stat", "did you mean 'mean'?"),
        ("/compare/metrics", {"layer": 500}, "layer", "no trial has layer 500"),
        ("/compare/metrics", {"metric": "isometry_gap/attn"}, "metric", "does not record"),
        ("/compare/metrics", {"epoch": 7}, "epoch", "epoch 7 is not recorded"),
        ("/compare/metrics", {"activaton": "relu"}, "activaton", "did you mean 'activation'?"),
    ],
)
def test_compare_errors_name_the_field(api, path, params, field, says):
    one, two, _, _ = _two(api)
    r = api.get(path, params={"sweep": [one["id"], two["id"]], **params})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == field and says in error["message"], error


def test_compare_needs_existing_sweeps_and_at_most_eight(api):
    one, _, _, _ = _two(api)
    assert api.get("/compare/metrics", params={"sweep": [one["id"], 999]}).status_code == 404
    r = api.get("/compare/metrics")
    assert r.status_code == 422 and r.json()["error"]["field"] == "sweep"
    r = api.get("/compare/metrics", params={"sweep": list(range(1, 10))})
    assert r.status_code == 422 and "at most 8" in r.json()["error"]["message"]


def test_the_python_client_compares_into_pandas(api, tmp_path):
    """Client.compare → one DataFrame (NaN/±inf decoded to floats), Client.compare_plot → bytes."""
    import isosweep

    one = submit(api, spec("one", depth=[2, 4], norm="batch"))
    two = submit(api, spec("two", depth=[2, 4], norm="layer"))
    fill(api, one["id"])
    t2 = fill(api, two["id"], epochs=0)  # records of epochs 0..E below, NaN/±inf among them
    special = [math.nan, math.inf, -math.inf, 0.5]
    batch = []
    for k, t in enumerate(t2):
        c = t["config"]
        for e in range(c["epochs"] + 1):
            batch.append((t["id"], record(t["id"], e, c["depth"], train_loss=special[k % 4])))
    api.store.write_records(batch)
    with isosweep.Client(api.url) as c:
        frame = c.compare([one["id"], two["id"]], metric="train_loss", epoch=0)
        assert list(frame.columns[:3]) == ["sweep_id", "sweep", "trial_id"]
        assert frame["value"].dtype == float and len(frame) == 8
        mine = frame[frame["sweep_id"] == two["id"]].sort_values("trial_id")["value"].to_numpy()
        want = np.array([special[k % 4] for k in range(len(t2))])
        assert np.array_equal(mine, want, equal_nan=True)
        assert set(frame["sweep"]) == {
            f"sweep {one['id']} (norm=batch)",
            f"sweep {two['id']} (norm=layer)",
        }
        path = tmp_path / "c.svg"
        image = c.compare_plot([one["id"], two["id"]], "training_curves", metric="train_loss",
                               path=path)  # fmt: skip
        assert image == path.read_bytes() and b"<svg" in image
        with pytest.raises(isosweep.ApiError) as info:
            c.compare([one["id"], two["id"]], layer=99)
        assert info.value.field == "layer" and info.value.status == 422


# --- the dashboard's compare page --------------------------------------------------------------


def _page(api, path, code=200):
    r = api.client.get(api.url + path)
    assert r.status_code == code, r.text[:2000]
    assert r.headers["content-type"].startswith("text/html")
    return r.text


def test_the_sweeps_list_leads_to_the_compare_page(api):
    import re
    from html import unescape

    one, two, _, _ = _two(api)
    index = _page(api, "/")
    for s in (one, two):
        assert f'<input type="checkbox" name="sweep" value="{s["id"]}" form="compare"' in index
    assert '<form class="filters compare" id="compare" method="get" action="/compare">' in index
    for query in (f"sweep={one['id']}&sweep={two['id']}", f"sweeps={one['id']},+{two['id']}"):
        html = _page(api, f"/compare?{query}")
        assert f"sweep {one['id']} (norm=batch)" in html
        assert f"sweep {two['id']} (norm=layer)" in html
        assert "what differs between the specs: norm." in html
        src = unescape(re.search(r'<img data-plot src="([^"]+)"', html).group(1))
        assert src.startswith("/api/v1/compare/plots/depth_scaling?")
        r = api.client.get(api.url + src)
        assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml"
        assert f"sweep {one['id']} (norm=batch)" in r.text
    html = _page(api, f"/compare?sweep={one['id']}&sweep={two['id']}&kind=layer_profile"
                      "&metric=grad_norm&layer=2&stat=median")  # fmt: skip
    src = unescape(re.search(r'<img data-plot src="([^"]+)"', html).group(1))
    assert "layer=" not in src and "stat=median" in src and "metric=grad_norm" in src
    assert api.client.get(api.url + src).status_code == 200
    links = [unescape(h) for h in re.findall(r'<li><a href="([^"]+)">', html)]
    csv = api.client.get(api.url + links[-1])  # grad_norm only
    frame = pd.read_csv(io.StringIO(csv.text))
    assert set(frame["metric"]) == {"grad_norm"} and set(frame["sweep_id"]) == {
        one["id"],
        two["id"],
    }


def test_the_compare_page_names_a_bad_choice(api):
    one, two, _, _ = _two(api)
    ids = f"sweep={one['id']}&sweep={two['id']}"
    assert "kind: unknown value" in _page(api, f"/compare?{ids}&kind=heatmap", 422)
    assert "sweeps: sweep ids are numbers" in _page(api, "/compare?sweeps=3x", 422)
    assert "name the sweeps" in _page(api, "/compare", 422)
    assert "no sweep" in _page(api, f"/compare?{ids}&sweep=999", 404)
