"""`dsdata run --resume` against an uninterrupted run: pipelines/pretrain.yaml on N generated documents.

    python benchmarks/resume.py --docs 5000              # a check (minutes on 2 busy cores)
    python benchmarks/resume.py --docs 100000            # the issue's size

The corpus comes from benchmarks/million_corpus.py (real text with other languages, junk, exact and
near duplicates), cut into --files files.  Three `dsdata run` processes on the default runner, one
after the other, each timed by the CPU seconds (user + system) the kernel reports for it (wait4):

  uninterrupted   the recipe on the whole corpus
  killed          the same into another OUT, SIGKILLed once --kill-at of the input files are committed
                  (the units OUT/resume/units/*.json markers list, polled every 20 ms)
  resumed         `dsdata run … --resume` into that OUT

The issue's goal: the resumed run spends at most 75 % of the uninterrupted run's CPU (it reruns the
whole-corpus stages — dedup, difficulty, tokenize, shards — over everything, but not the per-document
stages of the committed files).  Also printed: killed + resumed against uninterrupted (what the kill
cost in all), and whether every output is identical (kept/rejected rows, stats.json without timing,
difficulty.json, every shard file byte for byte).  With --rounds N the three runs are repeated and
the ratios are medians: CPU time on a shared machine drifts by ±15 % between runs.  The last line
printed is one JSON object.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from million_corpus import generate  # noqa: E402

RECIPE = REPO / "pipelines" / "pretrain.yaml"


def run_timed(args: list[str], log: Path, kill_when=None) -> dict:
    """One `dsdata run` process: its exit status, wall and CPU seconds (itself and what it waited for).
    kill_when(): polled every 20 ms; when true the process is SIGKILLed."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    start = time.time()
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "dsdata.cli", "run", *args], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
        killed = False
        if kill_when is not None:
            while proc.poll() is None:
                if kill_when():
                    os.kill(proc.pid, signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.02)
        # wait4, not Popen.wait: the kernel's account of the child's CPU time (a killed one too).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "killed": killed, "wall_s": round(time.time() - start, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2)}


def outputs(out: Path) -> dict:
    """What must be identical: kept/rejected rows (sorted), stats.json without timing and the
    resume section, difficulty.json, and every shard file's sha256."""
    rows = {}
    for kind in ("kept", "rejected"):
        table = []
        for f in sorted((out / kind).glob("*.parquet")):
            table.extend(pq.read_table(f).to_pylist())
        rows[kind] = sorted(json.dumps(r, sort_keys=True, default=str) for r in table)
    stats = json.loads((out / "stats.json").read_text())
    for key in ("seconds", "stage_time", "stage_time_unavailable", "resume"):
        stats.pop(key, None)
    shards = {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in sorted((out / "shards").rglob("*")) if p.is_file()}
    return {"rows": rows, "stats": stats, "difficulty": (out / "difficulty.json").read_text(), "shards": shards}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=20, help="input files the corpus is cut into (the units)")
    parser.add_argument("--kill-at", type=float, default=0.6, help="share of the input files committed at the kill")
    parser.add_argument("--corpus-dir", type=Path, default=None, help="generated once per size (default: temporary)")
    parser.add_argument("--work-dir", type=Path, default=None, help="the runs' outputs (default: temporary)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the three runs; the ratios are medians (CPU time drifts on a shared machine)")
    args = parser.parse_args(argv)

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="dsdata-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus_dir or work / "corpus"
    per_file = math.ceil(args.docs / args.files)
    summary = corpus / "corpus.json"  # million_corpus's own summary: the corpus is reused when it matches
    wanted = {"docs": args.docs, "files": math.ceil(args.docs / per_file)}
    if not summary.is_file() or {k: json.loads(summary.read_text()).get(k) for k in wanted} != wanted:
        generate(corpus, args.docs, docs_per_file=per_file)
    files = len(glob.glob(str(corpus / "*.jsonl")))
    inputs = ["--input", str(corpus / "*.jsonl"), "--quiet", "--progress=off"]
    target = max(1, round(args.kill_at * files))
    rounds = []
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}: {args.docs} documents in {files} files; SIGKILL once {target} "
              "are committed", file=sys.stderr)
        rounds.append(one_round(work, inputs, target))
        print(f"  {json.dumps(rounds[-1])}", file=sys.stderr)

    def median(values):
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 3) if present else None

    identical = all(r["outputs_identical"] for r in rounds)
    ratio = median([r["resumed_vs_uninterrupted_cpu"] for r in rounds])
    result = {
        "benchmark": "resume", "docs": args.docs, "files": files, "kill_at": args.kill_at,
        "rounds": len(rounds),
        "cpu_s": {k: median([r["cpu_s"][k] for r in rounds]) for k in ("uninterrupted", "killed", "resumed")},
        "resumed_vs_uninterrupted_cpu": ratio,
        "resumed_vs_uninterrupted_cpu_rounds": [r["resumed_vs_uninterrupted_cpu"] for r in rounds],
        "killed_plus_resumed_vs_uninterrupted_cpu": median([r["killed_plus_resumed_vs_uninterrupted_cpu"]
                                                            for r in rounds]),
        "goal_met": bool(identical and ratio is not None and ratio <= 0.75), "outputs_identical": identical,
        "committed_at_kill": [r["committed_at_kill"] for r in rounds], "reused": rounds[-1]["reused"],
        "wall_s": rounds[-1]["wall_s"], "exit_codes": rounds[-1]["exit_codes"],
    }
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    return 0 if identical else 1


