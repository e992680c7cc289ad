"""Tensor parallelism (Megatron-style, with DTensor `parallelize_module`) applied to the plain model;
what is split how is docs/parallel.md's ("What each dimension does").
"""
from __future__ import annotations

from torch import nn

from dsdata.train.config import ConfigError


def check_tensor_parallel(args, tp: int) -> None:
    """Refuse model shapes that cannot be split over tp ranks (one clear line)."""
    if tp == 1:
        return
    problems = []
    if args.n_heads % tp:
        problems.append(f"model.n_heads ({args.n_heads})")
    if args.kv_heads % tp:
        problems.append(f"model.n_kv_heads ({args.kv_heads})")
    if args.hidden_dim % tp and not args.moe_experts:
        problems.append(f"the feed-forward width ({args.hidden_dim})")
    if problems:
        raise ConfigError(f"parallel.tensor_parallel_size = {tp} must divide {', '.join(problems)}")


def apply_tensor_parallel(model: nn.Module, tp_mesh, vocab_parallel_loss: bool = True) -> list[nn.Parameter]:
    """Shard the (possibly pipeline-pruned) model in place; returns replicated params with partial grads.
    vocab_parallel_loss: shard embedding and output over the vocabulary (needs vocab_size % tp == 0)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from dsdata.train.model import FeedForward

    tied = (model.tok_embeddings is not None and model.output is not None
            and model.output.weight is model.tok_embeddings.weight)
    # Without vocab_parallel_loss the embedding and output stay replicated: every tp rank computes the
    # full logits from its replicated input.
    plan = {}
    if model.tok_embeddings is not None and vocab_parallel_loss:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if model.output is not None and vocab_parallel_loss:
        plan["output"] = ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False)
    if plan:
        parallelize_module(model, tp_mesh, plan)
    if tied and vocab_parallel_loss:
        # Both styles shard the (vocab, dim) weight on dim 0: re-point output at the embedding's DTensor
        # so the two uses stay one parameter (parallelize_module made two).
        model.output.weight = model.tok_embeddings.weight

    partial = []
    for block in model.layers.values():
        block_plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
        }
        if isinstance(block.feed_forward, FeedForward):  # MoE experts stay replicated
            block_plan.update({"feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                               "feed_forward.w2": RowwiseParallel()})
        parallelize_module(block, tp_mesh, block_plan)
        partial.extend(p for p in block.attention.kernel.parameters() if p.requires_grad)
    return partial
