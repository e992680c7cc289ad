"""The `Layout` protocol: everything the trainer, the checkpointer and the export ask of a parallel
layout, and nothing optional (a method a subclass leaves out is abstract: TypeError naming it).
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Callable, Protocol

import torch
import torch.distributed as dist
from torch import nn

from dsdata.train.distributed import DistEnv
from dsdata.train.parallel.dims import ParallelDims

# loss_fn(logits, targets) -> (loss to differentiate, language-model loss to report)
LossFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Layout(Protocol):
    env: DistEnv
    dims: ParallelDims  # sizes and the global-batch split (dp × micro_batch_size × accumulation)
    dp_rank: int
    vocab_parallel: bool = False  # logits sharded over tp into loss_parallel (DTensor logits: loss stays eager)

    @abstractmethod
    def parallelize(self, model: nn.Module) -> nn.Module:
        """Apply the layout to the plain model (in place where it can); returns the module to train."""

    def local_micro_batches(self, global_batch: torch.Tensor) -> list[torch.Tensor]:
        """This rank's micro-batches of the global batch (every rank draws the same global batch)."""
        return self.dims.rows_of(global_batch, self.dp_rank)

    @abstractmethod
    def forward_backward(self, model: nn.Module, micro_batches: list[torch.Tensor], loss_fn: LossFn,
                         loss_multiplier: float, autocast_ctx: Callable) -> torch.Tensor:
        """Backward of Σ loss · multiplier / micro-batches; afterwards every gradient is the one a single
        process would hold (reduced over data parallel).  Returns this rank's mean LM loss (detached)."""

    @abstractmethod
    def mean_over_data_parallel(self, value: torch.Tensor) -> torch.Tensor:
        """The global mean of the per-rank loss, on every rank."""

    @abstractmethod
    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The global L2 norm of the gradients, every parameter counted once, on every rank."""

    # The same for every layout (they differ in how ranks are grouped, not in who is rank 0).

    def barrier(self) -> None:
        """Wait for every rank (nothing with one process)."""
        if self.env.world_size > 1:
            dist.barrier()

    @property
    def writes_metrics(self) -> bool:
        """True on the one rank that writes metrics.jsonl, TensorBoard, the export and checkpoint JSON."""
        return self.env.rank == 0

    @abstractmethod
    def describe(self) -> str:
        """One line for the run's set-up message, e.g. 'ddp, dp 2 × tp 1 × pp 1, ...'."""

    @abstractmethod
    def optimizer_state_to_save(self, optim_state: dict) -> dict:
        """The optimizer state dict to hand to DCP (a pipeline stage lists every stage's parameters)."""

    @abstractmethod
    def names_on_any_rank(self, names: list[str]) -> list[str]:
        """The names any rank holds (the parameters with optimizer state, recorded in trainer_state.json)."""

    @abstractmethod
    def after_checkpoint_load(self, model: nn.Module, optimizer: torch.optim.Optimizer, keep: set[str]) -> set[str]:
        """Finish a load (e.g. copy a tied weight to its second stage); returns the parameter names
        whose optimizer state to keep."""

    @abstractmethod
    def full_model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's state (CPU tensors) on the metrics rank, {} elsewhere (all ranks call it)."""
