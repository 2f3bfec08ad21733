"""The sweep driver: run a claimed sweep's unfinished trials on Ray Tune and store what they report.

    info = run_sweep(store, sweep_id, runner_id="host:123")

- One Tune trial per stored trial still to run (`store.runnable_trials`): a grid over
  {"trial_id", "config", "data_dir"} dicts, each with the spec's resources (CPU or GPU,
  fractional GPUs allowed) and `FailureConfig(max_failures=spec.max_failures)`.
- workers/callbacks.py: `StoreCallback` (the only writer), `CancelStopper` (the cancel flag,
  divergence), `Heartbeat` (the lease), `SweepProgress`.
- The lease: `Runner.run_once` starts the Heartbeat at the claim, before Ray starts, and hands its
  `SweepControl` in; called without one, run_sweep holds the lease itself from its start.

Resumption is the store's, not Tune's: a restarted runner claims the sweep again and runs the
trials that are not finished; writes are idempotent upserts, so nothing is duplicated.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import ray
from ray import tune

from service.errors import Conflict
from service.spec import SweepSpec
from service.status import TrialStatus
from service.store import Store, SweepInfo, TrialInfo
from workers.callbacks import (
    CancelStopper,
    Heartbeat,
    StoreCallback,
    SweepControl,
    SweepProgress,
    trial_name,
)
from workers.trainable import PARAM_KEY, run_trial

log = logging.getLogger("isosweep.driver")

TUNE_LOGGERS = (  # Tune's own reports of what StoreCallback already records
    "ray.tune.tune",
    "ray.tune.execution.tune_controller",
    "ray.tune.analysis.experiment_analysis",
)


# --- Ray and the sweep run ----------------------------------------------------------------------


def init_ray(
    address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None
) -> bool:
    """Connect to the Ray cluster at `address` (or RAY_ADDRESS), else start a local instance.

    Returns:
        True when this call started Ray (the caller shuts it down), False when Ray was already
        initialized in this process.
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        log.info("connected to the Ray cluster at %s", address)
    else:
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False)
        log.info("started a local Ray instance: %s", ray.cluster_resources())
    return True


def run_sweep(
    store: Store,
    sweep_id: int,
    *,
    runner_id: str,
    progress: Callable[[SweepProgress], None] | None = None,
    ray_address: str | None = None,
    lease_s: float | None = None,
    control: SweepControl | None = None,
) -> SweepInfo:
    """Run the trials of a sweep claimed by `runner_id` that are not finished, then finish it.

    Args:
        store: where the sweep is; the only place results go.
        sweep_id: a sweep this runner holds (store.claim_sweep).
        runner_id: the id it was claimed with; the heartbeat extends that lease.
        progress: called with a SweepProgress after every trial event (in the driver thread).
        ray_address: the cluster, when Ray is not initialized yet (default RAY_ADDRESS, else a
            local instance).
        lease_s: the lease the sweep was claimed with (default settings.runner_lease_s); the
            heartbeat runs every lease_s / 3.
        control: the run's SweepControl when the caller already holds the lease with a
            Heartbeat of its own (Runner.run_once, from the claim on; `lease_s` is then
            unused). Setting its `stop` stops the run cleanly (the runner's SIGTERM): trials
            stop, records are flushed, and the sweep goes back to the queue at once
            (store.release_sweep). Without it, run_sweep starts the Heartbeat itself, and the
            run ends when the sweep is finished, cancelled or taken over.

    Returns:
        The sweep as it stands: finished (completed, failed or cancelled), queued again when it
        was stopped, or running when another runner took it over.

    Raises:
        NotFound: no such sweep.
        StorageError: the store failed while results were being written.
    """
    sweep = store.get_sweep(sweep_id)
    spec = SweepSpec.model_validate(sweep.spec)
    trials = store.runnable_trials(sweep_id)
    tracker = new_progress(sweep, trials)
    if progress is not None:
        progress(tracker)
    held = control is not None
    control = control or SweepControl()
    lease = lease_s or store.settings.runner_lease_s
    beat = Heartbeat(store, sweep_id, runner_id, lease / 3, control, lease_s=lease)
    with contextlib.nullcontext() if held else beat:
        # not when cancelled while its runner was gone, nor stopped or lost while Ray started
        if trials and not sweep.cancel_requested and not control.halted():
            init_ray(ray_address)
            local = not (ray_address or os.environ.get("RAY_ADDRESS"))
            short = unmet_resources(spec.resources.cpu, spec.resources.gpu) if local else None
            if short:  # a fixed local instance would wait forever: fail the trials instead
                for t in trials:
                    store.finish_trial(t.id, TrialStatus.FAILED, short, runner_id=runner_id)
            else:
                _tune(store, sweep, spec, trials, control, tracker, progress, runner_id)
    return conclude(store, sweep_id, runner_id, control)


