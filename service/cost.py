"""What a sweep costs before it runs: floating-point operations from each trial's shape, and
seconds from the throughput this store's finished trials measured (docs/api.md, "Cost
estimate"). No torch: the API answers a submission with it.

The operation count (flops; one multiply-add = 2 flops) of one trial:

    M      multiply-adds of one sample's forward pass (macs_per_sample, by family):
             mlp, registered  d_in·d + (L−1)·d² + d·C     (a registered model: as an MLP)
             resmlp           d_in·d + L·d² + d·C
             cnn              H·W·k²·(c·d + (L−1)·d²) + d·C          (same padding, stride 1)
             transformer      T·t·d + L·(T·(4d² + 2·d·r·d) + 2·T²·d) + d·C
           (d_in, C: the dataset's input size and classes; c, H, W: its image; T tokens of t
           values, service.config.tokens_of; r = mlp_ratio; norms and activations are O(d) per
           sample and left out)
    train  6·M·N per training epoch: forward 2M and backward 4M per sample, N = the samples
           the epoch steps on (⌊N_train/n⌋·n: the short tail is dropped; N_train after
           max_train_samples)
    record per recorded epoch: the test set's forward 2·M·N_test; the probe batch's forward
           and backward 6·M·n; and the float64 factors of the gaps — for each of the
           |tap kinds|·L taps, an n × f matrix (f: d; cnn d·H·W; transformer d, token-mean
           pooled) factored twice (gap and range gap) at Q(n, f) = 2·min(n, f)²·max(n, f)
           (Householder QR); each block's weight (out × in) and the head once; a
           transformer's token Grams n·L·Q(T, d); a Jacobian sample 4·M·d + 4·Q(d, d_in)
    epoch 0 also evaluates the training set's seeded subset (epoch0_train_samples): 2·M·N₀

    flops(trial) = epochs·train + recorded_epochs·record + 2·M·N₀

This is an order-of-magnitude model (dense arithmetic only; memory traffic, Python and the
small matrices' poor efficiency are in the measured throughput instead). The throughput is
measured the way the model counts: Σ training flops of the finished epochs of the newest
completed trials over Σ their epoch_time_s × the CPUs (or GPUs) each trial held, per resources
kind; members of a packed trial share one epoch time, counted once. Before anything has been
measured, DEFAULT_THROUGHPUT (per CPU or GPU) stands in, a conservative figure for small
networks on one CPU core.

The seconds of a sweep: its flops over (throughput × units per trial × trials at once), trials
at once = min(trials, ⌊units of this host / units per trial⌋) (os.cpu_count() CPUs, one GPU:
the API does not see the cluster, so a larger one finishes sooner), and never less than its
largest trial alone.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, Field

from service.config import DATASET_IMAGES, DATASET_SHAPES, tokens_of
from service.models import tap_kinds

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

# (train, test) samples of each dataset (workers/data.py, workers/digits_split.py)
DATASET_SIZES: dict[str, tuple[int, int]] = {
    "cifar10": (50_000, 10_000),
    "cifar100": (50_000, 10_000),
    "mnist": (60_000, 10_000),
    "fashion_mnist": (60_000, 10_000),
    "digits": (1437, 360),
    "gaussian": (4000, 1000),
}
# flop/s per CPU (per GPU) assumed before a finished trial has measured one: about what a small
# network (depth 10, width 100, batch 100) reaches on one loaded CPU core, and a fraction of a
# GPU's peak for the same (kernel launches dominate small trials).
DEFAULT_THROUGHPUT: dict[str, float] = {"cpu": 2e9, "gpu": 2e11}
THROUGHPUT_TRIALS = 200  # the newest completed trials (of a kind) the throughput is taken from
THROUGHPUT_TTL_S = 30.0  # a measurement is reused this long (the ETA of every listed sweep)

# The TrialConfig fields the operation count reads: trials equal in these cost the same.
COST_FIELDS: tuple[str, ...] = (
    "model",
    "dataset",
    "depth",
    "width",
    "batch_size",
    "max_train_samples",
    "kernel_size",
    "patch_size",
    "heads",
    "mlp_ratio",
    "norm",
    "epochs",
    "record_every",
    "epoch0_train_samples",
    "jacobian_samples",
)


class Shape(NamedTuple):
    """A trial's COST_FIELDS (from a TrialConfig, a config dict or a database row)."""

    model: str
    dataset: str
    depth: int
    width: int
    batch_size: int
    max_train_samples: int | None
    kernel_size: int
    patch_size: int | None
    heads: int
    mlp_ratio: int
    norm: str
    epochs: int
    record_every: int
    epoch0_train_samples: int | None
    jacobian_samples: int

    @property
    def n_recorded_epochs(self) -> int:  # TrialConfig.n_recorded_epochs
        return self.epochs // self.record_every + 1 + (self.epochs % self.record_every != 0)