def committed_units(out: Path) -> int:
    """Units listed in OUT's commit markers (each marker lists one commit group's)."""
    count = 0
    for marker in glob.glob(str(out / "resume" / "units" / "*.json")):
        try:
            count += len(json.loads(Path(marker).read_text())["units"])
        except (OSError, ValueError, KeyError):  # being renamed into place this instant
            pass
    return count


def one_round(work: Path, inputs: list[str], target: int) -> dict:
    """Uninterrupted, killed once `target` units are committed, resumed: CPU, ratios, identical outputs."""
    full, resumed = work / "uninterrupted", work / "resumed"
    for out in (full, resumed):
        shutil.rmtree(out, ignore_errors=True)
    first = run_timed([str(RECIPE), *inputs, "--output", str(full)], work / "uninterrupted.log")
    killed = run_timed([str(RECIPE), *inputs, "--output", str(resumed)], work / "killed.log",
                       kill_when=lambda: committed_units(resumed) >= target)
    committed = committed_units(resumed)
    second = run_timed([str(RECIPE), *inputs, "--output", str(resumed), "--resume"], work / "resumed.log")
    ok = first["rc"] == 0 and second["rc"] == 0 and killed["killed"]
    identical = ok and outputs(full) == outputs(resumed)
    reuse = json.loads((resumed / "stats.json").read_text()).get("resume") if second["rc"] == 0 else None
    return {
        "committed_at_kill": committed,
        "cpu_s": {"uninterrupted": first["cpu_s"], "killed": killed["cpu_s"], "resumed": second["cpu_s"]},
        "wall_s": {"uninterrupted": first["wall_s"], "killed": killed["wall_s"], "resumed": second["wall_s"]},
        "resumed_vs_uninterrupted_cpu": round(second["cpu_s"] / first["cpu_s"], 3) if first["cpu_s"] else None,
        "killed_plus_resumed_vs_uninterrupted_cpu":
            round((killed["cpu_s"] + second["cpu_s"]) / first["cpu_s"], 3) if first["cpu_s"] else None,
        "outputs_identical": identical, "reused": reuse, "exit_codes": [first["rc"], killed["rc"], second["rc"]],
    }


if __name__ == "__main__":
    sys.exit(main())
