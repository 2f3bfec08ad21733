"""One trial: build the network, measure it untrained, train it, yield a record per recorded epoch.

    for record in fit(TrialConfig(depth=50, init="orthogonal")):
        print(record["epoch"], record["grad_norm"][0])

`fit` is a plain generator: no Ray, no database. The record is specified in
docs/architecture.md ("The epoch record"). Everything random derives from `config.seed` through
separate streams (init, probe batch, shuffling, subset, epoch 0's subset), so that measuring —
or how often — never changes what is trained. Same config, seed, device and torch thread count
give bit-identical records (`fit(threads=…)`; reductions split over threads round differently).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from service.config import TrialConfig, parse_trial_config
from service.errors import InvalidInput
from service.isometry import cosine_gram
from workers import models, nn
from workers.custom_metrics import snapshot, update_ratios
from workers.data import Dataset, load_dataset, normalize_inputs, subset
from workers.jacobian import jacobian_singular_values
from workers.metrics import probe_metrics
from workers.precision import precision_check

STREAMS = {"init": 0, "probe": 1, "shuffle": 2, "subset": 3, "epoch0": 4}
EVAL_CHUNK = 4096  # samples per forward when batch composition cannot change the result


def generator(seed: int, stream: str) -> torch.Generator:
    """A CPU generator for one purpose, independent of the others (numpy's SeedSequence mixes
    (seed, stream) into a well-spread 64-bit seed)."""
    state = np.random.SeedSequence([seed, STREAMS[stream]]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


@dataclass
class EpochStats:
    loss: float  # mean cross-entropy over the minibatches seen (non-finite if one's loss was)
    acc: float
    time_s: float
    diverged: bool = False  # a minibatch's loss, or the parameters after the last step, non-finite


def flat_state(state: nn.State) -> tuple[Tensor, nn.State]:
    """The running statistics as views into one flat buffer, so that a snapshot before a step is
    one copy (`buffer.clone()`) and restoring it one `copy_`. Values are unchanged."""
    if not state:
        return torch.empty(0), {}
    buffer = torch.cat([v.reshape(-1) for v in state.values()])
    views: nn.State = {}
    start = 0
    for k, v in state.items():
        views[k] = buffer[start : start + v.numel()].view(v.shape)
        start += v.numel()
    return buffer, views


def all_finite(tensors: list[Tensor]) -> bool:
    """Every entry of every tensor finite (one device sync)."""
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


class Trial:
    """The tensors of one trial — data, parameters, running statistics, optimizer, probe batch —
    and the three things done with them: train an epoch, evaluate, measure."""

    def __init__(self, config: TrialConfig, *, device: str = "cpu", data_dir: Path | None = None):
        self.config = c = config
        self.device = torch.device(device)
        self.net = models.build(c)
        data = prepared_dataset(c, self.device, data_dir)
        if c.max_train_samples is not None:  # rows of the prepared set (input_norm is per row)
            data = subset(data, c.max_train_samples, generator(c.seed, "subset"))
        if len(data.X_train) < c.batch_size:
            raise InvalidInput(
                f"{c.batch_size} exceeds the {len(data.X_train)} training samples of "
                f"{c.dataset!r} (max_train_samples={c.max_train_samples})",
                field="batch_size",
            )
        self.data = data
        params = self.net.init_params(generator(c.seed, "init"))
        self.params = {k: v.to(self.device).requires_grad_() for k, v in params.items()}
        self._state_buffer, self.state = flat_state(
            nn.to_device(self.net.init_state(), self.device)
        )
        self.steps = 0  # optimizer steps taken; running statistics exist once it is > 0
        self._optimizer: torch.optim.Optimizer | None = None
        n = len(data.X_train)
        probe = torch.randperm(n, generator=generator(c.seed, "probe"))[: c.batch_size]
        self.probe = (
            self.data.X_train[probe.to(self.device)],
            self.data.y_train[probe.to(self.device)],
        )
        self.shuffle = generator(c.seed, "shuffle")
        self.epoch0_rows = epoch0_rows(c, n)
        self.recorded_weights: dict[str, Tensor] | None = None  # at the last record (copies)

    @property
    def spec(self) -> nn.Spec:
        """The MLP's nn.Spec (model mlp only; other families have no Spec)."""
        return self.net.spec  # type: ignore[attr-defined]

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Built at the first step that needs it: constructing a torch optimizer imports
        torch._dynamo (~1 s, ~170 MB), which an init-only trial (epochs = 0) never needs.
        Construction draws no randomness, so when it happens changes no number."""
        if self._optimizer is None:
            self._optimizer = make_optimizer(self.config, list(self.params.values()))
        return self._optimizer

    def train_epoch(self) -> EpochStats:
        """One pass over the training set in shuffled minibatches of `batch_size` (the short tail
        is dropped: every step sees exactly batch_size samples, which batch norm's theory needs).

        Stops at the first minibatch whose loss is non-finite, before stepping on it, and puts
        back the running statistics its forward pass updated: the network is left as it was
        after the last good step, weights and statistics alike. A step that breaks the network
        shows in the next minibatch's loss or — for the epoch's last step — in `still_finite`
        on that last minibatch; either marks the epoch diverged.
        """
        X, y = self.data.X_train, self.data.y_train
        bs = self.config.batch_size
        perm = torch.randperm(len(X), generator=self.shuffle).to(self.device)
        losses: list[float] = []
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        start = time.perf_counter()
        for i in range(len(X) // bs):
            idx = perm[i * bs : (i + 1) * bs]
            saved = self._state_buffer.clone()
            logits, _ = self.net.forward(self.params, self.state, X[idx], "train")
            loss = F.cross_entropy(logits, y[idx])
            losses.append(loss.item())  # the per-step divergence check needs the value anyway
            correct += (logits.argmax(dim=1) == y[idx]).sum()
            if not math.isfinite(losses[-1]):
                self._state_buffer.copy_(saved)
                break
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.steps += 1
        elapsed = time.perf_counter() - start
        mean = sum(losses) / len(losses)
        diverged = not math.isfinite(mean) or not self.still_finite(X[idx], y[idx])
        return EpochStats(mean, correct.item() / (len(losses) * bs), elapsed, diverged)

    def still_finite(self, x: Tensor, y: Tensor) -> bool:
        """After a step: parameters finite, and the loss on (x, y) with batch statistics (running
        ones untouched) finite — what the next step's check would have seen."""
        if not all_finite(list(self.params.values())):
            return False
        with torch.no_grad():
            logits, _ = self.net.forward(self.params, self.state, x, "batch")
            return math.isfinite(F.cross_entropy(logits, y).item())

    def evaluate(self, X: Tensor, y: Tensor, mode: nn.Mode) -> tuple[float, float]:
        """Mean cross-entropy and accuracy over (X, y), nothing updated.

        Where normalization uses batch statistics (mode "batch" with batch/batch_scale norm), the
        forward runs in minibatches of batch_size (a short tail joins the last one), as in
        training; otherwise a sample's output does not depend on its batch-mates, and the forward
        runs in large chunks.
        """
        loss, correct = 0.0, 0
        with torch.no_grad():
            for lo, hi in eval_chunks(self.config, len(X), mode):
                logits, _ = self.net.forward(self.params, self.state, X[lo:hi], mode)
                loss += F.cross_entropy(logits, y[lo:hi], reduction="sum").item()
                correct += int((logits.argmax(dim=1) == y[lo:hi]).sum())
        return loss / len(X), correct / len(X)

    def initial_stats(self) -> EpochStats:
        """Epoch 0's train loss/accuracy: the untrained network over the training set — or over
        the seeded subset `epoch0_rows` (TrialConfig.epoch0_train_samples) — in minibatches
        with their own statistics (as training would see them), nothing updated."""
        X, y = self.data.X_train, self.data.y_train
        if self.epoch0_rows is not None:
            rows = self.epoch0_rows.to(self.device)
            X, y = X[rows], y[rows]
        loss, acc = self.evaluate(X, y, "batch")
        return EpochStats(loss, acc, 0.0, not math.isfinite(loss))

    def record(
        self,
        epoch: int,
        stats: EpochStats,
        test: tuple[float, float] | None = None,
        probe: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The epoch record of docs/architecture.md: probe-batch metrics, test metrics, stats.
        `test` (the test loss and accuracy) and `probe` (probe_metrics' fields) if already
        measured: a pack measures its members at once (workers/packed.py).

        Test metrics use BatchNorm's running statistics when eval_norm = "running" (torch's eval
        mode) or each test batch's own when "batch". Before the first step there are no running
        statistics (torch's placeholders, mean 0 and variance 1, would make every norm the
        identity: an unnormalized network), so epoch 0 uses each test batch's own under either
        setting. Beware (docs/science.md): deep BN networks in eval mode can sit at chance on the
        test set while training accuracy is high — the running statistics lag the weights. Both
        are recorded as what they are.
        """
        test_loss, test_acc = test or self.evaluate(
            self.data.X_test, self.data.y_test, self.test_mode()
        )
        rec: dict[str, Any] = {
            "epoch": epoch,
            "diverged": stats.diverged,
            "train_loss": stats.loss,
            "train_acc": stats.acc,
            "test_loss": test_loss,
            "test_acc": test_acc,
            "epoch_time_s": stats.time_s,
        }
        if probe is None:
            probe = probe_metrics(
                self.net, self.params, self.state, *self.probe,
                spectra=self.config.spectra, tap_metrics=self.config.tap_metrics,
            )  # fmt: skip
        rec.update(probe)
        rec.update(self.update_ratios())
        check = self.config.precision_check and self.config.dtype == "float32"
        if epoch == 0 and check:  # float32 vs a float64 re-run: workers/precision.py
            rec.update(precision_check(self.config, self.params, self.state, self.probe, probe))
        if self.config.jacobian_samples:  # σ(∂h_L(x_i)/∂x_i), i < k (workers/jacobian.py)
            rec["jacobian_singular_values"] = jacobian_singular_values(
                self.net, self.params, self.state, self.probe[0], self.config.jacobian_samples
            )
        if epoch == 0:
            rec["input_gram"] = cosine_gram(self.probe[0].cpu().numpy(), zero="nan")
            x = self.probe[0].to(torch.float64)  # as the first Linear sees it (after input_norm)
            rec["input_moments"] = (x.square().sum(dim=1) / x.shape[1]).cpu().numpy()
        return rec

    def update_ratios(self) -> dict[str, Any]:
        """ "update_ratio" per block and "head_update_ratio": ‖W(e) − W(e_prev)‖_F /
        ‖W(e_prev)‖_F of the block's listed weights since the previous record — NaN at the
        first (epoch 0: nothing to compare with) —, then this record's weights kept for the
        next (workers/custom_metrics.py)."""
        layers, head = self.net.layer_weights(), self.net.head_weight
        previous = self.recorded_weights
        self.recorded_weights = snapshot(self.params, [*(w for ws in layers for w in ws), head])
        if previous is None:
            return {"update_ratio": np.full(len(layers), math.nan), "head_update_ratio": math.nan}
        return update_ratios(layers, head, self.params, previous)

    def test_mode(self) -> nn.Mode:
        """How test metrics normalize: eval_norm, except "batch" before any step (see record)."""
        running = self.config.eval_norm == "running" and self.steps > 0
        return "running" if running else "batch"


_PREPARED: dict[tuple, Dataset] = {}
PREPARED_KEEP = 2  # prepared sets kept per process (one per dataset × dtype × input_norm × device)


def prepared_dataset(config: TrialConfig, device: torch.device, data_dir: Path | None) -> Dataset:
    """The trial's dataset in its dtype, with its input_norm, on its device — shared by every
    trial of the process that asks for the same (read-only: do not modify it)."""
    key = (config.dataset, str(data_dir), config.dtype, config.input_norm, str(device))
    if key not in _PREPARED:
        data = load_dataset(config.dataset, data_dir)
        dt = nn.DTYPES[config.dtype]
        X_train, X_test = (normalize_inputs(X.to(dt), config.input_norm) for X in data[::2])
        prepared = Dataset(X_train, data.y_train, X_test, data.y_test)
        while len(_PREPARED) >= PREPARED_KEEP:
            _PREPARED.pop(next(iter(_PREPARED)))
        _PREPARED[key] = Dataset(*(t.to(device) for t in prepared))
    return _PREPARED[key]


def eval_chunks(config: TrialConfig, n: int, mode: nn.Mode) -> list[tuple[int, int]]:
    """The [lo, hi) row ranges `Trial.evaluate` forwards at once: minibatches of batch_size
    where normalization uses batch statistics (a short tail joins the last one), else chunks of
    EVAL_CHUNK (a sample's output does not depend on its batch-mates)."""
    per_batch = mode == "batch" and couples_batch(config)
    size = config.batch_size if per_batch else EVAL_CHUNK
    starts = list(range(0, n, size))
    if len(starts) > 1 and n - starts[-1] < size:
        starts.pop()  # the short tail joins the last full batch
    return list(zip(starts, [*starts[1:], n], strict=True))


def couples_batch(config: TrialConfig) -> bool:
    """Whether a sample's output can depend on its batch-mates under batch statistics: the
    batch norms, and any registered model (its modules are not known here)."""
    from service.config import BUILTIN_MODELS

    return config.norm in ("batch", "batch_scale") or config.model not in BUILTIN_MODELS


def epoch0_rows(config: TrialConfig, n: int) -> Tensor | None:
    """The training rows epoch 0's train_loss/train_acc are measured on: None (all n, in order)
    when n ≤ epoch0_train_samples or it is None; else max(epoch0_train_samples, batch_size)
    rows drawn without replacement from the "epoch0" stream — its own, so neither the probe
    batch, the training subset, the shuffling nor the initialization moves. The mean over k of n
    samples is unbiased for the whole set's; for the accuracy its standard error is at most
    √(n − k) / (2√(k(n − 1))) (a proportion sampled without replacement): 0.0067 at k = 5000
    of n = 50000."""
    k = config.epoch0_train_samples
    if k is None or k >= n:
        return None
    k = max(k, config.batch_size)  # at least one whole minibatch (batch_size ≤ n)
    return torch.randperm(n, generator=generator(config.seed, "epoch0"))[:k]


def make_optimizer(config: TrialConfig, params: list[Tensor]) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
        )
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    raise InvalidInput(
        f"unknown optimizer {config.optimizer!r}", field="optimizer", allowed=("sgd", "adam")
    )


def fit(
    config: TrialConfig | dict[str, Any],
    *,
    device: str = "cpu",
    data_dir: Path | None = None,
    threads: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Train one trial, yielding its epoch records: epoch 0 (untrained), every `record_every`
    epochs, and the last. A trial whose loss turns NaN/±inf — on a minibatch, or on the last
    minibatch after the epoch's last step (`Trial.still_finite`) — yields that epoch's record with
    `diverged=True` (measured as it stands) and stops.

    Args:
        config: a TrialConfig, or a dict validated into one.
        device: "cpu" or a torch device such as "cuda"; everything, eigenvalues included, runs
            there (in float64 for the Grams).
        data_dir: root of the torchvision datasets; default Settings.data_dir.
        threads: torch's intra-op thread count for this trial (process-wide, put back when the
            generator finishes); None keeps the process's (the Ray trainable sets it to the
            trial's CPUs). Records are bit-identical at equal thread counts only.

    Raises:
        InvalidInput: an invalid config, or a batch larger than the training set.
        DataUnavailable: the dataset's files are missing and cannot be downloaded.
    """
    if not isinstance(config, TrialConfig):
        config = parse_trial_config(dict(config))
    if threads is not None and threads < 1:
        raise InvalidInput(f"threads must be ≥ 1, not {threads}", field="threads")
    set_cuda_precision(device)
    if threads is None:
        yield from _epochs(Trial(config, device=device, data_dir=data_dir))
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield from _epochs(Trial(config, device=device, data_dir=data_dir))
    finally:
        torch.set_num_threads(before)


def set_cuda_precision(device: str | torch.device) -> None:
    """On CUDA, TF32 off for matmuls and convolutions unless Settings.allow_tf32
    (ISOSWEEP_ALLOW_TF32): TF32 keeps 10 mantissa bits, which moves measured gaps and gradient
    norms by ~1e-3 relative — a training-speed option, never the default for measurements."""
    if torch.device(device).type != "cuda":
        return
    from service.settings import get_settings

    allow = get_settings().allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def _epochs(trial: Trial) -> Iterator[dict[str, Any]]:
    config = trial.config
    recorded = set(config.recorded_epochs)
    stats = trial.initial_stats()
    yield trial.record(0, stats)
    for epoch in range(1, config.epochs + 1):
        if stats.diverged:
            return
        stats = trial.train_epoch()
        if stats.diverged or epoch in recorded:
            yield trial.record(epoch, stats)
