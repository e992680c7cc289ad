"""Global batches for the training loop: every rank draws the same global batch and keeps its rows,
so the batch of step s is the same windows under any parallel layout and the loader position is one
state shared by all ranks (a checkpoint resumes under any layout).
"""
from __future__ import annotations

import os
from typing import Any

import torch

from dsdata.shards.format import manifest_vocab_size
from dsdata.train.config import ConfigError, DataConfig
from dsdata.train.protocols import BatchSource


class ShardBatches:
    """Global batches of `seq_len + 1` token windows from a shard directory: an endless batched
    ShardDataset, batches in the shard's dtype (`distributed.token_ids_on` widens them on the device).
    """

    def __init__(self, data: DataConfig, seq_len: int, total_steps: int, batch_size: int):
        from dsdata.train.data import ShardDataset

        self.path = resolve_shard_dir(data.path)
        self.batch_size = batch_size
        # Checks the manifest and shard files now: a bad data.path fails before the model is built.
        self.dataset = ShardDataset(self.path, batch_size=batch_size, endless=True, seq_len=seq_len, rank=0,
                                    world_size=1, seed=data.seed, verify=data.verify,
                                    curriculum=data.curriculum or None, prefetch=data.prefetch,
                                    total_steps=total_steps)
        if self.dataset.windows_per_epoch() == 0:
            raise ConfigError(f"{self.path}: the shards hold no complete window of training.seq_len + 1 = "
                              f"{seq_len + 1} tokens; use a smaller training.seq_len")
        self._iter = None

    @property
    def vocab_size(self) -> int | None:
        return manifest_vocab_size(self.dataset.manifest)

    def tokenizer(self) -> tuple[dict, str] | None:
        return self.dataset.manifest.get("tokenizer") or {}, self.path

    def step_metrics(self) -> dict[str, float]:
        return {}

    def next_batch(self, step: int) -> torch.Tensor:
        """The [batch_size, seq_len + 1] batch of `step`, in the shard's dtype (uint16 or uint32)."""
        self.dataset.set_step(step)
        if self._iter is None:
            self._iter = iter(self.dataset)
        return next(self._iter)

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Positions count windows, not batches: a state saved under another batch size continues.
        self.dataset.load_state_dict({**state, "batch_size": self.dataset.batch_size})
        self._iter = None

    def close(self) -> None:
        self.dataset.close()
        self._iter = None


class SyntheticBatches:
    """A learnable synthetic stream (for tests, smoke runs and benchmarks without shards): window i, a
    function of (seed, i), walks a fixed random permutation of the vocabulary with 10 % of the tokens
    replaced at random; token t is perm applied (t − r) times to the noise token at r, the last reset."""

    def __init__(self, vocab_size: int, seq_len: int, batch_size: int, seed: int = 0):
        self.vocab_size, self.seq_len, self.batch_size, self.seed = vocab_size, seq_len, batch_size, seed
        gen = torch.Generator().manual_seed(seed)
        self.successor = torch.randperm(vocab_size, generator=gen)
        self.position = 0
        # powers[j] = successor applied 2^j times, for every distance up to seq_len.
        self._powers = [self.successor]
        while (1 << len(self._powers)) <= seq_len:
            last = self._powers[-1]
            self._powers.append(last[last])

    def _draws(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Window `index`'s noise tokens and where they replace the walk (its own generator)."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index + 1)
        noise = torch.randint(0, self.vocab_size, (self.seq_len + 1,), generator=gen)
        keep_noise = torch.rand(self.seq_len + 1, generator=gen) < 0.1
        return noise, keep_noise

    def windows(self, first: int, count: int) -> torch.Tensor:
        """Windows first .. first + count − 1, (count, seq_len + 1) int64."""
        draws = [self._draws(first + i) for i in range(count)]
        noise = torch.stack([d[0] for d in draws])
        reset = torch.stack([d[1] for d in draws])
        reset[:, 0] = True  # the walk starts from a noise token
        positions = torch.arange(self.seq_len + 1).expand(count, -1)
        last_reset = torch.where(reset, positions, 0).cummax(dim=1).values
        out = noise.gather(1, last_reset)
        distance = positions - last_reset
        for j, power in enumerate(self._powers):
            step = (distance >> j) & 1 == 1
            out = torch.where(step, power[out], out)
        return out

    def next_batch(self, step: int) -> torch.Tensor:
        batch = self.windows(self.position, self.batch_size)
        self.position += self.batch_size
        return batch

    def step_metrics(self) -> dict[str, float]:
        return {}

    def tokenizer(self) -> tuple[dict, str] | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"format": "dsdata-synthetic", "seed": self.seed, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != "dsdata-synthetic" or state.get("seed") != self.seed:
            raise ValueError("checkpoint's loader state is not this synthetic source (different data.path or seed)")
        self.position = int(state["position"])

    def close(self) -> None:
        pass


def resolve_shard_dir(path: str) -> str:
    """Accept the shard directory itself or a `dsdata run` output directory holding shards/."""
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return path
    nested = os.path.join(path, "shards")
    if os.path.isfile(os.path.join(nested, "manifest.json")):
        return nested
    raise ConfigError(f"data.path = {path!r}: no manifest.json there or in its shards/ folder; "
                      "point it at the shards of a `dsdata run` (RUN_DIR or RUN_DIR/shards)")


def build_batches(data: DataConfig, seq_len: int, total_steps: int, batch_size: int) -> BatchSource:
    """The batch source of `data` (a mixture, one shard set, or the synthetic stream), serving
    batches of `batch_size` (training.global_batch_size) windows."""
    if data.sources:
        from dsdata.train.mixture import MixtureBatches

        return MixtureBatches(data, seq_len, total_steps, batch_size)
    if data.path:
        return ShardBatches(data, seq_len, total_steps, batch_size)
    return SyntheticBatches(data.synthetic_vocab, seq_len, batch_size, data.seed)
