"""Sparse attention vs dense SDPA on CPU: forward+backward time and peak memory per sequence length.

    python benchmarks/attention.py                 # 1k, 2k, 4k, 8k  (about 3-5 minutes, 1 thread)
    python benchmarks/attention.py --max-len 16384 # adds 16k (dense takes minutes there)

Each (kernel, length) runs in a forked child so its peak RSS growth is its own.  Shapes: batch 1,
8 heads, head size 64, fp32; dynamic_sparse with its defaults (top-k 16, window 64, block 64), eager
(`reference`, the CPU default) and `fused` (compiled by Inductor; peak memory includes compiling),
lsh with chunk 64.  Last line: one JSON object with speedup_8k (dynamic_sparse vs dense).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from dsdata.train.attention import DenseAttention, DynamicSparseAttention, LSHAttention  # noqa: E402

KERNELS = {
    "dense": lambda d: DenseAttention(),
    "dynamic_sparse": lambda d: DynamicSparseAttention(d, top_k=16, window=64, block=64),
    # the same kernel compiled whole by Inductor (the CUDA default; here its C++ backend; the
    # warm-up run compiles)
    "sparse_fused": lambda d: DynamicSparseAttention(d, top_k=16, window=64, block=64, kernel="fused"),
    "lsh": lambda d: LSHAttention(d, chunk=64),
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measure(kernel_name: str, seqlen: int, heads: int, dim: int, repeats: int, threads: int, queue) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    kernel = KERNELS[kernel_name](dim)
    q, k, v = (torch.randn(1, heads, seqlen, dim, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, heads, seqlen, dim)
    base = _rss_bytes()
    times = []
    for i in range(repeats + 1):  # the first run warms up allocator and kernels
        began = time.perf_counter()
        out = kernel(q, k, v)
        out.backward(grad)
        elapsed = time.perf_counter() - began
        q.grad = k.grad = v.grad = None
        del out
        if i:
            times.append(elapsed)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    queue.put({"seconds": min(times), "peak_mb": max(0, peak - base) / 2 ** 20})


def measure(kernel_name: str, seqlen: int, heads: int, dim: int, repeats: int, threads: int) -> dict:
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(kernel_name, seqlen, heads, dim, repeats, threads, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-len", type=int, default=8192, help="longest sequence (16384 for the full sweep)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: stable timings on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [n for n in (1024, 2048, 4096, 8192, 16384) if n <= args.max_len]
    results: dict[int, dict[str, dict]] = {}
    print(f"fwd+bwd, batch 1, {args.heads} heads x {args.dim}, fp32, {args.threads} thread(s)")
    print(f"{'len':>6} {'kernel':>15} {'seconds':>9} {'peak MB':>9} {'speedup':>8} {'mem ratio':>9}")
    for n in lengths:
        results[n] = {}
        for name in KERNELS:
            repeats = 3 if n <= 2048 else 1
            results[n][name] = measure(name, n, args.heads, args.dim, repeats, args.threads)
            dense = results[n]["dense"]
            r = results[n][name]
            speed = dense["seconds"] / r["seconds"]
            mem = r["peak_mb"] / dense["peak_mb"] if dense["peak_mb"] > 0 else float("nan")
            print(f"{n:>6} {name:>15} {r['seconds']:>9.3f} {r['peak_mb']:>9.1f} {speed:>7.2f}x {mem:>9.2f}", flush=True)
    summary = {"device": "cpu", "threads": args.threads, "heads": args.heads, "head_dim": args.dim}
    for n in lengths:
        tag = f"{n // 1024}k"
        dense = results[n]["dense"]["seconds"]
        summary[f"speedup_{tag}"] = round(dense / results[n]["dynamic_sparse"]["seconds"], 3)
        summary[f"fused_speedup_{tag}"] = round(dense / results[n]["sparse_fused"]["seconds"], 3)
        summary[f"lsh_speedup_{tag}"] = round(dense / results[n]["lsh"]["seconds"], 3)
        summary[f"seconds_{tag}"] = {k: round(v["seconds"], 4) for k, v in results[n].items()}
        summary[f"peak_mb_{tag}"] = {k: round(v["peak_mb"], 1) for k, v in results[n].items()}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