def shape_of(config: Any) -> Shape:
    """The Shape of a TrialConfig (or anything with its attributes) or of its dict."""
    if isinstance(config, Shape):
        return config
    if isinstance(config, Mapping):
        from service.config import TrialConfig

        defaults = TrialConfig.model_fields
        return Shape(*(config.get(f, defaults[f].default) for f in COST_FIELDS))
    return Shape(*(getattr(config, f) for f in COST_FIELDS))


def macs_per_sample(s: Shape) -> int:
    """M: multiply-adds of one sample's forward pass (the module docstring's table)."""
    d_in, n_classes = DATASET_SHAPES[s.dataset]
    L, d = s.depth, s.width
    head = d * n_classes
    if s.model == "resmlp":
        return d_in * d + L * d * d + head
    if s.model == "cnn":
        _, c, h, w = DATASET_IMAGES[s.dataset]
        return h * w * s.kernel_size**2 * (c * d + (L - 1) * d * d) + head
    if s.model == "transformer":
        t, token = tokens_of(s)  # type: ignore[arg-type]  # reads dataset and patch_size only
        hidden = s.mlp_ratio * d
        return t * token * d + L * (t * (4 * d * d + 2 * d * hidden) + 2 * t * t * d) + head
    return d_in * d + (L - 1) * d * d + head  # mlp, and a registered model as an MLP


def train_samples(s: Shape) -> int:
    """The training set's size after max_train_samples."""
    n_train = DATASET_SIZES[s.dataset][0]
    return min(n_train, s.max_train_samples) if s.max_train_samples else n_train


def stepped_samples(s: Shape) -> int:
    """N: the samples one training epoch steps on (whole minibatches only)."""
    return train_samples(s) // s.batch_size * s.batch_size


@lru_cache(maxsize=8192)
def train_flops_per_epoch(s: Shape) -> float:
    """6·M·N: one training epoch's forward and backward passes."""
    return 6.0 * macs_per_sample(s) * stepped_samples(s)


def factor_flops(rows: int, cols: int) -> float:
    """Q(m, f) = 2·min²·max: a Householder QR (or LU) of an m × f matrix, to leading order."""
    lo, hi = min(rows, cols), max(rows, cols)
    return 2.0 * lo * lo * hi


def _tap_features(s: Shape) -> int:
    if s.model == "cnn":
        _, _, h, w = DATASET_IMAGES[s.dataset]
        return s.width * h * w
    return s.width


def _weight_shapes(s: Shape) -> list[tuple[int, int]]:
    """(out, in) of each block's recorded weight, then the head."""
    d_in, n_classes = DATASET_SHAPES[s.dataset]
    d, L = s.width, s.depth
    if s.model == "cnn":
        _, c, _, _ = DATASET_IMAGES[s.dataset]
        k2 = s.kernel_size**2
        blocks = [(d, c * k2)] + [(d, d * k2)] * (L - 1)
    elif s.model in ("resmlp", "transformer"):
        blocks = [(d, d)] * L
    else:
        blocks = [(d, d_in)] + [(d, d)] * (L - 1)
    return [*blocks, (n_classes, d)]


@lru_cache(maxsize=8192)
def record_flops(s: Shape) -> float:
    """One recorded epoch's measurements: test forward, probe forward/backward, the gaps'
    float64 factors (taps twice, weights once), token Grams, Jacobian samples."""
    m, n = macs_per_sample(s), s.batch_size
    n_test = DATASET_SIZES[s.dataset][1]
    taps = len(tap_kinds(s)) * s.depth  # type: ignore[arg-type]  # reads model, norm, mlp_ratio
    flops = 2.0 * m * n_test + 6.0 * m * n
    flops += taps * 2 * factor_flops(n, _tap_features(s))
    flops += sum(factor_flops(o, i) for o, i in _weight_shapes(s))
    if s.model == "transformer":
        t, _ = tokens_of(s)  # type: ignore[arg-type]
        flops += n * s.depth * factor_flops(t, s.width)
    if s.jacobian_samples:
        d_in = DATASET_SHAPES[s.dataset][0]
        flops += s.jacobian_samples * (4.0 * m * s.width + 4 * factor_flops(s.width, d_in))
    return flops


