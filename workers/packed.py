"""Packed trials: K trials of the same network shape trained as one batched model (issue 13,
docs/architecture.md "Packed trials").

Members of a pack share everything that fixes the computation's shapes and graph
(`service.packs.pack_key`: model, depth, width, norm, activation and gains, batch size,
dataset, epochs, …) and may differ in what only sets the starting point or the optimizer:
seed, init, init_gain, orthogonal_gain, head_init, bias_init, lr, momentum, weight_decay
(`service.packs.PER_MEMBER`).

    for index, record in fit_packed([config_a, config_b, …]):
        ...   # member `index`'s epoch records, in the order fit() would yield them

How a member's numbers stay its own:
- Every member is a `workers.train.Trial` of its own config: its initialization, probe batch,
  shuffling, subset and epoch-0 rows come from its own seed's streams, exactly as unpacked.
- Epoch records are measured for the whole pack at once — one vmap'd forward and backward on the
  members' own probe batches (`metrics.probe_metrics_packed`), the float64 factorizations of all
  members' taps in shared batched calls, the test and epoch-0 training sets in one vmap'd
  evaluation — and assembled member by member (`Trial.record`). Epoch 0 agrees with
  `fit(config)` bit for bit in most arrays (463 of 506 measured); elsewhere by the batched
  kernels' float32 rounding of the forward pass, which a gap amplifies with its Gram's
  conditioning. Measured (bench/pack_conditioning.py: 908 finite gaps of 20 float32 members of
  mlp and resmlp packs), the largest relative difference by λ_min/λ_max: 1.1e-7 at ≥ 1e-4,
  5.3e-7 in [1e-6, 1e-4), 2.8e-6 in [1e-8, 1e-6), 1.6e-5 in [1e-12, 1e-8); those packs' gaps at
  1e-22..1e-14 happened to be bit-identical, while an audit saw 4.9e-4 at 1.5e-14 (resmlp, gelu,
  BatchNorm). A later epoch differs besides through training.
- Training runs the family's pure forward under `torch.func.vmap` over the stacked parameters
  and running statistics (K, …), each member on its own minibatch; the loss is the sum of the
  members' mean cross-entropies, so each member's gradient is its own. The optimizers (SGD with
  momentum and weight decay, Adam) are torch's update rules written over the stacked tensors with
  per-member hyper-parameters (`StackedSGD`, `StackedAdam`). Batched kernels round differently
  from single ones, so trained numbers agree with `fit` to a tolerance (measured in
  tests/workers/test_packed.py and stated in docs/architecture.md), not bit for bit.
- A member whose minibatch loss is non-finite is frozen before stepping on it (its parameters,
  optimizer state and running statistics as after its last good step) and leaves the pack at the
  end of the epoch with its diverged record; the others go on. `stop(index)` ends a member (a
  cancel) at the next epoch boundary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import vmap

from service.config import TrialConfig, parse_trial_config
from service.errors import InvalidInput
from service.packs import PER_MEMBER, pack_key
from workers.metrics import probe_metrics_packed
from workers.train import EpochStats, Trial, eval_chunks, fit, set_cuda_precision

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, as workers.train.make_optimizer uses
ADAM_EPS = 1e-8


def _per_member(values: Sequence[float], like: Tensor) -> Tensor:
    """(K,) hyper-parameters shaped (K, 1, …, 1) to broadcast over a stacked tensor `like`."""
    t = torch.tensor(values, dtype=like.dtype, device=like.device)
    return t.reshape(-1, *([1] * (like.dim() - 1)))


class StackedSGD:
    """torch.optim.SGD's update (dampening 0, no Nesterov) on stacked parameters (K, …), with a
    learning rate, momentum and weight decay per member:

        g ← ∇ + λ·θ;   b ← g (first step) or μ·b + g;   θ ← θ − η·(b if μ ≠ 0 else g)

    Members where `mask` is False are left exactly as they were (parameters and buffers)."""

    def __init__(self, params: dict[str, Tensor], configs: Sequence[TrialConfig]):
        self.params = params
        self.lr = [c.lr for c in configs]
        self.momentum = [c.momentum for c in configs]
        self.weight_decay = [c.weight_decay for c in configs]
        self.buffers: dict[str, Tensor] = {}

    @torch.no_grad()
    def step(self, grads: dict[str, Tensor], mask: Tensor) -> None:
        for name, p in self.params.items():
            g = grads[name]
            keep = mask.reshape(-1, *([1] * (p.dim() - 1)))
            if any(self.weight_decay):
                g = g + _per_member(self.weight_decay, p) * p
            if any(self.momentum):
                mu = _per_member(self.momentum, p)
                if name not in self.buffers:
                    buf = g.clone()
                else:
                    buf = torch.where(keep, mu * self.buffers[name] + g, self.buffers[name])
                # a member without momentum steps on g itself (its buffer is kept but unused)
                direction = torch.where(mu != 0, buf, g)
                self.buffers[name] = buf
            else:
                direction = g
            p.copy_(torch.where(keep, p - _per_member(self.lr, p) * direction, p))

    def select(self, keep: list[int]) -> None:
        self.lr, self.momentum, self.weight_decay = (
            [v[i] for i in keep] for v in (self.lr, self.momentum, self.weight_decay)
        )
        self.buffers = {k: v[keep] for k, v in self.buffers.items()}


class StackedAdam:
    """torch.optim.Adam's update (β = (0.9, 0.999), ε = 1e-8, L2 weight decay, no AMSGrad) on
    stacked parameters, with a learning rate and weight decay per member:

        g ← ∇ + λ·θ;  m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²;  t ← t + 1
        θ ← θ − (η/(1−β₁ᵗ)) · m / (√v/√(1−β₂ᵗ) + ε)
    """

    def __init__(self, params: dict[str, Tensor], configs: Sequence[TrialConfig]):
        self.params = params
        self.lr = [c.lr for c in configs]
        self.weight_decay = [c.weight_decay for c in configs]
        self.m = {k: torch.zeros_like(v) for k, v in params.items()}
        self.v = {k: torch.zeros_like(v) for k, v in params.items()}
        self.t = [0] * len(configs)

    @torch.no_grad()
    def step(self, grads: dict[str, Tensor], mask: Tensor) -> None:
        on = mask.tolist()
        self.t = [t + int(a) for t, a in zip(self.t, on, strict=True)]
        b1, b2 = ADAM_BETAS
        for name, p in self.params.items():
            g = grads[name]
            keep = mask.reshape(-1, *([1] * (p.dim() - 1)))
            if any(self.weight_decay):
                g = g + _per_member(self.weight_decay, p) * p
            m = torch.where(keep, torch.lerp(self.m[name], g, 1 - b1), self.m[name])
            v = torch.where(keep, self.v[name] * b2 + (1 - b2) * g * g, self.v[name])
            self.m[name], self.v[name] = m, v
            t = [max(t, 1) for t in self.t]
            step = _per_member([lr / (1 - b1**k) for lr, k in zip(self.lr, t, strict=True)], p)
            root = _per_member([math.sqrt(1 - b2**k) for k in t], p)
            new = p - step * (m / (v.sqrt() / root + ADAM_EPS))
            p.copy_(torch.where(keep, new, p))

    def select(self, keep: list[int]) -> None:
        self.lr = [self.lr[i] for i in keep]
        self.weight_decay = [self.weight_decay[i] for i in keep]
        self.t = [self.t[i] for i in keep]
        self.m = {k: v[keep] for k, v in self.m.items()}
        self.v = {k: v[keep] for k, v in self.v.items()}


class Pack:
    """The members of one pack and their stacked tensors (see the module docstring)."""

    def __init__(
        self,
        configs: Sequence[TrialConfig],
        *,
        device: str = "cpu",
        data_dir: Path | None = None,
    ):
        if not configs:
            raise InvalidInput("a pack needs at least one trial", field="pack")
        keys = {pack_key(c) for c in configs}
        if len(keys) > 1:
            raise InvalidInput(
                f"the trials of a pack must share every field but {', '.join(sorted(PER_MEMBER))}",
                field="pack",
            )
        self.configs = list(configs)
        self.members = [Trial(c, device=device, data_dir=data_dir) for c in configs]
        self.active = list(range(len(configs)))  # member indices still training
        self.stopped: set[int] = set()
        # asked at every epoch boundary for members to stop (`stop`): early stopping's
        # decisions, made on the driver (workers/trainable.py's StopBoard)
        self.poll: Callable[[], Iterable[int]] | None = None
        self.net = self.members[0].net
        self.params: dict[str, Tensor] = {}
        self.state: dict[str, Tensor] = {}
        self.optimizer: StackedSGD | StackedAdam | None = None
        self.strides: dict[int, dict[str, tuple[int, ...]]] = {}  # each member's, as fit() has

    # -- stacking ---------------------------------------------------------------------------

    def _stack(self) -> None:
        """Stack the active members' tensors (K, …) and point each member at its slice."""
        ms = [self.members[i] for i in self.active]
        names = list(ms[0].params)
        if not self.strides:
            self.strides = {
                i: {k: v.stride() for k, v in m.params.items()} for i, m in enumerate(self.members)
            }
        self.params = {
            k: torch.stack([m.params[k].detach() for m in ms]).requires_grad_() for k in names
        }
        self.state = {k: torch.stack([m.state[k] for m in ms]) for k in ms[0].state}
        configs = [self.configs[i] for i in self.active]
        opt = StackedAdam if configs[0].optimizer == "adam" else StackedSGD
        self.optimizer = opt(self.params, configs)
        self._point_members()

    def _point_members(self) -> None:
        for j, i in enumerate(self.active):
            m = self.members[i]
            m.params = {k: v[j].detach() for k, v in self.params.items()}
            m.state = {k: v[j] for k, v in self.state.items()}

    def _leave(self, gone: set[int]) -> None:
        """Drop members from the stacked tensors (their slices are copied out first)."""
        if not gone:
            return
        keep = [j for j, i in enumerate(self.active) if i not in gone]
        for j, i in enumerate(self.active):
            if i in gone:
                m = self.members[i]
                m.params = {k: v[j].detach().clone() for k, v in self.params.items()}
                m.state = {k: v[j].clone() for k, v in self.state.items()}
        self.active = [self.active[j] for j in keep]
        if not self.active:
            return
        with torch.no_grad():
            self.params = {k: v[keep].detach().requires_grad_() for k, v in self.params.items()}
        self.state = {k: v[keep] for k, v in self.state.items()}
        assert self.optimizer is not None
        self.optimizer.params = self.params
        self.optimizer.select(keep)
        self._point_members()

    # -- one epoch for every active member --------------------------------------------------

    def train_epoch(self) -> dict[int, EpochStats]:
        """One shuffled pass for every active member (each its own order, as `Trial.train_epoch`
        draws it), stepping all of them per minibatch; stats per member index."""
        ms = [self.members[i] for i in self.active]
        K = len(ms)
        first = ms[0]
        bs = first.config.batch_size
        X = torch.stack([m.data.X_train for m in ms]) if _own_rows(ms) else first.data.X_train
        Y = torch.stack([m.data.y_train for m in ms]) if _own_rows(ms) else first.data.y_train
        N = X.shape[-2]
        device = first.device
        perms = torch.stack([torch.randperm(N, generator=m.shuffle) for m in ms]).to(device)
        rows = torch.arange(K, device=device)[:, None]
        losses: list[list[float]] = [[] for _ in ms]
        correct = torch.zeros(K, dtype=torch.int64, device=device)
        training = torch.ones(K, dtype=torch.bool, device=device)
        forward = vmap(lambda p, s, x: self.net.forward(p, s, x, "train")[0])
        start = time.perf_counter()
        idx = perms[:, :bs]
        for step in range(N // bs):
            idx = perms[:, step * bs : (step + 1) * bs]  # (K, bs)
            xb = X[rows, idx] if X.dim() == 3 else X[idx]
            yb = Y[rows, idx] if Y.dim() == 2 else Y[idx]
            saved = {k: v.clone() for k, v in self.state.items()}
            logits = forward(self.params, self.state, xb)  # (K, bs, C)
            member_loss = F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none")
            member_loss = member_loss.view(K, bs).mean(dim=1)
            values = member_loss.tolist()  # one sync: every member's divergence check
            was = training.tolist()
            hits = (logits.argmax(dim=2) == yb).sum(dim=1)
            for j in range(K):
                if was[j]:
                    losses[j].append(values[j])
            correct += torch.where(training, hits, 0)
            finite = torch.tensor([math.isfinite(v) for v in values], device=device)
            training &= finite
            if bool(training.any()):
                total = torch.where(training, member_loss, 0.0).sum()
                grads = torch.autograd.grad(total, list(self.params.values()))
                assert self.optimizer is not None
                self.optimizer.step(dict(zip(self.params, grads, strict=True)), training)
            with torch.no_grad():  # members not training keep their statistics as they were
                for k, v in self.state.items():  # (after backward, which saved them)
                    keep = training.reshape(-1, *([1] * (v.dim() - 1)))
                    v.copy_(torch.where(keep, v, saved[k]))
            if not bool(training.any()):
                break
            for j in range(K):
                if was[j] and bool(training[j]):
                    ms[j].steps += 1
        elapsed = time.perf_counter() - start
        out: dict[int, EpochStats] = {}
        counts = correct.tolist()
        last = idx
        for j, m in enumerate(ms):
            mean = sum(losses[j]) / len(losses[j])
            diverged = not math.isfinite(mean)
            if not diverged:  # what the next step's check would see (Trial.still_finite)
                xl = X[j, last[j]] if X.dim() == 3 else X[last[j]]
                yl = Y[j, last[j]] if Y.dim() == 2 else Y[last[j]]
                diverged = not m.still_finite(xl, yl)
            out[self.active[j]] = EpochStats(
                mean, counts[j] / (len(losses[j]) * bs), elapsed, diverged
            )
        return out

    def _polled(self) -> None:
        """Stop the members `poll` names (at an epoch boundary)."""
        if self.poll is not None:
            for index in self.poll():
                self.stop(index)

    def stop(self, index: int) -> None:
        """End member `index` at the next epoch boundary (a cancel): it yields no more records."""
        self.stopped.add(index)

    def evaluate(
        self, X: Tensor, y: Tensor, mode: Any, *, own_rows: bool = False
    ) -> list[tuple[float, float]]:
        """`Trial.evaluate` for every active member at once (vmap over the stacked tensors): the
        mean cross-entropy and accuracy of each over (X, y) — shared rows (N, d) / (N,), or each
        member's own (K, N, d) / (K, N) with `own_rows` — in the chunks `Trial.evaluate` uses.
        Sums are in float64 per chunk, so a member's values agree with its own evaluate's to
        rounding (≤ 1e-6 relative; tests/workers/test_packed.py)."""
        K = len(self.active)
        n = X.shape[-2]
        net = self.net
        x_dim = 0 if own_rows else None
        forward = vmap(lambda p, s, x: net.forward(p, s, x, mode)[0], in_dims=(0, 0, x_dim))
        loss = torch.zeros(K, dtype=torch.float64, device=X.device)
        correct = torch.zeros(K, dtype=torch.int64, device=X.device)
        with torch.no_grad():
            for lo, hi in eval_chunks(self.configs[self.active[0]], n, mode):
                xb, yb = (X[:, lo:hi], y[:, lo:hi]) if own_rows else (X[lo:hi], y[lo:hi])
                logits = forward(self.params, self.state, xb)  # (K, m, C)
                yy = yb if own_rows else yb.expand(K, -1)
                ce = F.cross_entropy(logits.flatten(0, 1), yy.flatten(), reduction="none")
                loss += ce.view(K, -1).sum(dim=1, dtype=torch.float64)
                correct += (logits.argmax(dim=2) == yy).sum(dim=1)
        return [(lv / n, c / n) for lv, c in zip(loss.tolist(), correct.tolist(), strict=True)]

    def _initial_stats(self) -> list[EpochStats]:
        """`Trial.initial_stats` of every active member at once."""
        ms = [self.members[i] for i in self.active]
        rows = [m.epoch0_rows for m in ms]
        X, y = ms[0].data.X_train, ms[0].data.y_train
        own = _own_rows(ms) or rows[0] is not None
        if own:

            def pick(m: Trial, r: Tensor | None, t: Tensor) -> Tensor:
                return t if r is None else t[r.to(t.device)]

            X = torch.stack([pick(m, r, m.data.X_train) for m, r in zip(ms, rows, strict=True)])
            y = torch.stack([pick(m, r, m.data.y_train) for m, r in zip(ms, rows, strict=True)])
        return [
            EpochStats(loss, acc, 0.0, not math.isfinite(loss))
            for loss, acc in self.evaluate(X, y, "batch", own_rows=own)
        ]

    def _records(self, epoch: int, stats: dict[int, EpochStats]) -> Iterator[tuple[int, dict]]:
        """The records of members `stats` names: test metrics for all active members at once
        (grouped by their test mode), the probe measurements member by member."""
        modes = {i: self.members[i].test_mode() for i in self.active}
        test: dict[int, tuple[float, float]] = {}
        for mode in sorted(set(modes.values())):
            first = self.members[self.active[0]]
            values = self.evaluate(first.data.X_test, first.data.y_test, mode)
            test.update(
                {i: v for i, v in zip(self.active, values, strict=True) if modes[i] == mode}
            )
        recorded = sorted(stats)
        rows = [self.active.index(i) for i in recorded]
        probes = self._probe([self.members[i] for i in recorded], rows) if recorded else []
        for i, j, probe in zip(recorded, rows, probes, strict=True):
            m = self.members[i]
            # what the record reads besides (the Jacobian, running statistics): the member's own
            # copies, in the memory layout fit() gives its tensors
            m.params = {
                k: _copy_strided(v[j].detach(), self.strides[i][k]) for k, v in self.params.items()
            }
            m.state = {k: v[j].clone() for k, v in self.state.items()}
            yield i, m.record(epoch, stats[i], test[i], probe)
        self._point_members()

    def _probe(self, ms: list[Trial], rows: list[int]) -> list[dict[str, Any]]:
        """probe_metrics of members `ms` (rows `rows` of the stacks) at once, each on its own
        probe batch (`metrics.probe_metrics_packed`)."""
        params = {k: v[rows].detach() for k, v in self.params.items()}
        state = {k: v[rows] for k, v in self.state.items()}
        X = torch.stack([m.probe[0] for m in ms])
        Y = torch.stack([m.probe[1] for m in ms])
        c = self.configs[0]
        return probe_metrics_packed(
            self.net, params, state, X, Y, spectra=c.spectra, tap_metrics=c.tap_metrics
        )

    def epochs(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(member index, record) for every member, in epoch order (members in pack order within
        an epoch): the records fit() would yield for each member's config alone."""
        for batch in self.epoch_batches():
            yield from batch

    def epoch_batches(self) -> Iterator[list[tuple[int, dict[str, Any]]]]:
        """`epochs`, one list per epoch (the members' records of that epoch, possibly none)."""
        config = self.configs[0]
        recorded = set(config.recorded_epochs)
        self._stack()
        stats0 = dict(zip(self.active, self._initial_stats(), strict=True))
        yield list(self._records(0, stats0))
        self._polled()
        self._leave({i for i, st in stats0.items() if st.diverged} | self.stopped)
        for epoch in range(1, config.epochs + 1):
            if not self.active:
                return
            stats_of = self.train_epoch()
            shown = {i: st for i, st in stats_of.items() if st.diverged or epoch in recorded}
            yield list(self._records(epoch, shown))
            self._polled()
            self._leave({i for i, st in stats_of.items() if st.diverged} | self.stopped)


def _copy_strided(t: Tensor, stride: tuple[int, ...]) -> Tensor:
    """A copy of t with the given strides (a fresh allocation)."""
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _own_rows(members: Sequence[Trial]) -> bool:
    """Whether members train on rows of their own (a seeded max_train_samples subset each) rather
    than on one shared training set."""
    first = members[0].data.X_train
    return any(m.data.X_train is not first for m in members)


def fit_packed(
    configs: Sequence[TrialConfig | dict[str, Any]],
    *,
    device: str = "cpu",
    data_dir: Path | None = None,
    threads: int | None = None,
    poll: Callable[[], Iterable[int]] | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """fit() for a pack: (member index, record) pairs; see the module docstring. A pack of one
    trains through fit() itself (no batching, so its records are fit's bit for bit). `poll`,
    asked at every epoch boundary of a pack, names members to stop there (Pack.stop)."""
    for batch in fit_packed_by_epoch(
        configs, device=device, data_dir=data_dir, threads=threads, poll=poll
    ):
        yield from batch


def fit_packed_by_epoch(
    configs: Sequence[TrialConfig | dict[str, Any]],
    *,
    device: str = "cpu",
    data_dir: Path | None = None,
    threads: int | None = None,
    poll: Callable[[], Iterable[int]] | None = None,
) -> Iterator[list[tuple[int, dict[str, Any]]]]:
    """`fit_packed`, one list per epoch: what a Ray trial reports as one result (a result per
    member record would cost the driver ~25 ms each; bench/packed.py)."""
    parsed = [c if isinstance(c, TrialConfig) else parse_trial_config(dict(c)) for c in configs]
    if len(parsed) == 1:
        for record in fit(parsed[0], device=device, data_dir=data_dir, threads=threads):
            yield [(0, record)]
        return
    set_cuda_precision(device)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        pack = Pack(parsed, device=device, data_dir=data_dir)
        pack.poll = poll
        yield from pack.epoch_batches()
    finally:
        torch.set_num_threads(before)
