"""Block-sparse attention through FlexAttention (``torch.nn.attention.flex_attention``).

The sparse kernels of attention.py pick the keys; the attention runs as one FlexAttention call over
a ``BlockMask`` of the key blocks each query block may see, a ``mask_mod`` choosing the exact keys.
torch has no CPU backward: there `emulate_flex` evaluates the same masks densely (docs/train.md).
"""
from __future__ import annotations

import functools
import inspect

import torch

FLEX_BLOCK = 128  # query and key block size of the block masks (FlexAttention's own default)


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_with_lse(q, k, v, block_mask, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp of each query's logits), compiled on CUDA."""
    from torch.nn.attention import flex_attention as flex_module

    if q.device.type != "cuda" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return emulate_flex(q, k, v, block_mask, scale)
    fn = _compiled_flex() if q.device.type == "cuda" else flex_module.flex_attention
    if hasattr(flex_module, "AuxRequest"):  # torch >= 2.10: return_lse is deprecated
        out, aux = fn(q, k, v, block_mask=block_mask, scale=scale,
                      return_aux=flex_module.AuxRequest(lse=True))
        return out, aux.lse
    return fn(q, k, v, block_mask=block_mask, scale=scale, return_lse=True)


def block_mask_from_pairs(visible: torch.Tensor, mask_mod, seqlen: int, block_sizes: tuple[int, int]):
    """A BlockMask from `visible` (B, H, q_blocks, kv_blocks) bool: which key blocks each query block
    may touch (all treated as partial: `mask_mod` decides inside them)."""
    from torch.nn.attention.flex_attention import BlockMask

    counts = visible.sum(-1, dtype=torch.int32)
    # Listed blocks first, in ascending block order (a stable sort of "not visible").
    indices = torch.argsort((~visible).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    kwargs = {"BLOCK_SIZE": block_sizes, "mask_mod": mask_mod}
    if "seq_lengths" in inspect.signature(BlockMask.from_kv_blocks).parameters:
        kwargs["seq_lengths"] = (seqlen, seqlen)
    return BlockMask.from_kv_blocks(counts.contiguous(), indices.contiguous(), **kwargs)


def band_blocks(n_q: int, n_kv: int, block_sizes: tuple[int, int], reach: int, device) -> torch.Tensor:
    """(n_q, n_kv) bool: key block j is visible from query block i when one of its keys lies at most
    `reach` − 1 places before (or at) one of its queries: a causal band of width `reach`."""
    q_block, kv_block = block_sizes
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_kv, device=device)[None, :]
    first_key, last_key = j * kv_block, (j + 1) * kv_block - 1
    first_query, last_query = i * q_block, (i + 1) * q_block - 1
    return (first_key <= last_query) & (last_key >= first_query - (reach - 1))


def emulate_flex(q, k, v, block_mask, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """What FlexAttention computes, in plain differentiable torch over the dense (T, T) grid: keys
    outside the listed blocks or refused by mask_mod are masked; lse is the natural log-sum-exp."""
    bsz, heads, q_len, dim = q.shape
    kv_len = k.shape[2]
    acc = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale
    b = torch.arange(bsz, device=q.device)[:, None, None, None]
    h = torch.arange(heads, device=q.device)[None, :, None, None]
    qi = torch.arange(q_len, device=q.device)[None, None, :, None]
    ki = torch.arange(kv_len, device=q.device)[None, None, None, :]
    listed = block_mask.to_dense().bool()  # (B or 1, H or 1, q_blocks, kv_blocks)
    q_block, kv_block = block_mask.BLOCK_SIZE
    listed = listed.repeat_interleave(q_block, 2)[:, :, :q_len].repeat_interleave(kv_block, 3)[..., :kv_len]
    allowed = listed & block_mask.mask_mod(b, h, qi, ki)
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return torch.matmul(probs, v.to(acc)).to(q.dtype), lse
