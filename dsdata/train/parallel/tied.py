"""A tied embedding split over pipeline stages (Megatron's "embedding group"; docs/parallel.md).
On a checkpoint load the last stage's copy takes the first stage's weight and optimizer state (a
checkpoint names the tied weight once, as tok_embeddings.weight).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from dsdata.train.parallel.dims import ParallelDims
from dsdata.train.parallel.gradients import local


class TiedEmbedding:
    def __init__(self, dims: ParallelDims, rank: int, pp_group):
        self.dims = dims
        dp_rank, pp_rank, tp_rank = dims.coordinates(rank)
        self.is_first, self.is_last = pp_rank == 0, pp_rank == dims.pp - 1
        self.source = dims.rank_of(dp_rank, 0, tp_rank)  # this rank's first-stage counterpart
        self.group = pp_group if dims.pp == 2 else None
        if dims.pp > 2:
            for dp in range(dims.dp):  # every rank creates every group, in the same order
                for tp in range(dims.tp):
                    group = dist.new_group([dims.rank_of(dp, 0, tp), dims.rank_of(dp, dims.pp - 1, tp)])
                    if (dp, tp) == (dp_rank, tp_rank) and (self.is_first or self.is_last):
                        self.group = group
        self.param: nn.Parameter | None = None  # this stage's copy (None on middle stages)

    def bind(self, stage: nn.Module) -> None:
        """Find this stage's copy (after tensor parallelism, which replaces the parameters)."""
        if self.is_first:
            self.param = stage.tok_embeddings.weight
        elif self.is_last:
            self.param = stage.output.weight

    @torch.no_grad()
    def sum_gradients(self) -> None:
        tied = self.param
        if tied is None or tied.grad is None:
            return
        if isinstance(tied.grad, DTensor) and tied.grad.placements != tied.placements:
            # The vocab-parallel embedding's backward may hand back a replicated gradient; the output
            # side's is sharded like the weight: both copies must all-reduce the same shard.
            tied.grad = tied.grad.redistribute(tied.device_mesh, tied.placements)
        dist.all_reduce(local(tied.grad), group=self.group)

    def duplicate_gradient(self) -> torch.Tensor | None:
        """The second copy's gradient (last stage), which a global norm must not count again."""
        return self.param.grad if (self.param is not None and not self.is_first) else None

    @torch.no_grad()
    def load_from_first_stage(self, optimizer: torch.optim.Optimizer, keep: set[str]) -> set[str]:
        """Give the last stage's copy the first stage's weight and optimizer state; returns `keep` with the
        copy's name (output.weight) wherever the tied weight's state is kept."""
        if self.param is None:
            return keep
        if "tok_embeddings.weight" in keep:
            keep = keep | {"output.weight"}
        state = optimizer.state.get(self.param, {})
        tensors = [local(self.param.data)] + [local(state[k]) for k in sorted(state) if torch.is_tensor(state[k])]
        for tensor in tensors:
            dist.broadcast(tensor, src=self.source, group=self.group)
        return keep
