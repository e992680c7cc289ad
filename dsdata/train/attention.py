"""Attention kernels: causal attention over rotated q, k, v of shape (batch, heads, seq, head_dim).

``DenseAttention`` (SDPA), ``DynamicSparseAttention`` and ``LSHAttention``; docs/train.md
("Attention") defines them and the sparse kernels' implementations (reference, fused, flex, auto).
Kernels take the head count from the tensors, so tensor parallelism may split heads.  A kernel is
one ``AttentionKernel`` subclass and one ``ATTENTION_KERNELS`` row.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dsdata.core.params import Boolean, Choice, Integer, NoOptions, Param, Settings
from dsdata.train.block_sparse import FLEX_BLOCK, band_blocks, block_mask_from_pairs, flex_available, flex_with_lse
from dsdata.train.registry import Registry

KERNEL_CHOICES = ("auto", "fused", "flex", "reference")


class AttentionKernel(nn.Module):
    """Base of the kernels: the `protocols.AttentionKernel` members, the per-step ones as no-ops.
    `Config` is the `[model.attention_config]` table; `from_config` builds one layer's kernel."""

    Config: type[Settings] = NoOptions
    llama_compatible = False  # the exported weights are a Hugging Face LlamaForCausalLM's

    @classmethod
    def from_config(cls, options, head_dim: int, layer_id: int) -> "AttentionKernel":
        return cls()

    def on_training_step(self, step: int) -> None:
        """Called before optimizer step `step` (0-based) starts."""

    def on_weights_initialised(self) -> None:
        """Called after the model's weights were (re)initialised."""


def _implementation(kernel: str, q: torch.Tensor, cuda_default: str) -> str:
    """The implementation a call runs: ``kernel``, ``auto`` as ``cuda_default`` on CUDA, else reference."""
    if kernel != "auto":
        return kernel
    if q.device.type != "cuda":
        return "reference"
    return "flex" if cuda_default == "flex" and not flex_available() else cuda_default


@functools.cache
def _fused(method):
    """``method`` (a reference forward, called with the module) compiled whole by Inductor."""
    return torch.compile(method, dynamic=False)


class _SparseKernel(AttentionKernel):
    """A sparse kernel: ``_forward_reference`` is its definition, ``kernel`` the implementation run."""

    cuda_default = "fused"

    def __init__(self, kernel: str):
        super().__init__()
        if kernel not in KERNEL_CHOICES:
            raise ValueError(f"sparse attention kernel = {kernel!r}; choose one of {KERNEL_CHOICES}")
        self.kernel = kernel
        self.flex_blocks = (FLEX_BLOCK, FLEX_BLOCK)  # (query, key) block sizes

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        implementation = _implementation(self.kernel, q, self.cuda_default)
        if implementation == "flex":
            return self._forward_flex(q, k, v)
        # Under an enclosing torch.compile the reference is simply traced into that graph.
        if implementation == "fused" and not torch.compiler.is_compiling():
            return _fused(type(self)._forward_reference)(self, q, k, v)
        return self._forward_reference(q, k, v)


class DenseAttention(AttentionKernel):
    llama_compatible = True

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _accum_dtype(t: torch.Tensor) -> torch.dtype:
    """fp32 for bf16/fp16/fp32 inputs, fp64 for fp64 (softmax and sums never run in low precision)."""
    return torch.promote_types(t.dtype, torch.float32)


