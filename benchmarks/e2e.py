#!/usr/bin/env python3
"""The whole pipeline beside datatrove: a generated en+zh corpus through language ID, the quality
rules and near-duplicate removal, each tool run as one process tree at a time, interleaved.

  dsdata     `python -m dsdata.cli run` on a recipe of lang (fastText, keep zh+en) → rules → dedup
             (threshold 0.8); --workers 2 adds --direct_running_mode=multi_processing
             --direct_num_workers=2
  datatrove  JsonlReader → LanguageFilter(en, zh) → GopherRepetitionFilter → GopherQualityFilter →
             C4QualityFilter → FineWebQualityFilter → JsonlWriter (the filtered documents) →
             MinhashDedupSignature, then MinhashDedupBuckets, MinhashDedupCluster, and
             JsonlReader → MinhashDedupFilter → JsonlWriter: datatrove's own four-step MinHash
             recipe at its defaults, LocalPipelineExecutor, `--workers` tasks and workers (the
             buckets step one task per bucket; workers forked, so that they inherit the model path),
             in the peers' venv (benchmarks/peer_venv.py), with the same local lid.176.ftz as dsdata

Corpus: benchmarks/million_corpus.py (--docs, default 20,000; prose in en and zh, other languages,
off-topic, junk, exact and near duplicates).  A kept document's language is its source's (a
duplicate takes its original's), so kept counts per language compare like with like.

Per run: CPU seconds of the whole process tree (RUSAGE_CHILDREN of the parent, which only runs
that child), wall seconds, and memory sampled from /proc every 50 ms: the peak of the tree's summed
RSS and the largest single process's peak (its VmHWM).  --repeat rounds, interleaved; medians.

Then the full pipelines/pretrain.yaml (clean, lang, rules, decontaminate, relevance, dedup, pii,
difficulty, tokenize, shards) on the same corpus, in-process: its CPU split between stage work (the
stages' own CPU, stats.json "stage_time") and everything else in the tree (start-up, reading, Beam,
Parquet, spill, the ledger), and the fixed part of the latter apart (start-up: the CPU that is not
stage work of the same run on the corpus's first 20 documents) — `--no-pretrain` skips it.

usage: python benchmarks/e2e.py [--docs 20000] [--repeat 1] [--workers 1|2] [--no-pretrain]
Last line: one JSON object of the ratios (dsdata ÷ datatrove).  CPU time, not wall time: the
machine may be shared, so compare ratios of runs made in one invocation.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import million_corpus  # noqa: E402
import peer_venv  # noqa: E402

STARTUP_DOCS = 20
RECIPE = ("name: e2e\ninput: {paths: [\"*.jsonl\"]}\nstages:\n"
          "  - lang: {backend: fasttext, keep: [zh, en]}\n  - rules: {}\n  - dedup: {threshold: 0.8}\n")

DATATROVE_RUN = r"""
import glob, json, os, sys
from datatrove.executor.local import LocalPipelineExecutor
from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                              MinhashDedupFilter, MinhashDedupSignature)
from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                        GopherRepetitionFilter, LanguageFilter)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
import datatrove.utils.lid

corpus, work, model_path, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
# The same local lid.176.ftz as dsdata, never a download.
datatrove.utils.lid.cached_asset_path_or_download = lambda *args, **kwargs: model_path
config = MinhashConfig()
def run(pipeline, name, tasks):
    # fork, not datatrove's default forkserver, so that the workers inherit the local model path above
    LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(workers, tasks), start_method="fork",
                          logging_dir=os.path.join(work, "logs", name)).run()
run([JsonlReader(corpus, glob_pattern="*.jsonl"), LanguageFilter(languages=["en", "zh"]),
     GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(), FineWebQualityFilter(),
     JsonlWriter(os.path.join(work, "filtered"), compression=None),
     MinhashDedupSignature(output_folder=os.path.join(work, "sigs"), config=config)], "signatures", workers)
run([MinhashDedupBuckets(input_folder=os.path.join(work, "sigs"), output_folder=os.path.join(work, "buckets"),
                         config=config)], "buckets", config.num_buckets)
run([MinhashDedupCluster(input_folder=os.path.join(work, "buckets"), output_folder=os.path.join(work, "remove"),
                         config=config)], "cluster", 1)
run([JsonlReader(os.path.join(work, "filtered"), glob_pattern="*.jsonl"),
     MinhashDedupFilter(input_folder=os.path.join(work, "remove")),
     JsonlWriter(os.path.join(work, "kept"), compression=None)], "filter", workers)
kept = []
for path in sorted(glob.glob(os.path.join(work, "kept", "*.jsonl"))):
    with open(path, encoding="utf-8") as fh:
        kept += [json.loads(line)["id"] for line in fh]
