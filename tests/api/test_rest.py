"""The REST API over a real HTTP server, on SQLite and Postgres: sweeps, trials, metrics (JSON,
CSV, Parquet; filters, `last`, layers, seed aggregation; NaN/±inf), plots, theory, health."""

from __future__ import annotations

import io
import math
import statistics

import numpy as np
import pandas as pd
import pytest
from api_support import fill, record, spec, submit, value_of
from scipy import stats

from service.activations import ACTIVATION_NAMES
from service.config import LAYER_METRICS, METRICS, SCALAR_METRICS
from service.jsonfmt import decode_float
from service.plots import PLOT_KINDS
from service.tidy import AGGREGATE_COLUMNS

INDEX = {m: i for i, m in enumerate(METRICS)}  # the metric's index in value_of


# --- sweeps ---------------------------------------------------------------------------------


def test_submit_returns_201_with_the_expanded_sweep(api):
    s = submit(api, spec("bn", seeds=3, depth=[2, 4], init=["gaussian", "orthogonal"]))
    assert s["name"] == "bn" and s["status"] == "queued"
    assert s["n_trials"] == 2 * 2 * 3
    assert s["counts"] == {
        "queued": 12,
        "running": 0,
        "completed": 0,
        "diverged": 0,
        "failed": 0,
        "cancelled": 0,
        "stopped": 0,
    }
    assert s["progress"] == 0.0 and s["eta_s"] is None and s["cancel_requested"] is False
    assert s["spec"]["parameters"]["depth"] == [2, 4]
    assert api.get(f"/sweeps/{s['id']}").json() == s


