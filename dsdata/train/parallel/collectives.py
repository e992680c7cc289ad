"""Agreements every rank takes part in: whether any rank saw a flag, the union of every rank's names."""
from __future__ import annotations

import torch
import torch.distributed as dist

from dsdata.train.distributed import DistEnv


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True on every rank when `flag` is true on any (e.g. SIGTERM: all ranks must checkpoint together)."""
    if env.world_size == 1:
        return flag
    value = torch.tensor(1.0 if flag else 0.0, device=env.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def union_of_names(names: list[str], env: DistEnv) -> list[str]:
    """Sorted union of every rank's names (all ranks must call)."""
    if env.world_size == 1:
        return sorted(set(names))
    device = env.device
    data = torch.tensor(list("\n".join(sorted(set(names))).encode("utf-8")), dtype=torch.uint8, device=device)
    size = torch.tensor([data.numel()], device=device)
    sizes = [torch.zeros_like(size) for _ in range(env.world_size)]
    dist.all_gather(sizes, size)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:data.numel()] = data
    gathered = [torch.zeros_like(padded) for _ in range(env.world_size)]
    dist.all_gather(gathered, padded)
    union = set()
    for blob, n in zip(gathered, sizes):
        text = bytes(blob[:int(n.item())].cpu().tolist()).decode("utf-8")
        union.update(x for x in text.split("\n") if x)
    return sorted(union)
