"""pipelines/pretrain.yaml on a generated corpus (default one million documents) on each runner.

    python benchmarks/million.py --docs 20000                      # a check: ~10–20 min on 2 busy cores
    python benchmarks/million.py --docs 1000000 --runners default  # the full size (hours; ~3 GB input)

The corpus comes from benchmarks/million_corpus.py (real text, varied by edits, with shares of other
languages, junk, exact and near duplicates) and is generated into --corpus-dir once per size.  Each
runner runs `dsdata run` in its own process tree, sampled every 0.5 s with psutil:

  default           Beam's in-process FnApiRunner (dsdata's default; the peer the ratios divide by)
  multiprocessing   --direct_running_mode=multi_processing --direct_num_workers=CORES
  prism             Beam's Prism runner (binary from .ci/engines-setup), in a loopback-only netns
  flink-1tm, flink  a real local Flink cluster (tests/local_flink.py, test tooling: JobManager + 1 or 2 one-slot
                    TaskManagers, SDK workers from dsdata's worker pool, all in a loopback-only netns),
                    submitted with FlinkRunner at parallelism 1 or 2; the cluster is started before and
                    stopped after the timed run; RSS covers every process in the namespace.  With
                    --cores-per-taskmanager K the cluster, its workers and the launcher are pinned to
                    K cores per TaskManager (sched_setaffinity, inherited by every process they start):
                    on a 2-core machine one unpinned TaskManager already keeps ~1.5 cores busy (its
                    JVM, the SDK worker and the job server overlap), so 2 vs 1 TaskManagers there
                    measures the machine, not Flink's scale-out; pinned, each TaskManager has one core.

With both Flink runners, the JSON also gives the machine's own two-process ceiling on the same
cores (benchmarks/filters.py's reference loop: one process alone, then two at once).

Per runner: finished (exit 0 within --timeout and under --max-rss-gb, ledger ok), wall seconds,
docs/s, docs/s per core (input documents / wall / cores of the machine), peak RSS of the largest
process and of the whole tree, the tree's RSS once a minute, per-stage counts (stats.json "stages")
and CPU seconds (stats.json "stage_time"), and whether
kept/rejected ids and stats equal the default runner's.
The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))  # the local Flink cluster is test tooling

from million_corpus import generate  # noqa: E402

from dsdata.beam.engines.artifacts import flink_job_server_jar  # noqa: E402
from local_flink import ClusterError, LocalFlinkCluster  # noqa: E402
from prism_binary import prism_binary  # noqa: E402

RECIPE = REPO / "pipelines" / "pretrain.yaml"


def runner_flags(name: str, cores: int) -> list[str] | None:
    if name == "default":
        return []
    if name == "multiprocessing":
        return ["--direct_running_mode=multi_processing", f"--direct_num_workers={cores}"]
    if name == "prism":
        prism = prism_binary()
        if prism is None or shutil.which("unshare") is None:
            return None
        # Beam 2.77's PortableRunner opens the job's state and message streams with a gRPC deadline of
        # --job_server_timeout (300 s by default): any job running longer fails with DEADLINE_EXCEEDED.
        return ["--runner=PrismRunner", f"--prism_location={prism}", "--environment_type=LOOPBACK",
                "--job_server_timeout=86400"]
    if name in FLINK_TASKMANAGERS:
        return []  # the cluster's own flags: see flink_cluster()
    raise SystemExit(f"million: error: unknown runner {name!r}")


# Flink runner names and their TaskManager counts (one slot each).
FLINK_TASKMANAGERS = {"flink-1tm": 1, "flink": 2}


def pinned_cores(taskmanagers: int, per_taskmanager: int) -> set[int] | None:
    """The first per_taskmanager × taskmanagers cores this process may use, or None (not pinned)."""
    if per_taskmanager <= 0:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    want = per_taskmanager * taskmanagers
    if want > len(allowed):
        raise ValueError(f"--cores-per-taskmanager {per_taskmanager} × {taskmanagers} TaskManagers needs "
                         f"{want} cores; this process may use {len(allowed)}")
    return set(allowed[:want])


class pinned:
    """Runs the block (and every process started in it) on `cores`; None leaves the affinity alone."""

    def __init__(self, cores: set[int] | None):
        self.cores, self.saved = cores, None

    def __enter__(self):
        if self.cores:
            self.saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.cores)
        return self

    def __exit__(self, *exc):
        if self.saved:
            os.sched_setaffinity(0, self.saved)


def _kill_each(procs) -> None:
    """Kill each process by PID; one already gone is skipped."""
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def run_monitored(cmd: list[str], timeout: float, env: dict, log_dir: Path, max_rss: float = float("inf"),
                  more_pids=lambda: []) -> dict:
    """Run cmd; sample its process tree's RSS every 0.5 s. Peak per process and of the whole tree,
    and the tree's RSS once a minute (how memory grows as the run goes).  The tree is killed (by PID)
    past `timeout` seconds or past `max_rss` bytes.  Output goes to files: a pipe nobody reads
    would stop an hours-long run once it fills.  more_pids() names processes outside the tree that the
    run uses (a Flink cluster's JVMs and SDK workers); they count in the peaks and the timeline."""
    start = time.time()
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "stdout.txt", "w") as out_fh, open(log_dir / "stderr.txt", "w") as err_fh:
        proc = subprocess.Popen(cmd, stdout=out_fh, stderr=err_fh, text=True, env=env, cwd=REPO)
    peak_by_pid: dict[int, int] = {}
    peak_tree = 0
    timeline: list[tuple[int, int]] = []  # (seconds since start, tree RSS in MiB), once a minute
    root = psutil.Process(proc.pid)
    timed_out = over_memory = False
    try:
        while proc.poll() is None:
            total = 0
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            tree = {p.pid for p in procs}
            for pid in more_pids():
                if pid not in tree:
                    try:
                        procs.append(psutil.Process(pid))
                    except psutil.NoSuchProcess:
                        pass
            for p in procs:
                try:
                    rss = p.memory_info().rss
                except psutil.NoSuchProcess:
                    continue
                total += rss
                peak_by_pid[p.pid] = max(peak_by_pid.get(p.pid, 0), rss)
            peak_tree = max(peak_tree, total)
            elapsed = time.time() - start
            if not timeline or elapsed - timeline[-1][0] >= 60:
                timeline.append((round(elapsed), round(total / 2**20)))
            over_memory = total > max_rss
            if elapsed > timeout or over_memory:
                timed_out = not over_memory
                _kill_each(reversed(procs[:len(tree)]))  # children first, then the CLI process
                break
            time.sleep(0.5)
    except BaseException:  # the benchmark itself stopped (Ctrl-C; SIGTERM, see main): take the run with it
        try:
            _kill_each(reversed([root] + root.children(recursive=True)))
        except psutil.NoSuchProcess:  # the CLI process is already gone
            pass
        raise
    proc.wait()
    return {"rc": proc.returncode, "timed_out": timed_out, "over_memory": over_memory,
            "wall_s": round(time.time() - start, 1),
            "peak_rss_max_process_mb": round(max(peak_by_pid.values(), default=0) / 2**20),
            "peak_rss_tree_mb": round(peak_tree / 2**20), "processes": len(peak_by_pid),
            "rss_tree_mb_by_minute": timeline,
            "stderr": (log_dir / "stderr.txt").read_text(errors="replace")}


