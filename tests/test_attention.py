"""Sparse attention kernels against dense attention with the equivalent explicit mask; the
block-sparse FlexAttention kernels (kernel="flex") against the same definition and against the
gather references, forward and backward."""
import math

import pytest
import torch

from dsdata.train.attention import DenseAttention, DynamicSparseAttention, LSHAttention
from dsdata.train.model import ModelArgs, Transformer
from dsdata.core.params import parse
from tests.conftest import needs_compiler

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


def make_sparse(top_k, window=8, block=4, summary=True, kernel="reference", dim=8):
    kernel = DynamicSparseAttention(dim, top_k=top_k, window=window, block=block, gate_hidden=6, summary=summary,
                                    kernel=kernel).double()
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


@pytest.mark.parametrize("implementation", ["reference", "flex"])
@pytest.mark.parametrize("summary", [True, False])
@pytest.mark.parametrize("top_k,window,block", [(3, 8, 4), (5, 4, 4), (2, 12, 4), (16, 8, 8)])
def test_dynamic_sparse_equals_explicit_mask_forward_and_backward(top_k, window, block, summary, implementation):
    q, k, v = qkv(seed=top_k + window)
    kernel = make_sparse(top_k, window, block, summary, implementation)
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


@pytest.mark.parametrize("implementation", ["reference", "flex"])
@pytest.mark.parametrize("chunk,t,buckets", [(8, 53, 0), (4, 64, 4), (64, 40, 1)])
def test_lsh_equals_explicit_mask_forward_and_backward(chunk, t, buckets, implementation):
    q, k, v = qkv(seed=chunk, t=t)
    kernel = LSHAttention(8, chunk=chunk, n_buckets=buckets, kernel=implementation)
    out = kernel(q, k, v)
    ref = lsh_reference(kernel, q, k, v)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    for g, r in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-8)
    if chunk >= t and buckets == 1:  # one bucket, one chunk: dense causal attention
        torch.testing.assert_close(out, DenseAttention()(q, k, v), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("attention,implementation", [("dense", "auto"), ("dynamic_sparse", "reference"),
                                                      ("lsh", "reference"), ("dynamic_sparse", "flex"),
                                                      ("lsh", "flex")])
def test_model_is_strictly_causal(attention, implementation):
    """Changing tokens after position p changes no logit at positions <= p, and no gradient flows back."""
    torch.manual_seed(0)
    options = {"dynamic_sparse": {"top_k": 2, "window": 4, "block": 4, "kernel": implementation},
               "lsh": {"chunk": 4, "kernel": implementation}}.get(attention, {})
    args = parse(ModelArgs, dict(dim=32, n_layers=2, n_heads=2, vocab_size=50, max_seq_len=64, attention=attention,
                                 attention_config=options), "model")
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


def _outputs_and_grads(kernel, q, k, v, grad):
    for t in (q, k, v):
        t.grad = None
    kernel.zero_grad(set_to_none=True)
    out = kernel(q, k, v)
    out.backward(grad)
    params = [p.grad for p in kernel.parameters()]
    return [out.detach()] + [t.grad.clone() for t in (q, k, v)] + params


# Lengths that are and are not multiples of FlexAttention's 128-position blocks; query blocks
# smaller and larger than them (block 256: one reference block spans two flex blocks).
SPARSE_SHAPES = [(300, 4, 16, 16), (256, 16, 64, 64), (600, 8, 256, 256), (520, 3, 64, 32)]


@pytest.mark.parametrize("t,top_k,window,block", SPARSE_SHAPES)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-9), (torch.bfloat16, 3e-2)])
def test_flex_dynamic_sparse_equals_the_gather_reference(t, top_k, window, block, dtype, tol):
    reference = make_sparse(top_k, window, block, dim=16)
    flex = make_sparse(top_k, window, block, kernel="flex", dim=16)
    flex.load_state_dict(reference.state_dict())
    if dtype == torch.float64:  # under bf16 autocast the gate's weights stay fp32, as in the model
        reference.to(dtype), flex.to(dtype)
    else:
        reference.float(), flex.float()
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in qkv(seed=t, b=1, h=2, t=t, d=16))
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    want = _outputs_and_grads(reference, q, k, v, grad)
    got = _outputs_and_grads(flex, q, k, v, grad)
    assert got[-1] is not None and got[-1].abs().sum() > 0  # the gate learns through the flex kernel too
    for g, w in zip(got, want):  # bf16: errors relative to each tensor's scale (sums of rounded terms)
        torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=tol * max(1.0, w.abs().max().item()))


