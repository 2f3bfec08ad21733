"""Per-epoch 2-D arrays of a trial (service.config.SPECTRUM_KEYS), in the `spectra` table: the
eigenvalues of every measured Gram of one kind, (L, n), and the singular values of the
input–output Jacobian on the first k probe samples, (k, min(d, d_in)).

Unlike a metric row (one per-layer vector), a row here is a whole (rows, columns) array as
little-endian float64 bytes in C order, keyed by (trial, name, epoch). Writes reuse the metrics'
idempotent upsert (service.store.upserts): an epoch written again is replaced whole, and
arrays its new record no longer holds are deleted. Reads are bounded like every read: the values
are counted from the stored shapes before any blob is fetched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Select, Table, bindparam, delete, func, select
from sqlalchemy.orm import Session

from service.config import SPECTRUM_KEYS
from service.errors import InvalidInput, LimitExceeded
from service.store import codec
from service.store.models import SqlSpectrum, SqlTrial
from service.store.trials import get_trial_row
from service.store.upserts import CHUNK, upsert

SPECTRUM_TABLE: Table = SqlSpectrum.__table__  # type: ignore[assignment]
JACOBIAN_KEY = "jacobian_singular_values"
EpochArg = int | str | None  # a recorded epoch, "last" (the highest stored), or None (all)


@dataclass(frozen=True)
class Spectrum:
    """One stored array: `values` (rows, columns) float64 — rows are layers ℓ = 1..L for
    `spectrum/*`, probe samples i = 1..k for the Jacobian; one row when a layer was chosen."""

    name: str
    epoch: int
    values: np.ndarray
    layer: int | None = None  # the layer chosen, if one was


# --- writing --------------------------------------------------------------------------------


def record_rows(record: dict[str, Any], t: SqlTrial, epoch: int) -> list[dict[str, Any]]:
    """The spectra rows of one epoch record (keys of SPECTRUM_KEYS whose value is not None).

    Raises:
        InvalidInput: a value that is not a non-empty 2-D array of numbers, or a `spectrum/*`
            array without one row per layer.
    """
    rows = []
    for key in SPECTRUM_KEYS:
        if record.get(key) is None:
            continue
        a = _matrix(key, record[key])
        if key != JACOBIAN_KEY and a.shape[0] != t.depth:
            raise InvalidInput(
                f"has shape {a.shape}; a Gram spectrum has one row per layer, ({t.depth}, n)",
                field=f"record.{key}",
            )
        data = codec.encode(a.ravel())  # C order
        rows.append(
            {"trial_id": t.id, "name": key, "epoch": epoch, "shape": list(a.shape), "data": data}
        )
    return rows


def _matrix(key: str, value: Any) -> np.ndarray:
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInput("a 2-D array of numbers", field=f"record.{key}") from None
    if a.ndim != 2 or 0 in a.shape:
        raise InvalidInput(f"a non-empty 2-D array, got shape {a.shape}", field=f"record.{key}")
    return a


def write_spectra(s: Session, rows: list[dict[str, Any]], written: list[tuple[int, int]]) -> None:
    """Upsert `rows`; of the (trial, epoch)s in `written`, delete the stored arrays their rows
    lack (an epoch written again is replaced whole). One key-only query finds those first, so
    a batch of trials without spectra costs a single indexed read."""
    upsert(s, SPECTRUM_TABLE, rows, ("trial_id", "name", "epoch"), ("shape", "data"))
    if not written:
        return
    c = SPECTRUM_TABLE.c
    tids, epochs = sorted({t for t, _ in written}), sorted({e for _, e in written})
    found = s.execute(
        select(c.trial_id, c.epoch, c.name).where(c.trial_id.in_(tids), c.epoch.in_(epochs))
    ).all()
    keep = {(r["trial_id"], r["epoch"], r["name"]) for r in rows}
    asked = set(written)
    stale = [
        {"t": t, "e": e, "m": m} for t, e, m in found if (t, e) in asked and (t, e, m) not in keep
    ]
    gone = delete(SPECTRUM_TABLE).where(
        c.trial_id == bindparam("t"), c.epoch == bindparam("e"), c.name == bindparam("m")
    )
    for k in range(0, len(stale), CHUNK):
        s.execute(gone, stale[k : k + CHUNK])


# --- reading --------------------------------------------------------------------------------


def check_name(name: str | None) -> list[str]:
    if name is None:
        return list(SPECTRUM_KEYS)
    if name not in SPECTRUM_KEYS:
        raise InvalidInput(f"unknown spectrum {name!r}", field="name", allowed=SPECTRUM_KEYS)
    return [name]


def _check_int(value: Any, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise InvalidInput(f"an integer ≥ {low}, got {value!r}", field=field)
    return int(value)


def read_spectra(
    s: Session,
    trial_id: int,
    *,
    name: str | None,
    epoch: EpochArg,
    layer: int | None,
    max_points: int,
) -> list[Spectrum]:
    """The trial's stored arrays, by name then epoch (Store.spectra documents the arguments).
    A reused trial (results_from) reads the original trial's arrays."""
    t = get_trial_row(s, trial_id)
    names = check_name(name)
    if epoch is not None and epoch != "last":
        epoch = _check_int(epoch, "epoch", 0)
    if layer is not None:
        layer = _check_layer(layer, names, t.depth)
        names = [n for n in names if n != JACOBIAN_KEY]  # the Jacobian has no layers
    src = t.results_from or t.id
    q = _query(s, src, names, epoch)
    shapes = s.execute(q.add_columns(SqlSpectrum.shape)).scalars().all()
    points = sum(sh[1] if layer else sh[0] * sh[1] for sh in shapes)
    if points > max_points:
        raise LimitExceeded(
            f"the spectra would hold {points} values, over the limit of {max_points} (set by "
            "ISOSWEEP_MAX_POINTS); narrow it with name, epoch ('last' or a number) or layer",
            field="max_points",
        )
    sp = SqlSpectrum
    rows = s.execute(q.add_columns(sp.name, sp.epoch, sp.shape, sp.data)).all()
    order = {n: i for i, n in enumerate(SPECTRUM_KEYS)}
    rows = sorted(rows, key=lambda r: (order[r.name], r.epoch))
    return [_spectrum(r, layer) for r in rows]


