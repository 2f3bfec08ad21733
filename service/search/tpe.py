"""TPE search with Optuna's ask/tell, the store the source of truth (docs/api.md, "Adaptive
search"): a spec's `search: {kind: tpe, n, objective, mode, epoch, seed}`.

- One study per grid cell and seed (`cells`): the grid axes and the seed are fixed in it, and
  it asks `n` points of the distribution parameters (Optuna distributions: uniform →
  FloatDistribution, loguniform → FloatDistribution(log=True), int → IntDistribution(log=…),
  choice → CategoricalDistribution).
- The driver asks (`Studies.ask`), writes the asked trial to the store (Store.append_trials),
  `bind`s it, runs it, and `tell`s its outcome: completed → its objective (the record of
  `epoch`: the last one, or the last at or before K); diverged, failed, cancelled, or a
  completed trial without a finite objective → FAIL; stopped early → PRUNED.
- A resumed runner builds the studies again from the stored trials alone (`Studies.rebuild`):
  each stored trial, in index order, is added to a fresh study (optuna.trial.create_trial +
  study.add_trial) finished as it is stored, or RUNNING when it is queued or running (it is
  told when it finishes). No second storage.
- Each ask uses a TPESampler seeded from `search.seed`, the study's identity (its cell key:
  `study_seed`) and the study's trial count, so what a study asks next depends only on its
  trials so far — a resumed search asks what an uninterrupted one would have, given the same
  outcomes — and the studies of different cells and seeds start from different random points.

Imports Optuna; the driver imports this module, the API never does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState, create_trial

from service import sampling
from service.config import TrialConfig, parse_trial_config
from service.errors import InvalidInput
from service.search.models import TpeSearch
from service.status import TrialStatus

log = logging.getLogger("isosweep.search")
optuna.logging.set_verbosity(optuna.logging.WARNING)
SEED_STEP = 1_000_003  # the sampler seed of a study's k-th ask: seed + k·SEED_STEP (mod 2^32)
MAX_INVALID = 20  # asks in a row whose point is not a valid config before a study gives up


def optuna_distribution(d: sampling.Distribution) -> BaseDistribution:
    """The Optuna distribution of a spec distribution (service.sampling)."""
    if isinstance(d, sampling.Uniform):
        return FloatDistribution(d.a, d.b)
    if isinstance(d, sampling.LogUniform):
        return FloatDistribution(d.a, d.b, log=True)
    if isinstance(d, sampling.IntRange):
        return IntDistribution(d.a, d.b, log=d.log)
    return CategoricalDistribution([_choice_key(v) for v in d.values])


def _choice_key(v: Any) -> Any:
    """A choice as Optuna holds it: a scalar as is, anything else as its JSON text."""
    return v if v is None or isinstance(v, bool | int | float | str) else json.dumps(v)


def _from_choice(d: sampling.Distribution, v: Any) -> Any:
    if isinstance(d, sampling.Choice) and isinstance(v, str):
        for c in d.values:
            if _choice_key(c) == v:
                return c
    return v


def cell_key(config: Mapping[str, Any], axes: list[str]) -> str:
    """What identifies a trial's study: its grid axes' values and its seed."""
    return json.dumps([config.get(a) for a in axes] + [config.get("seed")], sort_keys=True)


def cells(spec: Any) -> list[tuple[str, dict[str, Any]]]:
    """(cell key, the cell's values: its axes' and linked axes', and its seed) of every grid
    cell × seed, in expansion order; cells whose configs normalize equal are one."""
    names = spec.grid_fields
    out: dict[str, dict[str, Any]] = {}
    for cell in spec.cells():
        for seed in spec.seed_list:
            point = {**cell, "seed": seed}
            try:
                config = parse_trial_config(spec.resolve(point)).to_dict()
            except InvalidInput:  # valid only with the sampled values: keyed as written
                config = {**spec.fixed, **point}
            out.setdefault(cell_key(config, names), point)
    return list(out.items())


def study_seed(search_seed: int, key: str) -> int:
    """A study's own sampler seed: the search's seed mixed with the study's identity (its cell
    key), so that the studies of different cells and seeds draw different start-up points."""
    digest = hashlib.sha256(f"{search_seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


@dataclass
class Asked:
    """A point a study asked for, not yet a stored trial (or stored: `trial_id`)."""

    cell: str
    number: int  # the Optuna trial number in the cell's study
    config: TrialConfig
    trial_id: int | None = None


@dataclass
class Study:
    key: str
    base: dict[str, Any]
    study: optuna.Study
    stored: int = 0  # trials of this cell in the store (asked and written)
    invalid: int = 0  # asks in a row refused as configs
    exhausted: bool = False


@dataclass
class Studies:
    """The sweep's studies, and the trials asked of them that are not told yet."""

    search: TpeSearch
    distributions: dict[str, sampling.Distribution]
    studies: dict[str, Study]
    axes: list[str]
    resolve: Callable[[Mapping[str, Any]], dict[str, Any]]  # SweepSpec.resolve: a trial's fields
    pending: dict[int, tuple[str, int]] = field(default_factory=dict)  # trial id → (cell, number)
    unwritten: list[Asked] = field(default_factory=list)  # asked, the store write failed

    @classmethod
    def rebuild(cls, spec: Any, stored: list[Any], values: Mapping[int, float | None]) -> Studies:
        """The studies of `spec` with the sweep's stored trials (TrialInfo, any order: added in
        index order) told: `values` maps a completed trial's id to its objective."""
        search = spec.search
        assert isinstance(search, TpeSearch)
        dists = spec.sampled
        axes = spec.grid_fields
        studies = {
            key: Study(key, base, optuna.create_study(direction=_direction(search.mode)))
            for key, base in cells(spec)
        }
        out = cls(search, dists, studies, axes, spec.resolve)
        odists = {k: optuna_distribution(d) for k, d in dists.items()}
        for t in sorted(stored, key=lambda t: t.index):
            st = studies.get(cell_key(t.config, axes))
            if st is None:
                log.warning("trial %d matches no cell of the search; not told", t.id)
                continue
            params = {}
            for name, od in odists.items():
                v = _choice_key(t.config.get(name))
                if v is not None and od._contains(od.to_internal_repr(v)):
                    params[name] = v
            state, value = _state(t.status, values.get(t.id))
            frozen = create_trial(
                state=state,
                value=value,
                params=params,
                distributions={k: odists[k] for k in params},
            )
            st.study.add_trial(frozen)
            st.stored += 1
            if state == TrialState.RUNNING:
                out.pending[t.id] = (st.key, len(st.study.trials) - 1)
        return out

    @property
    def planned(self) -> int:
        return self.search.n * len(self.studies)

    def owed(self) -> int:
        """Trials still to ask for (n per study, less those stored; 0 for exhausted ones)."""
        left = sum(
            max(self.search.n - s.stored, 0) for s in self.studies.values() if not s.exhausted
        )
        return left + len(self.unwritten)

    @property
    def outstanding(self) -> int:
        """Asked and not told yet (stored or not)."""
        return len(self.pending) + len(self.unwritten)

    def ask(self) -> Asked | None:
        """The next point: an earlier ask whose write failed, else a new ask of the study with
        the fewest trials that still owes some (None when none does)."""
        if self.unwritten:
            return self.unwritten.pop(0)
        while True:
            owing = [
                s for s in self.studies.values() if not s.exhausted and s.stored < self.search.n
            ]
            if not owing:
                return None
            st = min(owing, key=lambda s: s.stored)  # ties: the first cell
            asked = self._ask(st)
            if asked is not None:
                return asked

    def _ask(self, st: Study) -> Asked | None:
        k = len(st.study.trials)
        st.study.sampler = optuna.samplers.TPESampler(
            seed=(study_seed(self.search.seed, st.key) + k * SEED_STEP) % 2**32
        )
        fixed = {k: optuna_distribution(d) for k, d in self.distributions.items()}
        trial = st.study.ask(fixed)
        point = {k: _from_choice(self.distributions[k], v) for k, v in trial.params.items()}
        try:
            config = parse_trial_config(self.resolve({**st.base, **point}))
        except InvalidInput as exc:
            st.study.tell(trial.number, state=TrialState.FAIL)
            st.invalid += 1
            log.warning("search: the point %s is not a valid trial: %s", point, exc.message)
            if st.invalid >= MAX_INVALID:
                st.exhausted = True
                log.warning("search: cell %s gives up after %d invalid points", st.key, MAX_INVALID)
            return None
        st.invalid = 0
        st.stored += 1  # counted now; `unwrite` takes it back if the store refuses it
        return Asked(st.key, trial.number, config)

    def unwrite(self, asked: Asked) -> None:
        """The store could not write `asked`: it is handed out again by the next `ask`."""
        self.unwritten.insert(0, asked)

    def bind(self, asked: Asked, trial_id: int) -> None:
        """`asked` is stored as trial `trial_id`."""
        asked.trial_id = trial_id
        self.pending[trial_id] = (asked.cell, asked.number)

    def tell(self, trial_id: int, status: str, value: float | None) -> None:
        """A bound trial finished (`status`), with its objective `value` when it has one."""
        where = self.pending.pop(trial_id, None)
        if where is None:
            return
        st = self.studies[where[0]]
        state, v = _state(status, value)
        if state == TrialState.COMPLETE:
            st.study.tell(where[1], v)
        else:
            st.study.tell(where[1], state=state)

    def best(self) -> list[tuple[str, float, dict[str, Any]]]:
        """(cell key, best value, its params) of every study with a completed trial."""
        out = []
        for st in self.studies.values():
            done = [t for t in st.study.trials if t.state == TrialState.COMPLETE]
            if done:
                b = st.study.best_trial
                assert b.value is not None
                out.append((st.key, float(b.value), dict(b.params)))
        return out


def _direction(mode: str) -> Literal["minimize", "maximize"]:
    return "minimize" if mode == "min" else "maximize"


def _state(status: str, value: float | None) -> tuple[TrialState, float | None]:
    if status in (TrialStatus.QUEUED, TrialStatus.RUNNING):
        return TrialState.RUNNING, None
    if status == TrialStatus.STOPPED:
        return TrialState.PRUNED, None
    if status == TrialStatus.COMPLETED and value is not None and math.isfinite(value):
        return TrialState.COMPLETE, float(value)
    return TrialState.FAIL, None


def objective_value(epochs: Any, values: Any, search: TpeSearch) -> float | None:
    """A trial's objective from its stored history of the metric (epochs (E,), values (E,) or
    (E, L)): the record of `search.epoch` (the last one, or the last at or before K)."""
    import numpy as np

    epochs = np.asarray(epochs)
    if epochs.size == 0:
        return None
    at = np.arange(len(epochs))
    if search.epoch != "last":
        at = at[epochs <= search.epoch]
        if at.size == 0:
            return None
    row = np.asarray(values)[at[-1]]
    if search.layer is not None:
        if row.ndim == 0 or search.layer > row.shape[0]:
            return None
        row = row[search.layer - 1]
    return float(row)
