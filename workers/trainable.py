"""The Ray Tune trainable: a thin adapter that runs `fit()` in a Ray worker and hands each epoch
record to Tune, one `tune.report` per recorded epoch.

The trial process never opens a database connection and is never given a database URL: what it
receives is `{"trial_id", "config", "data_dir"}`, and everything it produces goes back to the
driver through `tune.report`, where `workers.callbacks.StoreCallback` is the only writer.

Records travel as plain Python values (arrays become nested lists of floats, which pickle keeps
bit-exact, NaN and ±inf included); `from_transport` turns a Tune result back into the epoch record
of docs/architecture.md.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from service.config import LAYER_METRICS, METRICS, RECORD_KEYS, SPECTRUM_KEYS
from service.errors import DataUnavailable, InvalidInput
from service.models import lab_metrics

PARAM_KEY = "param"  # the key of the Tune config that holds one trial's parameters
PACK_KEY = "pack"  # in PARAM_KEY's dict: the members of a pack (workers/packed.py)
PACK_SIZE_KEY = "pack_size"  # a result's: how many trials its Tune trial runs
MEMBERS_KEY = "members"  # a pack's result for one epoch: its members' results (each as above)
# what from_transport keeps of a Tune result
RESULT_KEYS = frozenset({*RECORD_KEYS, *METRICS, *SPECTRUM_KEYS})
ARRAY_KEYS = frozenset({*LAYER_METRICS, "input_gram", "input_moments", *SPECTRUM_KEYS})
DEVICE_KEY = "device"  # where the trial ran ("cpu", "cuda:0"); not stored, shown in progress
TRIAL_KEY = "sweep_trial_id"  # Tune overwrites a result's "trial_id" with its own string id
# the key of the last result of a trial that failed with an error that another attempt would
# only repeat (bad input, missing data): "<Type>: <message>", a blank line, the traceback
ERROR_KEY = "deterministic_error"
DETERMINISTIC = (InvalidInput, DataUnavailable)  # the errors no retry can cure
MAX_TRACE_CHARS = 20_000  # of a deterministic error's traceback (its tail is kept)
BOARD_KEY = "stop_board"  # in PARAM_KEY's dict: the name of the run's StopBoard actor, if any


class StopBoard:
    """The trials early stopping ended, for the packs still training them (a named Ray actor,
    one per Tune run with `early_stop`: the driver `add`s a trial id when it stops a pack's
    member; each pack asks `stopped(its ids)` once per epoch boundary and stops those members,
    Pack.stop, while the rest of the pack goes on). An unpacked trial is stopped by Tune itself
    (workers.callbacks.CancelStopper)."""

    def __init__(self) -> None:
        self.ids: set[int] = set()

    def add(self, trial_id: int) -> None:
        self.ids.add(int(trial_id))

    def stopped(self, trial_ids: list[int]) -> list[int]:
        """Which of `trial_ids` are stopped."""
        return [t for t in trial_ids if t in self.ids]


def members_of(param: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(trial id, config) of each trial a Tune trial runs: one, or a pack's members."""
    if PACK_KEY in param:
        return [(int(m["trial_id"]), m["config"]) for m in param[PACK_KEY]]
    return [(int(param["trial_id"]), param["config"])]


