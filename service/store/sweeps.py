"""Sweep operations inside one transaction (a Session); the Store wraps each in its own."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from datetime import timedelta
from operator import itemgetter
from typing import Any

from sqlalchemy import JSON, Table, and_, func, insert, literal, or_, select, update
from sqlalchemy.orm import Session

from service import cost
from service.config import CONFIG_FIELDS, TrialConfig, hash_of_text, seeded_texts
from service.datasets import check_datasets
from service.errors import Conflict, InvalidInput, LimitExceeded, NotFound
from service.settings import Settings
from service.spec import SweepSpec, TrialGroup, check_limits
from service.status import SweepStatus, TrialStatus
from service.store.models import (
    SWEEP_STATUSES,
    TRIAL_STATUSES,
    SqlSweep,
    SqlTrial,
    UTCDateTime,
    utcnow,
)
from service.store.schemas import SweepInfo

CHUNK = 500  # ids per IN (...) list
INSERT_ROWS = 10_000  # rows per executemany of a bulk insert
UNFINISHED_TRIAL = (TrialStatus.QUEUED, TrialStatus.RUNNING)
REUSABLE = (TrialStatus.COMPLETED, TrialStatus.DIVERGED)  # a divergence is a result too
# The runner id of an external sweep (isosweep.Monitor: service/store/external.py): never claimed.
EXTERNAL_RUNNER = "external"


def create_sweep(s: Session, spec: SweepSpec, settings: Settings) -> SweepInfo:
    """Write the sweep and its trials. What needs no database (expansion, the limits, config
    hashes, the trial rows) is done before the first statement, so outside the write
    transaction: a Session begins its transaction at its first statement, and on SQLite that
    BEGIN IMMEDIATE holds the database's one write lock until the commit (engine.py)."""
    trials = trial_rows(spec, settings)
    reuse = {} if spec.rerun else _reusable(s, [t["config_hash"] for t in trials])
    # The trials that will run need their dataset here (a few stat calls): refused now, naming
    # the missing files, rather than failed by every trial (InvalidInput, service.datasets).
    check_datasets({t["dataset"] for t in trials if t["config_hash"] not in reuse}, settings)
    # What the trials that will run cost (service.cost): refused over the budget unless accepted.
    key = itemgetter(*cost.COST_FIELDS)
    counts = Counter(key(t) for t in trials if t["config_hash"] not in reuse)
    own = Counter({cost.Shape(*k): n for k, n in counts.items()})
    if spec.adaptive:  # its trials are asked later: the planned ones, at their expected cost
        own = cost.search_shapes(spec)
    check_budget(_estimate(s, {"resources": spec.resources.model_dump()}, own), spec, settings)
    now = utcnow()
    all_reused = len(reuse) == len(trials) and bool(trials)
    sweep = SqlSweep(
        name=spec.name,
        description=spec.description,
        tags=list(spec.tags),
        spec=spec.model_dump(mode="json"),
        status=SweepStatus.COMPLETED if all_reused else SweepStatus.QUEUED,
        priority=spec.priority,
        cancel_requested=False,
        created_at=now,
        finished_at=now if all_reused else None,
    )
    s.add(sweep)
    s.flush()  # assigns sweep.id
    _remember_totals(s, sweep, own)
    for t in trials:
        _set_source(t, sweep.id, reuse.get(t["config_hash"]), now)
    for k in range(0, len(trials), INSERT_ROWS):  # in expansion order: ids follow the index
        insert_many(s, SqlTrial.__table__, trials[k : k + INSERT_ROWS])  # type: ignore[arg-type]
    return sweep_infos(s, [sweep])[0]


def check_budget(estimate: cost.CostEstimate, spec: SweepSpec, settings: Settings) -> None:
    """Refuse a sweep whose estimated time is over Settings.max_sweep_hours, unless its spec
    says `accept_cost: true`.

    Raises:
        LimitExceeded: field `budget`, with the estimate.
    """
    hours = settings.max_sweep_hours
    if estimate.seconds > hours * 3600 and not spec.accept_cost:
        raise LimitExceeded(
            f"the sweep would take {estimate.text}, over the budget of {hours:g} h (set by "
            "ISOSWEEP_MAX_SWEEP_HOURS); add `accept_cost: true` to the spec to run it anyway",
            field="budget",
        )