def unmet_resources(cpu: float, gpu: float) -> str | None:
    """Why one trial can never be placed on this Ray instance, or None when it can."""
    have = ray.cluster_resources()
    for name, need in (("CPU", cpu), ("GPU", gpu)):
        if need > have.get(name, 0):
            return (
                f"resources.{name.lower()}: a trial needs {need:g} {name}, but the local Ray "
                f"instance has {have.get(name, 0):g}; lower it, or set RAY_ADDRESS to a cluster "
                "that has them"
            )
    return None


def new_progress(sweep: SweepInfo, trials: list[TrialInfo]) -> SweepProgress:
    base = Counter({s: n for s, n in sweep.counts.items() if n})
    for t in trials:
        base[t.status] -= 1
    return SweepProgress(
        sweep_id=sweep.id,
        trials_total=sweep.n_trials,
        base_counts=+base,  # unary + drops the zeros
        expected={t.id: t.epochs_total for t in trials},
        status={t.id: TrialStatus.QUEUED for t in trials},
    )


def _tune(
    store: Store,
    sweep: SweepInfo,
    spec: SweepSpec,
    trials: list[TrialInfo],
    control: SweepControl,
    tracker: SweepProgress,
    progress: Callable[[SweepProgress], None] | None,
    runner_id: str,
) -> None:
    data_dir = str(Path(store.settings.data_dir).expanduser().resolve())
    params = [{"trial_id": t.id, "config": t.config, "data_dir": data_dir} for t in trials]
    resources = {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu}
    callback = StoreCallback(
        store,
        control,
        tracker,
        progress=progress,
        final_epochs={t.id: t.config["epochs"] for t in trials},
        runner_id=runner_id,
    )
    log.info(
        "sweep %d (%s): running %d of %d trials, %s per trial",
        sweep.id, sweep.name, len(trials), sweep.n_trials, resources,
    )  # fmt: skip
    storage = tempfile.mkdtemp(prefix=f"isosweep-tune-{sweep.id}-")
    try:
        tuner = tune.Tuner(
            tune.with_resources(run_trial, resources),
            param_space={PARAM_KEY: tune.grid_search(params)},
            tune_config=tune.TuneConfig(
                reuse_actors=True,  # a worker imports torch and loads a dataset once, not per trial
                trial_name_creator=trial_name,
                trial_dirname_creator=trial_name,
            ),
            run_config=tune.RunConfig(
                name=f"sweep_{sweep.id}",
                storage_path=storage,
                callbacks=[callback],
                stop=CancelStopper(store, sweep.id, control),
                failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                verbose=0,
            ),
        )
        with quiet(TUNE_LOGGERS):
            tuner.fit()
        callback.flush()
    finally:
        shutil.rmtree(storage, ignore_errors=True)


def conclude(store: Store, sweep_id: int, runner_id: str, control: SweepControl) -> SweepInfo:
    """Finish the sweep from its trials' statuses, unless this runner must leave it alone."""
    if control.lost.is_set():
        return store.get_sweep(sweep_id)
    if control.stop.is_set() and not control.cancel.is_set():
        store.release_sweep(sweep_id, runner_id)
        log.info("sweep %d: stopped and released; the next runner resumes it", sweep_id)
        return store.get_sweep(sweep_id)
    try:
        info = store.finish_sweep(sweep_id)
    except Conflict as exc:  # trials Tune never finished: leave them to the next claim
        log.error("sweep %d: %s", sweep_id, exc)
        return store.get_sweep(sweep_id)
    log.info("sweep %d: %s %s", sweep_id, info.status, {k: v for k, v in info.counts.items() if v})
    return info


@contextlib.contextmanager
def quiet(names: tuple[str, ...], level: int = logging.CRITICAL) -> Iterator[None]:
    """Silence loggers for a while (Tune's failure tracebacks and "trials did not complete"
    reports, which StoreCallback records and logs in its own words)."""
    loggers = [logging.getLogger(n) for n in names]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, lvl in zip(loggers, before, strict=True):
            lg.setLevel(lvl)
