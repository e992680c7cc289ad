"""DeepOpt and LambdaOpt vs AdamW on the tiny LM: steps to reach a target loss (same data and seed).

    python benchmarks/optim.py                          # synthetic stream, 300 steps each
    python benchmarks/optim.py --data RUN_DIR/shards --target 6.5 --steps 400

AdamW and DeepOpt share --lr; LambdaOpt gets --lamb-lr (10× by default): its LAMB trust ratio makes
each layer's step lr · ‖p‖, far smaller than Adam's per-element lr at the same value (at 3e-3 it
does not reach the target in 300 steps).  Runs the real trainer (dsdata.train.loop.train) once per optimizer with models/tiny.toml.  "Steps to
target" is the first step whose loss, smoothed by an exponential moving average (0.9), is at or below
the target.  Last line: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from dsdata.train.config import load_config  # noqa: E402
from dsdata.train.loop import train  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "tiny.toml")


def steps_to_target(losses: list[float], target: float) -> int | None:
    smooth = None
    for step, loss in enumerate(losses, start=1):
        smooth = loss if smooth is None else 0.9 * smooth + 0.1 * loss
        if smooth <= target:
            return step
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", type=float, default=1.5, help="smoothed loss to reach")
    parser.add_argument("--data", default="", help="shard dir (default: the synthetic stream)")
    parser.add_argument("--lr", type=float, default=3e-3, help="learning rate of AdamW and DeepOpt")
    parser.add_argument("--lamb-lr", type=float, default=3e-2, help="learning rate of LambdaOpt")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    results = {}
    print(f"tiny LM (models/tiny.toml), {args.steps} steps, target smoothed loss {args.target}")
    print(f"{'optimizer':>10} {'lr':>8} {'steps to target':>16} {'final loss':>11} {'vs adamw':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("adamw", "deepopt", "lambdaopt"):
            lr = args.lamb_lr if name == "lambdaopt" else args.lr
            sets = [f"training.steps={args.steps}", f"optimizer.name={name}", f"optimizer.lr={lr}",
                    "checkpoint.interval=0", "export.enabled=false", "logging.tensorboard=false",
                    "logging.console_interval=0", f"data.path={args.data}", *args.set]
            run_dir = os.path.join(tmp, name)
            train(load_config(CONFIG, sets), run_dir)
            with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
                losses = [json.loads(line)["loss"] for line in fh]
            reached = steps_to_target(losses, args.target)
            final = sum(losses[-10:]) / len(losses[-10:])
            results[name] = {"steps_to_target": reached, "final_loss": round(final, 4), "lr": lr}
            base = results["adamw"]["steps_to_target"]
            ratio = f"{base / reached:.2f}x" if reached and base else "-"
            print(f"{name:>10} {lr:>8.0e} {str(reached):>16} {final:>11.4f} {ratio:>9}", flush=True)
    summary = {"target": args.target, "steps": args.steps, "data": args.data or "synthetic", **{
        f"{k}_steps_to_target": v["steps_to_target"] for k, v in results.items()},
        **{f"{k}_final_loss": v["final_loss"] for k, v in results.items()},
        **{f"{k}_lr": v["lr"] for k, v in results.items()}}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