def _estimate(
    s: Session,
    spec: dict[str, Any],
    shapes: Any,
    throughputs: dict[str, cost.Throughput] | None = None,
) -> cost.CostEstimate:
    """cost.estimate_counts of a stored spec's trials at the store's measured throughput."""
    kind, units = cost.resources_kind(spec.get("resources"))
    if throughputs is None or kind not in throughputs:
        measured = cost.measure_throughput(s, kind)
        if throughputs is not None:
            throughputs[kind] = measured
    else:
        measured = throughputs[kind]
    return cost.estimate_counts(shapes, measured, units)


# The shapes of each sweep's own trials (immutable once created), by (database, sweep, created).
_TOTALS: dict[tuple[str, int, Any], Counter[cost.Shape]] = {}
TOTALS_KEPT = 4096


def _totals_key(s: Session, w: SqlSweep) -> tuple[str, int, Any]:
    return (str(s.get_bind().engine.url), w.id, w.created_at)


def _remember_totals(s: Session, w: SqlSweep, shapes: Counter[cost.Shape]) -> None:
    while len(_TOTALS) >= TOTALS_KEPT:
        _TOTALS.pop(next(iter(_TOTALS)))
    _TOTALS[_totals_key(s, w)] = shapes


_COST_COLUMNS = [getattr(SqlTrial, f) for f in cost.COST_FIELDS]


def _sweep_costs(
    s: Session, sweeps: Sequence[SqlSweep]
) -> dict[int, tuple[cost.CostEstimate, float | None]]:
    """Each sweep's estimate (its own trials, service.cost) and, while it runs, the seconds its
    unfinished trials' remaining epochs take by the same model (the ETA)."""
    # an adaptive search adds trials as it goes (append_trials): its totals are never cached
    missing = [
        w
        for w in sweeps
        if _totals_key(s, w) not in _TOTALS or planned_trials(w.spec or {}) is not None
    ]
    if missing:
        grouped: dict[int, Counter[cost.Shape]] = defaultdict(Counter)
        q = (
            select(SqlTrial.sweep_id, *_COST_COLUMNS, func.count())
            .where(SqlTrial.sweep_id.in_([w.id for w in missing]))
            .where(SqlTrial.results_from.is_(None))
            .group_by(SqlTrial.sweep_id, *_COST_COLUMNS)
        )
        for sweep_id, *shape, n in s.execute(q):
            grouped[sweep_id][cost.Shape(*shape)] += n
        for w in missing:
            _remember_totals(s, w, grouped.get(w.id, Counter()))
    left: dict[int, list[tuple[cost.Shape, int, float]]] = defaultdict(list)
    running = [w.id for w in sweeps if w.status == SweepStatus.RUNNING]
    if running:
        q = (
            select(
                SqlTrial.sweep_id,
                *_COST_COLUMNS,
                func.count(),
                func.sum(func.coalesce(SqlTrial.last_epoch, 0)),
                func.sum(SqlTrial.epochs_done),
                func.count(SqlTrial.last_epoch),
            )
            .where(SqlTrial.sweep_id.in_(running), SqlTrial.status.in_(UNFINISHED_TRIAL))
            .where(SqlTrial.results_from.is_(None))
            .group_by(SqlTrial.sweep_id, *_COST_COLUMNS)
        )
        for sweep_id, *row in s.execute(q):
            *shape, n, last, done, started = row
            sh = cost.Shape(*shape)
            flops = cost.remaining_flops(
                sh, n * sh.epochs - int(last or 0), n * sh.n_recorded_epochs - int(done or 0), False
            ) + (n - int(started or 0)) * cost.remaining_flops(sh, 0, 0, True)
            left[sweep_id].append((sh, n, flops / n))
    throughputs: dict[str, cost.Throughput] = {}
    out: dict[int, tuple[cost.CostEstimate, float | None]] = {}
    for w in sweeps:
        spec = w.spec or {}
        shapes = _TOTALS[_totals_key(s, w)]
        items = [(sh, n, cost.trial_flops(sh)) for sh, n in shapes.items()]
        rest = left[w.id]
        planned = planned_trials(spec)
        created = sum(shapes.values())
        if planned is not None and planned > created and created:
            # the trials not asked yet: as many more of the mean trial so far (the commonest shape)
            mean = sum(n * f for _, n, f in items) / created
            extra = (shapes.most_common(1)[0][0], planned - created, mean)
            items, rest = [*items, extra], [*rest, extra]
        elif planned is not None and planned > created:  # none asked yet: from the spec
            extras = [(sh, n, cost.trial_flops(sh)) for sh, n in cost.search_shapes(spec).items()]
            items, rest = [*items, *extras], [*rest, *extras]
        total = _estimate(s, spec, items, throughputs)
        eta = _estimate(s, spec, rest, throughputs).seconds if w.id in running else None
        out[w.id] = (total, eta)
    return out


