"""`format=json` on the plot routes (docs/api.md, "Plots as JSON"): every kind the dashboard draws
answers its chart — the numbers the figure's series functions give, the figure's title, caption
and axes — valid against the OpenAPI document's ChartPublic, non-finite values spelled as the
API spells them, and the same 422 as the image where a kind cannot be drawn. Hand-made records
(tests/records.py): each value is known from where it sits."""

from __future__ import annotations

import math
import re

import jsonschema
import pytest
from api_support import fill, record, spec, submit, value_of
from test_search_plots import _asha

from api.app import create_app
from service.config import METRICS
from service.plots.search import SEARCH_PLOT_KINDS
from service.settings import Settings

pytestmark = [pytest.mark.sqlite_only]  # the answer does not depend on the backend

DOC = create_app(Settings(database_url="sqlite:///:memory:")).openapi()
GRAD = METRICS.index("grad_norm")


def chart_validator() -> jsonschema.Draft202012Validator:
    schema = {"$ref": "#/components/schemas/ChartPublic", "components": DOC["components"]}
    return jsonschema.Draft202012Validator(schema)


def chart(api, path: str, **params) -> dict:
    r = api.get(path, params={**params, "format": "json"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    errors = [e.message for e in chart_validator().iter_errors(body)]
    assert errors == [], errors[:3]
    return body


def svg_text(api, path: str, **params) -> str:
    """Every text the SVG figure draws, in drawing order, as one line (matplotlib writes each
    line of a wrapped text as a text of its own, in order)."""
    svg = api.get(path, params={**params, "format": "svg"}).text
    return " ".join(" ".join(re.findall(r"<!-- (.*?) -->", svg, flags=re.S)).split())


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def depth_init(api):
    """depth 2, 4 × init gaussian, orthogonal, one seed, epochs 0..2, every record stored."""
    sid = submit(api, spec("charts", seeds=1, depth=[2, 4], init=["gaussian", "orthogonal"]))["id"]
    trials = fill(api, sid)
    for t in trials:
        api.store.finish_trial(t["id"], "completed")
    api.store.finish_sweep(sid)
    return sid, trials


def test_depth_scaling_json_holds_the_stored_values_and_the_figures_texts(api, depth_init):
    sid, trials = depth_init
    path = f"/sweeps/{sid}/plots/depth_scaling"
    params = {"metric": "grad_norm", "layer": 1, "group_by": "init", "stat": "mean"}
    body = chart(api, path, **params)
    assert body["kind"] == "depth_scaling" and body["empty"] is None
    (one,) = body["panels"]
    assert [s["label"] for s in one["series"]] == ["gaussian", "orthogonal"]
    assert one["legend"] == "init" and one["stat"] == "mean"
    for s in one["series"]:
        assert s["x"] == [2, 4] and s["count"] == [1, 1] and s["lo"] is None  # one seed: no band
        tid = {t["config"]["depth"]: t["id"] for t in trials
               if t["config"]["init"] == s["label"]}  # fmt: skip
        assert s["y"] == [value_of(tid[d], 2, GRAD, 1) for d in (2, 4)]  # mean of one value
    texts = svg_text(api, path, **params)
    assert flat(body["title"]) in texts and flat(one["caption"]) in texts
    assert flat(one["x"]["label"]) in texts and flat(one["y"]["label"]) in texts
    assert (one["x"]["scale"], one["y"]["scale"]) == ("linear", "log")  # a gradient norm: log y


def test_every_line_kind_json_has_the_figures_title_and_caption(api, depth_init):
    sid, _ = depth_init
    for kind in ("layer_profile", "depth_scaling", "training_curves", "theory_overlay"):
        path = f"/sweeps/{sid}/plots/{kind}"
        body = chart(api, path)
        texts = svg_text(api, path)
        assert flat(body["title"]) in texts, (kind, body["title"])
        for p in body["panels"]:
            assert flat(p["caption"]) in texts, (kind, p["caption"], texts)
            assert all(len(s["x"]) == len(s["y"]) > 0 for s in p["series"]), kind


def test_the_default_scale_is_the_figures(api, depth_init):
    sid, _ = depth_init
    body = chart(api, f"/sweeps/{sid}/plots/depth_scaling", metric="grad_norm")
    assert body["panels"][0]["y"]["scale"] == "log"  # a gradient norm against depth: geomean, log
    assert body["panels"][0]["stat"] == "geomean"
    lin = chart(api, f"/sweeps/{sid}/plots/depth_scaling", metric="grad_norm", yscale="linear")
    assert lin["panels"][0]["y"]["scale"] == "linear"


def test_nonfinite_values_are_spelled_as_the_api_spells_them(api):
    s = submit(api, spec("inf", seeds=1, depth=[2, 3], epochs=0))
    trials = api.store.list_trials(s["id"])[0]
    grads = {2: [math.inf, 1.0], 3: [math.nan, -math.inf, 2.0]}
    api.store.write_records([
        (t.id, record(t.id, 0, t.config["depth"], grad_norm=grads[t.config["depth"]]))
        for t in trials
    ])  # fmt: skip
    body = chart(api, f"/sweeps/{s['id']}/plots/layer_profile", metric="grad_norm",
                 group_by="depth", stat="mean", yscale="linear")  # fmt: skip
    ys = {s["label"]: s["y"] for s in body["panels"][0]["series"]}
    assert ys == {"2": ["Infinity", 1.0], "3": ["NaN", "-Infinity", 2.0]}


def test_a_heatmap_json_holds_its_grid(api, depth_init):
    sid, trials = depth_init
    body = chart(api, f"/sweeps/{sid}/plots/heatmap", metric="grad_norm", layer=1, stat="mean")
    grid = body["panels"][0]["grid"]
    assert grid["x"] == [2, 4] and grid["y"] == ["gaussian", "orthogonal"]  # depth × init
    tid = {(t["config"]["init"], t["config"]["depth"]): t["id"] for t in trials}
    assert grid["values"] == [[value_of(tid[(i, d)], 2, GRAD, 1) for d in (2, 4)]
                              for i in ("gaussian", "orthogonal")]  # fmt: skip
    assert grid["present"] == [[True, True], [True, True]]


def test_a_kind_that_cannot_be_drawn_is_the_same_422_as_its_image(api, depth_init):
    sid, _ = depth_init
    for kind, params in [
        ("theory_overlay", {"metric": "weight_isometry_gap"}),
        ("depth_scaling", {"layer": 9}),
        ("layer_profile", {"x": "depth"}),
        ("heatmap", {"metric": "train_loss", "x": "depth", "group_by": "layer"}),
    ]:
        png = api.get(f"/sweeps/{sid}/plots/{kind}", params={**params, "format": "png"})
        js = api.get(f"/sweeps/{sid}/plots/{kind}", params={**params, "format": "json"})
        assert png.status_code == js.status_code == 422, (kind, js.text)
        assert png.json() == js.json()


def test_a_sweep_without_records_is_an_empty_chart(api):
    s = submit(api, spec("nothing", seeds=1))
    body = chart(api, f"/sweeps/{s['id']}/plots/layer_profile")
    assert body["panels"] == [] and body["empty"]


@pytest.mark.parametrize("kind", SEARCH_PLOT_KINDS)
def test_every_search_kind_as_json(api, kind):
    s = _asha(api)
    body = chart(api, f"/sweeps/{s['id']}/plots/{kind}")
    assert body["kind"] == kind and body["panels"]
    assert all(p["series"] for p in body["panels"])


def test_search_history_json_holds_each_trials_objective_and_the_best_so_far(api):
    s = _asha(api)
    body = chart(api, f"/sweeps/{s['id']}/plots/search_history", metric="train_loss")
    trials = {t.id: t for t in api.store.list_trials(s["id"], limit=100)[0]}
    completed = sorted((t.index, (math.log10(t.config["lr"]) + 2) ** 2) for t in trials.values()
                       if t.status == "completed")  # fmt: skip
    points = [x for x in body["panels"][0]["series"] if x["style"] == "points"]
    steps = [x for x in body["panels"][0]["series"] if x["style"] == "step"]
    assert len(points) == len(steps) >= 1
    drawn = sorted(v for p in points for v in p["y"])
    assert drawn == pytest.approx(sorted(v for _, v in completed), rel=1e-12)
    for p, b in zip(points, steps, strict=True):
        assert b["y"] == [min(p["y"][: i + 1]) for i in range(len(p["y"]))]  # mode min


def test_search_json_refuses_what_the_image_refuses(api):
    plain = _asha(api, early_stop=False, seed=1)
    for fmt in ("png", "json"):
        r = api.get(f"/sweeps/{plain['id']}/plots/halving_rungs", params={"format": fmt})
        assert r.status_code == 422 and "no early_stop" in r.json()["error"]["message"]


def test_compare_and_spectra_as_json(api, depth_init):
    sid, _ = depth_init
    other = submit(api, spec("other", seeds=1, depth=[2, 4], norm="layer"))["id"]
    fill(api, other)
    body = chart(api, "/compare/plots/depth_scaling", sweep=[sid, other], metric="grad_norm")
    labels = [s["label"] for s in body["panels"][0]["series"]]
    assert any(f"sweep {other}" in lab for lab in labels), labels
    r = api.get("/compare/plots/heatmap", params={"sweep": [sid, other], "format": "json"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "kind"


def test_the_document_declares_the_json_answer_after_the_images():
    for path in ("/sweeps/{sweep_id}/plots/{kind}", "/compare/plots/{kind}",
                 "/trials/{trial_id}/plots/{kind}"):  # fmt: skip
        op = DOC["paths"][f"/api/v1{path}"]["get"]
        content = op["responses"]["200"]["content"]
        assert list(content) == ["image/png", "image/svg+xml", "application/json"]
        assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/ChartPublic"}
        fmt = next(p for p in op["parameters"] if p["name"] == "format")
        assert fmt["schema"]["enum"] == ["png", "svg", "json"]


def test_a_trials_spectra_as_json(api):
    from test_trial_page_browser import K, spectra_arrays

    s = submit(api, spec("spectra", seeds=1, depth=[2, 3], spectra=True, jacobian_samples=K))
    trials = api.store.list_trials(s["id"])[0]
    api.store.write_records([
        (t.id, {**record(t.id, 0, t.config["depth"]), **spectra_arrays(t.config["depth"], 0)})
        for t in trials
    ])  # fmt: skip
    a, b = trials
    body = chart(api, f"/trials/{b.id}/plots/spectrum", name="spectrum/act")
    (one,) = body["panels"]
    lam = spectra_arrays(3, 0)["spectrum/act"]  # (3 layers, 4) descending
    assert [x["label"] for x in one["series"]] == ["ℓ = 1", "ℓ = 2", "ℓ = 3"]
    for ell, x in enumerate(one["series"], start=1):
        assert x["x"] == [1, 2, 3, 4]
        assert x["y"] == pytest.approx(lam[ell - 1] / lam[ell - 1].mean(), rel=1e-12)
    assert one["rules"] == [{"axis": "y", "value": 1.0, "label": "isometry: λ = mean λ"}]
    body = chart(api, f"/trials/{b.id}/plots/jacobian_spectrum", compare=[a.id])
    steps = body["panels"][0]["series"]
    assert len(steps) == 2 and all(x["y"][-1] == 1.0 for x in steps)  # F reaches 1
    r = api.get(f"/trials/{b.id}/plots/spectrum", params={"layer": 9, "format": "json"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "layer"


def test_a_count_of_flagged_seeds_becomes_a_per_point_flag():
    import pandas as pd

    from service.plots.charts import line_series

    s = pd.DataFrame({"x": [1, 2, 3], "mean": [1.0, math.inf, 3.0], "lo": [math.nan] * 3,
                      "hi": [math.nan] * 3, "count": [2, 2, 2], "n_finite": [2, 1, 2],
                      "n_excluded": [0, 0, 0], "n_unresolved": [0, 2, 1]})  # fmt: skip
    one = line_series("a", s, 3)
    assert one["flags"] == {"unresolved": [False, True, True]}
    assert one["y"] == [1.0, "Infinity", 3.0] and one["lo"] is None and one["key"] == 3
    assert line_series("a", s.assign(n_unresolved=0), 0)["flags"] is None  # none flagged