def _check_layer(layer: Any, names: list[str], depth: int) -> int:
    if names == [JACOBIAN_KEY]:
        raise InvalidInput(
            f"{JACOBIAN_KEY} has one row per probe sample, not per layer; leave layer out",
            field="layer",
        )
    layer = _check_int(layer, "layer", 1)
    if layer > depth:
        raise InvalidInput(f"layer {layer} of a depth-{depth} trial: 1..{depth}", field="layer")
    return layer


def _query(s: Session, src: int, names: list[str], epoch: EpochArg) -> Select:
    """The rows the read returns (no columns yet).

    Raises:
        InvalidInput: an epoch number with none of the names stored, listing the stored ones.
    """
    sp = SqlSpectrum
    q = select().select_from(sp).where(sp.trial_id == src, sp.name.in_(names))
    if epoch == "last":  # the highest epoch stored, per name
        top = (
            select(sp.name, func.max(sp.epoch).label("top"))
            .where(sp.trial_id == src)
            .group_by(sp.name)
            .subquery()
        )
        return q.join(top, (top.c.name == sp.name) & (top.c.top == sp.epoch))
    if epoch is None:
        return q
    stored = s.scalars(
        select(sp.epoch).where(sp.trial_id == src, sp.name.in_(names)).distinct()
    ).all()
    if epoch not in stored:
        what = names[0] if len(names) == 1 else "spectra"
        if not stored:
            msg = f"no {what} stored for this trial (were spectra / jacobian_samples on?)"
            raise InvalidInput(msg, field="epoch")
        raise InvalidInput(
            f"epoch {epoch} has no {what} stored", field="epoch", allowed=sorted(stored)
        )
    return q.where(sp.epoch == epoch)


def _spectrum(row: Any, layer: int | None) -> Spectrum:
    values = codec.decode(row.data).reshape(row.shape)  # (rows, columns)
    if layer is not None:
        values = values[layer - 1 : layer]
    return Spectrum(row.name, row.epoch, values, layer)