@pytest.mark.parametrize("t,chunk,buckets", [(300, 16, 0), (256, 64, 4), (130, 8, 2)])
def test_flex_lsh_equals_the_gather_reference(t, chunk, buckets):
    q, k, v = qkv(seed=t, b=2, h=2, t=t, d=16)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    want = _outputs_and_grads(LSHAttention(16, chunk, buckets, kernel="reference"), q, k, v, grad)
    got = _outputs_and_grads(LSHAttention(16, chunk, buckets, kernel="flex"), q, k, v, grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("blocks", [(128, 64), (64, 128)])
def test_flex_kernels_with_other_query_and_key_block_sizes(blocks):
    q, k, v = qkv(seed=3, b=1, h=2, t=330, d=16)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    reference = make_sparse(4, 16, 16, dim=16)
    flex = make_sparse(4, 16, 16, kernel="flex", dim=16)
    flex.load_state_dict(reference.state_dict())
    lsh_reference, lsh_flex = LSHAttention(16, 16, kernel="reference"), LSHAttention(16, 16, kernel="flex")
    flex.flex_blocks = lsh_flex.flex_blocks = blocks
    for mine, theirs in ((flex, reference), (lsh_flex, lsh_reference)):
        for g, w in zip(_outputs_and_grads(mine, q, k, v, grad), _outputs_and_grads(theirs, q, k, v, grad)):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def test_torch_flex_attention_itself_computes_the_sparse_forward():
    """Without gradients the CPU path calls torch's FlexAttention (not the emulation used for
    backward on CPU): its block mask and mask_mod reproduce the references."""
    q, k, v = (x.detach() for x in qkv(seed=9, b=1, h=2, t=300, d=16))
    reference = make_sparse(4, 16, 16, dim=16)
    flex = make_sparse(4, 16, 16, kernel="flex", dim=16)
    flex.load_state_dict(reference.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(flex(q, k, v), reference(q, k, v), rtol=1e-9, atol=1e-9)
        lsh = [LSHAttention(16, 16, kernel=kind)(q, k, v) for kind in ("flex", "reference")]
    torch.testing.assert_close(lsh[0], lsh[1], rtol=1e-9, atol=1e-9)


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel"):
        DynamicSparseAttention(8, kernel="triton")
    with pytest.raises(ValueError, match="model.attention_config.kernel must be one of auto, fused, flex, reference, got 'fast'"):
        parse(ModelArgs, {"attention": "lsh", "attention_config": {"kernel": "fast"}}, "model")


@needs_compiler
@pytest.mark.parametrize("t,top_k,window,block,dtype,tol", [(512, 16, 64, 64, torch.float32, 1e-4),
                                                           (300, 4, 32, 16, torch.float32, 1e-4),
                                                           (520, 8, 64, 64, torch.bfloat16, 3e-2)])
def test_fused_dynamic_sparse_equals_the_gather_reference(t, top_k, window, block, dtype, tol):
    """`fused` is the reference compiled whole by Inductor (here its C++ backend): the same output and
    gradients of q, k, v and the gate.  Compiled, the local-window `unfold` the reference once used
    gave wrong key gradients (torch 2.13's Inductor, C++ backend, more than one thread), which this
    catches."""
    torch.manual_seed(t)  # the model's own settings (gate_hidden 32; the gate's weights stay fp32, as
    # under bf16 autocast)
    reference = DynamicSparseAttention(16, top_k=top_k, window=window, block=block, kernel="reference")
    fused = DynamicSparseAttention(16, top_k=top_k, window=window, block=block, kernel="fused")
    fused.load_state_dict(reference.state_dict())
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in qkv(seed=t, b=1, h=4, t=t, d=16))
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    want = _outputs_and_grads(reference, q, k, v, grad)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the miscompiled backward was wrong only when run by several threads
    try:
        got = _outputs_and_grads(fused, q, k, v, grad)
    finally:
        torch.set_num_threads(threads)
    assert got[-1] is not None and got[-1].abs().sum() > 0  # the gate learns through the fused kernel
    for g, w in zip(got, want):  # bf16: errors relative to each tensor's scale (sums of rounded terms)
        torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=tol / 10 * max(1.0, w.abs().max().item()))


@needs_compiler
def test_fused_lsh_equals_the_gather_reference_and_layers_share_one_compiled_graph():
    from torch._dynamo.utils import counters

    q, k, v = (x.detach().float().requires_grad_() for x in qkv(seed=4, b=1, h=2, t=200, d=16))
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    for layer in range(2):  # another layer: another seed (its rotations), the same compiled code
        graphs = counters["stats"]["unique_graphs"]
        want = _outputs_and_grads(LSHAttention(16, 16, seed=7 + layer, kernel="reference"), q, k, v, grad)
        got = _outputs_and_grads(LSHAttention(16, 16, seed=7 + layer, kernel="fused"), q, k, v, grad)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        if layer == 1:
            assert counters["stats"]["unique_graphs"] == graphs, "the second layer compiled again"
    sparse = [make_sparse(4, 16, 16, kernel="fused", dim=16).float() for _ in range(2)]
    sparse[0](q, k, v)
    graphs = counters["stats"]["unique_graphs"]
    sparse[1](q, k, v)  # other weights, same settings
    assert counters["stats"]["unique_graphs"] == graphs


def test_auto_kernel_is_the_eager_reference_off_cuda():
    from dsdata.train.attention import _implementation

    q = torch.zeros(1, 1, 4, 8)
    assert _implementation("auto", q, cuda_default="fused") == "reference"
    assert _implementation("fused", q, cuda_default="flex") == "fused"
    parse(ModelArgs, {"attention": "dynamic_sparse", "attention_config": {"kernel": "fused"}}, "model")