def append_trials(
    s: Session, sweep_id: int, configs: Sequence[TrialConfig], *, rerun: bool = False
) -> list[SqlTrial]:
    """Add trials to a sweep after it was created (an adaptive search's asks: service/search/
    tpe.py), at the next indices, reusing stored results by config hash as create_sweep does
    (unless `rerun`). Returns the new rows, in order."""
    w = get_sweep_row(s, sweep_id, lock=True)
    top = s.scalar(select(func.max(SqlTrial.index)).where(SqlTrial.sweep_id == sweep_id))
    start = -1 if top is None else int(top)
    rows = _rows([TrialGroup(c, (c.seed,)) for c in configs], start=start + 1)
    reuse = {} if rerun else _reusable(s, [r["config_hash"] for r in rows])
    now = utcnow()
    for r in rows:
        _set_source(r, w.id, reuse.get(r["config_hash"]), now)
    insert_many(s, SqlTrial.__table__, rows)  # type: ignore[arg-type]
    q = (
        select(SqlTrial)
        .where(SqlTrial.sweep_id == sweep_id, SqlTrial.index > start)
        .order_by(SqlTrial.index)
    )
    return list(s.scalars(q))


def planned_trials(spec: dict[str, Any]) -> int | None:
    """An adaptive search's planned total from a stored spec (n × grid cells × seeds), or None
    for a sweep whose trials were all created with it."""
    search = spec.get("search") or {}
    if search.get("kind") != "tpe":
        return None
    cells = 1
    for k, v in (spec.get("parameters") or {}).items():
        if k == "zip":  # linked axes (service.spec): one axis each
            cells *= math.prod(len(group) for group in v)
        elif isinstance(v, list):
            cells *= len(v)
    seeds = spec.get("seeds", 1)
    return int(search["n"]) * cells * (seeds if isinstance(seeds, int) else len(seeds))


class JsonText(str):
    """A JSON column's value serialized already (service.config.config_text): insert_many binds
    the text as it is instead of serializing the value again."""


def insert_many(s: Session, table: Table, rows: list[dict[str, Any]]) -> None:
    """Insert rows that share one key set with the DBAPI's executemany. Each value goes through
    its column type's own bind processor, as a Core insert would do it (but None is SQL NULL,
    JSON columns included, and a JsonText is bound as the text it is), in one plain loop:
    SQLAlchemy's per-row parameter processing is most of a bulk insert's time (100,000 trial
    rows: ~9 s through `insert(SqlTrial)`, ~2 s here; bench/lazy_sweep.py)."""
    if not rows:
        return
    conn = s.connection()
    dialect = conn.dialect
    compiled = insert(table).compile(dialect=dialect, column_keys=list(rows[0]))
    keys = list(compiled.positiontup or ()) if compiled.positional else list(rows[0])
    if set(keys) != set(rows[0]):  # bind names that are not the column keys: the plain way
        s.execute(insert(table), [_plain(r) for r in rows])
        return
    processors = [
        (i, _binder(table.c[key].type, dialect))
        for i, key in enumerate(keys)
        if table.c[key].type.dialect_impl(dialect).bind_processor(dialect) is not None
    ]
    values = itemgetter(*keys)
    params: list[Any] = []
    for row in rows:
        v = list(values(row)) if len(keys) > 1 else [values(row)]
        for i, p in processors:
            if v[i] is not None:
                v[i] = p(v[i])
        params.append(tuple(v) if compiled.positional else dict(zip(keys, v, strict=True)))
    conn.exec_driver_sql(compiled.string, params)


