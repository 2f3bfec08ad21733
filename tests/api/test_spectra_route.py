"""GET /trials/{id}/spectra and /trials/{id}/plots/{spectrum,jacobian_spectrum} on a live server
(SQLite and Postgres): stored arrays come back exactly, NaN/±inf spelled as the API spells them,
filters, and errors in the one shape naming the field and the allowed values."""

import math

import numpy as np
from api_support import record, spec, submit

from service import config
from service.plots.spectra import SPECTRUM_PLOT_KINDS

# an MLP's spectrum keys (with norm and jacobian_samples): what its records hold
SPECTRUM_KEYS = (
    "spectrum/linear",
    "spectrum/norm",
    "spectrum/act",
    "spectrum/weight",
    "jacobian_singular_values",
)

DEPTH, N, K, M = 3, 4, 2, 8  # spec(): batch_size 4, width 8; d_in of digits is 64


def arrays(epoch: int, depth: int = DEPTH) -> dict[str, np.ndarray]:
    out = {}
    for i, key in enumerate(SPECTRUM_KEYS):
        rows, cols = (K, M) if key == "jacobian_singular_values" else (depth, N)
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        out[key] = 2.0 ** -(c + 1) * (1 + i + r + epoch)  # positive, descending per row
    out["spectrum/norm"][0, 1:] = [math.nan, math.inf, -math.inf]
    return out


def _trials(api, depths=(DEPTH,), epochs=(0, 2)):
    s = submit(api, spec(depth=list(depths), seeds=1, epochs=2, spectra=True, jacobian_samples=K))
    trials = api.get(f"/sweeps/{s['id']}/trials").json()["data"]
    batch = []
    for t in trials:
        d = t["config"]["depth"]
        batch += [(t["id"], {**record(t["id"], e, d), **arrays(e, d)}) for e in epochs]
    api.store.write_records(batch)
    return trials


def decode(values):
    return np.array([[float(v) for v in row] for row in values])


def test_spectra_come_back_exactly_with_nonfinite_spelled(api):
    (t,) = _trials(api)
    r = api.get(f"/trials/{t['id']}/spectra")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["data"]) == 2 * len(SPECTRUM_KEYS)
    assert [(s["name"], s["epoch"]) for s in body["data"]] == [
        (k, e) for k in SPECTRUM_KEYS for e in (0, 2)
    ]
    for s in body["data"]:
        want = arrays(s["epoch"])[s["name"]]
        assert s["shape"] == list(want.shape) and s["layer"] is None
        np.testing.assert_array_equal(decode(s["values"]), want)
    norm0 = next(s for s in body["data"] if s["name"] == "spectrum/norm" and s["epoch"] == 0)
    assert norm0["values"][0][1:] == ["NaN", "Infinity", "-Infinity"]
    assert "NaN" not in r.text.replace('"NaN"', "")  # never the bare JSON token


def test_filters_name_epoch_last_and_layer(api):
    (t,) = _trials(api)
    url = f"/trials/{t['id']}/spectra"
    body = api.get(url, params={"name": "jacobian_singular_values", "epoch": "last"}).json()
    assert body["count"] == 1 and body["data"][0]["epoch"] == 2
    assert body["data"][0]["shape"] == [K, M]
    body = api.get(url, params={"epoch": 0, "layer": 2}).json()
    assert [s["name"] for s in body["data"]] == [k for k in SPECTRUM_KEYS if "spectrum/" in k]
    for s in body["data"]:
        assert s["layer"] == 2 and s["shape"] == [1, N]
        np.testing.assert_array_equal(decode(s["values"])[0], arrays(0)[s["name"]][1])


def test_errors_name_the_field_and_the_allowed_values(api):
    (t,) = _trials(api)
    url = f"/trials/{t['id']}/spectra"
    r = api.get("/trials/999999/spectra")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    cases = [
        ({"name": "spectrum/gram"}, "name", list(config.SPECTRUM_KEYS)),
        ({"epoch": 1}, "epoch", ["0", "2"]),
        ({"epoch": "first"}, "epoch", None),
        ({"layer": 0}, "layer", None),
        ({"layer": DEPTH + 1}, "layer", None),
        ({"name": "jacobian_singular_values", "layer": 1}, "layer", None),
        ({"layers": 1}, "layers", ["epoch", "layer", "name"]),
    ]
    for params, field, allowed in cases:
        r = api.get(url, params=params)
        assert r.status_code == 422, (params, r.text)
        err = r.json()["error"]
        assert err["field"] == field and err["type"] == "invalid_input", params
        assert err["allowed"] == allowed, params


