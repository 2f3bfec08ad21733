"""Writing epoch records (docs/architecture.md, "The epoch record"): batched, idempotent upserts
keyed by (trial, metric, epoch), never one round trip per value."""

from __future__ import annotations

from numbers import Real
from typing import Any

import numpy as np
from sqlalchemy import Table, bindparam, delete, select
from sqlalchemy.orm import Session

from service import jsonfmt
from service.config import LAYER_METRICS, RECORD_KEYS, SCALAR_METRICS, SPECTRUM_KEYS
from service.errors import Conflict, InvalidInput, NotFound
from service.metric_names import LOOP_NAME_MAX, LOOP_PREFIX, is_scalar_metric
from service.models import is_layer_metric, known_metrics
from service.store import codec, spectra
from service.store.models import SqlArtifact, SqlMetric, SqlTrial
from service.store.upserts import CHUNK, upsert

METRIC_TABLE: Table = SqlMetric.__table__  # type: ignore[assignment]
ARTIFACT_TABLE: Table = SqlArtifact.__table__  # type: ignore[assignment]


def write_records(s: Session, batch: list[tuple[int, dict[str, Any]]]) -> None:
    if not batch:
        return
    trials = _lock_trials(s, sorted({tid for tid, _ in batch}))
    latest: dict[tuple[int, int], dict[str, Any]] = {}
    for tid, record in batch:  # the same epoch twice in one batch: the later record wins
        key = (tid, _epoch(record, trials[tid]))
        latest.pop(key, None)
        latest[key] = record
    rows: list[dict[str, Any]] = []
    stale: list[dict[str, Any]] = []
    known = known_metrics()  # METRICS and the lab's per-tap metrics
    artifacts: list[dict[str, Any]] = []
    arrays: list[dict[str, Any]] = []  # the spectra table's rows (service.store.spectra)
    # An epoch written again loses the known metrics it no longer has; a user's loop/ scalars
    # (external trials, whose stored steps are never rewritten: service/store/external.py) are
    # not listed here.
    for (tid, epoch), record in latest.items():
        t = trials[tid]
        found = _metric_rows(record, t, epoch)
        arrays.extend(spectra.record_rows(record, t, epoch))
        rows.extend(found)
        present = {r["metric"] for r in found}
        stale.extend({"t": tid, "e": epoch, "m": m} for m in known if m not in present)
        if record.get("input_gram") is not None:
            artifacts.append(_gram_row(tid, record["input_gram"]))
        if record.get("input_moments") is not None:
            artifacts.append(_moments_row(tid, record["input_moments"]))
        _advance(t, epoch, record)
    upsert(s, METRIC_TABLE, rows, ("trial_id", "metric", "epoch"), ("n", "data"))
    upsert(s, ARTIFACT_TABLE, artifacts, ("trial_id", "name"), ("shape", "data"))
    spectra.write_spectra(s, arrays, list(latest))
    if stale:  # an epoch written again is replaced whole, metrics it no longer has included
        m = METRIC_TABLE.c
        gone = delete(METRIC_TABLE).where(
            m.trial_id == bindparam("t"), m.epoch == bindparam("e"), m.metric == bindparam("m")
        )
        for k in range(0, len(stale), CHUNK):
            s.execute(gone, stale[k : k + CHUNK])
    s.flush()


def _lock_trials(s: Session, ids: list[int]) -> dict[int, SqlTrial]:
    """The batch's trials, row-locked in id order (concurrent writers cannot deadlock)."""
    found: dict[int, SqlTrial] = {}
    for k in range(0, len(ids), CHUNK):
        q = select(SqlTrial).where(SqlTrial.id.in_(ids[k : k + CHUNK])).order_by(SqlTrial.id)
        found.update({t.id: t for t in s.scalars(q.with_for_update())})
    for tid in ids:
        if tid not in found:
            raise NotFound(f"no trial with id {tid}")
        if found[tid].results_from is not None:
            raise Conflict(f"trial {tid} reuses the results of trial {found[tid].results_from}")
    return found


