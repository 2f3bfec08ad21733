"""`isosweep.Monitor`: isosweep's measurement inside the user's own training loop
(docs/own-loop.md).

    monitor = isosweep.Monitor(model, x_probe, y=y_probe, client=isosweep.Client(url),
                               sweep="my-transformer", taps="blocks.{i}", config=cfg)
    for step in range(steps):
        ...                                   # the user's own step: optimizer, AMP, schedule
        if step % 100 == 0 and not monitor.record(step, loss=loss.item()):
            break                             # cancelled from the dashboard, or diverged
    monitor.finish()

`record(step, **scalars)` measures the fixed batch `x` with `isosweep.probe` (workers/probe.py)
now — the module is left as it was — and stores that record, with the user's scalars, as the
record of epoch = step of an external trial of the named sweep (service/store/external.py),
either in a local `Store` (`store=`) or on a server through `Client` (`client=`): every key
probe returns — the per-tap metrics (effective and stable rank, the registered ones), the
attention entropy, and the update ratio since the previous record included. A scalar other than
the five the store shares with isosweep's trials (train_loss, …) — a learning rate, a clip
fraction — is stored as the scalar metric `loop/<name>` (service.metric_names.LOOP_PREFIX). It
returns True to go on, False once the sweep was cancelled (`POST /sweeps/{id}/cancel`, the
dashboard's button) or the run diverged (a non-finite train_loss, …; also a resumed run that
had diverged); the record that sees it is still stored. The user's config becomes the
trial's `model_params` (flattened), so `model_params.<name>` filters, plot axes, group-bys and
compare read it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

import numpy as np

from service.config import SPECTRUM_KEYS
from service.errors import InvalidInput
from service.metric_names import LOOP_NAME_MAX, LOOP_PREFIX, is_loop_name
from service.models import known_metrics
from service.status import TrialStatus
from service.store.external import LOOP_SCALARS, flatten

# The user's scalar keywords the store shares with isosweep's trials (LOOP_SCALARS) and their
# short spellings; any other keyword is the user's own scalar, stored as loop/<name>.
ALIASES = {"loss": "train_loss", "acc": "train_acc", "accuracy": "train_acc"}
SCALAR_NAMES = (*LOOP_SCALARS, *ALIASES)


class Monitor:
    """Measure a fixed batch through `module` at the steps of the user's own loop and store
    each measurement as a record of an external trial (docs/own-loop.md).

    Args:
        module, x, y, loss, taps, head, mode: as `isosweep.probe` takes them (docs/probe.md);
            `x` (and `y`) is the fixed probe batch measured at every record.
        client: an `isosweep.Client` — records go to its server; or
        store: a `service.store.Store` — records go to its database (exactly one of the two).
        sweep: the external sweep's name; created on first use, found again by name.
        config: the run's free-form config (nested mappings become dotted names, a value that
            is not a JSON scalar its JSON text): the trial's `model_params`, and an entry of
            the sweep's `model_params` axis.
        run: the run key that finds this run's trial again after a restart (default: a digest
            of the flattened config, so the same config resumes the same trial).
        update_ratio: keep the matrix weights of each record (one copy) and store the update
            ratio per tap since the previous record of this Monitor (NaN at its first, also
            after a restart: the previous weights are gone with the process).

    Raises:
        InvalidInput: neither or both of client and store, a tap that is not a submodule.
        Conflict (ApiError 409 through a client): the name belongs to a sweep isosweep runs, or
            to a cancelled external sweep.
    """

    def __init__(
        self,
        module: Any,
        x: Any,
        *,
        y: Any = None,
        loss: Any = None,
        client: Any = None,
        store: Any = None,
        sweep: str,
        taps: str | Sequence[str] = "blocks.{i}",
        config: Mapping[str, Any] | None = None,
        run: str | None = None,
        head: str | None = None,
        mode: str = "batch",
        update_ratio: bool = True,
    ) -> None:
        from workers.probe import tap_names

        if (client is None) == (store is None):
            raise InvalidInput("give exactly one of client= (a server) and store= (a database)")
        self.module, self.x, self.y, self.loss = module, x, y, loss
        self.taps = tap_names(module, taps)  # a wrong name: InvalidInput naming the closest
        self.head, self.mode, self.update_ratio = head, mode, update_ratio
        first = x if hasattr(x, "shape") else x[0]
        self.config = flatten(dict(config or {}))
        self.run = run if run is not None else _run_key(self.config)
        self._io: _Backend = _ClientBackend(client) if client is not None else _StoreBackend(store)
        self.sweep_id = self._io.open_sweep(sweep, self.config)
        trial = self._io.open_trial(
            self.sweep_id, self.run, depth=len(self.taps), batch_size=int(first.shape[0]),
            config=self.config,
        )  # fmt: skip
        self.trial_id: int = trial["id"]
        self.last_step: int | None = trial["last_epoch"]  # where a resumed run left off
        self.status: str = trial["status"]
        self.cancelled = False
        self.diverged = trial["diverged_epoch"] is not None
        # cancelled or diverged — a resumed run that diverged too —: record() returns False
        self.stopped = self.diverged or self.status == TrialStatus.DIVERGED
        self.last_record: dict[str, Any] | None = None  # probe's whole record, last step
        self.dropped: tuple[str, ...] = ()  # its keys the store does not take (none known)
        # (step, matrix weights) of this Monitor's last record and of the one before it: the
        # update ratio of a step is since the last earlier step (the same step again: the same)
        self._last: tuple[int, dict[str, Any]] | None = None
        self._before: tuple[int, dict[str, Any]] | None = None

    def __repr__(self) -> str:
        return f"isosweep.Monitor(sweep {self.sweep_id}, trial {self.trial_id}, run {self.run!r})"

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:  # a loop that raised leaves its trial running: it can resume
            self.finish()

    def record(self, step: int, **scalars: Any) -> bool:
        """Probe the fixed batch now and store the record as epoch `step` with `scalars`:
        train_loss (or `loss`), train_acc (or `acc`), test_loss, test_acc, epoch_time_s — the
        scalar metrics of isosweep's own trials — and any other scalar of the loop's (`lr=3e-4`,
        `clip_frac=…`, `tokens=…`), stored as the scalar metric `loop/<name>` (`loop/lr`) and
        read as the others are (`metrics(…, metric="loop/lr")`, a training_curves plot).

        Returns:
            True to go on; False once the sweep was cancelled or the run diverged (a non-finite
            train_loss, train_acc, test_loss, test_acc or epoch_time_s: the record is stored
            with `diverged` and the trial ends `diverged`; a non-finite `loop/` scalar is
            stored as it is, and is no divergence).

        Raises:
            InvalidInput (ApiError 422): a scalar name that is not [A-Za-z_][A-Za-z0-9_.]* of
                at most 59 characters, a value that is not a number (each naming the keyword),
                a step that is not an integer ≥ 0, a step below the last stored one.
            Conflict (ApiError 409): another record for a step already stored, or a new step
                of a finished trial.
        """
        if self.stopped:
            return False
        values = _scalars(scalars)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidInput(f"a step is an integer ≥ 0, not {step!r}", field="step")
        diverging = any(not math.isfinite(v) for k, v in values.items() if k in LOOP_SCALARS)
        record = self._probe(step, diverging=diverging)
        self.last_record = {**record, **values}
        storable = {*known_metrics(), *SPECTRUM_KEYS}
        kept = {k: v for k, v in record.items() if k in storable}
        self.dropped = tuple(k for k in record if k not in storable)
        answer = self._io.append(self.trial_id, step, {**kept, **values})
        self.last_step = answer["last_step"]
        self.status = answer["status"]
        self.cancelled = bool(answer["cancel_requested"])
        self.diverged = bool(answer["diverged"])
        self.stopped = self.cancelled or self.diverged
        return not self.stopped

    def _probe(self, step: int, *, diverging: bool) -> dict[str, Any]:
        from workers.probe import probe

        earlier = self._before if self._last is not None and self._last[0] == step else self._last
        previous = earlier[1] if self.update_ratio and earlier is not None else None
        try:
            record = probe(
                self.module, self.x, y=self.y, loss=self.loss, taps=self.taps, head=self.head,
                mode=self.mode, previous=previous,  # type: ignore[arg-type]
            )  # fmt: skip
        except Exception:
            if not diverging:
                raise
            return {}  # a diverged model may not be measurable: its scalars are the record
        if self.update_ratio:
            if previous is None:  # a first record (or the first after a restart): NaN
                record["update_ratio"] = np.full(len(self.taps), math.nan)
                if "head_weight_isometry_gap" in record:
                    record["head_update_ratio"] = math.nan
            if self._last is None or self._last[0] < step:
                self._before = self._last
            # the weights update_ratio reads: those with two or more axes
            now = {k: v.detach().clone() for k, v in self.module.named_parameters() if v.ndim >= 2}
            self._last = (step, now)
        return record

    def finish(self) -> str:
        """End the run: its trial `completed` (`diverged` if it diverged, `cancelled` after a
        cancel); the sweep finishes with its last run. Returns the trial's status."""
        done = self._io.finish(self.trial_id)
        self.status = done["status"]
        return self.status


