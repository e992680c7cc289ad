"""What the per-stage CPU report (stats.json `stage_time`) costs, and how close its sampling comes:
a recipe of one cheap per-document stage (`clean` on short plain text, where the clock's share is
largest) on the in-process runner, three ways, interleaved: as shipped (cheap elements timed one in
16), every element timed, and the clock replaced by a constant (no measurement).

usage: python benchmarks/stage_timing.py [--docs N] [--repeat N]
Prints the CPU-seconds of this process per variant (best of --repeat), their ratios, and the clean
stage's cpu_s as sampled and as measured on every element (medians); the last line is one JSON
object.  CPU time, not wall time: the machine is shared.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import dsdata.beam.transforms as transforms  # noqa: E402
from dsdata.beam.pipeline import run_recipe  # noqa: E402
from dsdata.recipe import load_recipe  # noqa: E402

# clean on plain text is the cheapest real per-document stage (no HTML): it bounds the share from above.
RECIPE = "name: timing\ninput: {paths: [\"*.jsonl\"]}\nstages:\n  - clean: {}\n"


def _run(directory: Path, clock, stride: int) -> tuple[float, float]:
    """(CPU-seconds of this process, the clean stage's cpu_s in stats.json)."""
    transforms.thread_time, transforms._SAMPLE_STRIDE = clock, stride
    start = time.process_time()
    stats = run_recipe(load_recipe(str(directory / "recipe.yaml")), str(directory / "out"), max_errors="0")
    return time.process_time() - start, stats.get("stage_time", {}).get("clean", {}).get("cpu_s", 0.0)


def _clock_cost(clock, n: int = 200000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        clock()
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    shipped, stride = transforms.thread_time, transforms._SAMPLE_STRIDE
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
        with open(directory / "in.jsonl", "w", encoding="utf-8") as fh:
            for i in range(args.docs):
                fh.write(json.dumps({"id": f"d{i}", "text": f"Short document {i}. It has two sentences."}) + "\n")
        runs: dict[str, list[tuple[float, float]]] = {"sampled": [], "exact": [], "untimed": []}
        for _ in range(args.repeat):
            runs["sampled"].append(_run(directory, shipped, stride))
            runs["exact"].append(_run(directory, shipped, 1))
            runs["untimed"].append(_run(directory, lambda: 0.0, stride))
        transforms.thread_time, transforms._SAMPLE_STRIDE = shipped, stride
    best = {k: min(r[0] for r in v) for k, v in runs.items()}
    stage = {k: sorted(r[1] for r in v)[len(v) // 2] for k, v in runs.items()}
    per_call = min(_clock_cost(shipped) for _ in range(3))
    result = {
        "docs": args.docs, "stride": stride,
        "cpu_s": {k: round(v, 3) for k, v in best.items()},
        "sampled_over_untimed": round(best["sampled"] / best["untimed"], 3),
        "exact_over_untimed": round(best["exact"] / best["untimed"], 3),
        "clean_cpu_s_sampled": round(stage["sampled"], 4), "clean_cpu_s_exact": round(stage["exact"], 4),
        "sampled_over_exact_estimate": round(stage["sampled"] / stage["exact"], 3),
        "thread_time_call_us": round(per_call * 1e6, 3),
    }
    print(f"{args.docs} docs, clean only, CPU-s of the run: sampled clock {result['cpu_s']['sampled']}, every "
          f"element {result['cpu_s']['exact']}, no clock {result['cpu_s']['untimed']}; clean's cpu_s sampled "
          f"{result['clean_cpu_s_sampled']} vs exact {result['clean_cpu_s_exact']}; "
          f"one thread_time() call {result['thread_time_call_us']} us")
    print(json.dumps(result))

if __name__ == "__main__":
    main()
