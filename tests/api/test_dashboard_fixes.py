"""Dashboard links the whole-surface test found refused: the compare page's default figure
(depth_scaling for sweeps that do not vary depth), the sweep page's theory_overlay link for a
family the theory does not cover, and a registered model's trial CSV (model_params as a Python
repr). Every figure and download a page links to is drawn or served, or — for a figure the
page cannot know beforehand — refused with the reason shown where the figure would be."""

from __future__ import annotations

import io
import re
from html import unescape

import pandas as pd
import pytest
from api_support import fill, spec, submit
from test_registered_models import EXAMPLE, registry, with_wide_mlp  # noqa: F401

from service.plots.compare import COMPARE_KINDS


def get(api, path):
    return api.client.get(api.url + path)


def html_of(api, path):
    r = get(api, path)
    assert r.status_code == 200, r.text[:2000]
    return r.text


def figures(html):
    return [unescape(s) for s in re.findall(r'<img data-plot src="([^"]+)"', html)]


def kind_links(html, sweep_id):
    return {
        kind: unescape(href)
        for href, kind in re.findall(
            rf'<a href="(/sweeps/{sweep_id}\?kind=[^"]*)"(?: class="current")?>(\w+)</a>', html
        )
    }


def example_sweep(api) -> tuple[int, list[dict]]:
    """examples/registered_model/spec.yaml (6 trials of wide_mlp, a model_params axis), each
    trial given epochs 0..2 of train_loss and of the per-layer rms and isometry_gap/output."""
    import numpy as np

    text = (EXAMPLE / "spec.yaml").read_text(encoding="utf-8")
    r = api.post("/sweeps", content=text, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    trials = api.get(f"/sweeps/{sweep_id}/trials").json()["data"]
    for t in trials:
        api.store.start_trial(t["id"])
        layers = np.arange(1, t["config"]["depth"] + 1.0)
        api.store.write_records(
            [
                (t["id"], {"epoch": e, "train_loss": 1.0 + e, "rms": 1.0 + layers,
                           "isometry_gap/output": 0.1 * layers})
                for e in range(3)
            ]
        )  # fmt: skip
        api.store.finish_trial(t["id"], "completed")
    return sweep_id, trials


# --- 1. the compare page's default figure ----------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"depth": 3}, {"depth": 3, "init": "orthogonal"}),  # neither varies depth
        ({"depth": [2, 3]}, {"depth": 3, "init": "orthogonal"}),  # one has a fixed depth
    ],
)
def test_the_compare_pages_default_figure_is_drawn(api, first, second):
    a = submit(api, spec("a", seeds=2, **first))
    b = submit(api, spec("b", seeds=2, **second))
    fill(api, a["id"])
    fill(api, b["id"])
    html = html_of(api, f"/compare?sweep={a['id']}&sweep={b['id']}")
    (src,) = figures(html)
    r = get(api, src)
    assert r.status_code == 200, (src, r.text)
    assert b"<svg" in r.content[:2000]


def test_the_compare_page_takes_depth_scaling_when_every_sweep_varies_depth(api):
    a = submit(api, spec("a", seeds=1, depth=[2, 3]))
    b = submit(api, spec("b", seeds=1, depth=[2, 3], init="orthogonal"))
    fill(api, a["id"])
    fill(api, b["id"])
    (src,) = figures(html_of(api, f"/compare?sweep={a['id']}&sweep={b['id']}"))
    assert "/compare/plots/depth_scaling?" in src
    assert get(api, src).status_code == 200


def test_the_compare_and_sweep_pages_share_the_figure_that_says_why_it_is_refused(api):
    """A refused figure's reason goes under it (static/dashboard.js fills the caption): the
    compare page has the same figure as the sweep page, an asked-for figure refused there too."""
    a = submit(api, spec("a", seeds=1, depth=3))
    b = submit(api, spec("b", seeds=1, depth=3, init="orthogonal"))
    fill(api, a["id"])
    fill(api, b["id"])
    compare = html_of(api, f"/compare?sweep={a['id']}&sweep={b['id']}&kind=depth_scaling")
    sweep = html_of(api, f"/sweeps/{a['id']}")

    def figure(html):
        m = re.search(r'<figure class="plot[^"]*"[^>]*>(.*?)</figure>', html, re.S)
        assert m, "no figure"
        return re.sub(r'src="[^"]*"|alt="[^"]*"|aria-label="[^"]*"', "", m.group(1))

    assert figure(compare) == figure(sweep)
    assert '<figcaption class="plot-error" role="status" hidden></figcaption>' in compare


@pytest.mark.parametrize("kind", COMPARE_KINDS)
def test_every_compare_kind_with_its_defaults_is_drawn_or_says_why(api, kind):
    a = submit(api, spec("a", seeds=1, depth=3))
    b = submit(api, spec("b", seeds=1, depth=[2, 3]))
    fill(api, a["id"])
    fill(api, b["id"])
    (src,) = figures(html_of(api, f"/compare?sweep={a['id']}&sweep={b['id']}&kind={kind}"))
    r = get(api, src)
    assert r.status_code in (200, 422), r.text
    if r.status_code == 422:
        assert "did you mean" not in r.text and "does not record" not in r.text