def run_trial(config: dict[str, Any]) -> None:
    """Run one trial — or a pack of them (workers/packed.py) — in a Ray worker: `config[PARAM_KEY]`
    is {"trial_id": int, "config": dict, "data_dir": str | None}, or for a pack {"pack":
    [{"trial_id", "config"}, …], "data_dir"}. Every result carries its trial's id (TRIAL_KEY)
    and the pack's size (PACK_SIZE_KEY). Uses CUDA when Ray gave the trial a GPU, and as many
    torch threads as it was given CPUs.

    An error that another attempt would only repeat (`DETERMINISTIC`: bad input, missing data)
    is not raised, which would make Tune retry the trial: its last result carries the error
    under `ERROR_KEY` instead, and the trial ends; StoreCallback marks it failed with it.

    Raises:
        RuntimeError: Ray assigned a GPU but this worker's torch cannot use CUDA.
        Exception: anything else fit() raises; Tune retries the trial (spec.max_failures),
            then marks it failed.
    """
    import torch
    from ray import tune

    from workers.packed import fit_packed_by_epoch

    param = config[PARAM_KEY]
    members = members_of(param)
    device = pick_device()
    torch.set_num_threads(assigned_threads())
    size = len(members)
    poll = board_poll(param.get(BOARD_KEY), [tid for tid, _ in members]) if size > 1 else None
    try:
        configs = [c for _, c in members]
        data_dir = param.get("data_dir")
        for batch in fit_packed_by_epoch(configs, device=device, data_dir=data_dir, poll=poll):
            results = [
                to_transport(record, trial_id=members[i][0], device=device, pack=size)
                for i, record in batch
            ]
            if size == 1 or len(results) == 1:
                for r in results:
                    tune.report(r)
            elif results:  # one Tune result for the pack's epoch: the driver's cost is per result
                tune.report({TRIAL_KEY: members[0][0], PACK_SIZE_KEY: size, MEMBERS_KEY: results})
    except DETERMINISTIC as exc:
        error = deterministic_error(exc)
        for tid, _ in members:
            tune.report({TRIAL_KEY: tid, DEVICE_KEY: device, PACK_SIZE_KEY: size, ERROR_KEY: error})


def board_poll(name: str | None, trial_ids: list[int]) -> Callable[[], list[int]] | None:
    """A pack's poll of the run's StopBoard (`name`): the member indices stopped so far (one
    small actor call per epoch boundary). None without a board."""
    if name is None:
        return None
    import ray

    board = ray.get_actor(name)
    index = {tid: i for i, tid in enumerate(trial_ids)}

    def poll() -> list[int]:
        return [index[t] for t in ray.get(board.stopped.remote(trial_ids))]

    return poll


def deterministic_error(exc: BaseException) -> str:
    """`<Type>: <message>` (the message whole), a blank line, then the traceback's tail."""
    trace = "".join(traceback.format_exception(exc)).rstrip()
    if len(trace) > MAX_TRACE_CHARS:
        trace = "…" + trace[-MAX_TRACE_CHARS:]
    return f"{type(exc).__name__}: {exc}\n\n{trace}"


def pick_device() -> str:
    """ "cuda:0" when Ray assigned this worker a GPU (Ray narrows CUDA_VISIBLE_DEVICES to it,
    so it is device 0 here), else "cpu"."""
    import ray
    import torch

    if not ray.get_gpu_ids():
        return "cpu"
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"Ray assigned GPU(s) {ray.get_gpu_ids()} to this trial, but torch "
            f"{torch.__version__} in this worker cannot use CUDA"
        )
    return "cuda:0"


def assigned_threads() -> int:
    """The CPUs Tune reserved for this trial, as a thread count (at least 1)."""
    from ray import tune

    try:
        cpus = tune.get_context().get_trial_resources().required_resources.get("CPU", 1)
    except Exception:  # outside a Tune session (a plain Ray task): one thread
        cpus = 1
    return max(1, math.floor(cpus))


def to_transport(
    record: dict[str, Any], *, trial_id: int, device: str, pack: int = 1
) -> dict[str, Any]:
    """An epoch record as plain Python values: arrays → (nested) lists of floats, numpy scalars
    → float/bool. Non-finite values stay what they are."""
    out: dict[str, Any] = {TRIAL_KEY: trial_id, DEVICE_KEY: device, PACK_SIZE_KEY: pack}
    for key, value in record.items():
        if isinstance(value, np.ndarray):
            out[key] = value.astype(np.float64).tolist()
        elif isinstance(value, np.generic):
            out[key] = value.item()
        else:
            out[key] = value
    return out


def from_transport(result: dict[str, Any]) -> dict[str, Any]:
    """The epoch record inside a Tune result: only the record's own keys (Tune adds its own:
    time_this_iter_s, config, …), per-layer vectors and the input Gram back to float64 arrays."""
    record: dict[str, Any] = {}
    lab = lab_metrics()  # a lab's per-tap metrics: per-layer arrays (service.models)
    for key in RESULT_KEYS.union(lab).intersection(result):
        value = result[key]
        array = key in ARRAY_KEYS or key in lab
        record[key] = np.asarray(value, dtype=np.float64) if array else value
    record["epoch"] = int(record["epoch"])
    record["diverged"] = bool(record.get("diverged", False))
    return record
