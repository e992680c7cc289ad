"""Pipeline parallelism: split the plain model into stages by layers, run GPipe or 1F1B.

The stage split is contiguous and balanced by parameter count: the first stage also carries the
embedding, the last the final norm and output projection, and the split minimises the largest
stage.  A stage is the plain `Transformer` with the layers it does not own deleted (the layer dict
keeps global indices, so parameter names, checkpoints and exports are the same as one process).

With tied embeddings the first stage owns the embedding and the last stage a copy as its output
projection; their gradients are summed across the two stages after backward (Megatron's
"embedding group"), so both copies take the same optimizer step and stay equal.

This module also holds a pure-Python model of the two schedules (`schedule_actions`,
`check_schedule`, `simulate`) used by the tests and by the bubble-fraction benchmark.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from dsdata.train.config import ConfigError


# ------------------------------------------------------------------ stage split

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


# ------------------------------------------------------------------ pure-Python schedule model

@dataclass(frozen=True)
class Action:
    stage: int
    kind: str  # "F" or "B"
    micro: int


def schedule_actions(kind: str, stages: int, micro: int) -> list[list[Action]]:
    """Per stage, the order in which it runs forward/backward of each micro-batch (as torch's schedules do)."""
    order: list[list[Action]] = []
    for s in range(stages):
        if kind == "gpipe":
            seq = [Action(s, "F", m) for m in range(micro)] + [Action(s, "B", m) for m in range(micro)]
        elif kind == "1f1b":
            warmup = min(micro, stages - s)
            seq = [Action(s, "F", m) for m in range(warmup)]
            next_f, next_b = warmup, 0
            while next_b < micro:
                seq.append(Action(s, "B", next_b))
                next_b += 1
                if next_f < micro:
                    seq.append(Action(s, "F", next_f))
                    next_f += 1
        else:
            raise ValueError(f"unknown schedule {kind!r}")
        order.append(seq)
    return order


def check_schedule(order: list[list[Action]], micro: int) -> None:
    """Raise AssertionError unless every stage runs F and B of every micro-batch exactly once, F before B,
    and the cross-stage dependencies can be met (F(s,m) after F(s-1,m); B(s,m) after B(s+1,m))."""
    stages = len(order)
    for s, seq in enumerate(order):
        for kind in "FB":
            got = sorted(a.micro for a in seq if a.kind == kind)
            assert got == list(range(micro)), f"stage {s}: {kind} of micro-batches {got}, expected each of 0..{micro - 1} once"
        position = {(a.kind, a.micro): i for i, a in enumerate(seq)}
        for m in range(micro):
            assert position[("F", m)] < position[("B", m)], f"stage {s}: backward of micro-batch {m} before its forward"
    simulate(order)  # raises on a dependency deadlock
    assert stages >= 1


def simulate(order: list[list[Action]], forward_cost: float = 1.0, backward_cost: float = 2.0) -> dict:
    """Run the per-stage orders on an idealised clock; returns makespan, busy time and bubble fraction."""
    stages = len(order)
    done: dict[tuple[str, int, int], float] = {}
    clock = [0.0] * stages
    cursor = [0] * stages
    remaining = sum(len(seq) for seq in order)
    while remaining:
        progressed = False
        for s in range(stages):
            if cursor[s] == len(order[s]):
                continue
            a = order[s][cursor[s]]
            if a.kind == "F":
                dep = ("F", s - 1, a.micro) if s > 0 else None
            else:
                dep = ("B", s + 1, a.micro) if s < stages - 1 else ("F", s, a.micro)
            if dep is not None and dep not in done:
                continue
            start = max(clock[s], done.get(dep, 0.0) if dep else 0.0)
            clock[s] = start + (forward_cost if a.kind == "F" else backward_cost)
            done[(a.kind, s, a.micro)] = clock[s]
            cursor[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise AssertionError(f"schedule deadlocks: stages wait on each other at {cursor}")
    makespan = max(clock)
    per_stage_busy = len(order[0]) // 2 * (forward_cost + backward_cost)
    return {"makespan": makespan, "busy_per_stage": per_stage_busy, "bubble_fraction": 1.0 - per_stage_busy / makespan}


def theoretical_bubble(stages: int, micro: int) -> float:
    """(p − 1) / (m + p − 1): the idle share of each stage in GPipe and 1F1B."""
    return (stages - 1) / (micro + stages - 1)
