"""External sweeps: trials recorded by the user's own training loop (`isosweep.Monitor`,
docs/own-loop.md), not run by isosweep's runner.

An external sweep is an ordinary sweep row whose spec is `{"external": true, "name": …,
"parameters": {"model": "external", "depth": the runs' numbers of taps (one, or a list),
"model_params": [each distinct run config]}, "runs": {run key: its config}}` — no migration:
the mark lives in the spec JSON. A run's config is the user's free-form config flattened into
fields (`flatten`), so `model_params` is an axis of the sweep like a registered model's
parameters: `model_params.<name>` columns, filters, plot axes, group-bys and compare
(service/param_columns.py; the free names filter as service/store/param_filters.py says). It
is created `running` under the reserved
runner id EXTERNAL_RUNNER with no lease, and claim_sweep never takes such a sweep
(service/store/sweeps.py `_claimable`). Each run of the loop is one trial, found again by its
run key (the trial's config_hash is `external:` + the key's digest, a spelling no real config
hash has, so no trial of a normal sweep ever reuses it). Its TrialConfig is a registered-model
config of model `external` (service.models): depth = the number of taps, batch_size = the
probe batch's n, epochs = the highest step stored so far (record_every 1), model_params = the
run's flattened config, tap_metrics = true (probe records the per-tap metrics); every other
field is its default and describes nothing.

Records are the epoch records of service/store/results.py with epoch = the loop's step (with
the 2-D arrays of service.config.SPECTRUM_KEYS, e.g. attention_entropy_heads), written
idempotently by step: the same step with the same values again is a no-op, different values for
a stored step are a Conflict (409), a step below the last stored one an InvalidInput (422). A
record whose user scalars (train_loss, …) are not finite is stored with `diverged: true` and
ends the trial as `diverged` (a divergence is a result). The user's own scalars, `loop/<name>`
(service.metric_names.is_loop_scalar; Monitor.record's other keywords), are stored as scalar
metrics too; a non-finite one is stored as it is and is no divergence (a learning rate does not
diverge).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import CONFIG_FIELDS, RECORD_KEYS, TrialConfig
from service.errors import Conflict, InvalidInput, NotFound
from service.status import SweepStatus, TrialStatus
from service.store import codec, results, sweeps
from service.store.models import SqlMetric, SqlSpectrum, SqlSweep, SqlTrial, utcnow
from service.store.schemas import SweepInfo, TrialInfo
from service.store.sweeps import EXTERNAL_RUNNER
from service.store.trials import trial_info

EXTERNAL_MODEL = "external"
HASH_PREFIX = "external:"
# The scalars a user's loop reports that isosweep's trials record too (Monitor.record's named
# keywords); a non-finite one is divergence. Any other is the user's own, loop/<name>.
LOOP_SCALARS = ("train_loss", "train_acc", "test_loss", "test_acc", "epoch_time_s")
MAX_NAME = 200


def is_external(spec: dict[str, Any] | None) -> bool:
    return bool((spec or {}).get("external"))


def run_key_hash(run: str) -> str:
    return HASH_PREFIX + hashlib.sha256(run.encode()).hexdigest()[: 64 - len(HASH_PREFIX)]


def flatten(config: dict[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """A free-form config as fields: nested mappings become dotted names; a value that is not
    a JSON scalar (a list, a non-finite float, an object) is kept as its JSON text (or str),
    so every field is one JSON scalar — a training loop's config is never refused for it."""
    out: dict[str, Any] = {}
    for k, v in (config or {}).items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{name}."))
        elif v is None or isinstance(v, bool | int | str):
            out[name] = v
        elif isinstance(v, float):
            out[name] = v if math.isfinite(v) else str(v)
        else:
            try:
                out[name] = json.dumps(v, sort_keys=True, default=str)
            except (TypeError, ValueError):
                out[name] = str(v)
    return out


