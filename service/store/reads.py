"""Bounded reads of stored metrics: the tidy frame, one trial's history, the input Gram.

Every read counts the values it would return (the `n` column) before fetching a blob, and
refuses with LimitExceeded over the bound, so no request can pull the whole database into memory.
Reused trials (results_from) read the original trial's rows under their own id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import ColumnElement, Select, func, or_, select
from sqlalchemy.orm import Session, aliased

from service.config import SCALAR_METRICS
from service.errors import InvalidInput, LimitExceeded, NotFound
from service.metric_names import LOOP_PREFIX, is_loop_scalar, is_scalar_metric
from service.models import EXTERNAL, known_metrics
from service.param_columns import config_columns
from service.spec import swept_fields_of
from service.store import codec
from service.store.models import SqlArtifact, SqlMetric, SqlTrial
from service.store.sweeps import get_sweep_row
from service.store.trials import free_params, get_trial_row, where_conditions
from service.tidy import aggregate_over_seeds, check_stat

EpochFilter = int | list[int] | str | None


def check_metrics(metrics: str | list[str] | None) -> list[str]:
    """The metric names asked for (all known ones when None; a read of all metrics adds the
    user's `loop/` scalars it finds).

    Raises:
        InvalidInput: an unknown name, listing service.config.METRICS and the lab's registered
            per-tap metrics (service.models.known_metrics); a user's scalar `loop/<name>`
            (service.metric_names.is_loop_scalar) is a known name.
    """
    known = known_metrics()
    if metrics is None:
        return list(known)
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    for m in names:
        if m not in known and not is_loop_scalar(m):
            raise InvalidInput(f"unknown metric {m!r}", field="metrics", allowed=known)
    return names


def _check_ints(values: Any, field: str, low: int) -> list[int]:
    items = values if isinstance(values, list | tuple) else [values]
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < low:
            raise InvalidInput(f"integers ≥ {low}, got {v!r}", field=field)
    return [int(v) for v in items]


def _check_epoch(epoch: EpochFilter) -> list[int] | str | None:
    if epoch is None or epoch == "last":
        return epoch
    if isinstance(epoch, str):
        raise InvalidInput(
            f"an epoch number, a list of them, or 'last', got {epoch!r}", field="epoch"
        )
    return _check_ints(epoch, "epoch", 0)


def read_metrics(
    s: Session,
    sweep_id: int,
    *,
    metrics: str | list[str] | None,
    epoch: EpochFilter,
    layers: int | list[int] | None,
    where: dict[str, Any] | None,
    aggregate: bool,
    max_points: int,
    stat: str = "mean",
    trial: int | None = None,
) -> pd.DataFrame:
    check_stat(stat, aggregate)
    sweep = get_sweep_row(s, sweep_id)
    fields = swept_fields_of(sweep.spec)  # the stored spec was validated when it was written
    names = check_metrics(metrics)
    epochs = _check_epoch(epoch)
    layer_list = None if layers is None else _check_ints(layers, "layers", 1)
    check_sweep_has(s, sweep_id, None if metrics is None else names, epochs, layer_list)
    conds = where_conditions(where, free_params(sweep.spec))
    if trial is not None:
        conds.append(SqlTrial.id == _trial_of(s, sweep_id, trial))
    source = func.coalesce(SqlTrial.results_from, SqlTrial.id)
    trials = s.execute(
        select(SqlTrial.id, source, *(getattr(SqlTrial, f) for f in fields))
        .where(SqlTrial.sweep_id == sweep_id, *conds)
        .order_by(SqlTrial.id)
    ).all()
    sources = select(source).where(SqlTrial.sweep_id == sweep_id, *conds)
    q = _metric_query(sources, names, epochs, loop=metrics is None)
    _check_points(s, q, layer_list, max_points)
    rows = s.execute(
        q.add_columns(
            SqlMetric.trial_id, SqlMetric.metric, SqlMetric.epoch, SqlMetric.data
        ).order_by(SqlMetric.trial_id, SqlMetric.metric, SqlMetric.epoch)
    ).all()
    frame = _tidy(rows, trials, fields, layer_list)
    return aggregate_over_seeds(frame, stat) if aggregate else frame


def _trial_of(s: Session, sweep_id: int, trial_id: int) -> int:
    """`trial_id`, once known to be a trial of the sweep.

    Raises:
        NotFound: no such trial, or one of another sweep (naming it).
    """
    owner = s.scalar(select(SqlTrial.sweep_id).where(SqlTrial.id == trial_id))
    if owner is None:
        raise NotFound(f"no trial {trial_id}")
    if owner != sweep_id:
        raise NotFound(f"trial {trial_id} belongs to sweep {owner}, not to sweep {sweep_id}")
    return trial_id


def check_sweep_has(
    s: Session,
    sweep_id: int,
    metrics: list[str] | None,
    epochs: list[int] | str | None,
    layers: list[int] | None,
) -> None:
    """What a read asks for must be something the sweep has: each named metric recorded by
    some trial's model (service.models.layer_metrics), each epoch number recorded by some
    trial's schedule (TrialConfig.recorded_epochs), and some asked layer within some trial's
    depth (several layers keep those a trial has, as a plot reads each depth's own layers).
    A sweep without trials has nothing to check.

    Raises:
        InvalidInput: naming `metric` (the sweep's metrics allowed), `epoch` (its recorded
            epochs) or `layer` (1..its deepest trial's depth), in the plots' wording
            (service.plots.select).
    """
    if not metrics and not isinstance(epochs, list) and not layers:
        return
    from service.config import TrialConfig
    from service.models import layer_metrics

    # What decides a trial's metrics (service.models.layer_metrics) and its recorded epochs.
    names = ("model", "norm", "mlp_ratio", "epochs", "record_every", "precision_check",
             "tap_metrics")  # fmt: skip
    keys = [getattr(SqlTrial, f) for f in names]
    kinds = s.execute(
        select(*keys, func.max(SqlTrial.depth)).where(SqlTrial.sweep_id == sweep_id).group_by(*keys)
    ).all()
    if not kinds:
        return
    configs = [
        (TrialConfig.model_construct(**dict(zip(names, row[:-1], strict=True))), int(row[-1]))
        for row in kinds
    ]
    if metrics:
        have = {m for c, _ in configs for m in layer_metrics(c)} | set(SCALAR_METRICS)
        if asked := [m for m in metrics if is_loop_scalar(m)]:  # a user's: is it stored?
            have |= _loop_scalars(s, sweep_id, asked)
        for m in metrics:
            if m not in have:
                allowed = [x for x in known_metrics() if x in have]
                if any(c.model == EXTERNAL.name for c, _ in configs):  # only these record them
                    allowed += sorted(_loop_scalars(s, sweep_id, None))
                raise InvalidInput(
                    f"sweep {sweep_id} does not record {m!r}", field="metric", allowed=allowed
                )
    if isinstance(epochs, list):
        recorded = {e for c, _ in configs for e in c.recorded_epochs}
        for e in epochs:
            if e not in recorded:
                from service.plots.select import ranges  # scipy: imported only here

                msg = f"epoch {e} is not recorded"
                raise InvalidInput(msg, field="epoch", allowed=ranges(recorded))
    if layers:
        deepest = max(int(d) for _, d in configs)
        if all(ell > deepest for ell in layers):
            shown = " or ".join(str(ell) for ell in sorted(set(layers))[:5])
            raise InvalidInput(
                f"no trial has layer {shown}", field="layer", allowed=[f"1..{deepest}"]
            )


def _loop_scalars(s: Session, sweep_id: int, names: list[str] | None) -> set[str]:
    """The user's `loop/` scalars some trial of the sweep has stored: of `names`, or all."""
    sources = select(func.coalesce(SqlTrial.results_from, SqlTrial.id)).where(
        SqlTrial.sweep_id == sweep_id
    )
    q = select(SqlMetric.metric).where(SqlMetric.trial_id.in_(sources)).distinct()
    if names is None:
        q = q.where(SqlMetric.metric.startswith(LOOP_PREFIX, autoescape=True))
    else:
        q = q.where(SqlMetric.metric.in_(names))
    return set(s.scalars(q))


def _metric_query(
    sources: Select, names: list[str], epochs: list[int] | str | None, *, loop: bool = False
) -> Select:
    """The rows of `names` (with `loop`, every `loop/` scalar too) at `epochs`."""
    q = select().select_from(SqlMetric).where(SqlMetric.trial_id.in_(sources))
    wanted: ColumnElement[bool] = SqlMetric.metric.in_(names)
    if loop:
        wanted = or_(wanted, SqlMetric.metric.startswith(LOOP_PREFIX, autoescape=True))
    q = q.where(wanted)
    if epochs == "last":  # each (source) trial's highest stored epoch
        owner = aliased(SqlTrial)
        q = q.join(owner, owner.id == SqlMetric.trial_id).where(SqlMetric.epoch == owner.last_epoch)
    elif epochs is not None:
        q = q.where(SqlMetric.epoch.in_(epochs))
    return q


def _check_points(s: Session, q: Select, layers: list[int] | None, max_points: int) -> None:
    """Count the values the query returns, before decoding: from each row's length `n`, and
    with a layer filter the filter's layers ℓ ≤ n of each per-layer row."""
    by_length = s.execute(
        q.add_columns(SqlMetric.metric, SqlMetric.n, func.count()).group_by(
            SqlMetric.metric, SqlMetric.n
        )
    ).all()
    wanted = np.sort(np.unique(layers)) if layers is not None else None
    points = 0
    for metric, n, rows in by_length:
        if wanted is not None and not is_scalar_metric(metric):
            points += rows * int(np.searchsorted(wanted, n, side="right"))  # layers 1..n kept
        else:
            points += rows * int(n)
    if points > max_points:
        raise LimitExceeded(
            f"the query would return {points} values, over the limit of {max_points} "
            "(set by ISOSWEEP_MAX_POINTS); narrow it with metrics, epoch ('last' or numbers), "
            "layers or config filters (where)",
            field="max_points",
        )


def _tidy(
    rows: Sequence[Any], trials: Sequence[Any], fields: list[str], layers: list[int] | None
) -> pd.DataFrame:
    """One row per (trial, epoch, metric, layer); columns as docs/architecture.md says: trial_id,
    the config columns (service.param_columns.config_columns), epoch, metric, layer, value."""
    n = np.array([len(r.data) // 8 for r in rows], dtype=np.int64)  # (R,)
    values = codec.decode_many([r.data for r in rows])  # (V,)
    starts = np.cumsum(n) - n
    layer = np.arange(len(values)) - np.repeat(starts, n) + 1  # ℓ = 1..n within each row
    scalar_row = np.array([is_scalar_metric(r.metric) for r in rows], dtype=bool)
    scalar = np.repeat(scalar_row, n)
    keep = scalar | np.isin(layer, layers) if layers is not None else np.ones(len(values), bool)
    src_of = {t[1]: i for i, t in enumerate(trials)}  # source trial id → row of `trials`
    which = np.repeat(np.array([src_of[r.trial_id] for r in rows], dtype=np.int64), n)[keep]
    tid = np.array([t[0] for t in trials], dtype=np.int64)
    cols: dict[str, Any] = {"trial_id": tid[which]}
    # the config columns: the swept fields, model_params as JSON text and one column per model
    # parameter (service.param_columns), each in its natural dtype, even when empty
    per_field = config_columns(fields, [t[2:] for t in trials])
    for c, column in per_field.items():
        per_trial = pd.Series(column, dtype=object).infer_objects()
        cols[c] = per_trial.iloc[which].reset_index(drop=True)
    cols["epoch"] = np.repeat(np.array([r.epoch for r in rows], dtype=np.int64), n)[keep]
    metric = np.repeat(np.array([r.metric for r in rows], dtype=object), n)[keep]
    cols["metric"] = pd.array(metric, dtype="str")
    cols["layer"] = pd.array(np.where(scalar, 0, layer)[keep], dtype="Int64")
    cols["layer"][scalar[keep]] = pd.NA
    cols["value"] = values[keep]
    frame = pd.DataFrame(cols)
    order = np.argsort(frame["trial_id"].to_numpy(), kind="stable")  # DB order within a trial
    return frame.iloc[order].reset_index(drop=True)


def trial_history(
    s: Session, trial_id: int, metric: str, max_points: int
) -> tuple[np.ndarray, np.ndarray]:
    t = get_trial_row(s, trial_id)
    check_metrics(metric)
    src = t.results_from or t.id
    q = select().select_from(SqlMetric).where(SqlMetric.trial_id == src, SqlMetric.metric == metric)
    _check_points(s, q, None, max_points)
    rows = s.execute(q.add_columns(SqlMetric.epoch, SqlMetric.data).order_by(SqlMetric.epoch)).all()
    epochs = np.array([r.epoch for r in rows], dtype=np.int64)  # (E,)
    values = codec.decode_many([r.data for r in rows])
    if not is_scalar_metric(metric):  # a per-layer metric (check_metrics knows it)
        return epochs, values.reshape(len(rows), t.depth)  # (E, L)
    return epochs, values  # (E,)


def input_gram(s: Session, trial_id: int, name: str = "input_gram") -> np.ndarray | None:
    """A per-trial artifact of epoch 0: "input_gram" (n, n) or "input_moments" (n,)."""
    t = get_trial_row(s, trial_id)
    art = s.get(SqlArtifact, (t.results_from or t.id, name))
    if art is None:
        return None
    return codec.decode(art.data).reshape(art.shape)