def epoch0_samples(s: Shape) -> int:
    """N₀: the training samples epoch 0's train_loss/train_acc are evaluated on."""
    n, k = train_samples(s), s.epoch0_train_samples
    return n if k is None or k >= n else max(k, s.batch_size)


@lru_cache(maxsize=8192)
def trial_flops(s: Shape) -> float:
    """flops(trial) = epochs·train + recorded epochs·record + 2·M·N₀."""
    epoch0 = 2.0 * macs_per_sample(s) * epoch0_samples(s)
    return s.epochs * train_flops_per_epoch(s) + s.n_recorded_epochs * record_flops(s) + epoch0


def flops_per_epoch(config: Any) -> float:
    """One training epoch and its record: train + record (module docstring), for a TrialConfig
    (or its Shape)."""
    s = shape_of(config)
    return train_flops_per_epoch(s) + record_flops(s)


def remaining_flops(s: Shape, train_epochs: int, records: int, epoch0: bool) -> float:
    """What is left of a trial that has `train_epochs` training epochs and `records` records
    to go (`epoch0`: its epoch-0 evaluation too)."""
    rest = max(train_epochs, 0) * train_flops_per_epoch(s) + max(records, 0) * record_flops(s)
    return rest + (2.0 * macs_per_sample(s) * epoch0_samples(s) if epoch0 else 0.0)


# --- throughput ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    """flop/s per CPU (kind cpu) or per GPU (kind gpu), measured or assumed."""

    kind: str
    flops_per_s: float
    epochs: int = 0  # finished training epochs it was measured on (0: the default)
    trials: int = 0

    @property
    def measured(self) -> bool:
        return self.epochs > 0

    @property
    def source(self) -> str:
        unit = self.kind.upper()
        rate = f"{format_rate(self.flops_per_s)} per {unit}"
        if self.measured:
            return f"this runner's measured {rate} ({self.epochs} epochs of {self.trials} trials)"
        return f"an assumed {rate} (no finished trial measured one yet)"


def default_throughput(kind: str) -> Throughput:
    return Throughput(kind, DEFAULT_THROUGHPUT[kind])


def resources_kind(resources: Mapping[str, Any] | None) -> tuple[str, float]:
    """("gpu", gpus) for a trial that asks for a GPU, else ("cpu", cpus)."""
    r = resources or {}
    gpu = float(r.get("gpu") or 0.0)
    return ("gpu", gpu) if gpu > 0 else ("cpu", float(r.get("cpu") or 1.0))


def throughput_of_epochs(
    epochs: Iterable[tuple[Any, Any, int, float, Shape, float]], kind: str
) -> Throughput:
    """The throughput of finished epochs (trial, pack key, epoch, epoch_time_s, shape, units
    held):
    Σ training flops / Σ time × units, an epoch time shared by the members of a pack (one pack
    key, one epoch, the same time) counted once. Non-finite or non-positive times are skipped;
    nothing left gives the default."""
    flops, unit_seconds = 0.0, 0.0
    seen: set[tuple[Any, int, float]] = set()
    n_epochs, trials = 0, set()
    for trial, key, epoch, t, shape, units in epochs:
        if not (math.isfinite(t) and t > 0):
            continue
        flops += train_flops_per_epoch(shape)
        n_epochs += 1
        trials.add(trial)
        if (key, epoch, t) not in seen:
            seen.add((key, epoch, t))
            unit_seconds += t * units
    if not n_epochs or not unit_seconds or not flops:
        return default_throughput(kind)
    return Throughput(kind, flops / unit_seconds, n_epochs, len(trials))


_MEASURED: dict[tuple[str, str], tuple[float, Throughput]] = {}


def measure_throughput(s: Session, kind: str) -> Throughput:
    """The throughput the store's newest THROUGHPUT_TRIALS completed trials of `kind` (that ran
    here, not reused) measured; cached THROUGHPUT_TTL_S per database and kind."""
    key = (str(s.get_bind().engine.url), kind)
    now = time.monotonic()
    hit = _MEASURED.get(key)
    if hit is not None and now - hit[0] < THROUGHPUT_TTL_S:
        return hit[1]
    found = _measure(s, kind)
    _MEASURED[key] = (now, found)
    return found


