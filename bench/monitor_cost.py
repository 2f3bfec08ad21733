"""The cost of `isosweep.Monitor.record` relative to one training step of the monitored model
(issue 21), for a GPT-2-style block stack and a small ResNet at CPU scale, one torch thread.

    .venv/bin/python bench/monitor_cost.py

Interleaved: each repeat times one AdamW step (forward, backward, step) on a training batch,
then one `record` (probe of the fixed batch with its gradients + the write to a local SQLite
Store), then `probe` alone; medians are printed, and record / step.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import isosweep
from service.store import Store


class Block(torch.nn.Module):
    """GPT-2's block: pre-LayerNorm causal self-attention and a 4× GELU MLP, residual."""

    def __init__(self, d: int, heads: int, T: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)
        )
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = self.ln1(h)
        h = h + self.attn(a, a, a, attn_mask=self.mask, need_weights=False)[0]
        return h + self.mlp(self.ln2(h))


class GPT(torch.nn.Module):
    def __init__(self, vocab=512, d=128, heads=4, depth=4, T=64) -> None:
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Parameter(torch.zeros(T, d))
        self.blocks = torch.nn.ModuleList(Block(d, heads, T) for _ in range(depth))
        self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids) + self.pos
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln(h))


def lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())


class Basic(torch.nn.Module):
    def __init__(self, c_in: int, c: int, stride: int) -> None:
        super().__init__()
        conv = torch.nn.Conv2d
        self.f = torch.nn.Sequential(
            conv(c_in, c, 3, stride, 1, bias=False), torch.nn.BatchNorm2d(c), torch.nn.ReLU(),
            conv(c, c, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(c),
        )  # fmt: skip
        self.skip = (
            torch.nn.Identity()
            if stride == 1 and c_in == c
            else torch.nn.Sequential(conv(c_in, c, 1, stride, bias=False), torch.nn.BatchNorm2d(c))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.f(x) + self.skip(x))


def resnet(widths=(16, 32, 64), per_stage=2) -> torch.nn.Module:
    m = torch.nn.Sequential()
    m.stem = torch.nn.Sequential(torch.nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                 torch.nn.BatchNorm2d(widths[0]), torch.nn.ReLU())  # fmt: skip
    blocks, c = [], widths[0]
    for k, w in enumerate(widths):
        for j in range(per_stage):
            blocks.append(Basic(c, w, 2 if (k and not j) else 1))
            c = w
    m.blocks = torch.nn.Sequential(*blocks)
    m.pool, m.flat, m.head = (
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(c, 10),
    )
    return m


def measure(name, model, batch, probe_batch, loss_fn, taps, repeats=7):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    xb, yb = batch
    xp, yp = probe_batch
    with tempfile.TemporaryDirectory() as tmp, Store(f"sqlite:///{tmp}/m.db") as store:
        mon = isosweep.Monitor(model, xp, y=yp, loss=loss_fn, store=store, sweep=name, taps=taps)
        steps, records, probes = [], [], []
        for step in range(repeats + 1):
            t0 = time.perf_counter()
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            t1 = time.perf_counter()
            mon.record(step, loss=float(loss.detach()))
            t2 = time.perf_counter()
            isosweep.probe(model, xp, y=yp, loss=loss_fn, taps=taps)
            t3 = time.perf_counter()
            if step:  # the first: warm-up
                steps.append(t1 - t0), records.append(t2 - t1), probes.append(t3 - t2)
    s, r, p = (statistics.median(v) for v in (steps, records, probes))
    print(
        f"{name}: step {s * 1e3:.0f} ms (batch {xb.shape[0]}), record {r * 1e3:.0f} ms "
        f"(probe alone {p * 1e3:.0f} ms, probe batch {xp.shape[0]}) = {r / s:.2f} steps"
    )


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    T, vocab = 64, 512
    gpt = GPT(vocab=vocab, T=T)
    ids = torch.randint(0, vocab, (32, T))
    probe_ids = torch.randint(0, vocab, (16, T))
    measure("gpt2-style d128 L4 T64", gpt, (ids, ids), (probe_ids, probe_ids), lm_loss,
            "blocks.{i}")  # fmt: skip
    net = resnet()
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    xp, yp = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    measure("resnet 3 stages × 2 blocks, 32×32", net, (x, y), (xp, yp),
            torch.nn.functional.cross_entropy, "blocks.{i}")  # fmt: skip


if __name__ == "__main__":
    main()