def _local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The full value of a parameter that a parallel wrapper may have turned into a DTensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _local_windows(x: torch.Tensor, lag: int, n_blocks: int) -> torch.Tensor:
    """(B, H, nb, (lag + 1)·bs, D): for each block b of x (B, H, nb·bs, D), blocks b − lag .. b in order
    (zeros before the start).  Contiguous copies, not `unfold` views: matmuls over overlapping views
    are slow on CPU, and Inductor (torch 2.13, CPU) miscompiles `unfold`'s backward."""
    bsz, heads, _, dim = x.shape
    blocks = F.pad(x, (0, 0, lag * (x.shape[2] // n_blocks), 0)).view(bsz, heads, n_blocks + lag, -1, dim)
    return torch.cat([blocks[:, :, j:j + n_blocks] for j in range(lag + 1)], dim=3)


@dataclass
class DynamicSparseConfig(Settings):
    legacy_prefix = "sparse_"
    top_k: int = Param(16, "far-past keys each query attends to, chosen by the gate", Integer(min=1))
    window: int = Param(64, "local window; a multiple of block", Integer(min=1))
    block: int = Param(64, "query block size of the blocked kernel", Integer(min=1))
    gate_hidden: int = Param(32, "hidden size of the gate that scores keys", Integer(min=1))
    refresh_steps: int = Param(4, "the gate that selects keys is re-snapshotted every N steps", Integer(min=1))
    summary: bool = Param(True, "attend to the mean of the unselected far past", Boolean())
    kernel: str = Param("auto", "implementation", Choice(KERNEL_CHOICES))

    def check(self, where: str) -> None:
        if self.window % self.block:
            raise ValueError(f"{where}.window ({self.window}) must be a positive multiple of {where}.block ({self.block})")


class DynamicSparseAttention(_SparseKernel):
    """Gated top-k + local window + mean summary attention (docs/train.md).  Keys are selected by a
    snapshot of the gate refreshed every ``refresh_steps``: a persistent buffer, so resume stays exact."""

    def __init__(self, head_dim: int, top_k: int = 16, window: int = 64, block: int = 64,
                 gate_hidden: int = 32, refresh_steps: int = 4, summary: bool = True, kernel: str = "auto"):
        super().__init__(kernel)
        if window <= 0 or window % block:
            raise ValueError(f"sparse window ({window}) must be a positive multiple of the block ({block})")
        self.top_k, self.window, self.block = top_k, window, block
        self.refresh_steps = max(1, refresh_steps)
        self.summary = summary
        self.gate_in = nn.Linear(head_dim, gate_hidden)
        self.gate_out = nn.Linear(gate_hidden, 1)
        for name, param in self._gate_params():
            self.register_buffer(f"snapshot_{name}", param.detach().clone())

    def _gate_params(self):
        return [("in_weight", self.gate_in.weight), ("in_bias", self.gate_in.bias),
                ("out_weight", self.gate_out.weight), ("out_bias", self.gate_out.bias)]

    @torch.no_grad()
    def refresh_selection(self) -> None:
        """Copy the live gate into the snapshot that selects keys."""
        for name, param in self._gate_params():
            getattr(self, f"snapshot_{name}").copy_(_local_tensor(param.detach()))

    Config = DynamicSparseConfig

    @classmethod
    def from_config(cls, options: DynamicSparseConfig, head_dim: int, layer_id: int) -> "DynamicSparseAttention":
        return cls(head_dim, options.top_k, options.window, options.block, options.gate_hidden, options.refresh_steps,
                   options.summary, options.kernel)

    def on_training_step(self, step: int) -> None:
        if step % self.refresh_steps == 0:
            self.refresh_selection()

    def on_weights_initialised(self) -> None:
        self.refresh_selection()

    def gate_scores(self, v: torch.Tensor, snapshot: bool) -> torch.Tensor:
        """Gate score per key position, (B, H, T)."""
        if snapshot:
            w1, b1 = self.snapshot_in_weight, self.snapshot_in_bias
            w2, b2 = self.snapshot_out_weight, self.snapshot_out_bias
        else:
            w1, b1, w2, b2 = self.gate_in.weight, self.gate_in.bias, self.gate_out.weight, self.gate_out.bias
        hidden = F.gelu(F.linear(v, w1.to(v.dtype), b1.to(v.dtype)))
        return F.linear(hidden, w2.to(v.dtype), b2.to(v.dtype)).squeeze(-1)

    def _selection(self, v: torch.Tensor, seqlen: int, n_blocks: int):
        """Gate scores (the snapshot's, padding −inf; the live gate's) and each query's selected
        candidates: (select_score, live_score, cand_idx, selected, far_last)."""
        with torch.no_grad():
            select_score = self.gate_scores(v, snapshot=True).to(_accum_dtype(v))
            select_score[..., seqlen:] = float("-inf")  # padding is never selected
        # The gate reads detached values: it learns which keys to pick without altering the
        # gradients of q, k, v (which then equal those of dense attention over the same keys).
        live_score = self.gate_scores(v.detach(), snapshot=False)
        cand_idx, cand_ok = self._candidates(select_score, n_blocks)  # (B, H, nb, C), sorted by score
        bs, window = self.block, self.window
        qpos = torch.arange(n_blocks * bs, device=v.device).view(n_blocks, bs)
        far_last = qpos - window  # key j is in the far past of query i iff j <= i - window
        valid = cand_ok[:, :, :, None, :] & (cand_idx[:, :, :, None, :] <= far_last[None, None, :, :, None])
        # Candidates are sorted by score, so the first top_k valid ones are the query's exact top-k.
        selected = valid & (valid.cumsum(-1) <= self.top_k)  # (B, H, nb, bs, C)
        return select_score, live_score, cand_idx, selected, far_last

    def _forward_flex(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The reference's function as one block-sparse FlexAttention call; the summary and the gate's
        gradient (`_gate_gradient_term`) are folded in through its log-sum-exp (docs/train.md, `flex`)."""
        bsz, heads, seqlen, dim = q.shape
        bs, window = self.block, self.window
        n_blocks = -(-seqlen // bs)
        padded = n_blocks * bs
        pad = (0, 0, 0, padded - seqlen)
        qp, kp, vp = (F.pad(t, pad) for t in (q, k, v)) if padded != seqlen else (q, k, v)
        select_score, live_score, cand_idx, selected, far_last = self._selection(vp, seqlen, n_blocks)
        n_cand = cand_idx.shape[-1]
        acc = _accum_dtype(v)
        q_block, kv_block = self.flex_blocks
        flex_len = seqlen + (-seqlen % math.lcm(q_block, kv_block))
        tail = (0, flex_len - seqlen)  # FlexAttention's padding: never selected, causally unseen
        with torch.no_grad():
            cand_score = select_score.gather(2, cand_idx.reshape(bsz, heads, -1)).view(bsz, heads, n_blocks, 1, n_cand)
            threshold = torch.where(selected, cand_score, torch.full_like(cand_score, float("inf"))).amin(-1)
            threshold = F.pad(threshold.reshape(bsz, heads, padded)[..., :seqlen], tail, value=float("inf"))
            score_f = F.pad(select_score[..., :seqlen], tail, value=float("-inf"))
            visible = self._visible_blocks(cand_idx, selected, n_blocks, flex_len)

        def mask_mod(b, h, q_idx, kv_idx):
            far = score_f[b, h, kv_idx] >= threshold[b, h, q_idx]
            return (kv_idx <= q_idx) & ((q_idx - kv_idx < window) | far)

        block_mask = block_mask_from_pairs(visible, mask_mod, flex_len, self.flex_blocks)
        qf, kf, vf = (F.pad(t, (0, 0) + tail) for t in (q, k, v))
        out, lse = flex_with_lse(qf, kf, vf, block_mask, scale=1.0 / math.sqrt(dim))
        # Back to the reference's block padding (rows past seqlen are cut at the end).
        out = F.pad(out[:, :, :seqlen], pad).to(acc)
        lse = F.pad(lse[:, :, :seqlen].to(acc), pad[2:])
        gather_idx = cand_idx.reshape(bsz, heads, n_blocks * n_cand)[..., None].expand(-1, -1, -1, dim)
        k_cand = kp.gather(2, gather_idx).view(bsz, heads, n_blocks, n_cand, dim)
        v_cand = vp.gather(2, gather_idx).view(bsz, heads, n_blocks, n_cand, dim)
        if self.summary:
            k_sum, v_sum, has_rest = self._summary(kp, vp, selected, k_cand, v_cand, far_last)
            q_blocks = qp.view(bsz, heads, n_blocks, bs, dim)
            logit_sum = (q_blocks.to(k_sum.dtype) * k_sum).sum(-1) / math.sqrt(dim)
            logit_sum = logit_sum.masked_fill(~has_rest, float("-inf")).reshape(bsz, heads, padded)
            total = torch.logaddexp(lse, logit_sum)
            v_sum = v_sum.reshape(bsz, heads, padded, dim)
            out = out * (lse - total).exp()[..., None] + v_sum * (logit_sum - total).exp()[..., None]
        else:
            total = lse
        if live_score.requires_grad:  # training: the gate learns; nothing to add without gradients
            out = out + self._gate_gradient_term(qp, k_cand, v_cand, cand_idx, selected, live_score, total, out)
        return out[:, :, :seqlen].to(v.dtype)

    def _gate_gradient_term(self, q, k_cand, v_cand, cand_idx, selected, live_score, total, out) -> torch.Tensor:
        """Σ_j sel_ij P_ij δ_j (v_j − out_i), δ_j = g_j − g_j.detach() (g: the live gate score), P, v, out
        detached: zero in the forward pass, the reference's straight-through gate gradient backward
        (d out_i/d s_ij = P_ij (v_j − out_i)).  P_ij = exp(s_ij − total_i), total_i over all of i's keys.
        """
        bsz, heads, n_blocks, n_cand, dim = k_cand.shape
        bs = self.block
        acc = total.dtype
        with torch.no_grad():
            q_blocks = q.detach().view(bsz, heads, n_blocks, bs, dim).to(acc)
            logits = torch.matmul(q_blocks, k_cand.detach().to(acc).transpose(-1, -2)) / math.sqrt(dim)
            weight = torch.where(selected, (logits - total.view(bsz, heads, n_blocks, bs, 1)).exp(),
                                 torch.zeros((), dtype=acc, device=q.device))
        gate = live_score.to(acc).gather(2, cand_idx.reshape(bsz, heads, -1)).view(bsz, heads, n_blocks, 1, n_cand)
        weighted = weight * (gate - gate.detach())  # (B, H, nb, bs, C), all zeros
        term = torch.matmul(weighted, v_cand.detach().to(acc))
        term = term - out.detach().view(bsz, heads, n_blocks, bs, dim) * weighted.sum(-1, keepdim=True)
        return term.reshape(bsz, heads, n_blocks * bs, dim)

    def _visible_blocks(self, cand_idx, selected, n_blocks: int, flex_len: int) -> torch.Tensor:
        """(B, H, q_blocks, kv_blocks) bool in FlexAttention blocks: the local band plus every block
        holding a key that some query of the block selected."""
        bsz, heads = cand_idx.shape[:2]
        (q_block, kv_block), bs = self.flex_blocks, self.block
        n_q, n_kv = flex_len // q_block, flex_len // kv_block
        device = cand_idx.device
        used = selected.any(3)  # (B, H, nb, C): selected by some query of the reference block
        per_ref = torch.zeros(bsz, heads, n_blocks, n_kv + 1, dtype=torch.int32, device=device)
        target = torch.where(used, cand_idx // kv_block, n_kv)  # unused candidates land in a spare column
        per_ref.scatter_(3, target, 1)
        per_ref = per_ref[..., :n_kv].bool()
        # Reference block r covers queries [r·bs, (r+1)·bs); OR it into every flex block it overlaps.
        first = torch.arange(n_q, device=device) * q_block // bs
        last = ((torch.arange(n_q, device=device) + 1) * q_block - 1) // bs
        visible = torch.zeros(bsz, heads, n_q, n_kv, dtype=torch.bool, device=device)
        for offset in range((q_block - 1) // bs + 2):
            ref = torch.minimum(first + offset, last).clamp(max=n_blocks - 1)
            visible |= per_ref[:, :, ref]
        return visible | band_blocks(n_q, n_kv, self.flex_blocks, self.window, device)

    def _forward_reference(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        bsz, heads, seqlen, dim = q.shape
        bs, window = self.block, self.window
        n_blocks = -(-seqlen // bs)
        padded = n_blocks * bs
        if padded != seqlen:
            pad = (0, 0, 0, padded - seqlen)
            q, k, v = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
        device = q.device
        scale = 1.0 / math.sqrt(dim)
        _, live_score, cand_idx, selected, far_last = self._selection(v, seqlen, n_blocks)
        n_cand = cand_idx.shape[-1]
        qpos = torch.arange(padded, device=device).view(n_blocks, bs)

        flat_idx = cand_idx.reshape(bsz, heads, n_blocks * n_cand)
        gather_idx = flat_idx[..., None].expand(-1, -1, -1, dim)
        k_cand = k.gather(2, gather_idx).view(bsz, heads, n_blocks, n_cand, dim)
        v_cand = v.gather(2, gather_idx).view(bsz, heads, n_blocks, n_cand, dim)
        q_blocks = q.view(bsz, heads, n_blocks, bs, dim)

        logit_cand = torch.matmul(q_blocks, k_cand.transpose(-1, -2)) * scale
        gate = live_score.gather(2, flat_idx).view(bsz, heads, n_blocks, 1, n_cand)
        logit_cand = logit_cand + (gate - gate.detach()).to(logit_cand.dtype)  # zero forward, gate gradient
        logit_cand = logit_cand.masked_fill(~selected, float("-inf"))

        # Local window: keys [b·bs − window, (b+1)·bs) of block b.
        k_local, v_local = _local_windows(k, window // bs, n_blocks), _local_windows(v, window // bs, n_blocks)
        logit_local = torch.matmul(q_blocks, k_local.transpose(-1, -2)) * scale
        kpos_local = (torch.arange(n_blocks, device=device)[:, None] * bs - window
                      + torch.arange(window + bs, device=device)[None, :])  # (nb, window+bs)
        local_ok = ((kpos_local[:, None, :] <= qpos[:, :, None])
                    & (kpos_local[:, None, :] > far_last[:, :, None])
                    & (kpos_local[:, None, :] >= 0))
        logit_local = logit_local.masked_fill(~local_ok, float("-inf"))

        parts = [logit_cand, logit_local]
        if self.summary:
            k_sum, v_sum, has_rest = self._summary(k, v, selected, k_cand, v_cand, far_last)
            logit_sum = (q_blocks.to(k_sum.dtype) * k_sum).sum(-1, keepdim=True) * scale
            parts.append(logit_sum.masked_fill(~has_rest[..., None], float("-inf")).to(logit_cand.dtype))
        probs = torch.softmax(torch.cat(parts, dim=-1).to(_accum_dtype(v)), dim=-1).to(v.dtype)
        p_cand, p_local = probs[..., :n_cand], probs[..., n_cand:n_cand + window + bs]
        out = torch.matmul(p_cand, v_cand) + torch.matmul(p_local, v_local)
        if self.summary:
            out = out + (probs[..., -1:].to(v_sum.dtype) * v_sum).to(out.dtype)
        return out.reshape(bsz, heads, padded, dim)[:, :, :seqlen]

    def _candidates(self, score: torch.Tensor, n_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per query block: every key any of its queries may select, sorted by score (descending).  Its far
        past ends inside key block b − lag; the top-k of that prefix lies within (top-k of the earlier
        blocks, itself within the union of each block's own top-k) ∪ (that one block)."""
        bsz, heads, padded = score.shape
        bs, top_k = self.block, self.top_k
        device = score.device
        lag = self.window // bs
        per_block = min(top_k, bs)
        blk_val, blk_pos = score.view(bsz, heads, n_blocks, bs).topk(per_block, dim=-1)
        blk_idx = blk_pos + (torch.arange(n_blocks, device=device) * bs)[:, None]
        # Top-k of blocks 0..b for every b: a log-depth (Hillis–Steele) scan whose step merges the
        # top-k of (b − 2^s, b] with that of (b − 2^(s+1), b − 2^s] — disjoint ranges, so no key
        # twice — instead of a top-k over an (nb × nb·k) matrix.
        val, idx = blk_val, blk_idx
        shift = 1
        while shift < n_blocks:
            earlier_val = F.pad(val, (0, 0, shift, 0), value=float("-inf"))[:, :, :n_blocks]
            earlier_idx = F.pad(idx, (0, 0, shift, 0))[:, :, :n_blocks]
            merged_val, merged_idx = torch.cat([val, earlier_val], -1), torch.cat([idx, earlier_idx], -1)
            val, order = merged_val.topk(min(top_k, merged_val.shape[-1]), dim=-1)
            idx = merged_idx.gather(-1, order)
            shift *= 2
        n_prefix = min(top_k, n_blocks * per_block)
        prefix_val = F.pad(val[..., :n_prefix], (0, 0, lag + 1, 0), value=float("-inf"))[:, :, :n_blocks]
        prefix_idx = F.pad(idx[..., :n_prefix], (0, 0, lag + 1, 0))[:, :, :n_blocks]
        blocks = torch.arange(n_blocks, device=device)

        own_idx = (blocks - lag)[:, None] * bs + torch.arange(bs, device=device)[None, :]  # (nb, bs)
        own_idx = own_idx.clamp(min=0)
        # Key block b − lag of every query block b: the scores shifted by lag blocks (−inf before 0).
        own_val = F.pad(score, (lag * bs, 0), value=float("-inf"))[..., :padded].view(bsz, heads, n_blocks, bs)

        cand_val = torch.cat([prefix_val, own_val], dim=-1)
        cand_idx = torch.cat([prefix_idx, own_idx.expand(bsz, heads, -1, -1)], dim=-1)
        cand_val, order = cand_val.sort(dim=-1, descending=True, stable=True)
        return cand_idx.gather(-1, order), torch.isfinite(cand_val)

    def _summary(self, k, v, selected, k_cand, v_cand, far_last):
        """Mean key/value of each query's far past minus its selected keys, and whether it is non-empty."""
        bsz, heads, padded, dim = k.shape
        n_blocks, bs = far_last.shape
        acc = _accum_dtype(k)
        far_count = (far_last + 1).clamp(min=0).to(acc)  # keys 0..i-window
        sel = selected.to(acc)
        rest = far_count - sel.sum(-1)  # (B, H, nb, bs)
        has_rest = rest > 0.5
        denom = rest.clamp(min=1.0)[..., None]
        means = []
        for values, cand in ((k, k_cand), (v, v_cand)):
            # Inclusive prefix sums along the sequence as a scan over the last, contiguous dimension
            # (CUDA runs a scan over an outer dimension as one sequential loop per column), read at
            # i − window by a shift (zeros before: no far past).
            sums = values.to(acc).transpose(2, 3).contiguous().cumsum(-1)
            prefix = F.pad(sums, (self.window, 0))[..., :padded].transpose(2, 3)
            means.append((prefix.reshape(bsz, heads, n_blocks, bs, dim) - torch.matmul(sel, cand.to(acc))) / denom)
        return means[0], means[1], has_rest


@dataclass
class LSHConfig(Settings):
    legacy_prefix = "lsh_"
    chunk: int = Param(64, "positions per chunk", Integer(min=1))
    buckets: int = Param(0, "hash buckets (0: one per chunk of the sequence, Reformer's choice)", Integer(min=0))
    seed: int = Param(1234, "seed of the rotations, plus the layer id", Integer())
    kernel: str = Param("auto", "implementation", Choice(KERNEL_CHOICES))


class LSHAttention(_SparseKernel):
    """Reformer-style LSH attention, one hash round; the rotations come from ``seed`` and the layer id
    (never trained nor checkpointed)."""

    def __init__(self, head_dim: int, chunk: int = 64, n_buckets: int = 0, seed: int = 1234, kernel: str = "auto"):
        super().__init__(kernel)
        self.head_dim, self.chunk, self.n_buckets, self.seed = head_dim, chunk, n_buckets, seed
        self._rotations: dict[tuple[int, str], torch.Tensor] = {}

    Config = LSHConfig
    cuda_default = "flex"

    @classmethod
    def from_config(cls, options: LSHConfig, head_dim: int, layer_id: int) -> "LSHAttention":
        return cls(head_dim, options.chunk, options.buckets, options.seed + layer_id, options.kernel)

    def rotations(self, n_buckets: int, device: torch.device) -> torch.Tensor:
        key = (n_buckets, str(device))
        if key not in self._rotations:
            gen = torch.Generator().manual_seed(self.seed * 1000003 + n_buckets)
            rot = torch.randn(self.head_dim, n_buckets // 2, generator=gen)
            self._rotations[key] = rot.to(device)
        return self._rotations[key]

    @torch.no_grad()
    def bucket_ids(self, k: torch.Tensor) -> torch.Tensor:
        """Hash bucket of every position, (B, H, T)."""
        n_buckets = self.n_buckets or max(2, 2 * math.ceil(k.shape[2] / self.chunk / 2))
        if n_buckets == 1:
            return torch.zeros(k.shape[:3], dtype=torch.long, device=k.device)
        proj = F.normalize(k.float(), dim=-1) @ self.rotations(n_buckets, k.device)
        # argmax over [proj, −proj] without building it: the largest of max(proj) and −min(proj),
        # the first half on a tie (argmax's first occurrence).
        top, bottom = proj.argmax(-1, keepdim=True), proj.argmin(-1, keepdim=True)
        use_top = proj.gather(-1, top) >= -proj.gather(-1, bottom)
        return torch.where(use_top, top, bottom + proj.shape[-1]).squeeze(-1)

    def _sorted(self, q, k, v):
        """q, k, v and the buckets in (bucket, position) order, and the order itself."""
        seqlen, dim = q.shape[2], q.shape[3]
        bucket = self.bucket_ids(k)
        order = (bucket * seqlen + torch.arange(seqlen, device=q.device)).argsort(dim=-1)
        gather_idx = order[..., None].expand(-1, -1, -1, dim)
        return q.gather(2, gather_idx), k.gather(2, gather_idx), v.gather(2, gather_idx), bucket.gather(2, order), order

    @staticmethod
    def _unsort(out: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        undo = order.argsort(dim=-1)
        return out.gather(2, undo[..., None].expand(-1, -1, -1, out.shape[-1]))

    def _forward_flex(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The reference's function as one FlexAttention call over the sorted sequence: a causal band
        of `chunk` places (two key blocks per query block) where the buckets match."""
        seqlen, dim = q.shape[2], q.shape[3]
        chunk = self.chunk
        qs, ks, vs, bucket, order = self._sorted(q, k, v)
        q_block, kv_block = self.flex_blocks
        flex_len = seqlen + (-seqlen % math.lcm(q_block, kv_block))
        tail = (0, 0, 0, flex_len - seqlen)
        qs, ks, vs = F.pad(qs, tail), F.pad(ks, tail), F.pad(vs, tail)
        bucket = F.pad(bucket, tail[2:], value=-1)  # padding: a bucket of its own, after every real query

        def mask_mod(b, h, q_idx, kv_idx):
            lag = q_idx - kv_idx
            return (lag >= 0) & (lag < chunk) & (bucket[b, h, q_idx] == bucket[b, h, kv_idx])

        visible = band_blocks(flex_len // q_block, flex_len // kv_block, self.flex_blocks, chunk,
                                           q.device)[None, None]
        block_mask = block_mask_from_pairs(visible, mask_mod, flex_len, self.flex_blocks)
        out, _ = flex_with_lse(qs, ks, vs, block_mask, scale=1.0 / math.sqrt(dim))
        return self._unsort(out[:, :, :seqlen], order)

    def _forward_reference(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        bsz, heads, seqlen, dim = q.shape
        chunk = self.chunk
        qs, ks, vs, bs_sorted, order = self._sorted(q, k, v)
        n_chunks = -(-seqlen // chunk)
        padded = n_chunks * chunk
        if padded != seqlen:
            pad = (0, 0, 0, padded - seqlen)
            qs, ks, vs = F.pad(qs, pad), F.pad(ks, pad), F.pad(vs, pad)
            bs_sorted = F.pad(bs_sorted, (0, padded - seqlen), value=-1)  # padding: a bucket of its own
        rank = torch.arange(padded, device=q.device).view(n_chunks, chunk)
        qc = qs.view(bsz, heads, n_chunks, chunk, dim)
        kc = ks.view(bsz, heads, n_chunks, chunk, dim)
        vc = vs.view(bsz, heads, n_chunks, chunk, dim)
        bc = bs_sorted.view(bsz, heads, n_chunks, chunk)
        # Look back one chunk; chunk 0 gets an empty previous chunk (bucket -2 matches nothing).
        k_win = torch.cat([F.pad(kc, (0, 0, 0, 0, 1, 0))[:, :, :-1], kc], dim=3)
        v_win = torch.cat([F.pad(vc, (0, 0, 0, 0, 1, 0))[:, :, :-1], vc], dim=3)
        b_win = torch.cat([F.pad(bc, (0, 0, 1, 0), value=-2)[:, :, :-1], bc], dim=3)
        r_win = torch.cat([rank - chunk, rank], dim=1)  # (nc, 2·chunk)
        # Same bucket and at most chunk-1 places back in the sorted order (position order within a
        # bucket).  Other buckets are never admitted: chunk edges depend on future positions' hashes.
        lag = rank[:, :, None] - r_win[:, None, :]  # (nc, chunk, 2·chunk)
        allowed = (b_win[:, :, :, None, :] == bc[:, :, :, :, None]) & ((lag >= 0) & (lag < chunk))
        logits = torch.matmul(qc, k_win.transpose(-1, -2)) / math.sqrt(dim)
        logits = logits.masked_fill(~allowed, float("-inf"))
        out = torch.matmul(torch.softmax(logits.to(_accum_dtype(v)), dim=-1).to(v.dtype), v_win)
        return self._unsort(out.reshape(bsz, heads, padded, dim)[:, :, :seqlen], order)


def _kernel_problem(kernel) -> str | None:
    if not (isinstance(kernel, type) and issubclass(kernel, AttentionKernel)):
        return f"{kernel!r} is not a subclass of dsdata.train.attention.AttentionKernel"
    return None


# The kernels by `model.attention` name; plugins: entry points `dsdata.attention_kernels` (module:Class).
ATTENTION_KERNELS = Registry("attention kernel", "dsdata.attention_kernels", _kernel_problem, {
    "dense": DenseAttention, "dynamic_sparse": DynamicSparseAttention, "lsh": LSHAttention,
})
DEFAULT_ATTENTION = "dense"


def register_attention(name: str, kernel: type[AttentionKernel]) -> None:
    """Add a kernel row (ValueError when the name is taken or it is no kernel)."""
    ATTENTION_KERNELS.register(name, kernel)


def build_attention_kernel(args, layer_id: int) -> AttentionKernel:
    """Layer `layer_id`'s kernel: the `model.attention` row built from `model.attention_config`."""
    return ATTENTION_KERNELS[args.attention].from_config(args.attention_config, args.head_dim, layer_id)
