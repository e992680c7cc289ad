"""Global batches for the training loop: every rank draws the same global batch and keeps its rows.

Drawing the whole global batch on every rank (from a ShardDataset opened as rank 0 of 1) costs a few
MB of memory-mapped reads per step and buys two things: the batch of step s is the same set of
windows whatever the parallel layout (so 1 process and N processes train the same math), and the
loader position is one state shared by all ranks (so a checkpoint resumes under any layout).
"""
from __future__ import annotations

import os
from typing import Any

import torch

from dsdata.train.config import ConfigError, DataConfig


class ShardBatches:
    """Global batches of `seq_len + 1` token windows from a shard directory."""

    def __init__(self, data: DataConfig, seq_len: int, total_steps: int):
        from dsdata.train.data import ShardDataset

        self.path = resolve_shard_dir(data.path)
        self.dataset = ShardDataset(self.path, seq_len, rank=0, world_size=1, seed=data.seed, verify=data.verify,
                                    curriculum=data.curriculum or None, prefetch=data.prefetch,
                                    total_steps=total_steps)
        self._iter = None

    @property
    def vocab_size(self) -> int | None:
        tokenizer = self.dataset.manifest.get("tokenizer") or {}
        return int(tokenizer["vocab_size"]) if tokenizer.get("vocab_size") else None

    def _next_window(self) -> torch.Tensor:
        for _ in range(2):
            if self._iter is None:
                self._iter = iter(self.dataset)
            try:
                return next(self._iter)
            except StopIteration:  # end of an epoch: the next iter() starts the next one
                self._iter = None
        raise ConfigError(f"{self.path}: the shards hold no complete window; use a smaller training.seq_len")

    def next_batch(self, step: int, batch_size: int) -> torch.Tensor:
        self.dataset.set_step(step)
        return torch.stack([self._next_window().long() for _ in range(batch_size)])

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
        self._iter = None


class SyntheticBatches:
    """A learnable synthetic stream (for tests and smoke runs without shards).

    Window i is a walk of a fixed random permutation of the vocabulary ("next token = perm[token]")
    with 10 % of the tokens replaced at random: a model can drive its loss well below log(vocab).
    Everything is a function of (seed, window index), so the state is one integer.
    """

    def __init__(self, vocab_size: int, seq_len: int, seed: int = 0):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        gen = torch.Generator().manual_seed(seed)
        self.successor = torch.randperm(vocab_size, generator=gen)
        self.position = 0

    def window(self, index: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index + 1)
        noise = torch.randint(0, self.vocab_size, (self.seq_len + 1,), generator=gen)
        keep_noise = torch.rand(self.seq_len + 1, generator=gen) < 0.1
        out = torch.empty(self.seq_len + 1, dtype=torch.long)
        out[0] = noise[0]
        for t in range(1, self.seq_len + 1):
            out[t] = noise[t] if keep_noise[t] else self.successor[out[t - 1]]
        return out

    def next_batch(self, step: int, batch_size: int) -> torch.Tensor:
        batch = torch.stack([self.window(self.position + i) for i in range(batch_size)])
        self.position += batch_size
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"format": "dsdata-synthetic", "seed": self.seed, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != "dsdata-synthetic" or state.get("seed") != self.seed:
            raise ValueError("checkpoint's loader state is not this synthetic source (different data.path or seed)")
        self.position = int(state["position"])


def resolve_shard_dir(path: str) -> str:
    """Accept the shard directory itself or a `dsdata run` output directory holding shards/."""
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return path
    nested = os.path.join(path, "shards")
    if os.path.isfile(os.path.join(nested, "manifest.json")):
        return nested
    raise ConfigError(f"data.path = {path!r}: no manifest.json there or in its shards/ folder; "
                      "point it at the shards of a `dsdata run` (RUN_DIR or RUN_DIR/shards)")


def build_batches(data: DataConfig, seq_len: int, total_steps: int):
    if data.path:
        return ShardBatches(data, seq_len, total_steps)
    return SyntheticBatches(data.synthetic_vocab, seq_len, data.seed)
