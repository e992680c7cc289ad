"""Hybrid-parallel layouts on CPU: tokens/s of each layout vs one process, and the pipeline bubble.

    python benchmarks/parallel.py            # tiny config, 2 processes per layout (about 3-5 minutes)
    python benchmarks/parallel.py --steps 40 --bubble-dim 512

Part 1 runs the real trainer (`torchrun -m dsdata.train`, models/tiny.toml, synthetic data) under each
layout and reads tokens_per_s from metrics.jsonl (median of the steps after the first 3).
Part 2 measures the pipeline bubble of GPipe and 1F1B on 2 stages: per stage, the time its own
forward+backward of all micro-batches takes without any pipeline (busy) vs the step time under the
schedule; bubble = 1 − busy / step, next to the theoretical (p − 1) / (m + p − 1).
On a 2-core machine the processes share cores, so tokens/s ratios show overheads, not speed-ups.
The last line printed is one JSON object with all figures.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = {
    "single": (1, []),
    "dp2": (2, ["parallel.data_parallel_size=2"]),
    "tp2": (2, ["parallel.tensor_parallel_size=2"]),
    "pp2_gpipe": (2, ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=gpipe"]),
    "pp2_1f1b": (2, ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=1f1b"]),
}


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")


def run_layout(name: str, nproc: int, extra: list[str], steps: int, workdir: Path) -> float:
    run_dir = workdir / name
    sets = [f"training.steps={steps}", "checkpoint.interval=0", "export.enabled=false", "logging.tensorboard=false",
            "logging.console_interval=0", "logging.histogram_interval=0", "training.threads=1", *extra]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] \
        if nproc > 1 else [sys.executable]
    cmd = [*launcher, "-m", "dsdata.train", "--config", str(REPO / "models" / "tiny.toml"), "--run-dir", str(run_dir)]
    for item in sets:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, cwd=str(REPO), env=_env(), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-4000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["tokens_per_s"] for r in rows[3:])


# ------------------------------------------------------------------ bubble worker (2 processes)

def bubble_worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from dsdata.train.config import config_from_dict
    from dsdata.train.model import Transformer
    from dsdata.train.parallel import MixedParallel

    torch.set_num_threads(1)
    results = {}
    for kind in ("gpipe", "1f1b"):
        for micro in args.micro:
            global_batch = micro * args.micro_batch
            config = config_from_dict({
                "model": {"dim": args.bubble_dim, "n_layers": 4, "n_heads": 4, "vocab_size": 512, "max_seq_len": 128},
                "training": {"seq_len": 64, "global_batch_size": global_batch}}, "bubble")
            layout = MixedParallel({"pipeline_parallel_size": 2, "pipeline_schedule": kind,
                                    "micro_batch_size": args.micro_batch, "gradient_accumulation_steps": micro},
                                   config=config)
            torch.manual_seed(0)
            model = layout.parallelize(Transformer(config.model))
            tokens = torch.randint(0, 512, (global_batch, 65), generator=torch.Generator().manual_seed(1))
            micro_batches = list(tokens.split(args.micro_batch))

            def loss_fn(logits, targets):
                loss = F.cross_entropy(logits.float().reshape(-1, 512), targets.reshape(-1))
                return loss, loss

            def pipeline_step():
                layout.forward_backward(model, micro_batches, loss_fn, 1.0, contextlib.nullcontext)

            def stage_alone():  # the same compute without neighbours: this stage's busy time
                for mb in micro_batches:
                    if layout.is_first_stage:
                        out = model(mb[:, :-1])
                        out.backward(torch.ones_like(out) * 1e-3)
                    else:
                        hidden = torch.randn(mb.shape[0], 64, args.bubble_dim, requires_grad=True)
                        loss_fn(model(hidden), mb[:, 1:])[0].backward()

            for fn in (pipeline_step, stage_alone):  # warm-up (shape inference, allocator)
                fn()
            step_times, busy_times = [], []
            for _ in range(args.repeats):
                dist.barrier()
                began = time.perf_counter()
                pipeline_step()
                step_times.append(time.perf_counter() - began)
                dist.barrier()
                began = time.perf_counter()
                stage_alone()
                busy_times.append(time.perf_counter() - began)
            # Minimum over repeats: the least disturbed run on a shared machine.
            step, busy = min(step_times), min(busy_times)
            bubble = torch.tensor([1.0 - busy / step])
            dist.all_reduce(bubble)
            results[f"{kind}_m{micro}"] = {"measured": round(float(bubble) / 2, 4),
                                          "theoretical": round(1 / (micro + 1), 4)}
            model.zero_grad(set_to_none=True)
    if dist.get_rank() == 0:
        print("BUBBLE " + json.dumps(results))
    dist.destroy_process_group()


def measure_bubble(args) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__,
           "--bubble-worker", "--bubble-dim", str(args.bubble_dim), "--micro-batch", str(args.micro_batch),
           "--repeats", str(args.repeats), "--micro", *map(str, args.micro)]
    proc = subprocess.run(cmd, cwd=str(REPO), env=_env(), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bubble measurement failed:\n{proc.stderr[-4000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("BUBBLE "))
    return json.loads(line.removeprefix("BUBBLE "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--bubble-dim", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--micro", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bubble-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bubble_worker:
        bubble_worker(args)
        return
    figures: dict = {"tokens_per_s": {}, "vs_single": {}}
    with tempfile.TemporaryDirectory(prefix="bench_parallel_") as tmp:
        for name, (nproc, extra) in LAYOUTS.items():
            rate = run_layout(name, nproc, extra, args.steps, Path(tmp))
            figures["tokens_per_s"][name] = round(rate, 1)
            print(f"{name:10s} {nproc} proc  {rate:9.1f} tokens/s", flush=True)
    single = figures["tokens_per_s"]["single"]
    for name, rate in figures["tokens_per_s"].items():
        figures["vs_single"][name] = round(rate / single, 3)
    print("ratio vs 1 process: " + ", ".join(f"{k} {v:.2f}x" for k, v in figures["vs_single"].items()))
    bubble = measure_bubble(args)
    for key, value in bubble.items():
        print(f"bubble {key:10s} measured {value['measured']:.3f}  theoretical (p-1)/(m+p-1) {value['theoretical']:.3f}")
    figures["bubble"] = bubble
    figures["cpu_count"] = os.cpu_count()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