def _binder(sql_type: Any, dialect: Any) -> Any:
    """The column's bind processor; for a JSON column, one that binds a JsonText as its text
    (on PostgreSQL as psycopg's Json wrapper with the text as its own serialization)."""
    process = sql_type.dialect_impl(dialect).bind_processor(dialect)
    if not isinstance(sql_type, JSON):
        return process
    as_text: Callable[[str], Any] = str
    if dialect.name == "postgresql":
        from psycopg.types.json import Json

        def as_text(v: str) -> Any:
            return Json(v, dumps=str)

    def bind(v: Any) -> Any:
        return as_text(v) if type(v) is JsonText else process(v)

    return bind


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A row for SQLAlchemy's own insert: JsonText values parsed back into documents."""
    return {k: json.loads(v) if type(v) is JsonText else v for k, v in row.items()}


# Every trial row has these keys (one statement for a whole batch); a reused trial sets them.
_NEW_TRIAL = {
    "status": TrialStatus.QUEUED.value,
    "attempts": 0,
    "epochs_done": 0,
    "sweep_id": None,
    "results_from": None,
    "finished_at": None,
    "last_epoch": None,
    "diverged_epoch": None,
    "summary": None,
}
# Config columns whose values are documents (model_params): serialized once per group.
_JSON_FIELDS = tuple(f for f in CONFIG_FIELDS if isinstance(SqlTrial.__table__.c[f].type, JSON))


def trial_rows(spec: SweepSpec, settings: Settings) -> list[dict[str, Any]]:
    """The trials' rows (sweep_id unset) in expansion order, in time independent of the epochs
    (the records a full run writes are counted, not listed: n_recorded_epochs) and near that of
    writing them: one validation and one serialization per group of trials that differ by their
    seed alone (service.spec.expand_groups, service.config.seeded_texts).

    Raises:
        LimitExceeded, InvalidInput: as service.spec.check_limits.
    """
    groups = check_limits(spec, settings)
    for g in groups:
        if g.config.model == "external":  # isosweep.Monitor's trials (service/store/external.py)
            raise InvalidInput(
                "model 'external' is recorded by the user's own training loop "
                "(isosweep.Monitor, docs/own-loop.md); a sweep isosweep runs cannot use it",
                field="parameters.model",
            )
    return _rows(groups, start=0)


def _rows(groups: Sequence[TrialGroup], *, start: int) -> list[dict[str, Any]]:
    """The rows of these trials at indices start, start + 1, …: the config, its hash and its
    columns, as a new queued trial."""
    rows = []
    index = start
    for c, seeds in groups:
        base = {
            **_NEW_TRIAL,
            "epochs_total": c.n_recorded_epochs,
            **{f: getattr(c, f) for f in CONFIG_FIELDS},
            **{f: JsonText(json.dumps(getattr(c, f))) for f in _JSON_FIELDS},
        }
        for seed, text in seeded_texts(c, seeds):
            rows.append(
                {
                    **base,
                    "index": index,
                    "seed": seed,
                    "config": JsonText(text),
                    "config_hash": hash_of_text(text),
                }
            )
            index += 1
    return rows


def _reusable(s: Session, hashes: list[str]) -> dict[str, SqlTrial]:
    """config hash → the newest finished trial holding results for it."""
    found: dict[str, SqlTrial] = {}
    for k in range(0, len(hashes), CHUNK):
        q = (
            select(SqlTrial)
            .where(SqlTrial.config_hash.in_(hashes[k : k + CHUNK]))
            .where(SqlTrial.status.in_(REUSABLE))
            .order_by(SqlTrial.id)
        )
        for t in s.scalars(q):
            found[t.config_hash] = t  # ascending ids: the newest wins
    return found


def _set_source(row: dict[str, Any], sweep_id: int, src: SqlTrial | None, now: Any) -> None:
    """Put the row in its sweep; a trial reusing `src`'s stored results is created finished."""
    row["sweep_id"] = sweep_id
    if src is not None:  # created finished, reading the original's results
        row.update(
            status=src.status,
            results_from=src.results_from or src.id,
            finished_at=now,
            epochs_done=src.epochs_done,
            last_epoch=src.last_epoch,
            diverged_epoch=src.diverged_epoch,
            summary=src.summary,
        )


