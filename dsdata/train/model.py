"""The decoder LM: pre-norm blocks of (RMSNorm → attention → residual, RMSNorm → SwiGLU/MoE → residual).

Plain single-device code, torchtitan style; the submodule names the parallel code relies on are
docs/train.md's.  ``layers`` is keyed by the global layer index: a pipeline stage deletes the layers
it does not own and sets ``tok_embeddings``/``norm``/``output`` to ``None``.  The RoPE tables (HF
Llama's rotate-half layout) are non-persistent buffers, never checkpointed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dsdata.core.params import Boolean, Choice, Integer, Number, Options, Param, Settings
from dsdata.train.attention import ATTENTION_KERNELS, DEFAULT_ATTENTION, build_attention_kernel
from dsdata.train.moe import MoEFeedForward


@dataclass
class ModelArgs(Settings):
    """Architecture of the decoder (the ``[model]`` table of a TOML config)."""

    dim: int = Param(256, "model width", Integer(min=1))
    n_layers: int = Param(4, "blocks", Integer(min=1))
    n_heads: int = Param(4, "attention heads", Integer(min=1))
    n_kv_heads: int | None = Param(None, "key/value heads: grouped-query attention when < n_heads", Integer(min=1))
    vocab_size: int = Param(32000, "vocabulary (the shards' tokenizer sets it)", Integer(min=0))
    ffn_hidden_dim: int | None = Param(None, "default: 8/3 · dim rounded up to multiple_of (SwiGLU)", Integer(min=0))
    multiple_of: int = Param(64, "the FFN width is rounded up to a multiple of this", Integer(min=1))
    norm_eps: float = Param(1e-5, "RMSNorm epsilon", Number(0, open_min=True))
    rope_theta: float = Param(10000.0, "RoPE base", Number(0, open_min=True))
    max_seq_len: int = Param(2048, "longest sequence (RoPE tables)", Integer(min=1))
    tie_embeddings: bool = Param(False, "the output layer shares the embedding's weights", Boolean())
    attention: str = Param(DEFAULT_ATTENTION, "the attention kernel, a row of attention.ATTENTION_KERNELS",
                           Choice(ATTENTION_KERNELS))
    attention_config: Settings | None = Param(None, "[model.attention_config]: the kernel's options",
                                              Options(ATTENTION_KERNELS, "attention"))
    moe_experts: int = Param(0, "mixture-of-experts feed-forward (0 experts: dense SwiGLU)", Integer(min=0))
    moe_top_k: int = Param(2, "experts per token", Integer(min=1))
    moe_capacity_factor: float = Param(1.25, "expert capacity over an even share", Number(0, open_min=True))
    moe_aux_loss_weight: float = Param(0.01, "weight of the load-balancing loss", Number(0))
    init_std: float = Param(0.02, "standard deviation of the initial weights", Number(0))

    def check(self, where: str = "model") -> None:
        if self.attention not in ATTENTION_KERNELS:  # built in Python, not parsed
            raise ValueError(f"{where}.attention must be one of {', '.join(ATTENTION_KERNELS)}, got {self.attention!r}")
        if not isinstance(self.attention_config, ATTENTION_KERNELS[self.attention].Config):
            raise ValueError(f"{where}.attention_config is a {type(self.attention_config).__name__}, not the options "
                             f"of attention {self.attention!r} ({ATTENTION_KERNELS[self.attention].Config.__name__})")
        self.attention_config.check(f"{where}.attention_config")
        if self.dim % self.n_heads:
            raise ValueError(f"{where}.dim ({self.dim}) must be a multiple of {where}.n_heads ({self.n_heads})")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"{where}.n_heads ({self.n_heads}) must be a multiple of {where}.n_kv_heads ({self.kv_heads})")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"{where}.dim / {where}.n_heads (the head size) must be even for RoPE")
        if self.moe_experts and self.moe_top_k > self.moe_experts:
            raise ValueError(f"{where}.moe_top_k must not exceed {where}.moe_experts")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        if self.ffn_hidden_dim:
            return self.ffn_hidden_dim
        hidden = int(8 * self.dim / 3)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)


class RMSNorm(nn.Module):
    """x / rms(x) · weight, computed in fp32 like Hugging Face's LlamaRMSNorm."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (max_seq_len, head_dim) in the rotate-half layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x of shape (B, T, H, D) by position; cos/sin are (T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    cos = cos[None, :, None, :].to(x.dtype)
    sin = sin[None, :, None, :].to(x.dtype)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Multi-head (grouped-query) self-attention; the attention kernel is pluggable."""

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.kernel = build_attention_kernel(args, layer_id)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        # -1: the head count comes from the (possibly tensor-parallel sharded) projection.
        q = self.wq(x).view(bsz, seqlen, -1, self.head_dim)
        k = self.wk(x).view(bsz, seqlen, -1, self.head_dim)
        v = self.wv(x).view(bsz, seqlen, -1, self.head_dim)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        n_rep = q.shape[2] // k.shape[2]
        if n_rep > 1:
            k = k.repeat_interleave(n_rep, dim=2)
            v = v.repeat_interleave(n_rep, dim=2)
        out = self.kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, H, T, D)
        out = out.transpose(1, 2).reshape(bsz, seqlen, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) · w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args, layer_id)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        if args.moe_experts:
            self.feed_forward = MoEFeedForward(args.dim, args.hidden_dim, args.moe_experts,
                                               args.moe_top_k, args.moe_capacity_factor)
        else:
            self.feed_forward = FeedForward(args.dim, args.hidden_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Decoder-only LM: tokens (B, T) → logits (B, T, vocab)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        args.check()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args, i) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) weights; residual output projections scaled by depth (GPT-2 style)."""
        std = self.args.init_std
        residual_std = std / math.sqrt(2 * self.args.n_layers)
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight, 0.0, std, generator=generator)
        for block in self.layers.values():
            for name, param in block.named_parameters():
                if name.endswith("norm.weight"):
                    nn.init.ones_(param)
                elif name.endswith(("wo.weight", "w2.weight", "experts.w2")):
                    nn.init.normal_(param, 0.0, residual_std, generator=generator)
                elif "kernel." in name and name.endswith("bias"):
                    nn.init.zeros_(param)
                else:
                    nn.init.normal_(param, 0.0, std, generator=generator)
            block.attention.kernel.on_weights_initialised()
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.output is not None and not self.args.tie_embeddings:
            nn.init.normal_(self.output.weight, 0.0, std, generator=generator)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # A pipeline stage without the embedding receives hidden states instead of token ids.
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        seqlen = h.shape[1]
        if seqlen > self.rope_cos.shape[0]:
            raise ValueError(f"sequence length {seqlen} exceeds model.max_seq_len {self.rope_cos.shape[0]}")
        cos, sin = self.rope_cos[:seqlen], self.rope_sin[:seqlen]
        for block in self.layers.values():
            h = block(h, cos, sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

    def aux_loss(self) -> torch.Tensor | None:
        """Sum of the MoE load-balancing losses of the last forward (None for a dense FFN)."""
        losses = [m.aux_loss for m in self.modules() if isinstance(m, MoEFeedForward) and m.aux_loss is not None]
        return torch.stack(losses).sum() if losses else None


def set_training_step(model: Transformer, step: int) -> None:
    """Tell each layer's attention kernel which optimizer step starts."""
    for block in model.layers.values():
        block.attention.kernel.on_training_step(step)


def compile_blocks(model: nn.Module) -> None:
    """Run each transformer block's forward through torch.compile (training.compile).  The method,
    not the module: a layout's hooks keep running eagerly and parameter names stay unchanged."""
    for block in model.layers.values():
        block.forward = _plain_input(torch.compile(block.forward))


def _plain_input(compiled):
    """Hand the compiled block a plain tensor: under tensor parallelism the embedding's output is an
    AsyncCollectiveTensor, whose gradient through a compiled graph DTensor refused (torch 2.13)."""
    def forward(x, *args, **kwargs):
        if type(x) is not torch.Tensor and hasattr(x, "trigger_wait"):
            x = x.clone()
        return compiled(x, *args, **kwargs)

    return forward


def lm_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, the log-softmax in fp32 whatever the logits' dtype
    (compiled, the cast fuses into the softmax and the fp32 logits are never stored)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
