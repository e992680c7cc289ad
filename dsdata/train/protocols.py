"""What the trainer asks of its batch sources and attention kernels (the layout's: parallel/protocol.py).
Every implementation provides every member (a no-op where it has nothing to do); the loop calls them all.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class BatchSource(Protocol):
    batch_size: int  # rows of every batch: training.global_batch_size
    vocab_size: int | None  # the data's vocabulary (the shards' tokenizer; the synthetic one), None: unknown

    def next_batch(self, step: int) -> torch.Tensor:
        """The [batch_size, seq_len + 1] token windows of optimizer step `step`."""

    def step_metrics(self) -> dict[str, float]:
        """Metrics of the data to log with the step ({} for a single source)."""

    def tokenizer(self) -> tuple[dict, str] | None:
        """(the manifest's tokenizer entry, the shard directory its path is relative to); None: no shards."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Stop any thread the source started (the end of a run)."""


@runtime_checkable
class AttentionKernel(Protocol):
    Config: type  # its options dataclass ([model.attention_config])
    llama_compatible: bool  # its weights export as a Hugging Face LlamaForCausalLM

    @classmethod
    def from_config(cls, options: Any, head_dim: int, layer_id: int) -> "AttentionKernel":
        """Layer `layer_id`'s kernel."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention over (batch, heads, seq, head_dim) tensors, any head count."""

    def on_training_step(self, step: int) -> None:
        """Before optimizer step `step` starts."""

    def on_weights_initialised(self) -> None:
        """After the model's weights were (re)initialised."""