def outputs_digest(out: Path) -> dict:
    ids = {}
    for kind in ("kept", "rejected"):
        rows = []
        for f in sorted((out / kind).glob("*.parquet")):
            rows.extend(pq.read_table(f, columns=["id"]).column("id").to_pylist())
        ids[kind] = sorted(rows)
    stats = json.loads((out / "stats.json").read_text())
    stats.pop("seconds", None)
    stats.pop("stage_time", None)  # CPU seconds: timing, not output
    manifest = out / "shards" / "manifest.json"
    shards = sorted((s["file"], s["sha256"]) for s in json.loads(manifest.read_text())["shards"]) \
        if manifest.is_file() else None
    difficulty = out / "difficulty.json"
    return {"ids": ids, "stats": stats, "shards": shards,
            "difficulty": json.loads(difficulty.read_text()) if difficulty.is_file() else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--runners", default="default,multiprocessing,prism")
    parser.add_argument("--corpus-dir", type=Path, default=None,
                        help="where the corpus is generated (default: a temporary directory)")
    parser.add_argument("--work-dir", type=Path, default=None, help="outputs (default: temporary)")
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per runner")
    parser.add_argument("--max-rss-gb", type=float, default=20.0,
                        help="stop a runner whose process tree passes this (the machine's memory is finite)")
    parser.add_argument("--cores-per-taskmanager", type=int, default=0,
                        help="pin each Flink run to this many cores per TaskManager (0: not pinned)")
    parser.add_argument("--reuse", action="store_true",
                        help="take a runner's result from --work-dir when an earlier invocation finished it")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so a stopped benchmark stops its run and its Flink cluster too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    tmp = Path(tempfile.mkdtemp(prefix="dsdata-million-"))
    corpus = args.corpus_dir or tmp / "corpus"
    work = args.work_dir or tmp / "work"
    summary_path = corpus / "corpus.json"
    if summary_path.is_file() and json.loads(summary_path.read_text())["docs"] == args.docs:
        corpus_summary = json.loads(summary_path.read_text())
    else:
        corpus_summary = generate(corpus, args.docs)
    print(json.dumps({"corpus": corpus_summary}), flush=True)

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    results: dict[str, dict] = {}
    digests: dict[str, dict] = {}  # finished runners' outputs, compared with the default's at the end
    for name in [r for r in args.runners.split(",") if r]:
        out = work / name
        saved = work / f"{name}.result.json"
        if args.reuse and saved.is_file() and (out / "stats.json").is_file():
            # A finished runner's result from an earlier invocation on the same corpus and work dir.
            results[name] = json.loads(saved.read_text())
            digests[name] = outputs_digest(out)
            print(json.dumps({name: results[name], "reused": True}), flush=True)
            continue
        flags = runner_flags(name, args.cores)
        if flags is None:
            results[name] = {"finished": False, "skipped": "no prism binary or no unshare (run .ci/engines-setup)"}
            continue
        cli = [sys.executable, "-m", "dsdata.cli", "run", str(RECIPE), "--input", str(corpus / "part-*.jsonl"),
               "--output", str(out), "--quiet", *flags]
        if name == "prism":
            # Prism listens on every interface; a network namespace with only loopback keeps it local.
            cli = ["unshare", "-n", "sh", "-c", "ip link set lo up && exec " + shlex.join(cli)]
        if name in FLINK_TASKMANAGERS:
            jar = flink_job_server_jar()
            if jar is None:
                results[name] = {"finished": False, "skipped": "no Flink job-server jar (run .ci/engines-setup)"}
                continue
            cores = pinned_cores(FLINK_TASKMANAGERS[name], args.cores_per_taskmanager)
            try:
                with pinned(cores), LocalFlinkCluster(work / f"{name}-cluster",
                                                      taskmanagers=FLINK_TASKMANAGERS[name]) as cluster:
                    run = run_monitored(cluster.nsenter(cli + cluster.dsdata_run_args(jar)), args.timeout,
                                        dict(cluster.job_server_env(), PYTHONPATH=env["PYTHONPATH"]),
                                        work / f"{name}-logs", args.max_rss_gb * 2**30, cluster.namespace_pids)
            except (ClusterError, ValueError) as exc:
                results[name] = {"finished": False, "skipped": str(exc)}
                continue
        else:
            run = run_monitored(cli, args.timeout, env, work / f"{name}-logs", args.max_rss_gb * 2**30)
        finished = run["rc"] == 0 and not run["timed_out"] and not run["over_memory"]
        result = {k: run[k] for k in ("wall_s", "peak_rss_max_process_mb", "peak_rss_tree_mb", "processes",
                                      "rss_tree_mb_by_minute")}
        result["finished"] = finished
        if name in FLINK_TASKMANAGERS:
            result["pinned_cores"] = sorted(cores) if cores else None
        if not finished:
            result["error"] = ("timed out" if run["timed_out"] else
                               f"stopped: process tree over {args.max_rss_gb} GB" if run["over_memory"] else
                               run["stderr"].strip().splitlines()[-1:])
        else:
            stats = json.loads((out / "stats.json").read_text())
            result["docs_per_s"] = round(stats["input"] / run["wall_s"], 1)
            result["docs_per_s_per_core"] = round(stats["input"] / run["wall_s"] / args.cores, 1)
            result["kept"], result["rejected"] = stats["kept"], stats["rejected_total"]
            result["stages_kept_after"] = {s: v["kept_after"] for s, v in stats["stages"].items()}
            result["stage_cpu_s"] = {s: v.get("cpu_s") for s, v in (stats.get("stage_time") or {}).items()}
            digests[name] = outputs_digest(out)
        results[name] = result
        saved.write_text(json.dumps(result))
        print(json.dumps({name: result}), flush=True)

    # Kept and rejected ids, stats.json, shard hashes and difficulty.json against the default runner's,
    # whichever order the runners ran in (or an earlier invocation ran them, with --reuse).
    for name, digest in digests.items():
        if name != "default" and "default" in digests:
            results[name]["same_outputs_as_default"] = digest == digests["default"]
    base = results.get("default", {})
    ratios = {}
    for name, r in results.items():
        if name != "default" and r.get("finished") and base.get("finished"):
            ratios[name] = {"wall_vs_default": round(r["wall_s"] / base["wall_s"], 2),
                            "peak_tree_vs_default": round(r["peak_rss_tree_mb"] / base["peak_rss_tree_mb"], 2)}
    one, two = results.get("flink-1tm", {}), results.get("flink", {})
    if one.get("finished") and two.get("finished"):
        ratios["flink_2tm_speedup_over_1tm"] = round(one["wall_s"] / two["wall_s"], 2)
        if one.get("pinned_cores") != two.get("pinned_cores"):
            ratios["flink_pinned_cores"] = {"flink-1tm": one.get("pinned_cores"), "flink": two.get("pinned_cores")}
        # The same cores' ceiling for two processes of pure Python (filters.py --scaling's reference).
        from filters import machine_two_vs_one

        with pinned(pinned_cores(2, args.cores_per_taskmanager)):
            ceiling = machine_two_vs_one(next(corpus.glob("part-*.jsonl")), 4)[2]
        ratios["machine_two_process_ceiling"] = round(ceiling, 2)
    if args.corpus_dir is None and args.work_dir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"benchmark": "million", "docs": args.docs, "bytes": corpus_summary["bytes"],
                      "cores": args.cores, "runners": results, "ratios": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
