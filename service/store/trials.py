"""Trial operations inside one transaction (a Session); the Store wraps each in its own."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import delete, false, func, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from service import jsonfmt
from service.config import FILTER_FIELDS
from service.errors import Conflict, InvalidInput, NotFound
from service.param_columns import param_of, spec_param_axes
from service.settings import Settings
from service.spec import validate_field
from service.status import TrialStatus
from service.store.models import (
    FINISHED_TRIAL,
    TRIAL_STATUSES,
    SqlArtifact,
    SqlMetric,
    SqlSpectrum,
    SqlTrial,
    utcnow,
)
from service.store.param_filters import param_condition
from service.store.schemas import TrialInfo
from service.store.sweeps import UNFINISHED_TRIAL, check_page, check_status, get_sweep_row

# Finished for good: a failed trial may start again (Tune's retry, or a resumed sweep's run).
FINAL_TRIAL = (
    TrialStatus.COMPLETED,
    TrialStatus.DIVERGED,
    TrialStatus.CANCELLED,
    TrialStatus.STOPPED,
)


def trial_info(t: SqlTrial) -> TrialInfo:
    summary = {k: jsonfmt.decode_float(v) for k, v in (t.summary or {}).items()}
    return TrialInfo(
        id=t.id,
        sweep_id=t.sweep_id,
        index=t.index,
        config=t.config,
        config_hash=t.config_hash,
        status=t.status,
        attempts=t.attempts,
        error=t.error,
        started_at=t.started_at,
        finished_at=t.finished_at,
        # epochs count training (8/8 for an 8-epoch run); the stored columns count records
        # (9 there: epoch 0's too), which progress and the driver weigh
        epochs_done=t.last_epoch or 0,
        epochs_total=t.epochs,
        records_done=t.epochs_done,
        records_total=t.epochs_total,
        last_epoch=t.last_epoch,
        diverged_epoch=t.diverged_epoch,
        results_from=t.results_from,
        summary=summary,
    )


def get_trial_row(s: Session, trial_id: int, *, lock: bool = False) -> SqlTrial:
    q = select(SqlTrial).where(SqlTrial.id == trial_id)
    if lock:
        q = q.with_for_update()
    t = s.scalars(q).one_or_none()
    if t is None:
        raise NotFound(f"no trial with id {trial_id}")
    return t


def free_params(spec: Mapping[str, Any] | None) -> set[str]:
    """An external sweep's model parameters — isosweep.Monitor's free-form config, which no
    params class types (service/store/external.py) —; none for other sweeps."""
    if not (spec or {}).get("external"):
        return set()
    return {p for c in spec_param_axes(spec or {}) if (p := param_of(c)) is not None}


def where_conditions(where: dict[str, Any] | None, free: Collection[str] = ()) -> list[Any]:
    """SQL conditions for config filters: field → value, or a list of values (any of them);
    `free`: an external sweep's untyped model parameters (service.store.param_filters).

    Raises:
        InvalidInput: an unknown field (naming it and listing the fields), or a bad value.
    """
    conditions: list[ColumnElement[bool]] = []
    for name, value in (where or {}).items():
        field = f"where.{name}"
        if name not in FILTER_FIELDS:  # model_params.<name>, or an error naming the fields
            conditions.append(param_condition(name, value, where=field, free=free))
            continue
        col = getattr(SqlTrial, name)
        values = value if isinstance(value, list | tuple) else [value]
        if not values:
            conditions.append(false())
            continue
        parsed = [validate_field(name, v, where=field) for v in values]
        present = [v for v in parsed if v is not None]
        either = [col.in_(present)] if present else []
        if len(present) < len(parsed):
            either.append(col.is_(None))
        conditions.append(or_(*either))
    return conditions


def list_trials(
    s: Session,
    sweep_id: int,
    status: str | None,
    where: dict[str, Any] | None,
    offset: int,
    limit: int,
    settings: Settings,
) -> tuple[list[TrialInfo], int]:
    check_page(offset, limit, settings)
    sweep = get_sweep_row(s, sweep_id)
    conds = where_conditions(where, free_params(sweep.spec))
    q = select(SqlTrial).where(SqlTrial.sweep_id == sweep_id, *conds)
    if status is not None:
        check_status(status, TRIAL_STATUSES)
        q = q.where(SqlTrial.status == status)
    total = s.scalar(select(func.count()).select_from(q.subquery()))
    page = s.scalars(q.order_by(SqlTrial.index).offset(offset).limit(limit))
    return [trial_info(t) for t in page], int(total or 0)


def _runnable(sweep_id: int) -> tuple[ColumnElement[bool], ...]:
    return (
        SqlTrial.sweep_id == sweep_id,
        SqlTrial.status.in_(UNFINISHED_TRIAL),
        SqlTrial.results_from.is_(None),
    )


def runnable_trials(
    s: Session, sweep_id: int, after_index: int | None = None, limit: int | None = None
) -> list[TrialInfo]:
    """The trials still to run in expansion order; with `after_index` and `limit`, one keyset
    page of them (index > after_index), read along the (sweep_id, index) unique index, so that
    a page costs the same however large the sweep is and however far it has got."""
    get_sweep_row(s, sweep_id)
    q = select(SqlTrial).where(*_runnable(sweep_id)).order_by(SqlTrial.index)
    if after_index is not None:
        q = q.where(SqlTrial.index > after_index)
    if limit is not None:
        if limit < 1:
            raise InvalidInput("must be ≥ 1", field="limit")
        q = q.limit(limit)
    return [trial_info(t) for t in s.scalars(q)]


def runnable_totals(s: Session, sweep_id: int) -> tuple[int, int]:
    """(trials still to run, the records a full run of them writes), without listing them."""
    get_sweep_row(s, sweep_id)
    q = select(func.count(), func.coalesce(func.sum(SqlTrial.epochs_total), 0))
    n, epochs = s.execute(q.where(*_runnable(sweep_id))).one()
    return int(n), int(epochs)


def start_trial(s: Session, trial_id: int) -> TrialInfo:
    t = get_trial_row(s, trial_id, lock=True)
    if t.results_from is not None:
        raise Conflict(f"trial {trial_id} reuses the results of trial {t.results_from}")
    if t.status in FINAL_TRIAL:
        raise Conflict(f"trial {trial_id} is {t.status}; it does not run again")
    t.status, t.attempts = TrialStatus.RUNNING, t.attempts + 1
    t.started_at, t.finished_at, t.error = utcnow(), None, None
    # this attempt's progress starts over: a retry that stops earlier must not keep the last
    # attempt's last epoch (read_metrics(epoch="last") joins on it) or its summary
    t.epochs_done, t.diverged_epoch = 0, None
    t.last_epoch, t.summary = None, None
    # and its results: the rows of one attempt only
    for table in (SqlMetric, SqlArtifact, SqlSpectrum):
        s.execute(delete(table).where(table.trial_id == trial_id))
    s.flush()
    return trial_info(t)


def finish_trial(s: Session, trial_id: int, status: str, error: str | None) -> TrialInfo:
    check_status(status, FINISHED_TRIAL)
    t = get_trial_row(s, trial_id, lock=True)
    if t.results_from is not None:
        raise Conflict(f"trial {trial_id} reuses the results of trial {t.results_from}")
    t.status, t.error, t.finished_at = status, error, utcnow()
    s.flush()
    return trial_info(t)
