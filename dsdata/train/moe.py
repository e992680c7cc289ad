"""Mixture-of-experts SwiGLU feed-forward: top-k routing (k = 2), expert capacity, load-balancing loss."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class GroupedExperts(nn.Module):
    """E SwiGLU experts with stacked weights: w1, w3 (E, hidden, dim) and w2 (E, dim, hidden)."""

    def __init__(self, dim: int, hidden_dim: int, n_experts: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, hidden_dim))
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden_dim, dim))
        for w in (self.w1, self.w2, self.w3):
            nn.init.normal_(w, 0.0, 0.02)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(x, self.w1[e])) * F.linear(x, self.w3[e]), self.w2[e])


class MoEFeedForward(nn.Module):
    """Routes each token to its top-k experts (GShard-style), at most ``ceil(capacity_factor · tokens ·
    k / E)`` assignments per expert, the rest dropped; ``aux_loss`` after a forward is the load-balancing
    loss (1.0 when uniform).  docs/train.md ("MoE") has the rules."""

    def __init__(self, dim: int, hidden_dim: int, n_experts: int, top_k: int = 2, capacity_factor: float = 1.25):
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = GroupedExperts(dim, hidden_dim, n_experts)
        self.aux_loss: torch.Tensor | None = None

    def route(self, x_flat: torch.Tensor):
        """(expert ids (N, k), gate weights (N, k), kept mask (N, k), aux loss)."""
        n_tokens = x_flat.shape[0]
        probs = torch.softmax(self.router(x_flat).float(), dim=-1)
        top_p, top_e = probs.topk(self.top_k, dim=-1)
        gates = top_p / top_p.sum(-1, keepdim=True)
        capacity = math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_experts)
        # Slot of each assignment in its expert's queue: choice rank first, then token order.
        onehot = F.one_hot(top_e.t().reshape(-1), self.n_experts)  # (k·N, E)
        slot = ((onehot.cumsum(0) - 1) * onehot).sum(-1).view(self.top_k, n_tokens).t()
        kept = slot < capacity
        share = onehot.float().mean(0)
        aux = self.n_experts * (share * probs.mean(0)).sum()
        return top_e, gates, kept, aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x_flat = x.reshape(-1, shape[-1])
        top_e, gates, kept, aux = self.route(x_flat)
        self.aux_loss = aux
        out = torch.zeros_like(x_flat)
        for e in range(self.n_experts):
            token, choice = torch.nonzero((top_e == e) & kept, as_tuple=True)
            if token.numel() == 0:
                continue
            y = self.experts.expert(e, x_flat[token])
            out = out.index_add(0, token, (y * gates[token, choice, None].to(y.dtype)).to(out.dtype))
        return out.view(shape)