def _run_key(config: Mapping[str, Any]) -> str:
    text = json.dumps(config, sort_keys=True, default=str)
    return "config-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _scalars(scalars: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in scalars.items():
        key = ALIASES.get(name, name)
        if key not in LOOP_SCALARS:  # the user's own: loop/<name>
            if not is_loop_name(name):
                hint = (
                    f" (give {name!r} as {name.removeprefix(LOOP_PREFIX)!r}: the store adds "
                    f"{LOOP_PREFIX!r})"
                    if name.startswith(LOOP_PREFIX)
                    else ""
                )
                raise InvalidInput(
                    f"a scalar's name is [A-Za-z_][A-Za-z0-9_.]* of at most {LOOP_NAME_MAX} "
                    f"characters, not {name!r}{hint}; it is stored as {LOOP_PREFIX}<name> "
                    f"besides {', '.join(LOOP_SCALARS)} (loss and acc are short for "
                    "train_loss and train_acc)",
                    field=name,
                    allowed=SCALAR_NAMES,
                )
            key = LOOP_PREFIX + name
        if key in out:
            raise InvalidInput(f"{key} is given twice ({name!r} is short for it)", field=name)
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()  # a 0-d tensor or numpy scalar
        if isinstance(value, bool) or not isinstance(value, Real):
            raise InvalidInput(f"{name}: a number, not {value!r}", field=name)
        out[key] = float(value)
    return out