def forget_throughput() -> None:
    """Drop the cached measurements (tests; a store whose results changed wholesale)."""
    _MEASURED.clear()


def _measure(s: Session, kind: str) -> Throughput:
    from sqlalchemy import select

    from service.status import TrialStatus
    from service.store.codec import decode
    from service.store.models import SqlMetric, SqlSweep, SqlTrial

    resources: dict[int, tuple[str, float]] = {}
    newest = select(SqlSweep.id, SqlSweep.spec).order_by(SqlSweep.id.desc()).limit(1000)
    for sweep_id, spec in s.execute(newest):
        resources[sweep_id] = resources_kind((spec or {}).get("resources"))
    ids = [i for i, (k, _) in resources.items() if k == kind]
    if not ids:
        return default_throughput(kind)
    columns = [getattr(SqlTrial, f) for f in COST_FIELDS]
    q = (
        select(SqlTrial.id, SqlTrial.sweep_id, *columns)
        .where(SqlTrial.status == TrialStatus.COMPLETED, SqlTrial.results_from.is_(None))
        .where(SqlTrial.sweep_id.in_(ids))
        .order_by(SqlTrial.id.desc())
        .limit(THROUGHPUT_TRIALS)
    )
    trials = {row[0]: (row[1], Shape(*row[2:])) for row in s.execute(q)}
    if not trials:
        return default_throughput(kind)
    times = s.execute(
        select(SqlMetric.trial_id, SqlMetric.epoch, SqlMetric.data).where(
            SqlMetric.metric == "epoch_time_s",
            SqlMetric.epoch > 0,
            SqlMetric.trial_id.in_(list(trials)),
        )
    )
    epochs = []
    for trial_id, epoch, data in times:
        sweep_id, shape = trials[trial_id]
        units = resources[sweep_id][1]
        epochs.append((trial_id, sweep_id, epoch, float(decode(data)[0]), shape, units))
    return throughput_of_epochs(epochs, kind)


# --- estimates ----------------------------------------------------------------------------


class CostEstimate(BaseModel):
    """What a sweep costs: its trials' epochs, operations and expected seconds (service.cost)."""

    trials: int = Field(description="trials that will run (stored results reused cost nothing)")
    trial_epochs: int = Field(description="training epochs summed over the trials")
    records: int = Field(description="recorded epochs (measurements) summed over the trials")
    flops: float = Field(description="floating-point operations, by docs/api.md's model")
    seconds: float = Field(description="expected wall time at the throughput, trials at once")
    kind: str = Field(description="cpu or gpu: the resources the throughput is per unit of")
    throughput_flops_per_s: float = Field(description="flop/s per CPU (or GPU) of one trial")
    throughput_source: str = Field(description="measured from finished trials, or assumed")
    parallel: int = Field(description="trials at once on this host")
    per_trial_flops_max: float = Field(description="the largest trial's operations")
    per_trial_seconds_max: float = Field(description="the largest trial's seconds alone")

    @property
    def text(self) -> str:
        """ "≈ 1.3 h on this runner's measured 3.1 GFLOP/s per CPU …" """
        return (
            f"≈ {format_duration(self.seconds)} for {self.trials} trials "
            f"({self.trial_epochs} epochs, {format_flops(self.flops)}, {self.parallel} at once) "
            f"on {self.throughput_source}"
        )


def host_units(kind: str) -> int:
    """Units of `kind` this host is assumed to run trials on: its CPUs, or one GPU."""
    return (os.cpu_count() or 1) if kind == "cpu" else 1