def get_sweep_row(s: Session, sweep_id: int, *, lock: bool = False) -> SqlSweep:
    q = select(SqlSweep).where(SqlSweep.id == sweep_id)
    if lock:
        q = q.with_for_update()  # Postgres row lock; SQLite is already serialized
    sweep = s.scalars(q).one_or_none()
    if sweep is None:
        raise NotFound(f"no sweep with id {sweep_id}")
    return sweep


def sweep_infos(s: Session, sweeps: Sequence[SqlSweep]) -> list[SweepInfo]:
    """SweepInfo of each sweep, with one grouped query over their trials."""
    stats = _trial_stats(s, [w.id for w in sweeps])
    costs = _sweep_costs(s, sweeps)
    return [_info(w, stats.get(w.id, []), *costs[w.id]) for w in sweeps]


def _trial_stats(s: Session, ids: list[int]) -> dict[int, list[tuple]]:
    if not ids:
        return {}
    reused = SqlTrial.results_from.is_not(None)
    q = (
        select(
            SqlTrial.sweep_id,
            SqlTrial.status,
            reused,
            func.count(),
            func.sum(SqlTrial.epochs_done),
            func.sum(SqlTrial.epochs_total),
        )
        .where(SqlTrial.sweep_id.in_(ids))
        .group_by(SqlTrial.sweep_id, SqlTrial.status, reused)
    )
    out: dict[int, list[tuple]] = defaultdict(list)
    for sweep_id, *rest in s.execute(q):
        out[sweep_id].append(tuple(rest))
    return out


def _info(
    w: SqlSweep, stats: list[tuple], estimate: cost.CostEstimate, eta_s: float | None
) -> SweepInfo:
    counts = dict.fromkeys(TRIAL_STATUSES, 0)
    done = total = own_done = own_total = 0
    for status, reused, n, ep_done, ep_total in stats:
        counts[status] += n
        d = ep_total if TrialStatus(status).is_finished() else min(ep_done or 0, ep_total)
        done, total = done + d, total + ep_total
        if not reused:
            own_done, own_total = own_done + d, own_total + ep_total
    planned = planned_trials(w.spec or {})
    if planned is not None and not SweepStatus(w.status).is_finished():
        rows = sum(counts.values())  # the trials not asked yet count as queued
        if planned > rows:
            counts[TrialStatus.QUEUED] += planned - rows
            per = total // rows if rows else 0  # records per trial, as the asked ones have
            total += per * (planned - rows)
            own_total += per * (planned - rows)
    progress = done / total if total else (1.0 if SweepStatus(w.status).is_finished() else 0.0)
    return SweepInfo(
        id=w.id,
        name=w.name,
        description=w.description,
        tags=list(w.tags or []),
        status=w.status,
        priority=w.priority,
        created_at=w.created_at,
        started_at=w.started_at,
        finished_at=w.finished_at,
        counts=counts,
        n_trials=sum(counts.values()),
        progress=progress,
        eta_s=eta_s if w.status == SweepStatus.RUNNING else None,
        cancel_requested=w.cancel_requested,
        runner_id=w.runner_id,
        error=w.error,
        spec=w.spec,
        estimate=estimate,
    )


def list_sweeps(
    s: Session, status: str | None, offset: int, limit: int, settings: Settings
) -> tuple[list[SweepInfo], int]:
    check_page(offset, limit, settings)
    q = select(SqlSweep)
    if status is not None:
        check_status(status, SWEEP_STATUSES)
        q = q.where(SqlSweep.status == status)
    total = s.scalar(select(func.count()).select_from(q.subquery()))
    page = s.scalars(q.order_by(SqlSweep.id.desc()).offset(offset).limit(limit)).all()
    return sweep_infos(s, page), int(total or 0)


def check_page(offset: int, limit: int, settings: Settings) -> None:
    if offset < 0:
        raise InvalidInput("must be ≥ 0", field="offset")
    if limit < 1:
        raise InvalidInput("must be ≥ 1", field="limit")
    if limit > settings.max_page_size:
        raise LimitExceeded(
            f"{limit} is over the page size limit of {settings.max_page_size} "
            "(set by ISOSWEEP_MAX_PAGE_SIZE); page with offset",
            field="limit",
        )


def check_status(status: str, allowed: tuple[str, ...], field: str = "status") -> None:
    if status not in allowed:
        raise InvalidInput(f"unknown status {status!r}", field=field, allowed=allowed)