print(json.dumps({"kept_ids": kept}))
"""


# ---------------------------------------------------------------------------------------- measuring
def _proc_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _memory_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of one process in kB; (0, 0) once it is gone."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith(b"VmHWM:"):
                    hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


def run_tree(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, dict]:
    """Run one child to the end; its tree's CPU seconds, wall seconds and peak memory."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    peak = {"tree_kb": 0, "largest_kb": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            total = 0
            for pid in _proc_tree(child.pid):
                rss, hwm = _memory_kb(pid)
                total += rss
                peak["largest_kb"] = max(peak["largest_kb"], hwm, rss)
            peak["tree_kb"] = max(peak["tree_kb"], total)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = child.communicate()
    done.set()
    sampler.join()
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.CompletedProcess(cmd, child.returncode, stdout, stderr)
    if child.returncode:
        raise RuntimeError(f"{' '.join(str(c) for c in cmd[:5] if chr(10) not in str(c))} … failed "
                           f"({child.returncode}):\n{stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, {"cpu_s": cpu, "wall_s": wall, "tree_mb": peak["tree_kb"] / 1024,
                  "largest_mb": peak["largest_kb"] / 1024}


# ---------------------------------------------------------------------------------------- the runs
def beam_workers(workers: int) -> list[str]:
    return [] if workers == 1 else ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]


def run_dsdata(recipe: Path, corpus: Path, out: Path, model: str, workers: int) -> tuple[set[str], dict, dict]:
    """(kept ids, measurements, stats.json)."""
    import pyarrow.parquet as pq

    _, measured = run_tree(
        [sys.executable, "-m", "dsdata.cli", "run", str(recipe), "--input", str(corpus / "*.jsonl"),
         "--output", str(out), "--set", f"lang.model={model}", "--quiet", *beam_workers(workers)],
        cwd=str(REPO), env=peer_venv.dsdata_env())
    kept = set()
    for part in sorted((out / "kept").glob("*.parquet")):
        kept.update(pq.read_table(part, columns=["id"]).column("id").to_pylist())
    return kept, measured, json.loads((out / "stats.json").read_text(encoding="utf-8"))


