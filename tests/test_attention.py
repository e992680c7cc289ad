"""Sparse attention kernels against dense attention with the equivalent explicit mask."""
import math

import pytest
import torch

from dsdata.train.attention import DenseAttention, DynamicSparseAttention, LSHAttention
from dsdata.train.model import ModelArgs, Transformer

torch.set_num_threads(1)


def qkv(seed=0, b=2, h=3, t=53, d=8):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3)]


def dense_reference(q, k, v, mask, summary_k=None, summary_v=None, summary_ok=None):
    """Softmax attention over keys allowed by mask (B,H,T,T), plus an optional per-query summary key."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    if summary_k is not None:
        s = ((q * summary_k).sum(-1, keepdim=True) * scale).masked_fill(~summary_ok[..., None], float("-inf"))
        logits = torch.cat([logits, s], dim=-1)
    probs = torch.softmax(logits, dim=-1)
    out = probs[..., : k.shape[2]] @ v
    if summary_k is not None:
        out = out + probs[..., -1:] * summary_v
    return out


def sparse_reference(kernel, q, k, v):
    """Per query i, straight from the definition: window (i-W, i], top-k gated keys of [0, i-W], mean of the rest."""
    b, h, t, d = q.shape
    score = kernel.gate_scores(v, snapshot=True)
    mask = torch.zeros(b, h, t, t, dtype=torch.bool)
    rest = torch.zeros(b, h, t, t, dtype=torch.bool)
    for i in range(t):
        lo = max(0, i - kernel.window + 1)
        mask[:, :, i, lo : i + 1] = True
        far = i - kernel.window + 1  # keys 0..far-1
        if far > 0:
            top = score[:, :, :far].topk(min(kernel.top_k, far), dim=-1).indices
            chosen = torch.zeros(b, h, far, dtype=torch.bool).scatter_(-1, top, True)
            mask[:, :, i, :far] = chosen
            rest[:, :, i, :far] = ~chosen
    if not kernel.summary:
        return dense_reference(q, k, v, mask), mask
    count = rest.sum(-1, keepdim=True)
    sk = (rest.to(q.dtype) @ k) / count.clamp(min=1)
    sv = (rest.to(q.dtype) @ v) / count.clamp(min=1)
    return dense_reference(q, k, v, mask, sk, sv, count[..., 0] > 0), mask


def grads(out, tensors, seed=1):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    return torch.autograd.grad((out * weight).sum(), tensors)


def make_sparse(top_k, window=8, block=4, summary=True):
    kernel = DynamicSparseAttention(8, top_k=top_k, window=window, block=block, gate_hidden=6, summary=summary).double()
    torch.nn.init.normal_(kernel.gate_in.weight, std=0.5)
    kernel.refresh_selection()
    return kernel


def test_dynamic_sparse_with_topk_covering_sequence_equals_dense_causal():
    q, k, v = qkv()
    kernel = make_sparse(top_k=64)
    out = kernel(q, k, v)
    ref = DenseAttention()(q, k, v)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for g, r in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("summary", [True, False])
@pytest.mark.parametrize("top_k,window,block", [(3, 8, 4), (5, 4, 4), (2, 12, 4), (16, 8, 8)])
def test_dynamic_sparse_equals_explicit_mask_forward_and_backward(top_k, window, block, summary):
    q, k, v = qkv(seed=top_k + window)
    kernel = make_sparse(top_k, window, block, summary)
    out = kernel(q, k, v)
    ref, mask = sparse_reference(kernel, q, k, v)
    # The pattern is really sparse here, not dense in disguise.
    assert mask[..., -1, :].sum(-1).max() <= top_k + window < q.shape[2]
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    for g, r in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-8)


def test_dynamic_sparse_gate_gets_gradient_but_no_forward_effect():
    q, k, v = qkv()
    kernel = make_sparse(top_k=3)
    out = kernel(q, k, v)
    out.square().sum().backward()
    assert kernel.gate_in.weight.grad is not None and kernel.gate_in.weight.grad.abs().sum() > 0
    # Changing the live gate (not the snapshot) leaves the forward unchanged until refresh.
    with torch.no_grad():
        kernel.gate_in.weight.add_(1.0)
    torch.testing.assert_close(kernel(q, k, v), out.detach())
    kernel.on_training_step(4)
    assert not torch.allclose(kernel(q, k, v), out.detach())


def lsh_reference(kernel, q, k, v):
    """Query i sees key j <= i of its own bucket with fewer than `chunk` same-bucket positions in (j, i]."""
    t = q.shape[2]
    bucket = kernel.bucket_ids(k)
    same = bucket[..., :, None] == bucket[..., None, :]  # (B, H, i, j)
    count_upto = same.long().cumsum(-1)  # same-bucket positions in [0, j]
    between = count_upto.diagonal(dim1=-2, dim2=-1)[..., :, None] - count_upto  # in (j, i]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    return dense_reference(q, k, v, same & causal & (between < kernel.chunk))


@pytest.mark.parametrize("chunk,t,buckets", [(8, 53, 0), (4, 64, 4), (64, 40, 1)])
def test_lsh_equals_explicit_mask_forward_and_backward(chunk, t, buckets):
    q, k, v = qkv(seed=chunk, t=t)
    kernel = LSHAttention(8, chunk=chunk, n_buckets=buckets)
    out = kernel(q, k, v)
    ref = lsh_reference(kernel, q, k, v)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    for g, r in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-8)
    if chunk >= t and buckets == 1:  # one bucket, one chunk: dense causal attention
        torch.testing.assert_close(out, DenseAttention()(q, k, v), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("attention", ["dense", "dynamic_sparse", "lsh"])
def test_model_is_strictly_causal(attention):
    """Changing tokens after position p changes no logit at positions <= p, and no gradient flows back."""
    torch.manual_seed(0)
    args = ModelArgs(dim=32, n_layers=2, n_heads=2, vocab_size=50, max_seq_len=64, attention=attention,
                     sparse_top_k=2, sparse_window=4, sparse_block=4, lsh_chunk=4)
    model = Transformer(args).double()
    for module in model.modules():  # make the gate discriminative so selection varies with content
        if isinstance(module, DynamicSparseAttention):
            torch.nn.init.normal_(module.gate_in.weight, std=1.0)
            module.refresh_selection()
    tokens = torch.randint(0, 50, (2, 40))
    base = model(tokens)
    for p in (0, 7, 21, 38):
        changed = tokens.clone()
        changed[:, p + 1 :] = torch.randint(0, 50, changed[:, p + 1 :].shape)
        out = model(changed)
        torch.testing.assert_close(out[:, : p + 1], base[:, : p + 1], rtol=0, atol=1e-12)
    emb = model.tok_embeddings(tokens).detach().requires_grad_()
    model_no_emb = model.tok_embeddings
    model.tok_embeddings = None  # feed hidden states directly (as a pipeline stage does)
    try:
        out = model(emb)
        (grad,) = torch.autograd.grad(out[:, 10].sum(), emb)
    finally:
        model.tok_embeddings = model_no_emb
    assert grad[:, 11:].abs().max() == 0
    assert grad[:, :11].abs().max() > 0