def request_cancel(s: Session, sweep_id: int) -> SweepInfo:
    w = get_sweep_row(s, sweep_id, lock=True)
    if SweepStatus(w.status).is_finished():
        return sweep_infos(s, [w])[0]
    now = utcnow()
    w.cancel_requested = True
    s.execute(
        update(SqlTrial)
        .where(SqlTrial.sweep_id == sweep_id, SqlTrial.status == TrialStatus.QUEUED)
        .values(status=TrialStatus.CANCELLED, finished_at=now)
    )
    if w.status == SweepStatus.QUEUED:
        w.status, w.finished_at = SweepStatus.CANCELLED, now
    s.flush()
    return sweep_infos(s, [w])[0]


# Priority, then the sweep that ran least recently: never-run sweeps first (oldest first), then
# by last heartbeat, so that a long sweep that yields its runner (workers.driver) goes behind the
# sweeps that were waiting, and long sweeps of one priority take turns.
CLAIM_ORDER = (
    SqlSweep.priority.desc(),
    SqlSweep.heartbeat_at.asc().nulls_first(),
    SqlSweep.created_at,
    SqlSweep.id,
)


def is_sweep_waiting(s: Session, sweep_id: int) -> bool:
    """Whether another claimable sweep of at least this one's priority exists (it would be
    claimed first were this one released: CLAIM_ORDER puts a sweep that just ran last)."""
    w = get_sweep_row(s, sweep_id)
    q = (
        select(SqlSweep.id)
        .where(_claimable(utcnow()), SqlSweep.id != sweep_id, SqlSweep.priority >= w.priority)
        .limit(1)
    )
    return s.scalar(q) is not None


def _claimable(now: Any) -> Any:
    expired = and_(SqlSweep.status == SweepStatus.RUNNING, SqlSweep.lease_expires_at < now)
    # never an external sweep: the user's own loop records it (service/store/external.py)
    own_loop = or_(SqlSweep.runner_id.is_(None), SqlSweep.runner_id != EXTERNAL_RUNNER)
    return and_(or_(SqlSweep.status == SweepStatus.QUEUED, expired), own_loop)


def claim_sweep(
    s: Session, runner_id: str, lease_s: float, sweep_id: int | None = None
) -> SweepInfo | None:
    if not runner_id:
        raise InvalidInput("must not be empty", field="runner_id")
    if not lease_s > 0:
        raise InvalidInput("must be > 0 seconds", field="lease_s")
    for _ in range(8):  # another runner may win the candidate between SELECT and UPDATE
        now = utcnow()
        q = select(SqlSweep.id).where(_claimable(now)).order_by(*CLAIM_ORDER).limit(1)
        if sweep_id is not None:
            q = q.where(SqlSweep.id == sweep_id)
        if s.get_bind().dialect.name == "postgresql":
            q = q.with_for_update(skip_locked=True)
        candidate = s.scalar(q)
        if candidate is None:
            return None
        taken = s.execute(
            update(SqlSweep)
            .where(SqlSweep.id == candidate, _claimable(now))
            .values(
                status=SweepStatus.RUNNING,
                runner_id=runner_id,
                lease_s=lease_s,
                lease_expires_at=now + timedelta(seconds=lease_s),
                heartbeat_at=now,
                started_at=func.coalesce(SqlSweep.started_at, literal(now, UTCDateTime())),
            )
            .execution_options(synchronize_session=False)
        )
        if taken.rowcount == 1:  # type: ignore[attr-defined]  # an UPDATE: a CursorResult
            # Trials the dead runner left running start over; their epochs get overwritten.
            _requeue_running_trials(s, candidate)
            return sweep_infos(s, [get_sweep_row(s, candidate)])[0]
    return None


def _requeue_running_trials(s: Session, sweep_id: int) -> None:
    s.execute(
        update(SqlTrial)
        .where(SqlTrial.sweep_id == sweep_id, SqlTrial.status == TrialStatus.RUNNING)
        .values(status=TrialStatus.QUEUED)
    )


def release_sweep(s: Session, sweep_id: int, runner_id: str) -> bool:
    w = get_sweep_row(s, sweep_id, lock=True)
    if w.status != SweepStatus.RUNNING or w.runner_id != runner_id:
        return False
    _requeue_running_trials(s, sweep_id)
    w.status, w.runner_id, w.lease_expires_at = SweepStatus.QUEUED, None, None
    return True