def run_datatrove(py: Path, corpus: Path, work: Path, model: str, workers: int) -> tuple[set[str], dict]:
    proc, measured = run_tree([str(py), "-c", DATATROVE_RUN, str(corpus), str(work), model, str(workers)],
                              env={**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1"})
    return set(peer_venv.last_json(proc.stdout)["kept_ids"]), measured


def languages(corpus: Path) -> dict[str, str]:
    """id → en / zh / other: a prose document's language, a duplicate's original's, else other."""
    source: dict[str, str] = {}
    for path in sorted(corpus.glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                source[rec["id"]] = rec["source"]
    lang = {}
    for doc_id, src in source.items():
        if src.startswith(("dup-of:", "near-dup-of:")):
            src = source.get(src.split(":", 1)[1], "")
        lang[doc_id] = {"prose-en": "en", "prose-zh": "zh"}.get(src, "other")
    return lang


def by_lang(kept: set[str], lang: dict[str, str]) -> dict[str, int]:
    counts = Counter(lang[i] for i in kept)
    return {k: counts.get(k, 0) for k in ("en", "zh", "other")}


def stage_split(stats: dict, tree_cpu: float) -> dict:
    """Stage work (stats.json stage_time) against the process tree's CPU."""
    stages = {name: round(row["cpu_s"], 3) for name, row in (stats.get("stage_time") or {}).items()}
    work = sum(stages.values())
    return {"stage_cpu_s": stages, "stage_work_s": round(work, 2), "tree_cpu_s": round(tree_cpu, 2),
            "other_s": round(tree_cpu - work, 2), "stage_work_fraction": round(work / tree_cpu, 3)}


def median_row(rows: list[dict], docs: int) -> dict:
    row = {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}
    row["docs_per_cpu_s"] = round(docs / row["cpu_s"], 1)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds of each tool (medians)")
    ap.add_argument("--workers", type=int, default=1, choices=(1, 2), help="workers on each side")
    ap.add_argument("--no-pretrain", action="store_true", help="skip the full pipelines/pretrain.yaml run")
    args = ap.parse_args(argv)
    if not (million_corpus.DATA / "prose-en.txt").is_file():
        print(f"e2e: error: shared dev data not found at {million_corpus.DATA}", file=sys.stderr)
        return 2
    from dsdata.stages.lang import default_fasttext_model

    model = default_fasttext_model()
    py = peer_venv.python()
    with tempfile.TemporaryDirectory(prefix="dsdata-e2e-") as tmp:
        work = Path(tmp)
        corpus = work / "corpus"
        summary = million_corpus.generate(corpus, args.docs)
        lang = languages(corpus)
        print(f"{args.docs} documents ({summary['bytes'] / 1e6:.1f} MB, {summary['kinds']}); "
              f"{args.workers} worker(s) each; LID model {model}")
        recipe = work / "e2e.yaml"
        recipe.write_text(RECIPE, encoding="utf-8")
        rows: dict[str, list[dict]] = {"dsdata": [], "datatrove": []}
        kept: dict[str, set[str]] = {}
        stats = {}
        for round_no in range(max(1, args.repeat)):
            kept["dsdata"], measured, stats = run_dsdata(recipe, corpus, work / f"ds-{round_no}", model, args.workers)
            rows["dsdata"].append(measured)
            kept["datatrove"], measured = run_datatrove(py, corpus, work / f"dt-{round_no}", model, args.workers)
            rows["datatrove"].append(measured)
            print(f"round {round_no + 1}: " + ", ".join(
                f"{name} {r[-1]['cpu_s']:.1f} CPU-s, {r[-1]['wall_s']:.1f} s wall, tree {r[-1]['tree_mb']:.0f} MB, "
                f"largest process {r[-1]['largest_mb']:.0f} MB" for name, r in rows.items()))
        results = {name: median_row(r, args.docs) | {"kept": len(kept[name]), "kept_by_lang": by_lang(kept[name], lang)}
                   for name, r in rows.items()}
        results["dsdata"]["split"] = stage_split(stats, results["dsdata"]["cpu_s"])
        pretrain = None
        if not args.no_pretrain:
            _, measured, pstats = run_dsdata(REPO / "pipelines" / "pretrain.yaml", corpus, work / "pretrain", model, 1)
            pretrain = {"cpu_s": round(measured["cpu_s"], 2), "docs_per_cpu_s": round(args.docs / measured["cpu_s"], 1),
                        "tree_mb": round(measured["tree_mb"]), "kept": pstats.get("kept"),
                        "split": stage_split(pstats, measured["cpu_s"])}
            # The fixed start-up apart: the same recipe on the corpus's first STARTUP_DOCS documents.
            (work / "tiny").mkdir()
            with open(next(corpus.glob("*.jsonl")), encoding="utf-8") as fh:
                (work / "tiny" / "part.jsonl").write_text("".join(next(fh) for _ in range(STARTUP_DOCS)), encoding="utf-8")
            _, tiny, tstats = run_dsdata(REPO / "pipelines" / "pretrain.yaml", work / "tiny", work / "tiny-out", model, 1)
            fixed = tiny["cpu_s"] - stage_split(tstats, tiny["cpu_s"])["stage_work_s"]
            pretrain["startup_cpu_s"] = round(fixed, 2)
            pretrain["other_ms_per_doc"] = round(1000 * (pretrain["split"]["other_s"] - fixed) / args.docs, 3)

    ours, peer = results["dsdata"], results["datatrove"]
    ratio = {"docs_per_cpu_s": round(ours["docs_per_cpu_s"] / peer["docs_per_cpu_s"], 2),
             "tree_rss": round(ours["tree_mb"] / peer["tree_mb"], 2),
             "largest_process_rss": round(ours["largest_mb"] / peer["largest_mb"], 2),
             "stage_work_fraction": ours["split"]["stage_work_fraction"]}
    if pretrain:
        ratio["pretrain_docs_per_cpu_s"] = pretrain["docs_per_cpu_s"]
        ratio["pretrain_stage_work_fraction"] = pretrain["split"]["stage_work_fraction"]
    print(f"{'':>10} {'CPU-s':>8} {'docs/CPU-s':>11} {'wall s':>8} {'tree MB':>8} {'largest MB':>11}  kept (en / zh / other)")
    for name, r in results.items():
        k = r["kept_by_lang"]
        print(f"{name:>10} {r['cpu_s']:8.2f} {r['docs_per_cpu_s']:11.1f} {r['wall_s']:8.1f} {r['tree_mb']:8.0f} "
              f"{r['largest_mb']:11.0f}  {r['kept']} ({k['en']} / {k['zh']} / {k['other']})")
    split = ours["split"]
    print(f"dsdata lang → rules → dedup: stage work {split['stage_work_s']} of {split['tree_cpu_s']} CPU-s "
          f"({split['stage_work_fraction']:.0%}); per stage {split['stage_cpu_s']}")
    if pretrain:
        ps = pretrain["split"]
        print(f"pretrain.yaml: {pretrain['docs_per_cpu_s']} docs/CPU-s, stage work {ps['stage_work_s']} of "
              f"{ps['tree_cpu_s']} CPU-s ({ps['stage_work_fraction']:.0%}); per stage {ps['stage_cpu_s']}; "
              f"start-up (not stage work on {STARTUP_DOCS} documents) {pretrain['startup_cpu_s']} CPU-s, "
              f"the rest {pretrain['other_ms_per_doc']} ms per document")
    print(f"dsdata ÷ datatrove: {ratio['docs_per_cpu_s']}x docs per CPU-second, peak RSS {ratio['tree_rss']}x "
          f"(tree) and {ratio['largest_process_rss']}x (largest process)")
    print(json.dumps({"benchmark": "e2e", "docs": args.docs, "workers": args.workers, "repeat": args.repeat,
                      "results": results, "pretrain": pretrain, "ratio": ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
