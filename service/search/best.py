"""The best trial so far of a sweep with a search objective or an early-stopping metric
(docs/api.md, "Adaptive search"): what `GET /api/v1/sweeps/{id}` reports as `best`."""

from __future__ import annotations

import math
from typing import Any

from service.errors import InvalidInput, LimitExceeded
from service.status import TrialStatus


def objective_of(spec: dict[str, Any]) -> dict[str, Any] | None:
    """(metric, layer, mode, epoch) of a stored spec's objective: a tpe search's, else its
    early_stop metric at the last epoch; None when it has neither."""
    search = spec.get("search") or {}
    if search.get("kind") == "tpe":
        return {
            "metric": search["objective"],
            "layer": search.get("layer"),
            "mode": search.get("mode", "min"),
            "epoch": search.get("epoch", "last"),
        }
    stop = spec.get("early_stop")
    if stop:
        return {"metric": stop["metric"], "layer": stop.get("layer"), "mode": stop.get("mode",
                "min"), "epoch": "last"}  # fmt: skip
    return None


def best_trial(store: Any, sweep_id: int, spec: dict[str, Any]) -> dict[str, Any] | None:
    """{trial_id, value, metric, mode, epoch} of the completed trial with the best objective
    (its value at `epoch`: the last record, or the last at or before K; non-finite values never
    win), or None when the spec has no objective or no completed trial has a value."""
    obj = objective_of(spec)
    if obj is None:
        return None
    try:
        frame = store.read_metrics(
            sweep_id,
            metrics=[obj["metric"]],
            layers=None if obj["layer"] is None else [obj["layer"]],
            epoch="last" if obj["epoch"] == "last" else None,
        )
    except (InvalidInput, LimitExceeded):  # nothing recorded yet, or too much to weigh here
        return None
    if frame.empty:
        return None
    if obj["layer"] is not None:
        frame = frame[frame["layer"] == obj["layer"]]
    if obj["epoch"] != "last":
        frame = frame[frame["epoch"] <= obj["epoch"]]
    trials = completed_ids(store, sweep_id)
    frame = frame[frame["trial_id"].isin(trials)]
    last = frame.sort_values(["trial_id", "epoch"]).groupby("trial_id").tail(1)
    best = None
    for tid, epoch, value in last[["trial_id", "epoch", "value"]].itertuples(index=False):
        if not math.isfinite(value):
            continue
        better = best is None or (value < best[2] if obj["mode"] == "min" else value > best[2])
        if better:
            best = (int(tid), int(epoch), float(value))
    if best is None:
        return None
    return {"trial_id": best[0], "value": best[2], "epoch": best[1], "metric": obj["metric"],
            "mode": obj["mode"]}  # fmt: skip


def completed_ids(store: Any, sweep_id: int) -> set[int]:
    out: set[int] = set()
    offset, page_size = 0, store.settings.max_page_size
    while True:
        page, total = store.list_trials(
            sweep_id, status=TrialStatus.COMPLETED, offset=offset, limit=page_size
        )
        out |= {t.id for t in page}
        offset += len(page)
        if not page or offset >= total:
            return out