class LeaseLost(Conflict):
    """A runner wrote to a sweep it no longer holds (another runner took it over)."""


def check_holder(s: Session, trial_ids: Sequence[int], runner_id: str) -> None:
    """Fence a runner's write: every trial's sweep must be running under `runner_id`. On
    Postgres the sweep rows are share-locked until the write commits, so a claim (an UPDATE of
    the row) comes wholly before or after it; SQLite's write transactions are serialized.

    Raises:
        LeaseLost: a sweep is not running under runner_id (nothing may be written). Unknown
            trial ids pass: the write itself reports them.
    """
    q = (
        select(SqlSweep.id, SqlSweep.status, SqlSweep.runner_id)
        .join(SqlTrial, SqlTrial.sweep_id == SqlSweep.id)
        .where(SqlTrial.id.in_(sorted(set(trial_ids))))
    )
    if s.get_bind().dialect.name == "postgresql":  # FOR SHARE allows no DISTINCT: deduped here
        q = q.with_for_update(read=True, of=SqlSweep)
    for sweep_id, status, holder in set(s.execute(q).all()):
        if status != SweepStatus.RUNNING or holder != runner_id:
            raise LeaseLost(
                f"sweep {sweep_id} is no longer held by runner {runner_id} "
                f"({status}, runner {holder}); nothing was written"
            )


def heartbeat(s: Session, sweep_id: int, runner_id: str) -> bool:
    w = get_sweep_row(s, sweep_id, lock=True)
    if w.status != SweepStatus.RUNNING or w.runner_id != runner_id:
        return False
    now = utcnow()
    w.heartbeat_at = now
    w.lease_expires_at = now + timedelta(seconds=w.lease_s or 0.0)  # lease_s set by the claim
    return True


def is_cancel_requested(s: Session, sweep_id: int) -> bool:
    flag = s.scalar(select(SqlSweep.cancel_requested).where(SqlSweep.id == sweep_id))
    if flag is None:
        raise NotFound(f"no sweep with id {sweep_id}")
    return bool(flag)


def _failure_summary(s: Session, sweep_id: int, failed: int, total: int) -> str:
    """ "k of n trials failed", then the first failure's reason whole: its error up to the first
    blank line (the summary line; the traceback after it stays on the trial)."""
    first = s.execute(
        select(SqlTrial.id, SqlTrial.error)
        .where(SqlTrial.sweep_id == sweep_id, SqlTrial.status == TrialStatus.FAILED)
        .order_by(SqlTrial.finished_at.is_(None), SqlTrial.finished_at, SqlTrial.id)
        .limit(1)
    ).first()
    text = f"{failed} of {total} trials failed"
    reason = (first.error or "").split("\n\n", 1)[0].strip() if first else ""
    return f"{text}; the first, trial {first.id}: {reason}" if first and reason else text


def finish_sweep(s: Session, sweep_id: int) -> SweepInfo:
    w = get_sweep_row(s, sweep_id, lock=True)
    if SweepStatus(w.status).is_finished():
        return sweep_infos(s, [w])[0]
    counts = dict(
        s.execute(
            select(SqlTrial.status, func.count())
            .where(SqlTrial.sweep_id == sweep_id)
            .group_by(SqlTrial.status)
        ).all()
    )
    left = sum(n for status, n in counts.items() if not TrialStatus(status).is_finished())
    now = utcnow()
    if w.cancel_requested:
        s.execute(
            update(SqlTrial)
            .where(SqlTrial.sweep_id == sweep_id, SqlTrial.status.in_(UNFINISHED_TRIAL))
            .values(status=TrialStatus.CANCELLED, finished_at=now)
        )
        w.status = SweepStatus.CANCELLED
    elif left:
        raise Conflict(
            f"sweep {sweep_id} still has {left} trials queued or running; finish them first "
            "(or request cancel)"
        )
    elif counts.get(TrialStatus.FAILED, 0):
        w.status = SweepStatus.FAILED
        w.error = _failure_summary(s, sweep_id, counts[TrialStatus.FAILED], sum(counts.values()))
    else:
        w.status = SweepStatus.COMPLETED
    w.finished_at, w.lease_expires_at = now, None
    s.flush()
    return sweep_infos(s, [w])[0]