def test_a_trial_without_spectra_has_none(api):
    s = submit(api, spec(depth=[2], seeds=1))
    (t,) = api.get(f"/sweeps/{s['id']}/trials").json()["data"]
    api.store.write_records([(t["id"], record(t["id"], 0, 2))])
    assert api.get(f"/trials/{t['id']}/spectra").json() == {"data": [], "count": 0}
    r = api.get(f"/trials/{t['id']}/spectra", params={"epoch": 0})
    assert r.status_code == 422 and "jacobian_samples" in r.json()["error"]["message"]


def test_over_the_bound_is_refused(start_api):
    api = start_api(max_points=2 * DEPTH * N)
    (t,) = _trials(api)
    r = api.get(f"/trials/{t['id']}/spectra")
    assert r.status_code == 422 and r.json()["error"]["field"] == "max_points"
    assert api.get(f"/trials/{t['id']}/spectra", params={"epoch": 0, "layer": 1}).status_code == 200


# --- plots ------------------------------------------------------------------------------------


def test_both_plot_kinds_as_png_and_svg(api):
    shallow, deep = _trials(api, depths=(2, 5))
    params = {
        "spectrum": {"name": "spectrum/weight", "layer": [1, 5], "epoch": 0},
        "jacobian_spectrum": {"compare": [shallow["id"]]},
    }
    for kind in SPECTRUM_PLOT_KINDS:
        for fmt, media, magic in (
            ("png", "image/png", b"\x89PNG"),
            ("svg", "image/svg+xml", b"<svg"),
        ):
            r = api.get(
                f"/trials/{deep['id']}/plots/{kind}", params={**params[kind], "format": fmt}
            )
            assert r.status_code == 200, r.text
            assert r.headers["content-type"] == media and magic in r.content[:400]
    svg = api.get(
        f"/trials/{deep['id']}/plots/jacobian_spectrum", params={**params["jacobian_spectrum"],
        "format": "svg"},
    ).text  # fmt: skip
    assert f"trial {shallow['id']}: depth 2" in svg and f"trial {deep['id']}: depth 5" in svg
    assert "dynamical isometry" in svg


def test_plot_errors(api):
    (t,) = _trials(api)
    url = f"/trials/{t['id']}/plots"
    r = api.get(f"{url}/violin")
    assert r.status_code == 404 and all(
        k in r.json()["error"]["message"] for k in SPECTRUM_PLOT_KINDS
    )
    cases = [
        ("spectrum", {"compare": t["id"]}, "compare"),
        ("spectrum", {"name": "jacobian_singular_values"}, "name"),
        ("spectrum", {"layer": DEPTH + 1}, "layer"),
        ("spectrum", {"epoch": 1}, "epoch"),
        ("jacobian_spectrum", {"layer": 1}, "layer"),
        ("jacobian_spectrum", {"name": "spectrum/act"}, "name"),
        ("jacobian_spectrum", {"format": "gif"}, "format"),
    ]
    for kind, params, field in cases:
        r = api.get(f"{url}/{kind}", params=params)
        assert r.status_code == 422, (kind, params, r.text)
        assert r.json()["error"]["field"] == field, (kind, params)
    r = api.get(f"{url}/jacobian_spectrum", params={"compare": 999999})
    assert r.status_code == 404


def test_a_plot_of_nothing_stored_says_so(api):
    s = submit(api, spec(depth=[2], seeds=1))
    (t,) = api.get(f"/sweeps/{s['id']}/trials").json()["data"]
    api.store.write_records([(t["id"], record(t["id"], 0, 2))])
    for kind in SPECTRUM_PLOT_KINDS:
        r = api.get(f"/trials/{t['id']}/plots/{kind}", params={"format": "svg"})
        assert r.status_code == 200 and "no data" in r.text