# --- 2. the sweep page's kind links ----------------------------------------------------------


def every_kind_link_is_drawn(api, sweep_id):
    html = html_of(api, f"/sweeps/{sweep_id}")
    links = kind_links(html, sweep_id)
    assert links, "no kind links"
    refused = {}
    for kind, href in links.items():
        for src in figures(html_of(api, href)):
            r = get(api, src)
            if r.status_code != 200:
                refused[kind] = (src, r.status_code, r.text[:300])
    return links, refused


def overlay_refuses(api, sweep_id, metric):
    """The route's answer to a theory overlay of `metric`: a 422 naming the metrics it takes
    for this sweep (service.plots.overlay), which `metric` is not among."""
    r = get(api, f"/api/v1/sweeps/{sweep_id}/plots/theory_overlay?metric={metric}&format=svg")
    assert r.status_code == 422 and r.json()["error"]["field"] == "metric", r.text
    assert metric not in (r.json()["error"].get("allowed") or []), r.text


def test_a_transformers_kind_links_are_drawn(api):
    """The theory does not cover a transformer with MLP sublayers (mlp_ratio 4, the default): no
    theory_overlay link, where the page proposed a refused isometry_gap/residual."""
    s = submit(api, spec("tf", seeds=1, model="transformer", depth=[2, 3]))
    fill(api, s["id"])
    links, refused = every_kind_link_is_drawn(api, s["id"])
    assert not refused, refused
    assert "theory_overlay" not in links and "layer_profile" in links
    overlay_refuses(api, s["id"], "isometry_gap/residual")
    page = html_of(api, f"/sweeps/{s['id']}")
    assert '<option value="theory_overlay"' not in page


def test_an_mlps_theory_overlay_link_draws_the_theorys_gap(api):
    s = submit(api, spec("mlp", seeds=1, depth=[2, 3], norm="layer"))
    fill(api, s["id"])
    links, refused = every_kind_link_is_drawn(api, s["id"])
    assert not refused, refused
    assert "metric=isometry_gap%2Fnorm" in links["theory_overlay"]


def test_a_registered_models_kind_links_are_drawn(api, with_wide_mlp):  # noqa: F811
    sweep_id, _ = example_sweep(api)
    links, refused = every_kind_link_is_drawn(api, sweep_id)
    assert not refused, refused
    assert "theory_overlay" not in links and "heatmap" in links
    overlay_refuses(api, sweep_id, "isometry_gap/output")


def test_a_wide_batch_mlps_overlay_draws_the_gap_not_its_range_gap(api):
    """n > d: the family's default is the range gap, which the overlay does not take; its link
    draws the gap itself (+∞, pinned and counted) rather than a refused range gap."""
    s = submit(api, spec("wide", seeds=1, depth=[2, 3], norm="none", batch_size=16, width=8))
    fill(api, s["id"], gram=False)
    links, refused = every_kind_link_is_drawn(api, s["id"])
    assert not refused, refused
    assert "metric=isometry_gap%2Fact" in links["theory_overlay"]
    assert "metric=range_isometry_gap%2Fact" in links["layer_profile"]
    overlay_refuses(api, s["id"], "range_isometry_gap/act")


# --- 3. a registered model's trial CSV -------------------------------------------------------


def test_a_registered_models_trial_csv_is_its_own_rows(api, with_wide_mlp):  # noqa: F811
    sweep_id, trials = example_sweep(api)
    for t in trials:
        html = html_of(api, f"/trials/{t['id']}")
        csv = unescape(re.search(r'<a href="([^"]+format=csv[^"]*)">', html).group(1))
        assert "{" not in csv and "%7B" not in csv, csv
        r = get(api, csv)
        assert r.status_code == 200, (csv, r.text)
        frame = pd.read_csv(io.StringIO(r.text))
        stored = api.store.read_metrics(sweep_id)
        assert set(frame["trial_id"]) == {t["id"]}
        assert len(frame) == (stored["trial_id"] == t["id"]).sum() == 3 * (1 + 8 + 8)  # 3 metrics


@pytest.mark.parametrize(
    ("other", "kind", "metric"),
    [
        ("mlp", "training_curves", None),  # no gap both record: the losses
        ("resmlp", "layer_profile", "isometry_gap%2Fresidual"),  # the stream's gap, both record
    ],
)
def test_comparing_a_transformer_with_another_family_draws_what_both_record(
    api, other, kind, metric
):
    a = submit(api, spec("tf", seeds=1, model="transformer", depth=3))
    b = submit(api, spec(other, seeds=1, model=other, depth=3))
    fill(api, a["id"])
    fill(api, b["id"])
    (src,) = figures(html_of(api, f"/compare?sweep={a['id']}&sweep={b['id']}"))
    assert f"/compare/plots/{kind}?" in src and (metric is None or f"metric={metric}" in src)
    r = get(api, src)
    assert r.status_code == 200, (src, r.text)
