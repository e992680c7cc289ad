"""The trainer on one GPU: matmul ceiling, the 1B config eager and compiled through the real Trainer,
Hugging Face's LlamaForCausalLM at the same shape as the reference, and the attention kernels.

    python benchmarks/train_gpu.py            # one GPU, about 4 minutes (at most --budget-s 420)
    python benchmarks/train_gpu.py --smoke    # tiny shapes on CPU in seconds (tests/test_train_gpu_bench.py)

Sections (each time-bounded; a failure is reported in the JSON and the rest still runs; every
section prints one `{"section": ...}` line as it finishes):

- ``matmul``: measured bf16 GEMM TFLOP/s (8192³), the ceiling MFU is also quoted against;
- ``trainer_eager`` / ``trainer_compiled``: models/llama-1b.toml (1.01B parameters, 16k tied
  vocabulary), bf16, seq 2048, micro-batch 8 × 4 accumulation = 65,536 tokens per step, the
  synthetic stream (no data.path), training.compile false / true; warm-up steps then timed steps of
  `Trainer.train_step` — the code path `python -m dsdata.train` runs;
- ``hf_llama``: transformers' LlamaForCausalLM, same shape, SDPA attention, fp32 weights under bf16
  autocast (as the Trainer), fused AdamW, clipping at 1.0: the reference, in the same run;
- each of the three then profiles one more step (``profile``: GPU time by kind of kernel — matmul,
  attention, Inductor-generated, optimizer, other — the 12 kernels with the most time, launches);
- ``attention``: forward+backward, bf16, batch 1, 16 heads × 128, at 8k/16k/32k/64k: dense SDPA
  (flash) against dynamic_sparse and lsh as a user gets them (``model.attention_config.kernel = auto``: the fused
  reference for dynamic_sparse, FlexAttention for lsh) and in their other implementations (flex,
  fused, the eager gather reference); first, each against the reference on this device (max
  |difference| of output and gradients); then a profile of dynamic_sparse at 8k (the kernels with
  the most time, and how many were launched).

MFU = tokens/s × (6·N + 12·L·T·d) / peak, against 989 TFLOP/s (H100/H200 dense bf16 datasheet) and
against the measured matmul ceiling.  Last line: one JSON object with every section's figures.
This script imports no Apache Beam (the GPU machine has none).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import signal
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATASHEET_TFLOPS = 989.0  # H100 / H200 SXM dense bf16


class SectionTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise SectionTimeout in the main thread after `seconds` (SIGALRM; a kernel already launched
    finishes, the Python around it stops)."""
    def expire(signum, frame):
        raise SectionTimeout(f"section exceeded its {seconds:.0f} s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Bench:
    def __init__(self, args):
        self.args = args
        self.smoke = args.smoke
        self.device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
        self.began = time.perf_counter()
        self.results: dict[str, dict] = {}

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.began)

    def run(self, name: str, fn, limit_s: float) -> None:
        """One section: at most limit_s (and what is left of the budget); errors are recorded."""
        limit = min(limit_s, self.left() - 5)
        if limit < 10 and not self.smoke:
            self.results[name] = {"skipped": f"budget spent ({self.left():.0f} s left)"}
        else:
            began = time.perf_counter()
            try:
                with time_limit(max(limit, 10)):
                    out = fn()
            except SectionTimeout as exc:
                out = {"error": str(exc)}
            except Exception as exc:  # noqa: BLE001 — a benchmark reports every failure and goes on
                out = {"error": f"{type(exc).__name__}: {exc}"[:600],
                       "where": traceback.format_exc().strip().splitlines()[-3:]}
            out["section_s"] = round(time.perf_counter() - began, 1)
            self.results[name] = out
        print(json.dumps({"section": name, **self.results[name]}), flush=True)
        self.release()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def release(self) -> None:
        gc.collect()
        torch._dynamo.reset()  # compiled code may hold the last section's modules
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gb(self) -> float | None:
        return round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if self.device.type == "cuda" else None

    # ------------------------------------------------------------------ matmul ceiling

    def matmul(self) -> dict:
        n = 256 if self.smoke else 8192
        dtype = torch.bfloat16
        a = torch.randn(n, n, device=self.device, dtype=dtype)
        b = torch.randn(n, n, device=self.device, dtype=dtype)
        for _ in range(3):
            a @ b
        self.sync()
        reps = 2 if self.smoke else 50
        began = time.perf_counter()
        for _ in range(reps):
            a @ b
        self.sync()
        seconds = (time.perf_counter() - began) / reps
        return {"n": n, "tflops": round(2 * n ** 3 / seconds / 1e12, 1)}

    # ------------------------------------------------------------------ the Trainer

    def trainer_overrides(self, compiled: bool) -> list[str]:
        common = ["data.path=", "training.steps=100000", "schedule.warmup_steps=10", "checkpoint.interval=0",
                  "logging.tensorboard=false", "logging.console_interval=0", "logging.histogram_interval=0",
                  "export.enabled=false", f"training.compile={'true' if compiled else 'false'}",
                  "training.precision=bf16"]
        if self.smoke:
            return common + ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
                             "model.ffn_hidden_dim=128", "model.vocab_size=256", "data.synthetic_vocab=256",
                             "model.max_seq_len=64", "training.seq_len=64", "training.global_batch_size=4",
                             "parallel.micro_batch_size=2", "training.device=cpu"]
        return common + ["model.vocab_size=16000", "data.synthetic_vocab=16000", "training.seq_len=2048",
                         "training.global_batch_size=32", "parallel.micro_batch_size=8", "training.device=cuda"]

    def trainer(self, compiled: bool) -> dict:
        from dsdata.train.config import load_config
        from dsdata.train.loop import Trainer

        config = load_config(os.path.join(REPO, "models", "llama-1b.toml"), self.trainer_overrides(compiled))
        with tempfile.TemporaryDirectory(prefix="dsdata-bench-") as run_dir:
            trainer = Trainer(config, run_dir)
            try:
                return self._time_steps(trainer, config)
            finally:
                trainer.metrics.close()
                del trainer

    def _time_steps(self, trainer, config) -> dict:
        t, m = config.training, trainer.config.model
        warmup, timed = (1, 2) if self.smoke else (self.args.warmup_steps, self.args.timed_steps)
        losses = []
        began = time.perf_counter()
        for _ in range(warmup):
            losses.append(trainer.train_step()["loss"])
        self.sync()
        warmup_s = time.perf_counter() - began
        began = time.perf_counter()
        for _ in range(timed):
            losses.append(trainer.train_step()["loss"])
        self.sync()
        seconds = (time.perf_counter() - began) / timed
        tokens = t.global_batch_size * t.seq_len
        peak = self.peak_gb()
        return {**self.throughput(tokens / seconds, trainer.parameter_count, m.n_layers, t.seq_len, m.dim),
                "step_s": round(seconds, 4), "warmup_s": round(warmup_s, 1), "tokens_per_step": tokens,
                "parameters": trainer.parameter_count,
                "losses": [round(x, 4) if x is not None else None for x in losses],
                "peak_gb": peak, "profile": self._profile(trainer.train_step)}

    # Kernel-name fragments → where a step's GPU time goes (first match wins).
    CATEGORIES = (("attention", ("flash", "fmha", "cudnn", "attention", "sdpa")),
                  ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "matmul", "aten::mm", "aten::bmm", "addmm")),
                  ("optimizer", ("adam", "foreach", "multi_tensor")),
                  ("generated", ("triton", "cpp_fused")),
                  ("other", ("",)))

    def _profile(self, fn) -> dict:
        """One more call of `fn` under the profiler: device time by kind of kernel (matmul, attention,
        Inductor-generated, optimizer — the multi-tensor kernels, grad norm and clipping included —,
        other), the kernels with the most time, and the launch count: where a step's time goes when
        the figures miss their goal (on CPU, operators' self time instead)."""
        from torch.profiler import ProfilerActivity, profile

        cuda = self.device.type == "cuda"
        with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
            fn()
            self.sync()
        rows = []
        for event in prof.key_averages():
            us = event.self_device_time_total if cuda else event.self_cpu_time_total
            if us > 0 and (not cuda or event.device_type.name == "CUDA"):
                rows.append((us, event.count, event.key))
        rows.sort(reverse=True)
        by_kind: dict[str, float] = {}
        for us, _, name in rows:
            low = name.lower()
            kind = next(kind for kind, parts in self.CATEGORIES if any(part in low for part in parts))
            by_kind[kind] = by_kind.get(kind, 0.0) + us / 1e3
        return {"launches": sum(count for _, count, _ in rows), "total_ms": round(sum(us for us, _, _ in rows) / 1e3, 3),
                "by_kind_ms": {kind: round(ms, 3) for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1])},
                "top": [[name[:90], count, round(us / 1e3, 3)] for us, count, name in rows[:12]]}

    def throughput(self, tokens_per_s: float, params: int, layers: int, seq: int, dim: int) -> dict:
        flops_per_token = 6 * params + 12 * layers * seq * dim
        achieved = tokens_per_s * flops_per_token / 1e12
        ceiling = self.results.get("matmul", {}).get("tflops")
        return {"tokens_per_s": round(tokens_per_s, 1), "gflops_per_token": round(flops_per_token / 1e9, 3),
                "tflops": round(achieved, 1), "mfu_989": round(achieved / DATASHEET_TFLOPS, 4),
                "mfu_measured_ceiling": round(achieved / ceiling, 4) if ceiling else None}

    # ------------------------------------------------------------------ Hugging Face reference

    def hf_llama(self) -> dict:
        from transformers import LlamaConfig, LlamaForCausalLM

        if self.smoke:
            shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
            seq, micro, accumulation = 64, 2, 2
        else:
            shape = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=16000, max_position_embeddings=2048)
            seq, micro, accumulation = 2048, 8, 4
        config = LlamaConfig(**shape, rope_theta=500000.0, tie_word_embeddings=True, attn_implementation="sdpa")
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(self.device)
        model.train()
        params = sum(p.numel() for p in model.parameters())
        fused = {"fused": True} if self.device.type == "cuda" else {}
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **fused)
        vocab = config.vocab_size

        def step() -> float:
            optimizer.zero_grad(set_to_none=True)
            total = torch.zeros((), device=self.device)
            for _ in range(accumulation):
                tokens = torch.randint(0, vocab, (micro, seq + 1), device=self.device)
                with torch.autocast(self.device.type, dtype=torch.bfloat16):
                    logits = model(input_ids=tokens[:, :-1]).logits
                    loss = F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))
                (loss / accumulation).backward()
                total += loss.detach() / accumulation
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            return float(total)

        warmup, timed = (1, 2) if self.smoke else (self.args.warmup_steps, self.args.timed_steps)
        for _ in range(warmup):
            step()
        self.sync()
        began = time.perf_counter()
        for _ in range(timed):
            step()
        self.sync()
        seconds = (time.perf_counter() - began) / timed
        tokens = micro * accumulation * seq
        out = {**self.throughput(tokens / seconds, params, shape["num_hidden_layers"], seq, shape["hidden_size"]),
               "step_s": round(seconds, 4), "parameters": params, "peak_gb": self.peak_gb(),
               "profile": self._profile(step)}
        del model, optimizer
        return out

    # ------------------------------------------------------------------ attention kernels

    def attention(self) -> dict:
        from dsdata.train.attention import DenseAttention, DynamicSparseAttention, LSHAttention

        heads, dim = (4, 32) if self.smoke else (16, 128)
        lengths = [256] if self.smoke else [8192, 16384, 32768, 65536]
        # Most important first (the attention time budget may end a length early): what a user gets
        # (`auto`: dynamic_sparse fused, lsh flex on CUDA), then the other implementations.
        def sparse(kernel: str):
            return lambda: DynamicSparseAttention(dim, top_k=16, window=64, block=64, kernel=kernel)

        def lsh(kernel: str):
            return lambda: LSHAttention(dim, chunk=64, kernel=kernel)

        kernels = {"dense": lambda: DenseAttention(), "dynamic_sparse": sparse("auto"), "lsh": lsh("auto"),
                   "dynamic_sparse_flex": sparse("flex"), "dynamic_sparse_reference": sparse("reference"),
                   "lsh_fused": lsh("fused"), "lsh_reference": lsh("reference")}
        dtype = torch.bfloat16
        out: dict = {"heads": heads, "head_dim": dim, "dtype": "bf16", "ms": {}, "peak_gb": {}, "errors": {},
                     "speedup_vs_dense": {}}
        deadline = time.perf_counter() + self.args.attention_s
        pairs = {f"{family}_{kernel}": (make(kernel), make("reference"))
                 for family, make in (("dynamic_sparse", sparse), ("lsh", lsh)) for kernel in ("fused", "flex")}
        for name, (kernel, reference) in pairs.items():
            try:
                out.setdefault("kernel_vs_reference_max_abs_diff", {})[name] = self._compare(kernel(), reference(),
                                                                                            heads, dim)
            except SectionTimeout:
                raise
            except Exception as exc:  # noqa: BLE001
                out["errors"][f"{name}@check"] = f"{type(exc).__name__}: {exc}"[:300]
        print(json.dumps({"attention_check": out.get("kernel_vs_reference_max_abs_diff"),
                          "errors": out["errors"]}), flush=True)
        def label(seqlen: int) -> str:
            return f"{seqlen // 1024}k" if seqlen >= 1024 else str(seqlen)

        # Kernel by kernel over the lengths (most important first), so a spent budget costs the
        # least important figures.
        for name, make in kernels.items():
            for seqlen in lengths:
                key = f"{name}@{label(seqlen)}"
                if time.perf_counter() > deadline:
                    out["errors"][key] = "skipped: attention time budget spent"
                    continue
                try:
                    module = make().to(self.device)
                    profiled = name == "dynamic_sparse" and seqlen == lengths[0]
                    ms, peak, profile = self._time_attention(module, seqlen, heads, dim, dtype, profiled)
                    out["ms"][key], out["peak_gb"][key] = round(ms, 3), peak
                    if profiled:
                        out["profile"] = {key: profile}
                except SectionTimeout:
                    raise
                except Exception as exc:  # noqa: BLE001
                    out["errors"][key] = f"{type(exc).__name__}: {exc}"[:300]
                self.release()
                print(json.dumps({"attention": key, "ms": out["ms"].get(key), "error": out["errors"].get(key)}),
                      flush=True)
        for seqlen in lengths:
            dense = out["ms"].get(f"dense@{label(seqlen)}")
            for name in kernels:
                mine = out["ms"].get(f"{name}@{label(seqlen)}")
                if dense and mine and name != "dense":
                    out["speedup_vs_dense"][f"{name}@{label(seqlen)}"] = round(dense / mine, 3)
        return out

    def _compare(self, kernel, reference, heads: int, dim: int) -> dict:
        """Max |kernel − reference| of the output and of dq, dk, dv (fp32, 1,000 positions: not a
        multiple of the block sizes) on this device: the kernels are equal, here as on CPU."""
        kernel, reference = kernel.to(self.device), reference.to(self.device)
        reference.load_state_dict(kernel.state_dict())
        torch.manual_seed(1)
        inputs = [torch.randn(1, heads, 1000, dim, device=self.device, requires_grad=True) for _ in range(3)]
        grad = torch.randn(1, heads, 1000, dim, device=self.device)
        results = []
        for module in (kernel, reference):
            for t in inputs:
                t.grad = None
            output = module(*inputs)
            output.backward(grad)
            results.append([output.detach()] + [t.grad.clone() for t in inputs])
        return {name: float((a - b).abs().max()) for name, a, b in zip(("out", "dq", "dk", "dv"), *results)}

    def _time_attention(self, module, seqlen: int, heads: int, dim: int, dtype,
                        profile: bool = False) -> tuple[float, float | None, dict | None]:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, heads, seqlen, dim, device=self.device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        grad = torch.randn(1, heads, seqlen, dim, device=self.device, dtype=dtype)

        def once():
            q.grad = k.grad = v.grad = None
            module(q, k, v).backward(grad)

        for _ in range(1 if self.smoke else 2):  # compiles (FlexAttention) and warms the allocator
            once()
        self.sync()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        reps = 1 if self.smoke else 5
        began = time.perf_counter()
        for _ in range(reps):
            once()
        self.sync()
        ms, peak = (time.perf_counter() - began) / reps * 1e3, self.peak_gb()
        # One more forward+backward under the profiler: what to attack next if the kernel is slow.
        return ms, peak, self._profile(once) if profile else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, in seconds")
    parser.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget of the whole run")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--timed-steps", type=int, default=5)
    parser.add_argument("--attention-s", type=float, default=170.0, help="time for the attention section")
    parser.add_argument("--sections", default="matmul,trainer_eager,trainer_compiled,hf_llama,attention",
                        help="comma-separated subset to run")
    args = parser.parse_args()
    if args.smoke:
        torch.set_num_threads(min(2, torch.get_num_threads()))
    bench = Bench(args)
    info = {"torch": torch.__version__, "device": (torch.cuda.get_device_name() if bench.device.type == "cuda"
                                                    else "cpu"), "smoke": args.smoke}
    print(json.dumps({"section": "environment", **info}), flush=True)
    limits = {"matmul": 30, "trainer_eager": 75, "trainer_compiled": 170, "hf_llama": 75,
              "attention": args.attention_s + 30}
    sections = {"matmul": bench.matmul, "trainer_eager": lambda: bench.trainer(False),
                "trainer_compiled": lambda: bench.trainer(True), "hf_llama": bench.hf_llama,
                "attention": bench.attention}
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(sections))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {sorted(sections)}")
    for name in chosen:
        if args.smoke and name == "trainer_compiled":
            bench.results[name] = {"skipped": "smoke: torch.compile takes minutes on a shared CPU "
                                              "(tests/test_train_compile.py covers the compiled path)"}
            print(json.dumps({"section": name, **bench.results[name]}), flush=True)
            continue
        bench.run(name, sections[name], limits[name])
    r = bench.results
    summary = {**info, "total_s": round(time.perf_counter() - bench.began, 1), **{k: v for k, v in r.items()}}
    compiled, eager, hf = (r.get(k, {}).get("tokens_per_s") for k in ("trainer_compiled", "trainer_eager", "hf_llama"))
    summary["ratios"] = {
        "compiled_vs_hf": round(compiled / hf, 3) if compiled and hf else None,
        "eager_vs_hf": round(eager / hf, 3) if eager and hf else None,
        "compiled_vs_eager": round(compiled / eager, 3) if compiled and eager else None,
    }
    print(json.dumps(summary), flush=True)
    failed = [k for k, v in r.items() if "error" in v]
    return 1 if failed and args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
