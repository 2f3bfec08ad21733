"""The Store: the only way anything reads or writes the database. Every public method is one
transaction (commit, or roll back and raise StorageError; domain errors pass through)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy.orm import Session

from service.errors import InvalidInput
from service.settings import Settings, get_settings
from service.spec import SweepSpec
from service.status import SweepStatus
from service.store import reads, results, spectra, sweeps, trials
from service.store.engine import Sessions, make_engine
from service.store.engine import migrate as run_migrations
from service.store.schemas import SweepInfo, TrialInfo


class Store:
    """Sweeps, trials and their metrics in SQLite (default) or Postgres.

    Args:
        url: a SQLAlchemy URL (`sqlite:///path.db`, `postgresql+psycopg://…`; plain
            `postgresql://` is routed to psycopg 3). Defaults to settings.database_url.
        migrate: apply Alembic migrations up to head first (safe with concurrent starts).
        settings: limits on reads and specs; defaults to get_settings().

    Raises:
        StorageError: the database is unreachable or cannot be migrated.
    """

    def __init__(
        self, url: str | None = None, *, migrate: bool = True, settings: Settings | None = None
    ):
        self.settings = settings or get_settings()
        self.url = url or self.settings.database_url
        self.engine = make_engine(self.url)
        self._sessions = Sessions(self.engine)
        if migrate:
            try:
                run_migrations(self.engine)
            except Exception:
                self.engine.dispose()
                raise

    @property
    def dialect(self) -> str:
        """ "sqlite" or "postgresql"."""
        return self.engine.dialect.name

    def close(self) -> None:
        """Close every pooled connection. The Store is unusable afterwards."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> AbstractContextManager[Session]:
        return self._sessions.transaction(write=False)

    def _write(self) -> AbstractContextManager[Session]:
        return self._sessions.transaction(write=True)

    # --- sweeps -------------------------------------------------------------------------------

    def create_sweep(self, spec: SweepSpec) -> SweepInfo:
        """Write a sweep and all its trials as `queued`, in one transaction.

        A trial whose config hash (config + measurement version) already finished `completed`
        or `diverged` is created finished, with that status and `results_from` pointing at the
        original, unless `spec.rerun`. A sweep whose trials are all reused is `completed` at once.

        Args:
            spec: a validated SweepSpec (service.spec.parse_spec); limits are checked again
                against this store's settings.

        Raises:
            LimitExceeded: the spec is over a limit of this store's settings.
            InvalidInput: some combination of parameters is not a valid trial.
            StorageError: the database failed; nothing was written.
        """
        with self._write() as s:
            return sweeps.create_sweep(s, spec, self.settings)

    def get_sweep(self, sweep_id: int) -> SweepInfo:
        """One sweep with its trial counts by status, progress and ETA.

        Raises:
            NotFound: no sweep has this id; `trial` is not one of its trials.
        """
        with self._read() as s:
            return sweeps.sweep_infos(s, [sweeps.get_sweep_row(s, sweep_id)])[0]

    def list_sweeps(
        self, *, status: str | None = None, offset: int = 0, limit: int = 50
    ) -> tuple[list[SweepInfo], int]:
        """A page of sweeps, newest first, and the total number matching.

        Args:
            status: only sweeps with this status.
            offset, limit: the page; limit ≤ settings.max_page_size.

        Raises:
            InvalidInput: unknown status, negative offset, limit < 1.
            LimitExceeded: limit over settings.max_page_size.
        """
        with self._read() as s:
            return sweeps.list_sweeps(s, status, offset, limit, self.settings)

    def request_cancel(self, sweep_id: int) -> SweepInfo:
        """Ask a sweep to stop. Queued trials become `cancelled` at once, and so does a queued
        sweep; a running sweep keeps running until its runner notices the flag and calls
        finish_sweep. Cancelling a finished sweep is a no-op that returns it. Stored results
        always stay.

        Raises:
            NotFound: no sweep has this id.
        """
        with self._write() as s:
            return sweeps.request_cancel(s, sweep_id)

    def claim_sweep(
        self, runner_id: str, lease_s: float, *, sweep_id: int | None = None
    ) -> SweepInfo | None:
        """Atomically take the next sweep to run: the highest priority, then the one that ran
        least recently (never-run sweeps first, oldest first; then by last heartbeat, so that a
        long sweep that gave its runner up for a while goes behind the sweeps waiting), that is
        queued or running with an expired lease (its runner died). The sweep becomes `running`
        under `runner_id` for `lease_s` seconds (heartbeat extends it); trials left `running` by
        a dead runner go back to `queued`. Two runners never get the same sweep.

        Args:
            sweep_id: claim this sweep only (as `isosweep run` does), if it is claimable.

        Returns:
            The claimed sweep, or None when there is nothing to run.

        Raises:
            InvalidInput: empty runner_id or lease_s ≤ 0.
        """
        with self._write() as s:
            return sweeps.claim_sweep(s, runner_id, lease_s, sweep_id)

    def release_sweep(self, sweep_id: int, runner_id: str) -> bool:
        """Give a running sweep back to the queue at once (a runner stopping cleanly): its
        running trials become `queued` and any runner may claim it without waiting for the lease.

        Returns:
            False when the sweep is not running under this runner (nothing changes).

        Raises:
            NotFound: no sweep has this id.
        """
        with self._write() as s:
            return sweeps.release_sweep(s, sweep_id, runner_id)

    def heartbeat(self, sweep_id: int, runner_id: str) -> bool:
        """Extend the runner's lease on a running sweep by the lease_s it claimed with.

        Returns:
            False when the sweep is no longer running under this runner (another took it over,
            or it finished): the caller must stop driving it.

        Raises:
            NotFound: no sweep has this id.
        """
        with self._write() as s:
            return sweeps.heartbeat(s, sweep_id, runner_id)

    def is_sweep_waiting(self, sweep_id: int) -> bool:
        """Whether another sweep is claimable now and would be claimed before this one if it
        went back to the queue: one of at least its priority (claim order: priority, then the
        sweep that ran least recently). A runner driving a long sweep asks it to know when to
        give the runner up for a while (workers.driver).

        Raises:
            NotFound: no sweep has this id.
        """
        with self._read() as s:
            return sweeps.is_sweep_waiting(s, sweep_id)

    def is_cancel_requested(self, sweep_id: int) -> bool:
        """Whether cancel was requested (one indexed read; the Tune stopper polls it).

        Raises:
            NotFound: no sweep has this id.
        """
        with self._read() as s:
            return sweeps.is_cancel_requested(s, sweep_id)

    def finish_sweep(self, sweep_id: int) -> SweepInfo:
        """Set a sweep's final status from its trials; the runner calls it when done.

        The rule: `cancelled` when cancel was requested (trials still queued or running become
        `cancelled`); otherwise `failed` when any trial failed; otherwise `completed` (every
        trial completed or diverged). Finishing a finished sweep returns it unchanged.

        Raises:
            NotFound: no sweep has this id.
            Conflict: trials are still queued or running and no cancel was requested.
        """
        with self._write() as s:
            return sweeps.finish_sweep(s, sweep_id)

    # --- trials -------------------------------------------------------------------------------

    def list_trials(
        self,
        sweep_id: int,
        *,
        status: str | None = None,
        where: dict[str, Any] | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> tuple[list[TrialInfo], int]:
        """A page of a sweep's trials in expansion order, and the total number matching.

        Args:
            status: only trials with this status.
            where: config field → value, or a list of values (any of them), e.g.
                {"depth": [10, 100], "norm": "batch"}; values are validated like TrialConfig's.
            offset, limit: the page; limit ≤ settings.max_page_size.

        Raises:
            NotFound: no sweep has this id.
            InvalidInput: an unknown config field (naming it, listing the fields) or status, or
                a bad value or page.
            LimitExceeded: limit over settings.max_page_size.
        """
        with self._read() as s:
            return trials.list_trials(s, sweep_id, status, where, offset, limit, self.settings)

    def get_trial(self, trial_id: int) -> TrialInfo:
        """One trial: config, status, attempts, error, times, progress, summary.

        Raises:
            NotFound: no trial has this id.
        """
        with self._read() as s:
            return trials.trial_info(trials.get_trial_row(s, trial_id))

    def runnable_trials(
        self, sweep_id: int, *, after_index: int | None = None, limit: int | None = None
    ) -> list[TrialInfo]:
        """The sweep's trials still to run (queued or running, not reused), in expansion order.

        Args:
            after_index, limit: one page of them: the first `limit` whose index is above
                `after_index` (a keyset page: the driver reads a sweep of any size this way,
                each page in the same time).

        Raises:
            NotFound: no sweep has this id.
            InvalidInput: limit < 1.
        """
        with self._read() as s:
            return trials.runnable_trials(s, sweep_id, after_index, limit)

    def append_trials(
        self, sweep_id: int, configs: list[Any], *, runner_id: str | None = None
    ) -> list[TrialInfo]:
        """Add trials (TrialConfigs) to a sweep at its next indices: an adaptive search's asks
        (service/search/tpe.py). A config whose results are stored (completed or diverged, same
        config hash) is created finished and reusing them, as in create_sweep, unless the
        spec says `rerun`.

        Args:
            runner_id: fence the write: only while the sweep is running under this runner.

        Raises:
            NotFound: no sweep has this id.
            LeaseLost: (a Conflict) runner_id does not hold the sweep.
        """
        with self._write() as s:
            w = sweeps.get_sweep_row(s, sweep_id, lock=True)
            if runner_id is not None and (
                w.status != SweepStatus.RUNNING or w.runner_id != runner_id
            ):
                raise sweeps.LeaseLost(
                    f"sweep {sweep_id} is no longer held by runner {runner_id} "
                    f"({w.status}, runner {w.runner_id}); nothing was written"
                )
            rerun = bool((w.spec or {}).get("rerun", False))
            rows = sweeps.append_trials(s, sweep_id, configs, rerun=rerun)
            return [trials.trial_info(t) for t in rows]

    def runnable_totals(self, sweep_id: int) -> tuple[int, int]:
        """How many of the sweep's trials are still to run, and the records a full run of them
        writes (one counting query; nothing listed).

        Raises:
            NotFound: no sweep has this id.
        """
        with self._read() as s:
            return trials.runnable_totals(s, sweep_id)

    def start_trial(self, trial_id: int, *, runner_id: str | None = None) -> TrialInfo:
        """Mark an attempt of a trial as started: `running`, attempts + 1, started_at now, its
        progress (epochs_done) and diverged_epoch reset, and the results of earlier attempts
        deleted, so the stored rows are always those of one attempt (a retry that diverges
        earlier than the attempt it replaces leaves no stale later epochs). A retry calls it again.

        Args:
            runner_id: fence the write: it happens only while the trial's sweep is running
                under this runner (the driver passes its own), else LeaseLost.

        Raises:
            NotFound: no trial has this id.
            Conflict: the trial reuses stored results, or is completed, diverged or cancelled.
            LeaseLost: (a Conflict) runner_id no longer holds the trial's sweep.
        """
        with self._write() as s:
            self._fence(s, [trial_id], runner_id)
            return trials.start_trial(s, trial_id)

    def finish_trial(
        self, trial_id: int, status: str, error: str | None = None, *, runner_id: str | None = None
    ) -> TrialInfo:
        """Mark a trial finished.

        Args:
            status: `completed`, `diverged`, `failed` or `cancelled` (service.status).
            error: what went wrong (for `failed`).
            runner_id: fence the write, as in start_trial.

        Raises:
            NotFound: no trial has this id.
            InvalidInput: status is not a finished status.
            Conflict: the trial reuses stored results.
            LeaseLost: (a Conflict) runner_id no longer holds the trial's sweep.
        """
        with self._write() as s:
            self._fence(s, [trial_id], runner_id)
            return trials.finish_trial(s, trial_id, status, error)

    # --- results ------------------------------------------------------------------------------

    def write_records(
        self, batch: list[tuple[int, dict[str, Any]]], *, runner_id: str | None = None
    ) -> None:
        """Store epoch records (docs/architecture.md) of many trials in one transaction.

        Idempotent: each (trial, metric, epoch) is upserted, and an epoch written again is
        replaced whole. Updates each trial's epochs_done, last_epoch, diverged_epoch and summary.
        NaN and ±inf are stored bit-exactly.

        Args:
            batch: (trial_id, record) pairs; a record holds "epoch", optional "diverged" and
                "input_gram" (n × n), "input_moments" (n,), any of service.config.METRICS,
                and any of SPECTRUM_KEYS (2-D arrays, read back with `spectra`).
            runner_id: fence the write, as in start_trial.

        Raises:
            NotFound: a trial id does not exist.
            Conflict: a trial reuses another's results (it has none of its own).
            LeaseLost: (a Conflict) runner_id no longer holds a trial's sweep; nothing is
                written.
            InvalidInput: an unknown metric, a per-layer vector whose length is not the trial's
                depth, a non-numeric value, or an epoch outside 0..epochs. Nothing is written.
        """
        with self._write() as s:
            self._fence(s, [tid for tid, _ in batch], runner_id)
            results.write_records(s, batch)

    def read_metrics(
        self,
        sweep_id: int,
        *,
        metrics: str | list[str] | None = None,
        epoch: int | list[int] | str | None = None,
        layers: int | list[int] | None = None,
        where: dict[str, Any] | None = None,
        aggregate: bool = False,
        stat: str = "mean",
        trial: int | None = None,
        max_points: int | None = None,
    ) -> pd.DataFrame:
        """The tidy frame (docs/architecture.md): trial_id, the sweep's swept fields, epoch,
        metric, layer (Int64, <NA> for scalars), value; sorted by trial, metric, epoch, layer.

        Args:
            metrics: names from service.config.METRICS (all when None).
            epoch: a number, a list of them, or "last" (each trial's highest stored epoch).
            layers: layer indices ℓ ≥ 1 kept for per-layer metrics (scalars are unaffected).
            where: config filters, as in list_trials.
            aggregate: pool seeds with service.tidy.aggregate_over_seeds.
            stat: with aggregate, "geomean" or "median" adds that column (service.tidy.STATS).
            trial: this trial of the sweep only (by id: trials that differ only in a document
                parameter, or in nothing a filter can name, are told apart).
            max_points: the most values the query may return (default settings.max_points).

        Raises:
            NotFound: no sweep has this id.
            InvalidInput: an unknown metric (listing METRICS) or config field, a bad epoch/layer.
            LimitExceeded: the query would return more than max_points values; counted before
                anything is decoded.
        """
        bound = self._bound(max_points)
        with self._read() as s:
            return reads.read_metrics(
                s,
                sweep_id,
                metrics=metrics,
                epoch=epoch,
                layers=layers,
                where=where,
                aggregate=aggregate,
                stat=stat,
                trial=trial,
                max_points=bound,
            )

    def trial_history(self, trial_id: int, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """One metric of one trial over its stored epochs.

        Returns:
            epochs (E,) and values: (E, L) for a per-layer metric, (E,) for a scalar.

        Raises:
            NotFound: no trial has this id.
            InvalidInput: an unknown metric (listing METRICS).
            LimitExceeded: more than settings.max_points values.
        """
        with self._read() as s:
            return reads.trial_history(s, trial_id, metric, self.settings.max_points)

    def input_gram(self, trial_id: int) -> np.ndarray | None:
        """The trial's input Gram (n × n, recorded with epoch 0), or None if not stored.

        Raises:
            NotFound: no trial has this id.
        """
        with self._read() as s:
            return reads.input_gram(s, trial_id)

    def input_moments(self, trial_id: int) -> np.ndarray | None:
        """The trial's ‖x_i‖²/d_in of its probe inputs, (n,), recorded with epoch 0 after
        input_norm; None if not stored (trials recorded before it existed).

        Raises:
            NotFound: no trial has this id.
        """
        with self._read() as s:
            return reads.input_gram(s, trial_id, "input_moments")

    def spectra(
        self,
        trial_id: int,
        *,
        name: str | None = None,
        epoch: int | str | None = None,
        layer: int | None = None,
    ) -> list[spectra.Spectrum]:
        """The trial's stored per-epoch arrays (service.config.SPECTRUM_KEYS), by name then
        epoch: Gram eigenvalues `spectrum/*` (L, n), Jacobian singular values (k, m).

        Args:
            name: one of SPECTRUM_KEYS (all when None).
            epoch: a stored epoch, "last" (the highest stored, per name), or None (all).
            layer: ℓ ≥ 1: only that row of each `spectrum/*` array (the Jacobian, which has
                none, is left out).

        Raises:
            NotFound: no trial has this id.
            InvalidInput: an unknown name (listing them), an epoch with nothing stored
                (listing the stored ones), a layer outside 1..depth or asked of the Jacobian.
            LimitExceeded: more than settings.max_points values.
        """
        with self._read() as s:
            return spectra.read_spectra(
                s, trial_id, name=name, epoch=epoch, layer=layer,
                max_points=self.settings.max_points,
            )  # fmt: skip

    @staticmethod
    def _fence(s: Session, trial_ids: list[int], runner_id: str | None) -> None:
        if runner_id is not None and trial_ids:
            sweeps.check_holder(s, trial_ids, runner_id)

    def _bound(self, max_points: int | None) -> int:
        if max_points is None:
            return self.settings.max_points
        if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1:
            raise InvalidInput("a positive integer", field="max_points")
        return max_points