def open_sweep(s: Session, name: str, config: dict[str, Any]) -> SweepInfo:
    """The external sweep called `name` (created `running` if there is none; a `completed`
    one is reopened). Raises Conflict for a sweep of that name that is not external, or one
    that was cancelled."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise InvalidInput(f"a non-empty name of at most {MAX_NAME} characters", field="sweep")
    found = _find_sweep(s, name)
    if found is None:
        now = utcnow()
        w = SqlSweep(
            name=name,
            description="recorded by the user's own training loop (isosweep.Monitor)",
            tags=["external"],
            spec={"external": True, "name": name, "parameters": _parameters([]), "runs": {}},
            status=SweepStatus.RUNNING,
            priority=0,
            cancel_requested=False,
            created_at=now,
            started_at=now,
            heartbeat_at=now,
            runner_id=EXTERNAL_RUNNER,
        )
        s.add(w)
        s.flush()
        if config:
            _with_run(w, config, None)
        return sweeps.sweep_infos(s, [w])[0]
    if found.status == SweepStatus.CANCELLED or found.cancel_requested:
        raise Conflict(f"the external sweep {name!r} (id {found.id}) was cancelled")
    if found.status != SweepStatus.RUNNING:
        found.status, found.finished_at, found.runner_id = (
            SweepStatus.RUNNING,
            None,
            EXTERNAL_RUNNER,
        )
        s.flush()
    return sweeps.sweep_infos(s, [found])[0]


def _find_sweep(s: Session, name: str) -> SqlSweep | None:
    q = select(SqlSweep).where(SqlSweep.name == name).order_by(SqlSweep.id.desc())
    rows = list(s.scalars(q.with_for_update()))
    external = [w for w in rows if is_external(w.spec)]
    if rows and not external:
        raise Conflict(
            f"sweep {name!r} (id {rows[0].id}) is not an external sweep; choose another name"
        )
    return external[0] if external else None


def external_sweep_row(s: Session, sweep_id: int, *, lock: bool = False) -> SqlSweep:
    w = sweeps.get_sweep_row(s, sweep_id, lock=lock)
    if not is_external(w.spec):
        raise Conflict(
            f"sweep {sweep_id} is not an external sweep (its trials are run by isosweep)"
        )
    return w


def open_trial(
    s: Session, sweep_id: int, run: str, *, depth: int, batch_size: int, config: dict[str, Any]
) -> TrialInfo:
    """The sweep's trial of run key `run`, created `running` on first use. Raises InvalidInput
    for a run key found again with another number of taps (depth)."""
    if not isinstance(run, str) or not run or len(run) > MAX_NAME:
        raise InvalidInput(f"a non-empty run key of at most {MAX_NAME} characters", field="run")
    for name, v in (("depth", depth), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidInput(f"a positive integer, not {v!r}", field=name)
    w = external_sweep_row(s, sweep_id, lock=True)
    key = run_key_hash(run)
    t = s.scalars(
        select(SqlTrial).where(SqlTrial.sweep_id == sweep_id, SqlTrial.config_hash == key)
    ).one_or_none()
    if t is not None:
        if t.depth != depth:
            raise InvalidInput(
                f"run {run!r} of sweep {sweep_id} records {t.depth} taps, not {depth}",
                field="depth",
            )
        return trial_info(t)
    if w.cancel_requested:
        raise Conflict(f"sweep {sweep_id} was cancelled; no new run can start in it")
    c = TrialConfig(
        model=EXTERNAL_MODEL, depth=depth, batch_size=batch_size, epochs=0, norm="none",
        tap_metrics=True, model_params=config,
    )  # fmt: skip
    top = s.scalar(select(SqlTrial.index).where(SqlTrial.sweep_id == sweep_id).order_by(
        SqlTrial.index.desc()).limit(1))  # fmt: skip
    now = utcnow()
    t = SqlTrial(
        sweep_id=sweep_id,
        index=0 if top is None else int(top) + 1,
        config=c.to_dict(),
        config_hash=key,
        status=TrialStatus.RUNNING,
        attempts=1,
        started_at=now,
        epochs_done=0,
        epochs_total=1,
        **{f: getattr(c, f) for f in CONFIG_FIELDS},
    )
    s.add(t)
    _with_run(w, c.model_params, depth)
    w.spec = {**w.spec, "runs": {**(w.spec.get("runs") or {}), run: c.model_params}}
    s.flush()
    return trial_info(t)


def _parameters(configs: list[dict[str, Any]], depths: list[int] | None = None) -> dict[str, Any]:
    depth: dict[str, Any] = {}
    if depths:  # the plots' layer choices read the spec's depths (service.plots.stored)
        depth = {"depth": depths[0] if len(depths) == 1 else depths}
    return {"model": EXTERNAL_MODEL, **depth, "model_params": configs}


def _with_run(w: SqlSweep, config: dict[str, Any], depth: int | None) -> None:
    """The sweep's model_params axis with `config` among its values and its depths with the
    run's (a spec written before the axis, whose parameters were one run's config, gains
    them)."""
    params = w.spec.get("parameters") or {}
    ours = params.get("model") == EXTERNAL_MODEL
    axis = params.get("model_params") if ours else None
    configs = list(axis) if isinstance(axis, list) else []
    if config not in configs:
        configs.append(config)
    had = params.get("depth") if ours else None
    depths = [] if had is None else (list(had) if isinstance(had, list) else [had])
    if depth is not None and depth not in depths:
        depths.append(depth)
    w.spec = {**w.spec, "parameters": _parameters(configs, depths)}


def append_record(s: Session, trial_id: int, record: dict[str, Any]) -> dict[str, Any]:
    """Store one step's record (epoch = step) of an external trial.

    Returns {"stored": bool (False: the same record was stored already), "step",
    "last_step", "diverged": bool, "cancel_requested": bool, "status": the trial's}.

    Raises:
        NotFound: no such trial. Conflict: not an external trial; a different record for a
        stored step; a new step for a finished trial. InvalidInput: a step below the last
        stored one, or what write_records refuses (an unknown metric, a wrong length, …).
    """
    t = s.scalars(select(SqlTrial).where(SqlTrial.id == trial_id).with_for_update()).one_or_none()
    if t is None:
        raise NotFound(f"no trial with id {trial_id}")
    w = external_sweep_row(s, t.sweep_id)
    step = record.get("epoch")
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
        raise InvalidInput(f"a step is an integer ≥ 0, not {step!r}", field="step")
    step = int(step)
    record = {**record, "epoch": step}
    diverged = bool(record.get("diverged")) or any(
        not _finite(record[k]) for k in LOOP_SCALARS if k in record
    )
    if diverged:
        record["diverged"] = True
    stored = _stored(s, trial_id, step)
    if stored is not None:
        if not _same(stored, record, t.diverged_epoch == step):
            raise Conflict(
                f"step {step} of trial {trial_id} is stored with other values; a stored step "
                "is never rewritten (send the same record, or a later step)"
            )
        return _answer(t, w, step, stored=False)
    if t.last_epoch is not None and step < t.last_epoch:
        raise InvalidInput(
            f"step {step} is below the last stored step {t.last_epoch} of trial {trial_id}; "
            "steps only go forward",
            field="step",
        )
    if TrialStatus(t.status).is_finished():
        raise Conflict(f"trial {trial_id} is {t.status}; it takes no new steps")
    if step > t.epochs:  # the trial's schedule grows with the loop (write_records checks it)
        t.epochs, t.epochs_total = step, step + 1
        t.config = {**t.config, "epochs": step}
    s.flush()
    results.write_records(s, [(trial_id, record)])
    if diverged:
        t.status, t.finished_at = TrialStatus.DIVERGED, utcnow()
        s.flush()
    return _answer(t, w, step, stored=True)


def _answer(t: SqlTrial, w: SqlSweep, step: int, *, stored: bool) -> dict[str, Any]:
    return {
        "stored": stored,
        "step": step,
        "last_step": t.last_epoch,
        "diverged": t.diverged_epoch is not None,
        "cancel_requested": bool(w.cancel_requested),
        "status": t.status,
        "trial_id": t.id,
        "sweep_id": w.id,
    }


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return True  # not a number: write_records names it


def _stored(s: Session, trial_id: int, step: int) -> dict[str, np.ndarray] | None:
    """The step's stored metrics and 2-D arrays (service.store.spectra), None if none."""
    rows = s.execute(
        select(SqlMetric.metric, SqlMetric.data).where(
            SqlMetric.trial_id == trial_id, SqlMetric.epoch == step
        )
    ).all()
    if not rows:
        return None
    arrays = s.execute(
        select(SqlSpectrum.name, SqlSpectrum.shape, SqlSpectrum.data).where(
            SqlSpectrum.trial_id == trial_id, SqlSpectrum.epoch == step
        )
    ).all()
    out = {m: codec.decode(d) for m, d in rows}
    out.update({k: codec.decode(d).reshape(shape) for k, shape, d in arrays})
    return out


def _same(stored: dict[str, np.ndarray], record: dict[str, Any], was_diverged: bool) -> bool:
    if bool(record.get("diverged")) != was_diverged:
        return False
    keys = {k for k in record if k not in RECORD_KEYS}
    if keys != set(stored):
        return False
    for k in keys:
        try:
            v = np.asarray(record[k], dtype=np.float64)
        except (TypeError, ValueError):
            return False
        v = v if v.ndim == 2 else np.atleast_1d(v)
        if v.shape != stored[k].shape or not np.array_equal(v, stored[k], equal_nan=True):
            return False
    return True


def finish_run(s: Session, trial_id: int) -> dict[str, Any]:
    """End an external trial: `completed` (`diverged` if it diverged; records stay). When no
    other run of its sweep is still recording, the sweep finishes too: `cancelled` if a cancel
    was requested, else `completed`. Finishing a finished trial is a no-op.

    Returns {"trial": TrialInfo, "sweep": SweepInfo}."""
    t = s.scalars(select(SqlTrial).where(SqlTrial.id == trial_id).with_for_update()).one_or_none()
    if t is None:
        raise NotFound(f"no trial with id {trial_id}")
    w = external_sweep_row(s, t.sweep_id, lock=True)
    if not TrialStatus(t.status).is_finished():
        if w.cancel_requested:
            t.status = TrialStatus.CANCELLED
        elif t.diverged_epoch is not None:
            t.status = TrialStatus.DIVERGED
        else:
            t.status = TrialStatus.COMPLETED
        t.finished_at = utcnow()
        s.flush()
    left = s.scalar(
        select(SqlTrial.id)
        .where(SqlTrial.sweep_id == w.id, SqlTrial.status.in_(sweeps.UNFINISHED_TRIAL))
        .limit(1)
    )
    if left is None and not SweepStatus(w.status).is_finished():
        sweeps.finish_sweep(s, w.id)
        w.runner_id = None
        s.flush()
    return {"trial": trial_info(t), "sweep": sweeps.sweep_infos(s, [w])[0]}


def sweep_state(s: Session, sweep_id: int) -> SweepInfo:
    external_sweep_row(s, sweep_id)
    return sweeps.sweep_infos(s, [sweeps.get_sweep_row(s, sweep_id)])[0]


# --- the Store's transactions (the Store itself is left as it is) -----------------------------


def store_open_sweep(store: Any, name: str, config: dict[str, Any]) -> SweepInfo:
    with store._write() as s:
        return open_sweep(s, name, config)


def store_open_trial(store: Any, sweep_id: int, run: str, **kw: Any) -> TrialInfo:
    with store._write() as s:
        return open_trial(s, sweep_id, run, **kw)


def store_append(store: Any, trial_id: int, record: dict[str, Any]) -> dict[str, Any]:
    with store._write() as s:
        return append_record(s, trial_id, record)


def store_finish(store: Any, trial_id: int) -> dict[str, Any]:
    with store._write() as s:
        return finish_run(s, trial_id)
