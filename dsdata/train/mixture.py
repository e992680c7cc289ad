"""Weighted mixing of several shard sets (`data.sources`), deterministic and exactly resumable.

Each source is an endless ShardDataset of its own; window n goes to the source whose count lags its
share most (ties to the first), so the state is the counts plus each source's ShardDataset state.
docs/shards.md ("Mixing shard sets by weight") is the reference.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np
import torch

from dsdata.shards.export.source import shard_set_name
from dsdata.shards.format import MANIFEST, ShardError, locate_shard_dir, manifest_vocab_size
from dsdata.train.config import ConfigError, DataConfig, check_sources

_STATE_FORMAT = "dsdata-mixture"


def pick_sources(weights: np.ndarray, counts: np.ndarray, rows: int) -> np.ndarray:
    """The source of each of the next `rows` windows; updates `counts` in place."""
    out = np.empty(rows, dtype=np.int64)
    total = int(counts.sum())
    for row in range(rows):
        lag = weights * (total + 1) - counts
        chosen = int(np.argmax(lag))
        counts[chosen] += 1
        total += 1
        out[row] = chosen
    return out


class MixtureBatches:
    """Global batches mixed from several shard sets (the trainer's loader for `data.sources`)."""

    def __init__(self, data: DataConfig, seq_len: int, total_steps: int, batch_size: int):
        from dsdata.train.data import ShardDataset

        check_sources(data.sources, "data")  # as load_config does, for a DataConfig built in Python
        self.seq_len, self.batch_size = seq_len, batch_size
        self.paths, self.names, self.datasets = [], [], []
        for i, source in enumerate(data.sources):
            try:
                path = locate_shard_dir(source["path"])
            except ShardError as exc:
                raise ConfigError(f"data.sources[{i}].path: {exc}") from None
            if not os.path.isfile(os.path.join(path, MANIFEST)):
                raise ConfigError(f"data.sources[{i}].path = {source['path']!r}: no manifest.json there or in its "
                                  "shards/ folder; point it at the shards of a `dsdata run` (RUN_DIR or RUN_DIR/shards)")
            dataset = ShardDataset(path, seq_len, seed=data.seed + 7919 * i, verify=data.verify,
                                   curriculum=data.curriculum or None, prefetch=data.prefetch,
                                   total_steps=total_steps, endless=True)
            if dataset.windows_per_epoch() == 0:
                raise ConfigError(f"data.sources[{i}] ({source['path']}): its shards hold no complete window of "
                                  f"training.seq_len + 1 = {seq_len + 1} tokens")
            self.paths.append(path)
            self.names.append(source.get("name") or shard_set_name(path))
            self.datasets.append(dataset)
        if len(set(self.names)) != len(self.names):
            raise ConfigError(f"data.sources: names {self.names} repeat; give each source a distinct `name`")
        self._check_same_tokenizer()
        raw = np.array([float(s["weight"]) if "weight" in s else
                        float(s["epochs"]) * float(d.manifest["totals"]["tokens"])
                        for s, d in zip(data.sources, self.datasets)])
        self.weights = raw / raw.sum()
        self.counts = np.zeros(len(self.datasets), dtype=np.int64)
        self._iters: list[Any] | None = None
        # what the trainer reads off its loader (vocabulary, the tokenizer to export): the first source's
        self.path = self.paths[0]

    def _check_same_tokenizer(self) -> None:
        first = self.datasets[0].manifest.get("tokenizer") or {}
        for path, dataset in zip(self.paths[1:], self.datasets[1:]):
            other = dataset.manifest.get("tokenizer") or {}
            for key in ("vocab_size", "eos_id", "sha256"):
                if first.get(key) != other.get(key):
                    raise ConfigError(f"data.sources: {path} was written with another tokenizer than {self.paths[0]} "
                                      f"({key} {other.get(key)!r} vs {first.get(key)!r}); mix shards of one tokenizer")
            if dataset.dtype != self.datasets[0].dtype:
                raise ConfigError(f"data.sources: {path} holds {dataset.dtype} ids, {self.paths[0]} {self.datasets[0].dtype}")

    @property
    def vocab_size(self) -> int | None:
        return manifest_vocab_size(self.datasets[0].manifest)

    def tokenizer(self) -> tuple[dict, str] | None:
        return self.datasets[0].manifest.get("tokenizer") or {}, self.path

    def next_batch(self, step: int) -> torch.Tensor:
        """The [batch_size, seq_len + 1] batch of `step`, rows in the order their sources were picked."""
        if self._iters is None:
            self._iters = [iter(d) for d in self.datasets]
        for dataset in self.datasets:
            dataset.set_step(step)
        chosen = pick_sources(self.weights, self.counts, self.batch_size)
        return torch.stack([next(self._iters[i]) for i in chosen.tolist()])

    def close(self) -> None:
        for dataset in self.datasets:
            dataset.close()
        self._iters = None

    def proportions(self) -> dict[str, float]:
        """The realised fraction of windows per source so far (0 before the first batch)."""
        total = int(self.counts.sum())
        return {name: (int(c) / total if total else 0.0) for name, c in zip(self.names, self.counts)}

    def step_metrics(self) -> dict[str, float]:
        return {f"mix/{name}": round(value, 6) for name, value in self.proportions().items()}

    def _identity(self) -> str:
        described = [[name, d.manifest_sha256, float(w)] for name, d, w in zip(self.names, self.datasets, self.weights)]
        return hashlib.sha256(json.dumps(described).encode()).hexdigest()

    def state_dict(self) -> dict[str, Any]:
        return {"format": _STATE_FORMAT, "version": 1, "identity": self._identity(), "names": list(self.names),
                "counts": [int(c) for c in self.counts], "sources": [d.state_dict() for d in self.datasets]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != _STATE_FORMAT:
            raise ValueError("the checkpoint's loader state is not a data.sources mixture (was it saved with data.path?)")
        if state.get("identity") != self._identity():
            raise ValueError(f"the checkpoint's loader state was saved with other data.sources (sources "
                             f"{state.get('names')}); resume with the same sources, weights and shards")
        for dataset, saved in zip(self.datasets, state["sources"]):
            dataset.load_state_dict(saved)
        self.counts = np.array(state["counts"], dtype=np.int64)
        self._iters = None
