"""A test-only attention kernel and a test-only optimizer: each one class/function here plus one
registry row, declared as entry points by tests/test_train_registries.py (no dsdata file names them)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dsdata.train.attention import AttentionKernel
from dsdata.train.optim import OptimizerRow
from dsdata.core.params import Integer, Number, Param, Settings


@dataclass
class BandConfig(Settings):
    band: int = Param(16, "each query sees its `band` latest keys (itself included)", Integer(min=1))


class BandAttention(AttentionKernel):
    """Causal attention limited to a band of recent keys, written out (softmax of masked logits);
    counts the optimizer steps it was told of in a persistent buffer (checkpointed and exported)."""

    Config = BandConfig

    def __init__(self, band: int):
        super().__init__()
        self.band = band
        self.register_buffer("steps_seen", torch.zeros((), dtype=torch.int64))

    @classmethod
    def from_config(cls, options: BandConfig, head_dim: int, layer_id: int) -> "BandAttention":
        return cls(options.band)

    def on_training_step(self, step: int) -> None:
        self.steps_seen += 1

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = q.shape[2]
        pos = torch.arange(t, device=q.device)
        distance = pos[:, None] - pos[None, :]
        allowed = (distance >= 0) & (distance < self.band)
        logits = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return torch.matmul(logits.masked_fill(~allowed, float("-inf")).softmax(-1), v)


@dataclass
class SGDConfig(Settings):
    momentum: float = Param(0.0, "SGD momentum", Number(0, 1, open_max=True))


def _sgd(groups, common, options: SGDConfig, total_steps, device):
    return torch.optim.SGD(groups, lr=common.lr, momentum=options.momentum)


SGD_ROW = OptimizerRow(_sgd, SGDConfig)