def estimate_counts(
    shapes: Mapping[Shape, int] | Iterable[tuple[Shape, int, float]],
    throughput: Throughput,
    units_per_trial: float = 1.0,
) -> CostEstimate:
    """The estimate of trials given as shape → count, or as (shape, count, flops of each)
    (the remaining work of a running sweep)."""
    items = (
        [(sh, n, trial_flops(sh)) for sh, n in shapes.items()]
        if isinstance(shapes, Mapping)
        else list(shapes)
    )
    trials = sum(n for _, n, _ in items)
    flops = sum(n * f for _, n, f in items)
    biggest = max((f for _, n, f in items if n), default=0.0)
    rate = throughput.flops_per_s * units_per_trial  # one trial's flop/s
    slots = max(1, math.floor(host_units(throughput.kind) / units_per_trial + 1e-9))
    parallel = max(1, min(trials, slots))
    seconds = max(flops / (rate * parallel), biggest / rate) if trials else 0.0
    return CostEstimate(
        trials=trials,
        trial_epochs=sum(n * sh.epochs for sh, n, _ in items),
        records=sum(n * sh.n_recorded_epochs for sh, n, _ in items),
        flops=flops,
        seconds=seconds,
        kind=throughput.kind,
        throughput_flops_per_s=throughput.flops_per_s,
        throughput_source=throughput.source,
        parallel=parallel,
        per_trial_flops_max=biggest,
        per_trial_seconds_max=biggest / rate if trials else 0.0,
    )


def estimate(
    trials: Iterable[Any], throughput: Throughput, resources: Mapping[str, Any] | None = None
) -> CostEstimate:
    """The cost of running `trials` (TrialConfigs, their dicts or Shapes) at `throughput`, each
    holding `resources` ({"cpu": …, "gpu": …}, a SweepSpec's; default one CPU)."""
    _, units = resources_kind(resources)
    return estimate_counts(Counter(shape_of(t) for t in trials), throughput, units)


def estimate_spec(spec: Any, throughput: Throughput | None = None) -> CostEstimate:
    """estimate() of a SweepSpec's expanded trials, at the default throughput of its kind unless
    one is given (no store: nothing measured, nothing reused)."""
    from service.spec import expand

    resources = spec.resources.model_dump()
    kind, _ = resources_kind(resources)
    return estimate(expand(spec), throughput or default_throughput(kind), resources)


# --- searches whose trials are not known up front -------------------------------------------

SEARCH_POINTS = 16  # points of the distributions an adaptive search's per-trial cost averages


def search_shapes(spec: Any) -> Counter[Shape]:
    """The shapes of an adaptive (TPE) search's planned trials, before any is asked: for each grid
    cell, search.n × seeds trials spread evenly over SEARCH_POINTS points of the sampled
    parameters (numpy's Generator, seed 0: the distributions' spread, as a random search would
    draw them), so that the estimate is n × the per-trial estimate averaged over the
    distributions. `spec`: a SweepSpec, or a stored one (its JSON dump). Empty for a spec
    without an adaptive search."""
    import json

    data = spec.model_dump(mode="json") if hasattr(spec, "model_dump") else dict(spec)
    if (data.get("search") or {}).get("kind") != "tpe":
        return Counter()
    return Counter(dict(_search_shapes(json.dumps(data, sort_keys=True))))


@lru_cache(maxsize=256)
def _search_shapes(text: str) -> tuple[tuple[Shape, int], ...]:
    import json

    import numpy as np

    from service.config import parse_trial_config
    from service.spec import SweepSpec

    data = json.loads(text)
    spec = SweepSpec.model_construct(**data)
    sampled = spec.sampled
    names = sorted(sampled)
    u = np.random.default_rng(0).random((SEARCH_POINTS, len(names)))  # (M, k)
    points = [
        {n: sampled[n].value(float(u[i, j])) for j, n in enumerate(names)}
        for i in range(SEARCH_POINTS)
    ]
    seeds = data.get("seeds", 1)
    per_cell = int(data["search"]["n"]) * (seeds if isinstance(seeds, int) else len(seeds))
    out: Counter[Shape] = Counter()
    for cell in spec.cells():  # the grid's and linked axes' values; derived fields resolved
        for i, point in enumerate(points):
            # per_cell trials over the points: point i gets its share (the first ones one more)
            k = per_cell // SEARCH_POINTS + (i < per_cell % SEARCH_POINTS)
            if k:
                out[shape_of(parse_trial_config(spec.resolve({**cell, **point})))] += k
    return tuple(out.items())


# --- formatting ---------------------------------------------------------------------------


def format_rate(flops_per_s: float) -> str:
    return _si(flops_per_s, "FLOP/s")


def format_flops(flops: float) -> str:
    return _si(flops, "FLOP")


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def format_duration(seconds: float) -> str:
    """ "42 s", "3.5 min", "1.3 h", "2.1 days"."""
    if seconds < 60:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.2g} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.2g} h"
    return f"{seconds / 86400:.3g} days"
