"""The parallel layout's sizes: data × pipeline × tensor = world size, and the global-batch split.

Rank order on the (dp, pp, tp) mesh is row-major with tp fastest, so the ranks of one tensor-parallel
group are neighbours (on a GPU node: the same NVLink island), then the pipeline stages, then the
data-parallel replicas (which only all-reduce gradients once per step, across nodes if need be).
"""
from __future__ import annotations

from dataclasses import dataclass

from dsdata.train.config import ConfigError, ParallelConfig
from dsdata.train.distributed import split_batch


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


def resolve_dims(parallel: ParallelConfig, world_size: int, global_batch_size: int) -> ParallelDims:
    """Check the sizes against the world size and split the global batch (one clear error otherwise)."""
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if tp < 1 or pp < 1 or parallel.data_parallel_size < 0:
        raise ConfigError("parallel.tensor_parallel_size and pipeline_parallel_size must be >= 1, "
                          "data_parallel_size >= 0 (0: world size / (tensor × pipeline))")
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
    schedule = parallel.pipeline_schedule
    if schedule not in ("gpipe", "1f1b", "interleaved_1f1b"):
        raise ConfigError(f"parallel.pipeline_schedule = {schedule!r}; choose gpipe or 1f1b")
    if schedule == "interleaved_1f1b" and pp > 1:
        raise ConfigError("parallel.pipeline_schedule = 'interleaved_1f1b' is not implemented; choose gpipe or 1f1b")
    micro, accumulation = split_batch(global_batch_size, dp, pp, parallel.micro_batch_size,
                                      parallel.gradient_accumulation_steps, schedule)
    return ParallelDims(dp, pp, tp, micro, accumulation, schedule)