def test_submit_yaml_text(api):
    text = "name: from-yaml\nparameters:\n  depth: [2, 3]\n  epochs: 1\nseeds: [5, 7]\n"
    r = api.post("/sweeps", content=text, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    assert r.json()["n_trials"] == 4
    trials = api.get(f"/sweeps/{r.json()['id']}/trials").json()["data"]
    assert sorted({t["config"]["seed"] for t in trials}) == [5, 7]


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"name": "x", "parameters": {"dpth": 3}}, "parameters.dpth", "unknown field"),
        ({"name": "x", "colour": "red"}, "colour", "unknown field"),
        ({"name": "x", "parameters": {"depth": 0}}, "parameters.depth", "greater than or equal"),
        ({"name": "x", "parameters": {"activation": "reluu"}}, "parameters.activation", "relu"),
        ({"name": "x", "seeds": [1, 1]}, "seeds", "distinct"),
        ({"name": "x", "parameters": {"depth": 10**6}}, "parameters.depth", "ISOSWEEP_MAX_DEPTH"),
        ({"name": "x", "priority": 2**40}, "priority", "32-bit"),
        ({"name": "x\u0000y"}, "name", "NUL"),
        ({"parameters": {}}, "name", "required"),
        # derived fields and linked axes (issue 22): the expression, the trial point, the point
        (
            {
                "name": "x",
                "parameters": {
                    "model": "resmlp",
                    "depth": [4, 8],
                    "residual_scale": {"expr": "1/sqrt(dpth)"},
                },
            },
            "parameters.residual_scale",
            "did you mean 'depth'",
        ),
        (
            {
                "name": "x",
                "parameters": {"width": {"expr": "2*batch_size"}, "batch_size": {"expr": "width"}},
            },
            "parameters.width",
            "cycle: width → batch_size → width",
        ),
        (
            {"name": "x", "parameters": {"depth": [4, 8], "init_gain": {"expr": "1/(depth-4)"}}},
            "parameters.init_gain",
            "division by zero in 1 / 0 (in the trial with depth=4, seed=0)",
        ),
        (
            {"name": "x", "parameters": {"width": {"expr": "__import__('os')"}}},
            "parameters.width",
            "only sqrt, log, exp, abs, round, min and max may be called",
        ),
        (
            {"name": "x", "parameters": {"zip": [{"width": 8, "batch_size": 8}, {"width": 16}]}},
            "parameters.zip[1]",
            "every point of a linked axis sets the same fields",
        ),
    ],
)
def test_bad_spec_is_422_naming_the_field(api, body, field, says):
    r = api.post("/sweeps", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["field"] == field
    assert says in err["message"]
    assert api.get("/sweeps").json()["count"] == 0  # nothing written


def test_malformed_bodies_are_422_on_body(api):
    cases = [
        (b"{not json", "application/json", "not valid JSON"),
        (b"", "application/json", "empty"),
        (b"name: [unclosed", "application/yaml", "YAML"),
        (b"\xff\xfe", "application/json", "UTF-8"),
        (b"<spec/>", "application/xml", "content type"),
        (b"[1, 2]", "application/json", "mapping"),
    ]
    for raw, media, says in cases:
        r = api.post("/sweeps", content=raw, headers={"Content-Type": media})
        assert r.status_code == 422, (raw, r.text)
        assert says in r.json()["error"]["message"], (raw, r.text)


def test_list_pages_newest_first_with_total_and_status_filter(api):
    ids = [submit(api, spec(f"s{i}", seeds=1))["id"] for i in range(3)]
    page = api.get("/sweeps", params={"limit": 2}).json()
    assert page["count"] == 3 and [s["id"] for s in page["data"]] == ids[::-1][:2]
    rest = api.get("/sweeps", params={"limit": 2, "offset": 2}).json()
    assert [s["id"] for s in rest["data"]] == [ids[0]]
    api.post(f"/sweeps/{ids[1]}/cancel")
    cancelled = api.get("/sweeps", params={"status": "cancelled"}).json()
    assert cancelled["count"] == 1 and cancelled["data"][0]["id"] == ids[1]
    r = api.get("/sweeps", params={"status": "done"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "status"
    r = api.get("/sweeps", params={"limit": api.settings.max_page_size + 1})
    assert r.status_code == 422 and r.json()["error"]["field"] == "limit"
    assert "ISOSWEEP_MAX_PAGE_SIZE" in r.json()["error"]["message"]


def test_missing_things_are_404(api):
    for path in ("/sweeps/999", "/trials/999", "/sweeps/999/trials", "/sweeps/999/metrics"):
        r = api.get(path)
        assert r.status_code == 404, path
        assert r.json()["error"]["type"] == "not_found"
    assert api.post("/sweeps/999/cancel").status_code == 404
    r = api.get("/no/such/route")
    assert r.status_code == 404 and "/docs" in r.json()["error"]["message"]
    r = api.client.delete("/sweeps")
    assert r.status_code == 405 and r.json()["error"]["type"] == "method_not_allowed"


def test_cancel_a_queued_sweep_cancels_its_trials_and_keeps_results(api):
    s = submit(api, spec(depth=[2], seeds=2))
    trials = fill(api, s["id"], epochs=1)
    c = api.post(f"/sweeps/{s['id']}/cancel")
    assert c.status_code == 200
    assert c.json()["status"] == "cancelled" and c.json()["cancel_requested"] is True
    assert c.json()["counts"]["cancelled"] == 2
    rows = api.get(f"/sweeps/{s['id']}/metrics", params={"metric": "train_loss"}).json()
    assert rows["count"] == len(trials)  # epoch 0 of each trial is still there


# --- trials ---------------------------------------------------------------------------------


def test_trials_filter_by_config_fields_and_status(api):
    s = submit(api, spec(depth=[2, 3], init=["gaussian", "orthogonal"], seeds=2))
    page = api.get(f"/sweeps/{s['id']}/trials", params={"depth": 3, "init": "orthogonal"}).json()
    assert page["count"] == 2
    assert {(t["config"]["depth"], t["config"]["init"]) for t in page["data"]} == {
        (3, "orthogonal")
    }
    both = api.get(f"/sweeps/{s['id']}/trials", params=[("depth", 2), ("depth", 3)]).json()
    assert both["count"] == 8
    one = api.get(f"/sweeps/{s['id']}/trials", params={"limit": 3, "offset": 6}).json()
    assert one["count"] == 8 and [t["index"] for t in one["data"]] == [6, 7]
    assert api.get(f"/sweeps/{s['id']}/trials", params={"status": "queued"}).json()["count"] == 8
    assert api.get(f"/sweeps/{s['id']}/trials", params={"status": "failed"}).json()["count"] == 0
    r = api.get(f"/sweeps/{s['id']}/trials", params={"init": "uniform"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "init"
    r = api.get(f"/sweeps/{s['id']}/trials", params={"dept": 3})
    assert r.status_code == 422 and r.json()["error"]["field"] == "dept"
    assert "depth" in r.json()["error"]["allowed"]


def test_status_parameters_offer_the_stores_statuses(api):
    from service.store.models import SWEEP_STATUSES, TRIAL_STATUSES

    doc = api.client.get(f"{api.url}/openapi.json").json()
    for path, statuses in (
        ("/api/v1/sweeps", SWEEP_STATUSES),
        ("/api/v1/sweeps/{sweep_id}/trials", TRIAL_STATUSES),
    ):
        (status,) = [p for p in doc["paths"][path]["get"]["parameters"] if p["name"] == "status"]
        assert status["schema"]["anyOf"][0]["enum"] == list(statuses)
    schemas = doc["components"]["schemas"]
    assert schemas["SweepPublic"]["properties"]["status"]["enum"] == list(SWEEP_STATUSES)
    assert schemas["TrialPublic"]["properties"]["status"]["enum"] == list(TRIAL_STATUSES)


def test_config_filters_keep_each_fields_own_bounds(api):
    """The 32-bit bound of integer filters must not override a field's own: depth ≥ 1."""
    doc = api.client.get(f"{api.url}/openapi.json").json()
    for path in ("/api/v1/sweeps/{sweep_id}/trials", "/api/v1/sweeps/{sweep_id}/metrics"):
        params = {p["name"]: p for p in doc["paths"][path]["get"]["parameters"]}
        depth = params["depth"]["schema"]["anyOf"][0]["items"]
        assert depth["minimum"] == 1 and depth["maximum"] == 2**31 - 1
        assert params["seed"]["schema"]["anyOf"][0]["items"]["minimum"] == 0
    s = submit(api, spec(depth=[2, 3], seeds=1))
    for route in ("trials", "metrics", "plots/layer_profile"):
        for params, field in (({"depth": 0}, "depth"), ({"seed": -1}, "seed")):
            r = api.get(f"/sweeps/{s['id']}/{route}", params=params)
            assert r.status_code == 422, (route, params, r.text)
            assert r.json()["error"]["field"] == field, r.text


def test_read_trial_spells_nonfinite_summary(api):
    s = submit(api, spec(depth=[2], seeds=1, epochs=1))
    (t,) = api.get(f"/sweeps/{s['id']}/trials").json()["data"]
    rec = record(t["id"], 1, 2, train_loss=math.nan, test_loss=math.inf, test_acc=-math.inf)
    api.store.write_records([(t["id"], rec)])
    r = api.get(f"/trials/{t['id']}")
    assert r.status_code == 200
    assert "NaN" in r.text and ":NaN" not in r.text  # a string, never the bare token
    summary = r.json()["summary"]
    assert summary["train_loss"] == "NaN"
    assert summary["test_loss"] == "Infinity" and summary["test_acc"] == "-Infinity"
    assert summary["train_acc"] == value_of(t["id"], 1, INDEX["train_acc"])
    assert r.json()["last_epoch"] == 1


# --- metrics --------------------------------------------------------------------------------


def frame_of(payload: dict) -> pd.DataFrame:
    return pd.DataFrame(payload["data"], columns=payload["columns"])


def test_metrics_rows_join_config_and_hold_the_stored_values(api):
    s = submit(api, spec(depth=[2, 3], seeds=2))
    trials = fill(api, s["id"])
    r = api.get(f"/sweeps/{s['id']}/metrics")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["columns"] == ["trial_id", "depth", "seed", "epoch", "metric", "layer", "value"]
    per_trial = sum(
        (len(SCALAR_METRICS) + len(LAYER_METRICS) * t["config"]["depth"]) * 3 for t in trials
    )
    assert body["count"] == per_trial == len(body["data"])
    config = {t["id"]: t["config"] for t in trials}
    for row in body["data"]:
        c = config[row["trial_id"]]
        assert (row["depth"], row["seed"]) == (c["depth"], c["seed"])
        ell = row["layer"] or 0
        assert (row["layer"] is None) == (row["metric"] in SCALAR_METRICS)
        assert row["value"] == value_of(row["trial_id"], row["epoch"], INDEX[row["metric"]], ell)


def test_metrics_filters_metric_epoch_layer_and_config(api):
    s = submit(api, spec(depth=[2, 4], init=["gaussian", "orthogonal"], seeds=2))
    fill(api, s["id"])
    params = [
        ("metric", "grad_norm"),
        ("metric", "train_loss"),
        ("epoch", 0),
        ("epoch", 2),
        ("layer", 1),
        ("layer", 4),
        ("depth", 4),
        ("init", "orthogonal"),
    ]
    rows = frame_of(api.get(f"/sweeps/{s['id']}/metrics", params=params).json())
    assert set(rows["metric"]) == {"grad_norm", "train_loss"}
    assert set(rows["epoch"]) == {0, 2}
    assert set(rows["depth"]) == {4} and set(rows["init"]) == {"orthogonal"}
    grads = rows[rows["metric"] == "grad_norm"]
    assert sorted(set(grads["layer"])) == [1, 4]
    assert len(grads) == 2 * 2 * 2  # seeds × epochs × layers
    assert rows[rows["metric"] == "train_loss"]["layer"].isna().all()


def test_metrics_epoch_last_is_each_trials_highest_epoch(api):
    s = submit(api, spec(depth=[2], seeds=2, epochs=3))
    trials = api.get(f"/sweeps/{s['id']}/trials").json()["data"]
    short, full = trials[0]["id"], trials[1]["id"]
    batch = [(short, record(short, e, 2)) for e in range(2)]  # stopped after epoch 1
    batch += [(full, record(full, e, 2)) for e in range(4)]
    api.store.write_records(batch)
    rows = api.get(f"/sweeps/{s['id']}/metrics", params={"metric": "test_acc", "epoch": "last"})
    got = {r["trial_id"]: r["epoch"] for r in rows.json()["data"]}
    assert got == {short: 1, full: 3}
    r = api.get(f"/sweeps/{s['id']}/metrics", params=[("epoch", "last"), ("epoch", "2")])
    assert r.status_code == 422 and r.json()["error"]["field"] == "epoch"
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"epoch": "-1"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "epoch"


def test_metrics_aggregate_over_seeds_matches_hand_computation(api):
    s = submit(api, spec(depth=[2], seeds=3, epochs=1))
    trials = fill(api, s["id"])
    ids = [t["id"] for t in trials]
    # One seed's grad_norm at epoch 1, layer 2 turns NaN: the mean becomes NaN, n_finite 2.
    bad = record(ids[0], 1, 2)
    bad["grad_norm"] = np.array([bad["grad_norm"][0], math.nan])
    api.store.write_records([(ids[0], bad)])
    params = {"metric": ["test_loss", "grad_norm"], "aggregate": "true"}
    agg = frame_of(api.get(f"/sweeps/{s['id']}/metrics", params=params).json())
    assert list(agg.columns) == ["depth", "epoch", "metric", "layer", *AGGREGATE_COLUMNS]
    sd = 1000.0 * statistics.stdev(ids)  # values differ across seeds by 1000·trial_id
    t_975 = stats.t.ppf(0.975, df=len(ids) - 1)  # Student t quantile, 2 degrees of freedom
    for e in (0, 1):
        row = agg[(agg["metric"] == "test_loss") & (agg["epoch"] == e)].iloc[0]
        mean = statistics.mean(value_of(i, e, INDEX["test_loss"]) for i in ids)
        assert row["mean"] == pytest.approx(mean)
        assert row["std"] == pytest.approx(sd)
        assert row["ci95"] == pytest.approx(t_975 * sd / math.sqrt(3))
        assert row["count"] == 3 and row["n_finite"] == 3
    nan_row = agg[(agg["metric"] == "grad_norm") & (agg["epoch"] == 1) & (agg["layer"] == 2)]
    assert nan_row["mean"].item() == "NaN" and nan_row["n_finite"].item() == 2
    ok_row = agg[(agg["metric"] == "grad_norm") & (agg["epoch"] == 1) & (agg["layer"] == 1)]
    assert ok_row["n_finite"].item() == 3


SPECIALS = {"train_loss": math.nan, "test_loss": math.inf, "test_acc": -math.inf}


def _nonfinite_sweep(api):
    s = submit(api, spec(depth=[3], seeds=1, epochs=0))
    (t,) = api.get(f"/sweeps/{s['id']}/trials").json()["data"]
    rec = record(t["id"], 0, 3, **SPECIALS)
    rec["grad_norm"] = np.array([-math.inf, 0.1 + 0.2, math.nan])
    api.store.write_records([(t["id"], rec)])
    return s["id"], rec


def test_nonfinite_values_round_trip_through_json(api):
    sid, _ = _nonfinite_sweep(api)
    r = api.get(f"/sweeps/{sid}/metrics")
    for token in (":NaN", ":Infinity", ":-Infinity"):
        assert token not in r.text  # standard JSON only
    rows = r.json()["data"]
    got = {(x["metric"], x["layer"]): decode_float(x["value"]) for x in rows}
    for m, v in SPECIALS.items():
        assert math.isnan(got[(m, None)]) if math.isnan(v) else got[(m, None)] == v
    assert got[("grad_norm", 1)] == -math.inf and math.isnan(got[("grad_norm", 3)])
    assert got[("grad_norm", 2)] == 0.1 + 0.2  # shortest repr: bit-exact


def test_nonfinite_values_round_trip_through_csv_and_parquet(api):
    sid, _ = _nonfinite_sweep(api)
    as_json = frame_of(api.get(f"/sweeps/{sid}/metrics").json())
    expected = np.array([decode_float(v) for v in as_json["value"]])
    r = api.get(f"/sweeps/{sid}/metrics", params={"format": "csv"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert "NaN" in r.text and "-Infinity" in r.text
    csv = pd.read_csv(io.StringIO(r.text))
    assert list(csv.columns) == list(as_json.columns)
    got = csv["value"].to_numpy()
    assert np.array_equal(got, expected, equal_nan=True)
    assert np.array_equal(got.view("<u8")[np.isfinite(got)], expected.view("<u8")[np.isfinite(got)])
    assert csv["layer"].isna().sum() == len(SCALAR_METRICS)  # scalars: an empty field
    r = api.get(f"/sweeps/{sid}/metrics", params={"format": "parquet"})
    assert r.status_code == 200
    pq = pd.read_parquet(io.BytesIO(r.content))
    assert np.array_equal(pq["value"].to_numpy(), expected, equal_nan=True)
    assert pq["layer"].isna().sum() == len(SCALAR_METRICS)


def test_csv_streams_in_chunks_and_keeps_every_row(api, monkeypatch):
    import api.routes.metrics as route
    import api.tables as tables

    s = submit(api, spec(depth=[2, 3], seeds=2))
    fill(api, s["id"])
    monkeypatch.setattr(tables, "CSV_CHUNK_ROWS", 7)  # many chunks, one header
    sent: list[bytes] = []  # each chunk the route's generator hands the StreamingResponse
    chunks = route.csv_chunks

    def counted(*args, **kw):
        for chunk in chunks(*args, **kw):
            sent.append(chunk)
            yield chunk

    monkeypatch.setattr(route, "csv_chunks", counted)
    with api.client.stream("GET", f"/sweeps/{s['id']}/metrics", params={"format": "csv"}) as r:
        text = "".join(r.iter_text())
        assert r.headers.get("transfer-encoding") == "chunked"
    csv = pd.read_csv(io.StringIO(text))
    total = api.get(f"/sweeps/{s['id']}/metrics").json()["count"]
    assert len(csv) == total and text.count("trial_id") == 1
    assert total > 3 * 7 and len(sent) == math.ceil(total / 7)  # CSV_CHUNK_ROWS rows each
    assert b"".join(sent).decode() == text  # what was sent is what arrived, in order
    rows = [c.decode().count("\n") for c in sent]
    assert rows == [1 + 7] + [7] * (len(sent) - 2) + [total - 7 * (len(sent) - 1)]  # + header


def test_metrics_json_pages(api):
    s = submit(api, spec(depth=[2], seeds=2))
    fill(api, s["id"])
    whole = api.get(f"/sweeps/{s['id']}/metrics").json()
    page = api.get(f"/sweeps/{s['id']}/metrics", params={"offset": 5, "limit": 4}).json()
    assert page["count"] == whole["count"] and page["data"] == whole["data"][5:9]
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"limit": 10**6})
    assert r.status_code == 422 and r.json()["error"]["field"] == "limit"


def test_metrics_over_max_points_is_refused_naming_the_filters(start_api):
    api = start_api(max_points=20)
    s = submit(api, spec(depth=[4], seeds=2))
    fill(api, s["id"])
    r = api.get(f"/sweeps/{s['id']}/metrics")
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["type"] == "limit_exceeded" and err["field"] == "max_points"
    for name in ("metric=", "epoch=last", "layer=", "ISOSWEEP_MAX_POINTS"):
        assert name in err["message"]
    small = api.get(f"/sweeps/{s['id']}/metrics", params={"metric": "train_loss", "epoch": 0})
    assert small.status_code == 200 and small.json()["count"] == 2


def test_unknown_metric_and_query_parameters_are_422(api):
    s = submit(api, spec(depth=[2], seeds=1))
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"metric": "loss"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "metric"
    assert "train_loss" in r.json()["error"]["message"]
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"metrc": "train_loss"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "metrc"
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"format": "xlsx"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "format"
    r = api.get(f"/sweeps/{s['id']}/metrics", params={"lr": "nan"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "lr"


# --- plots ----------------------------------------------------------------------------------

KIND_PARAMS = {
    "layer_profile": {"metric": "isometry_gap/act"},
    "depth_scaling": {"metric": "grad_norm", "group_by": "init", "layer": 1},
    "training_curves": {"metric": ["train_loss", "test_acc"]},
    "heatmap": {"metric": "isometry_gap/act", "depth": 2, "init": "gaussian"},
    "theory_overlay": {"metric": "isometry_gap/norm", "x": "layer", "depth": 4},
}


@pytest.mark.parametrize("kind", PLOT_KINDS)
def test_every_plot_kind_as_png_and_svg(api, kind):
    s = submit(api, spec(depth=[2, 4], init=["gaussian", "orthogonal"], seeds=2))
    fill(api, s["id"])
    for fmt, media, magic in (("png", "image/png", b"\x89PNG"), ("svg", "image/svg+xml", b"<svg")):
        r = api.get(f"/sweeps/{s['id']}/plots/{kind}", params={**KIND_PARAMS[kind], "format": fmt})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == media
        assert magic in r.content[:400]


def test_plot_errors_name_the_field(api):
    s = submit(api, spec(depth=[2, 4], seeds=1))
    fill(api, s["id"])
    r = api.get(f"/sweeps/{s['id']}/plots/violin")
    assert r.status_code == 404
    assert all(k in r.json()["error"]["message"] for k in PLOT_KINDS)
    r = api.get(f"/sweeps/{s['id']}/plots/depth_scaling", params={"x": "colour"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "x"
    r = api.get(f"/sweeps/{s['id']}/plots/training_curves", params={"epoch": "last"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "epoch"
    r = api.get(f"/sweeps/{s['id']}/plots/layer_profile", params={"epoch": 99})
    # an epoch the sweep does not record is an error (not an empty figure)
    assert r.status_code == 422 and r.json()["error"]["field"] == "epoch"
    r = api.get(f"/sweeps/{s['id']}/plots/layer_profile", params={"format": "gif"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "format"


def test_plot_of_one_trial(api):
    s = submit(api, spec(depth=[2, 4], seeds=2))
    trials = fill(api, s["id"])
    other = submit(api, spec("other", depth=[2], seeds=1))
    r = api.get(
        f"/sweeps/{s['id']}/plots/training_curves",
        params={"trial": trials[3]["id"], "format": "svg"},
    )
    assert r.status_code == 200 and r.content.startswith(b"<?xml")
    (foreign,) = api.get(f"/sweeps/{other['id']}/trials").json()["data"]
    r = api.get(f"/sweeps/{s['id']}/plots/training_curves", params={"trial": foreign["id"]})
    assert r.status_code == 404 and f"sweep {other['id']}" in r.json()["error"]["message"]


# --- theory and health ----------------------------------------------------------------------


def test_theory_beta_of_relu_matches_the_closed_form(api):
    r = api.get("/theory/activations/relu")
    assert r.status_code == 200
    a = r.json()
    assert a["beta"] == pytest.approx((3 * math.pi - 4) / (2 * math.pi - 2), abs=1e-12)
    assert a["kappa_prime0"] == pytest.approx(2 - a["beta"], abs=1e-15)
    c = np.array(a["coefficients"])
    assert len(c) == 21
    assert c[1] == pytest.approx(0.5, abs=1e-13)  # E[X·max(X, 0)] = 1/2
    assert c[0] == pytest.approx(1 / math.sqrt(2 * math.pi), abs=1e-13)  # E max(X, 0)
    # β from the returned coefficients (K = 60 terms carry all but ~1e-4 of Σ cₖ²)
    c = np.array(api.get("/theory/activations/relu", params={"terms": 60}).json()["coefficients"])
    assert 2 - c[1] ** 2 / np.sum(c[1:] ** 2) == pytest.approx(a["beta"], abs=2e-3)
    step = api.get("/theory/activations/step").json()
    assert step["beta"] == pytest.approx(2 - 2 / math.pi, abs=1e-12)
    ident = api.get("/theory/activations/identity", params={"gain": 3}).json()
    assert ident["beta"] == pytest.approx(1.0, abs=1e-14) and ident["gain"] == 3.0


def test_theory_registry_and_errors(api):
    body = api.get("/theory/activations", params={"gain": 0.5, "terms": 5}).json()
    assert body["count"] == len(ACTIVATION_NAMES) == len(body["data"])
    assert [a["name"] for a in body["data"]] == list(ACTIVATION_NAMES)
    assert all(len(a["coefficients"]) == 6 and 1 <= a["beta"] <= 2 for a in body["data"])
    r = api.get("/theory/activations/swish")
    assert r.status_code == 404 and "relu" in r.json()["error"]["message"]
    for params, field in (
        ({"gain": 0}, "gain"),
        ({"gain": "inf"}, "gain"),
        ({"terms": 0}, "terms"),
    ):
        r = api.get("/theory/activations/relu", params=params)
        assert r.status_code == 422 and r.json()["error"]["field"] == field


def test_healthz_reports_the_database_and_ray(api, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    h = api.get("/healthz").json()
    assert h["status"] == "ok" and h["database"]["ok"] is True
    assert h["database"]["backend"] in ("sqlite", "postgresql")
    assert h["ray"]["address"] is None and h["ray"]["reachable"] is None
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # nothing listens on port 1
    h = api.get("/healthz").json()
    assert h["ray"]["address"] == "127.0.0.1:1" and h["ray"]["reachable"] is False


def test_healthz_with_a_small_page_size_counts_every_running_sweep(start_api, monkeypatch):
    """ISOSWEEP_MAX_PAGE_SIZE under healthz's own page must not read as a database failure."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    api = start_api(max_page_size=1)
    for name, runner in (("a", "r1"), ("b", "r2")):
        submit(api, spec(name, seeds=1))
        assert api.store.claim_sweep(runner, 60.0) is not None
    r = api.get("/healthz")
    assert r.status_code == 200, r.text
    h = r.json()
    assert h["status"] == "ok" and h["database"]["ok"] is True
    assert h["ray"]["running_sweeps"] == 2  # the total, though one page lists one sweep
    assert len(h["ray"]["runners"]) == 1 and "2 running sweep(s)" in h["ray"]["detail"]
    assert start_api(max_page_size=50).get("/healthz").json()["status"] == "ok"


def test_metrics_pooled_by_geomean_and_median_equal_the_raw_rows(api):
    s = submit(api, spec(depth=[2, 3], seeds=3, epochs=0))
    fill(api, s["id"])
    base = f"/sweeps/{s['id']}/metrics"
    raw = frame_of(api.get(base, params={"metric": "grad_norm"}).json())
    for stat, pool in (
        ("median", np.median),
        ("geomean", lambda v: float(np.exp(np.mean(np.log(v))))),
    ):
        params = {"metric": "grad_norm", "aggregate": "true", "stat": stat}
        agg = frame_of(api.get(base, params=params).json())
        assert stat in agg.columns
        for _, row in agg.iterrows():
            same = raw[(raw["depth"] == row["depth"]) & (raw["layer"] == row["layer"])]
            assert row[stat] == pytest.approx(pool(same["value"].astype(float)), rel=1e-12)
    for params in ({"stat": "median"}, {"stat": "mode", "aggregate": "true"}):
        r = api.get(base, params=params)
        assert r.status_code == 422 and r.json()["error"]["field"] == "stat", r.text