class _Backend:
    def open_sweep(self, name: str, config: dict[str, Any]) -> int:
        raise NotImplementedError

    def open_trial(self, sweep_id: int, run: str, **kw: Any) -> dict[str, Any]:
        raise NotImplementedError

    def append(self, trial_id: int, step: int, record: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def finish(self, trial_id: int) -> dict[str, Any]:
        raise NotImplementedError


class _StoreBackend(_Backend):
    def __init__(self, store: Any) -> None:
        self.store = store

    def open_sweep(self, name: str, config: dict[str, Any]) -> int:
        from service.store import external

        return external.store_open_sweep(self.store, name, config).id

    def open_trial(self, sweep_id: int, run: str, **kw: Any) -> dict[str, Any]:
        from service.store import external

        return external.store_open_trial(self.store, sweep_id, run, **kw).model_dump()

    def append(self, trial_id: int, step: int, record: dict[str, Any]) -> dict[str, Any]:
        from service.store import external

        return external.store_append(self.store, trial_id, {**record, "epoch": step})

    def finish(self, trial_id: int) -> dict[str, Any]:
        from service.store import external

        return {"status": external.store_finish(self.store, trial_id)["trial"].status}


class _ClientBackend(_Backend):
    def __init__(self, client: Any) -> None:
        self.client = client

    def open_sweep(self, name: str, config: dict[str, Any]) -> int:
        return int(self.client.external_sweep(name, config)["id"])

    def open_trial(self, sweep_id: int, run: str, **kw: Any) -> dict[str, Any]:
        return self.client.external_trial(sweep_id, run, **kw)

    def append(self, trial_id: int, step: int, record: dict[str, Any]) -> dict[str, Any]:
        return self.client.external_record(trial_id, step, record)

    def finish(self, trial_id: int) -> dict[str, Any]:
        return self.client.external_finish(trial_id)["trial"]
