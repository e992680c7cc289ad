"""Pipeline parallelism: split the plain model into stages by layers, run GPipe or 1F1B (docs/parallel.md)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dsdata.train.config import ConfigError


def layer_parameter_counts(model: nn.Module) -> tuple[int, list[int], int]:
    """(embedding params, params per layer, norm + output params), tied output counted on both ends."""
    embed = model.tok_embeddings.weight.numel()
    layers = [sum(p.numel() for p in block.parameters()) for block in model.layers.values()]
    tail = model.norm.weight.numel() + model.output.weight.numel()
    return embed, layers, tail


def balanced_split(embed: int, layers: list[int], tail: int, stages: int) -> list[list[int]]:
    """Contiguous layer ranges per stage minimising the largest stage's parameter count (every stage ≥ 1 layer)."""
    n = len(layers)
    if stages > n:
        raise ConfigError(f"parallel.pipeline_parallel_size ({stages}) exceeds model.n_layers ({n}): "
                          "every stage needs at least one layer")
    prefix = [0]
    for count in layers:
        prefix.append(prefix[-1] + count)

    def cost(stage: int, lo: int, hi: int) -> int:
        extra = (embed if stage == 0 else 0) + (tail if stage == stages - 1 else 0)
        return prefix[hi] - prefix[lo] + extra

    inf = float("inf")
    # best[s][i]: smallest max-cost of the first i layers on stages 0..s-1; choice keeps the split points.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    choice = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], cost(s - 1, j, i))
                if value < best[s][i]:
                    best[s][i], choice[s][i] = value, j
    bounds, i = [], n
    for s in range(stages, 0, -1):
        j = choice[s][i]
        bounds.append(list(range(j, i)))
        i = j
    return bounds[::-1]


def prune_to_stage(model: nn.Module, owned_layers: list[int], first: bool, last: bool) -> nn.Module:
    """Delete what this stage does not own (in place) and return the stage module."""
    for name in list(model.layers.keys()):
        if int(name) not in owned_layers:
            del model.layers[name]
    if not first:
        model.tok_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    return model


def build_schedule(stage, kind: str, n_microbatches: int, loss_fn):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[kind]
    # scale_grads: gradients are divided by n_microbatches, i.e. the mean over micro-batches as in one process.
    return cls(stage, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)


def gather_stages(mine: dict[str, torch.Tensor], model_args, dims, rank: int,
                  device: torch.device) -> dict[str, torch.Tensor]:
    """The whole model's state on rank 0 from the stages' states (`mine`: this rank's, CPU tensors);
    the (dp 0, tp 0) rank of each later stage sends its tensors, other ranks return {}."""
    from dsdata.train.model import Transformer

    dp_rank, _, tp_rank = dims.coordinates(rank)
    if (dp_rank, tp_rank) != (0, 0):
        return {}
    with torch.device("meta"):
        reference = Transformer(model_args)
    splits = balanced_split(*layer_parameter_counts(reference), dims.pp)
    out = dict(mine) if rank == 0 else {}
    for stage in range(1, dims.pp):
        with torch.device("meta"):
            shapes = prune_to_stage(Transformer(model_args), splits[stage], False, stage == dims.pp - 1).state_dict()
        source = dims.rank_of(0, stage, 0)
        for key in sorted(shapes):
            if rank == source:  # nccl sends from the GPU, gloo from the CPU
                dist.send(mine[key].to(device).contiguous(), dst=0)
            elif rank == 0:
                buffer = torch.empty(shapes[key].shape, dtype=shapes[key].dtype, device=device)
                dist.recv(buffer, src=source)
                out.setdefault(key, buffer.cpu())
    return out
