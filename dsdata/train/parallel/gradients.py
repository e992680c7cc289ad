"""Gradient reductions of the hybrid layout: after them every gradient equals one process's (DTensor
gradients through their local shard, on the layout's process groups)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor, or the tensor itself."""
    return t.to_local() if isinstance(t, _dtensor_type()) else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole value of a DTensor (a collective), or the tensor itself."""
    return t.full_tensor() if isinstance(t, _dtensor_type()) else t


def _dtensor_type():
    from torch.distributed.tensor import DTensor

    return DTensor


@torch.no_grad()
def sum_partial_gradients(params: list[nn.Parameter], group) -> None:
    """Replicated parameters used on local heads only (the sparse-attention gate) hold partial
    gradients on each tensor-parallel rank: sum them."""
    for p in params:
        if p.grad is not None:
            dist.all_reduce(local(p.grad), group=group)


@torch.no_grad()
def average_over_data_parallel(params, group, size: int) -> None:
    """Mean of the gradients over the data-parallel replicas: one flat all-reduce per dtype (as DDP's
    buckets do)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            g = local(p.grad)
            by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        offset = 0
        for g in same:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


@torch.no_grad()
def global_grad_norm(grads: list[torch.Tensor], skip: torch.Tensor | None, tp_group, pp_group,
                     device: torch.device) -> torch.Tensor:
    """L2 norm over tensor-parallel shards and pipeline stages (a group is None when its size is 1);
    `skip` (a tied weight's second gradient copy) is left out so that every parameter counts once."""
    sharded = torch.zeros((), device=device, dtype=torch.float64)
    replicated = torch.zeros((), device=device, dtype=torch.float64)
    for g in grads:
        if g is skip:
            continue
        square = local(g).detach().double().pow(2).sum()
        if isinstance(g, _dtensor_type()) and any(p.is_shard() for p in g.placements):
            sharded += square
        else:
            replicated += square
    if tp_group is not None:
        dist.all_reduce(sharded, group=tp_group)
    total = sharded + replicated
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)
    return total.sqrt().float()
