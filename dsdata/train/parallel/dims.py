"""The parallel layout's sizes: data × pipeline × tensor = world size, and the global-batch split.
Rank order on the (dp, pp, tp) mesh: row-major, tp fastest (docs/parallel.md says why)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dsdata.train.config import ConfigError, ParallelConfig


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    pp: int
    tp: int
    micro_batch_size: int
    accumulation: int  # micro-batches per optimizer step and data-parallel rank (pipeline: n_microbatches)
    schedule: str

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(dp, pp, tp) index of a global rank."""
        return rank // (self.pp * self.tp), (rank // self.tp) % self.pp, rank % self.tp

    def rank_of(self, dp: int, pp: int, tp: int) -> int:
        return (dp * self.pp + pp) * self.tp + tp

    def rows_of(self, global_batch: torch.Tensor, dp_rank: int) -> list[torch.Tensor]:
        """The rows of data-parallel rank `dp_rank` (a contiguous slice) cut into micro-batches (views)."""
        per_rank = self.micro_batch_size * self.accumulation
        return list(global_batch[dp_rank * per_rank:(dp_rank + 1) * per_rank].split(self.micro_batch_size))

    def describe(self) -> str:
        """e.g. 'dp 2 × tp 1 × pp 2 (1f1b), 4 micro-batches of 2 per rank'."""
        schedule = f" ({self.schedule})" if self.pp > 1 else ""
        return (f"dp {self.dp} × tp {self.tp} × pp {self.pp}{schedule}, "
                f"{self.accumulation} micro-batch{'es' if self.accumulation != 1 else ''} of {self.micro_batch_size} per rank")


def resolve_dims(parallel: ParallelConfig, world_size: int, global_batch_size: int) -> ParallelDims:
    """Check the sizes against the world size and split the global batch (one clear error otherwise)."""
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if parallel.data_parallel_size:
        dp = parallel.data_parallel_size
    elif world_size % (tp * pp) == 0:
        dp = world_size // (tp * pp)
    else:
        dp = 0
    if dp * tp * pp != world_size:
        shown = dp if parallel.data_parallel_size else "world/(tp×pp)"
        raise ConfigError(
            f"parallel.data_parallel_size ({shown}) × tensor_parallel_size ({tp}) × pipeline_parallel_size ({pp}) "
            f"must equal the world size ({world_size} processes); launch torchrun with --nproc_per_node × --nnodes "
            f"= {max(dp, 1) * tp * pp} or change the sizes")
    schedule = parallel.pipeline_schedule  # gpipe or 1f1b: the config refuses anything else
    micro, accumulation = split_batch(global_batch_size, dp, pp, parallel.micro_batch_size,
                                      parallel.gradient_accumulation_steps, schedule)
    return ParallelDims(dp, pp, tp, micro, accumulation, schedule)


def split_batch(global_batch: int, dp: int, pp: int, micro_batch: int, accumulation: int,
                schedule: str) -> tuple[int, int]:
    """(micro_batch_size, micro-batches per step) with dp × micro × accumulation = global batch; unset
    values are derived (a pipeline's default: 2·pp micro-batches when the batch allows, else pp)."""
    if global_batch % dp:
        raise ConfigError(f"training.global_batch_size ({global_batch}) is not divisible by the "
                          f"data-parallel size ({dp})")
    per_rank = global_batch // dp
    if micro_batch and accumulation:
        if micro_batch * accumulation != per_rank:
            raise ConfigError(f"parallel.micro_batch_size ({micro_batch}) × parallel.gradient_accumulation_steps "
                              f"({accumulation}) must equal training.global_batch_size / data_parallel_size "
                              f"= {global_batch} / {dp} = {per_rank}")
    elif micro_batch:
        if per_rank % micro_batch:
            raise ConfigError(f"training.global_batch_size / data_parallel_size = {per_rank} is not divisible by "
                              f"parallel.micro_batch_size ({micro_batch})")
        accumulation = per_rank // micro_batch
    elif accumulation:
        if per_rank % accumulation:
            raise ConfigError(f"training.global_batch_size / data_parallel_size = {per_rank} is not divisible by "
                              f"parallel.gradient_accumulation_steps ({accumulation})")
        micro_batch = per_rank // accumulation
    elif pp > 1:
        accumulation = next((n for n in (2 * pp, pp) if per_rank % n == 0), 0)
        if not accumulation:
            raise ConfigError(f"training.global_batch_size / data_parallel_size = {per_rank} cannot be cut into "
                              f"{pp} pipeline micro-batches; set parallel.micro_batch_size")
        micro_batch = per_rank // accumulation
    else:
        micro_batch, accumulation = per_rank, 1
    if pp > 1 and schedule == "1f1b" and accumulation < pp:
        raise ConfigError(f"the 1f1b pipeline schedule needs at least pipeline_parallel_size ({pp}) micro-batches, "
                          f"got {accumulation}; lower parallel.micro_batch_size or use pipeline_schedule = 'gpipe'")
    return micro_batch, accumulation