def _epoch(record: dict[str, Any], t: SqlTrial) -> int:
    epoch = record.get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer):
        raise InvalidInput("every record needs an integer epoch", field="record.epoch")
    if not 0 <= epoch <= t.epochs:
        raise InvalidInput(
            f"epoch {epoch} is outside 0..{t.epochs} of trial {t.id}", field="record.epoch"
        )
    return int(epoch)


def _metric_rows(record: dict[str, Any], t: SqlTrial, epoch: int) -> list[dict[str, Any]]:
    rows = []
    for key, value in record.items():
        if key in RECORD_KEYS or key in SPECTRUM_KEYS:  # SPECTRUM_KEYS: service.store.spectra
            continue
        if is_scalar_metric(key):  # SCALAR_METRICS, or a user's loop/<name> (metric_names)
            data = codec.encode(_scalar(key, value))
        elif key in LAYER_METRICS or is_layer_metric(key):  # is_layer_metric: a lab's metric
            data = codec.encode(_vector(key, value, t.depth))
        elif key.startswith(LOOP_PREFIX):
            raise InvalidInput(
                f"a user's scalar is {LOOP_PREFIX}<name>, a name [A-Za-z_][A-Za-z0-9_.]* of at "
                f"most {LOOP_NAME_MAX} characters",
                field=f"record.{key}",
            )
        else:
            raise InvalidInput(
                "unknown metric",
                field=f"record.{key}",
                allowed=(*known_metrics(), f"{LOOP_PREFIX}<name>", *RECORD_KEYS, *SPECTRUM_KEYS),
            )
        rows.append(
            {"trial_id": t.id, "metric": key, "epoch": epoch, "n": len(data) // 8, "data": data}
        )
    return rows


def _scalar(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidInput(f"a number, got {value!r}", field=f"record.{key}")
    return float(value)


def _vector(key: str, value: Any, depth: int) -> np.ndarray:
    try:
        v = np.asarray(value, dtype=np.float64)  # (L,)
    except (TypeError, ValueError):
        raise InvalidInput("a vector of numbers", field=f"record.{key}") from None
    if v.shape != (depth,):
        raise InvalidInput(
            f"has shape {v.shape}; a per-layer metric has one value per layer, ({depth},)",
            field=f"record.{key}",
        )
    return v


def _moments_row(tid: int, moments: Any) -> dict[str, Any]:
    try:
        m = np.asarray(moments, dtype=np.float64)  # (n,)
    except (TypeError, ValueError):
        raise InvalidInput("a vector of numbers", field="record.input_moments") from None
    if m.ndim != 1:
        raise InvalidInput(f"a vector (n,), got shape {m.shape}", field="record.input_moments")
    return {
        "trial_id": tid,
        "name": "input_moments",
        "shape": list(m.shape),
        "data": codec.encode(m),
    }


def _gram_row(tid: int, gram: Any) -> dict[str, Any]:
    g = np.asarray(gram, dtype=np.float64)  # (n, n)
    if g.ndim != 2 or g.shape[0] != g.shape[1]:
        raise InvalidInput(f"a square matrix, got shape {g.shape}", field="record.input_gram")
    return {"trial_id": tid, "name": "input_gram", "shape": list(g.shape), "data": codec.encode(g)}


def _advance(t: SqlTrial, epoch: int, record: dict[str, Any]) -> None:
    """The trial's progress, divergence and summary after this record."""
    k = t.record_every
    n_recorded = epoch // k + 1 + (1 if epoch == t.epochs and epoch % k else 0)
    t.epochs_done = max(t.epochs_done, min(n_recorded, t.epochs_total))
    if record.get("diverged"):
        t.diverged_epoch = epoch
    if t.last_epoch is None or epoch >= t.last_epoch:
        t.last_epoch = epoch
        t.summary = {
            m: jsonfmt.encode_float(float(record[m])) for m in SCALAR_METRICS if m in record
        }
