#!/usr/bin/env python3
"""Quality filters end to end: `dsdata run` (lang + rules) side by side with datatrove on the same
real en+zh documents, with the language-ID model loaded from the same local lid.176.ftz file.

  dsdata     lang (fastText, keep zh+en, min_score 0.5) → rules (C4 + Gopher quality/repetition
             + FineWeb, CJK-aware)                        — `python3 -m dsdata.cli run`, 1 worker
  datatrove  JsonlReader → LanguageFilter(en, zh) → GopherRepetitionFilter → GopherQualityFilter
             → C4QualityFilter → FineWebQualityFilter → JsonlWriter (defaults; the same rule
             families as dsdata's rules stage) — LocalPipelineExecutor, 1 task, in the peers' venv
             (benchmarks/peer_venv.py); --without-fineweb adds a run of the same chain without
             FineWebQualityFilter (the chain issue 15 first measured)

Documents: pipelines/samples/docs.jsonl (178 real articles, many languages) and the documents of
../shared/data/prose-en.txt and prose-zh.txt (blank-line separated; 5,528), 12 MB in all.  Both
tools run as child processes (dsdata's bytecode cached, as an installed copy has it:
peer_venv.dsdata_env), interleaved, --repeat times; the figures are medians.  CPU seconds
are the child's user+sys (RUSAGE_CHILDREN), so docs per CPU-second is the per-core throughput on
a shared machine where wall time measures the neighbours.  Then dsdata's stages are timed
in-process (each stage class's process()/process_batch() on the documents that reach it) for a
per-stage breakdown; what is left of the end-to-end CPU time is start-up, reading, Beam and Parquet.

--scaling also runs dsdata under --direct_running_mode=multi_processing with 1 and with 2 workers
(issue 15 item 3): the ratio of their wall times, and the kept ids must be the same.  The same two
runs on a one-document input give each one's fixed cost (Beam's import, pipeline construction,
worker start-up, the report), so the JSON also says how the work beyond that scales.
--scaling-copies K runs the scaling pair on the documents K times over (new ids, K files): a
larger input, where the fixed cost weighs less.  Each round also measures the machine itself: a
fixed CPU-bound loop (regex words and counts over the same texts, no dsdata) in one child, then in
two children at once.  On a shared virtual machine two busy processes can each run slower than one
(steal time, a neighbour on the other hyperthread), so `machine_two_vs_one_wall` is what any
program's 2 workers could reach in that round, and `two_workers_share_of_machine` is dsdata's ratio
over it.

usage: python3 benchmarks/filters.py [--repeat 1] [--limit N] [--without-fineweb] [--scaling [--scaling-copies K]]
Last line: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import peer_venv  # noqa: E402

SHARED = REPO.parent / "shared" / "data"

DATATROVE_RUN = r"""
import json, sys, time
from datatrove.executor.local import LocalPipelineExecutor
from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                        GopherRepetitionFilter, LanguageFilter)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
import datatrove.utils.lid

data_dir, out_dir, log_dir, model_path, with_fineweb = sys.argv[1:6]
# The same local lid.176.ftz as dsdata, never a download (the executor deep-copies the pipeline,
# so the model is handed over by path, where datatrove would fetch it).
datatrove.utils.lid.cached_asset_path_or_download = lambda *args, **kwargs: model_path
lid = LanguageFilter(languages=["en", "zh"])
executor = LocalPipelineExecutor(
    pipeline=[JsonlReader(data_dir, glob_pattern="docs.jsonl"), lid, GopherRepetitionFilter(),
              GopherQualityFilter(), C4QualityFilter()] + ([FineWebQualityFilter()] if with_fineweb == "1" else [])
             + [JsonlWriter(out_dir, compression=None)],
    tasks=1, workers=1, logging_dir=log_dir)
executor.run()
import glob, os
kept = []
for path in glob.glob(out_dir + "/*.jsonl"):
    with open(path, encoding="utf-8") as fh:
        kept += [json.loads(line)["id"] for line in fh]
steps = {}  # datatrove's own per-step wall seconds (its stats.json)
try:
    with open(os.path.join(log_dir, "stats.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    for step in data if isinstance(data, list) else data.get("stats", []):
        name = "".join(ch for ch in step["name"] if ch.isascii()).replace(" - ", " ").strip(" -")
        steps[" ".join(name.split())] = round(step["time_stats"]["total"], 3)
except (OSError, KeyError, TypeError, ValueError):
    pass
print(json.dumps({"kept_ids": kept, "steps_s": steps}))
"""


def documents(limit: int) -> list[dict]:
    """{"id", "text", "lang"} records: the samples, then prose-en and prose-zh documents."""
    docs = []
    with open(REPO / "pipelines" / "samples" / "docs.jsonl", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            docs.append({"id": rec["id"], "text": rec["text"], "lang": rec.get("lang_label", "")})
    for name, lang in (("prose-en.txt", "en"), ("prose-zh.txt", "zh")):
        parts = [p for p in (SHARED / name).read_text(encoding="utf-8").split("\n\n") if p.strip()]
        docs += [{"id": f"{name}#{i}", "text": p, "lang": lang} for i, p in enumerate(parts)]
    return docs[:limit] if limit else docs


def lid_model() -> str:
    from dsdata.stages.lang import default_fasttext_model

    return default_fasttext_model()


MULTI_PROCESSING = ["--direct_running_mode=multi_processing"]

# The machine's own two-process ceiling: the same CPU-bound work (words and their counts over the
# benchmark's texts, pure CPython and its regex engine, no I/O) in one child, then in two at once.
MACHINE_LOOP = r"""
import collections, re, sys, time
text = open(sys.argv[1], encoding="utf-8").read()
words = re.compile(r"\w+")
cpu = time.process_time()
for _ in range(int(sys.argv[2])):
    collections.Counter(words.findall(text))
print(round(time.process_time() - cpu, 3))
"""


def machine_two_vs_one(text_path: Path, passes: int) -> tuple[float, float, float]:
    """Wall seconds of the loop alone, of two loops at once, and 2 × the first ÷ the second."""
    cmd = [sys.executable, "-c", MACHINE_LOOP, str(text_path), str(passes)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    alone = time.perf_counter() - start
    start = time.perf_counter()
    pair = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL) for _ in range(2)]
    if any(child.wait() for child in pair):
        raise RuntimeError("the machine reference loop failed")
    together = time.perf_counter() - start
    return alone, together, 2 * alone / together


def run_dsdata(work: Path, model: str, beam_args: tuple[str, ...] = (),
               inputs: str = "docs.jsonl") -> tuple[set[str], float, float]:
    recipe = work / "filters.yaml"
    out = work / "dsdata-out"
    proc, cpu, wall = peer_venv.timed_child(
        [sys.executable, "-m", "dsdata.cli", "run", str(recipe), "--input", str(work / inputs),
         "--output", str(out), "--set", f"lang.model={model}", "--quiet", *beam_args],
        cwd=str(REPO), env=peer_venv.dsdata_env(),
    )
    import pyarrow.parquet as pq

    kept = set()
    for part in sorted((out / "kept").glob("*.parquet")):
        kept.update(pq.read_table(part, columns=["id"]).column("id").to_pylist())
    return kept, cpu, wall


def run_datatrove(py: Path, work: Path, model: str, run_name: str, fineweb: bool = True) -> tuple[set[str], float, float, dict]:
    out, logs = work / f"dt-out-{run_name}", work / f"dt-logs-{run_name}"
    proc, cpu, wall = peer_venv.timed_child(
        [str(py), "-c", DATATROVE_RUN, str(work), str(out), str(logs), model, "1" if fineweb else "0"],
        env={**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1"},
    )
    result = peer_venv.last_json(proc.stdout)
    return set(result["kept_ids"]), cpu, wall, result["steps_s"]


def stage_breakdown(recs: list[dict], model: str) -> dict[str, dict]:
    """CPU seconds and docs/CPU-s of each dsdata stage, called directly on the documents that reach it."""
    from dsdata.document import Document, Rejected
    from dsdata.stages.lang import LanguageStage
    from dsdata.stages.rules import QualityRulesStage

    docs = [Document(r["id"], r["text"]) for r in recs]
    texts = {r["id"]: r["text"] for r in recs}
    lang = LanguageStage(backend="fasttext", model=model, keep=["zh", "en"], min_score=0.5)
    lang.setup()
    rules = QualityRulesStage()
    rules.process(Document("warm-up", "Load (or, after an edit, compile) the kernels outside the timing. " * 9))
    out: dict[str, dict] = {}
    cpu = time.process_time()
    kept = []
    for i in range(0, len(docs), lang.batch_max):
        kept += [d for d in lang.process_batch(docs[i : i + lang.batch_max]) if not isinstance(d, Rejected)]
    out["lang"] = {"docs": len(docs), "cpu_s": time.process_time() - cpu}
    cpu = time.process_time()
    results = [rules.process(d) for d in kept]
    out["rules"] = {"docs": len(kept), "cpu_s": time.process_time() - cpu,
                    "kept": sum(not isinstance(r, Rejected) for r in results)}
    # CJK verdicts unchanged: the CJK documents again through the pure-Python reference path.
    from dsdata.stages import rules as rules_module

    cjk = [(d, r) for d, r in zip(kept, results) if (r.doc if isinstance(r, Rejected) else r).annotations.get("rules_cjk")]
    saved, rules_module._kernels = rules_module._kernels, False
    try:
        same = sum(_verdict(rules.process(Document(d.id, t))) == _verdict(r) for (d, r), t in
                   zip(cjk, [texts[d.id] for d, _ in cjk]))
    finally:
        rules_module._kernels = saved
    out["rules"]["cjk_docs"] = len(cjk)
    out["rules"]["cjk_verdicts_equal_reference"] = same
    for row in out.values():
        row["docs_per_cpu_s"] = round(row["docs"] / row["cpu_s"], 1)
        row["cpu_s"] = round(row["cpu_s"], 3)
    return out


def _verdict(result) -> tuple:
    from dsdata.document import Rejected

    if isinstance(result, Rejected):
        return ("rejected", result.reason, result.detail)
    return ("kept", result.text)


def kept_by_lang(kept: set[str], recs: list[dict]) -> dict[str, int]:
    counts = Counter(r["lang"] for r in recs if r["id"] in kept)
    return {lang: counts.get(lang, 0) for lang in ("en", "zh")} | {"other": sum(
        n for lang, n in counts.items() if lang not in ("en", "zh"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1,
                    help="interleaved end-to-end runs of each, median (datatrove takes ~1 CPU-minute per run)")
    ap.add_argument("--limit", type=int, default=0, help="use the first N documents (default: all)")
    ap.add_argument("--without-fineweb", action="store_true",
                    help="also run datatrove without its FineWeb filter (the chain issue 15 measured)")
    ap.add_argument("--scaling", action="store_true",
                    help="also run dsdata with --direct_running_mode=multi_processing on 1 and on 2 workers "
                         "(wall-clock ratio: meaningful only on a machine with 2 idle cores)")
    ap.add_argument("--scaling-copies", type=int, default=1,
                    help="the scaling runs read the documents this many times over (new ids, one file per copy)")
    args = ap.parse_args(argv)
    if not (SHARED / "prose-en.txt").is_file():
        print(f"error: shared data not found at {SHARED}", file=sys.stderr)
        return 2
    recs = documents(args.limit)
    mb = sum(len(r["text"].encode("utf-8")) for r in recs) / 1e6
    model = lid_model()
    py = peer_venv.python()
    by_lang = Counter(r["lang"] if r["lang"] in ("en", "zh") else "other" for r in recs)
    print(f"{len(recs)} documents ({mb:.1f} MB; en {by_lang['en']}, zh {by_lang['zh']}, other {by_lang['other']}); "
          f"LID model {model}; pid {os.getpid()}")

    with tempfile.TemporaryDirectory(prefix="dsdata-filters-bench-") as tmp:
        work = Path(tmp)
        with open(work / "docs.jsonl", "w", encoding="utf-8") as fh:
            for r in recs:
                fh.write(json.dumps({"id": r["id"], "text": r["text"]}, ensure_ascii=False) + "\n")
        (work / "one").mkdir()
        with open(work / "one" / "doc.jsonl", "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"id": recs[0]["id"], "text": recs[0]["text"]}, ensure_ascii=False) + "\n")
        (work / "copies").mkdir()
        for copy in range(max(1, args.scaling_copies)):
            with open(work / "copies" / f"docs-{copy:03d}.jsonl", "w", encoding="utf-8") as fh:
                for r in recs:
                    doc_id = r["id"] if args.scaling_copies <= 1 else f"{r['id']}#copy{copy}"
                    fh.write(json.dumps({"id": doc_id, "text": r["text"]}, ensure_ascii=False) + "\n")
        (work / "filters.yaml").write_text(
            "name: filters-bench\ninput:\n  paths: [docs.jsonl]\noutput: dsdata-out\nstages:\n"
            "  - lang: {backend: fasttext, keep: [zh, en], min_score: 0.5}\n  - rules: {}\n", encoding="utf-8")
        runs: dict[str, list[tuple[float, float]]] = {"dsdata": [], "datatrove": []}
        machine: list[tuple[float, float, float]] = []
        kept: dict[str, set[str]] = {}
        for round_no in range(max(1, args.repeat)):
            kept["dsdata"], cpu, wall = run_dsdata(work, model)
            runs["dsdata"].append((cpu, wall))
            kept["datatrove"], cpu, wall, datatrove_steps = run_datatrove(py, work, model, str(round_no))
            runs["datatrove"].append((cpu, wall))
            if args.without_fineweb:
                kept["datatrove-no-fineweb"], cpu, wall, _ = run_datatrove(py, work, model, f"nf{round_no}", False)
                runs.setdefault("datatrove-no-fineweb", []).append((cpu, wall))
            if args.scaling:
                for workers in (1, 2):
                    flags = (*MULTI_PROCESSING, f"--direct_num_workers={workers}")
                    name = f"dsdata-mp{workers}"
                    kept[name], cpu, wall = run_dsdata(work, model, flags, "copies/*.jsonl")
                    runs.setdefault(name, []).append((cpu, wall))
                    _, cpu, wall = run_dsdata(work, model, flags, "one/doc.jsonl")
                    runs.setdefault(f"{name}-fixed", []).append((cpu, wall))
                # ~0.45 CPU-s a pass over the 12 MB: a few seconds, the order of the workers' shares
                machine.append(machine_two_vs_one(work / "docs.jsonl", 2 * max(1, args.scaling_copies)))
            print(f"round {round_no + 1}: " + ", ".join(
                f"{name} {runs[name][-1][0]:.1f} CPU-s / {runs[name][-1][1]:.1f} s wall" for name in runs)
                + (f", machine loop {machine[-1][0]:.1f} s alone / {machine[-1][1]:.1f} s two at once" if machine else ""))
        breakdown = stage_breakdown(recs, model)

    results = {}
    n_docs = {name: len(recs) * max(1, args.scaling_copies) if name in ("dsdata-mp1", "dsdata-mp2") else
              1 if name.endswith("-fixed") else len(recs) for name in runs}
    for name, rows in runs.items():
        cpu = statistics.median(c for c, _ in rows)
        wall = statistics.median(w for _, w in rows)
        results[name] = {
            "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
            "docs_per_cpu_s": round(n_docs[name] / cpu, 1), "docs_per_s": round(n_docs[name] / wall, 1),
        }
        if name in kept:
            copies = n_docs[name] // len(recs)
            results[name].update({"mb_per_cpu_s": round(mb * copies / cpu, 3), "mb_per_s": round(mb * copies / wall, 3),
                                  "kept": len(kept[name])})
            if copies == 1:
                results[name]["kept_by_lang"] = kept_by_lang(kept[name], recs)
    ours, peer = results["dsdata"], results["datatrove"]
    stage_cpu = sum(row["cpu_s"] for row in breakdown.values())
    breakdown["startup_io_beam_parquet"] = {"cpu_s": round(ours["cpu_s"] - stage_cpu, 2)}
    peer["steps_wall_s"] = datatrove_steps
    ratio = {"per_core": round(ours["docs_per_cpu_s"] / peer["docs_per_cpu_s"], 2),
             "wall": round(ours["docs_per_s"] / peer["docs_per_s"], 2)}
    if args.scaling:
        one, two = results["dsdata-mp1"], results["dsdata-mp2"]
        ratio["two_workers_vs_one_wall"] = round(one["wall_s"] / two["wall_s"], 2)
        # The same runs less their one-document run: how the work itself scales.
        ratio["two_workers_vs_one_wall_beyond_fixed"] = round(
            (one["wall_s"] - results["dsdata-mp1-fixed"]["wall_s"]) /
            max(two["wall_s"] - results["dsdata-mp2-fixed"]["wall_s"], 1e-9), 2)
        # Each round's own pair (the two runs minutes apart at most): the machine's drift moves
        # both, so the spread of these shows how far one round's ratio can be trusted.
        ratio["two_workers_vs_one_wall_rounds"] = [
            round(a[1] / b[1], 2) for a, b in zip(runs["dsdata-mp1"], runs["dsdata-mp2"])]
        ratio["scaling_docs"] = n_docs["dsdata-mp1"]
        ratio["machine_two_vs_one_wall"] = round(statistics.median(m[2] for m in machine), 2)
        ratio["machine_two_vs_one_rounds"] = [round(m[2], 2) for m in machine]
        ratio["two_workers_share_of_machine"] = round(
            ratio["two_workers_vs_one_wall"] / ratio["machine_two_vs_one_wall"], 2)
        assert kept["dsdata-mp2"] == kept["dsdata-mp1"], "worker count changed the kept documents"
        if args.scaling_copies <= 1:
            assert kept["dsdata-mp1"] == kept["dsdata"], "multi_processing changed the kept documents"
        print(f"multi_processing, 2 workers ÷ 1 worker: {ratio['two_workers_vs_one_wall']}x docs/s wall "
              f"(CPU-s {results['dsdata-mp1']['cpu_s']} and {results['dsdata-mp2']['cpu_s']}; target ≥ 1.7x); "
              f"the machine's own 2 processes ÷ 1: {ratio['machine_two_vs_one_wall']}x (rounds "
              f"{ratio['machine_two_vs_one_rounds']}), so dsdata reached {ratio['two_workers_share_of_machine']:.0%} of it")
    if "datatrove-no-fineweb" in results:
        ratio["per_core_vs_no_fineweb"] = round(ours["docs_per_cpu_s"] / results["datatrove-no-fineweb"]["docs_per_cpu_s"], 2)
    print(f"{'':>20} {'CPU-s':>8} {'docs/CPU-s':>11} {'MB/CPU-s':>9} {'docs/s':>8} {'MB/s':>7}  kept (en / zh / other)")
    for name, r in results.items():
        if "kept" not in r:  # a one-document run: its fixed cost only
            print(f"{name:>20} {r['cpu_s']:8.2f} {'':>11} {'':>9} {'':>8} {'':>7}  (one document, {r['wall_s']} s wall)")
            continue
        k = r.get("kept_by_lang")
        by_lang = f" ({k['en']} / {k['zh']} / {k['other']})" if k else f" ({args.scaling_copies} copies)"
        print(f"{name:>20} {r['cpu_s']:8.2f} {r['docs_per_cpu_s']:11.1f} {r['mb_per_cpu_s']:9.3f} "
              f"{r['docs_per_s']:8.1f} {r['mb_per_s']:7.3f}  {r['kept']}{by_lang}")
    print("dsdata per stage (in-process, CPU-s): " + ", ".join(
        f"{name} {row['cpu_s']}" + (f" ({row['docs_per_cpu_s']} docs/CPU-s)" if "docs_per_cpu_s" in row else "")
        for name, row in breakdown.items()))
    rules_row = breakdown["rules"]
    print(f"CJK documents at the rules stage: {rules_row['cjk_docs']}, verdicts equal to the pure-Python reference: "
          f"{rules_row['cjk_verdicts_equal_reference']}; datatrove's own step times (wall s): {datatrove_steps}")
    if "per_core_vs_no_fineweb" in ratio:
        print(f"dsdata ÷ datatrove without FineWeb: {ratio['per_core_vs_no_fineweb']}x docs per CPU-second")
    print(f"dsdata ÷ datatrove: {ratio['per_core']}x docs per CPU-second (per core), {ratio['wall']}x docs/s wall "
          f"(target ≥ 5x per core: {'met' if ratio['per_core'] >= 5 else 'not met'})")
    print(json.dumps({"benchmark": "filters", "docs": len(recs), "mb": round(mb, 2), "repeat": args.repeat,
                      "results": results, "dsdata_stages": breakdown, "ratio": ratio,
                      "target_5x_per_core_met": ratio["per_core"] >= 5,
                      "cjk_verdicts_unchanged": rules_row["cjk_verdicts_equal_reference"] == rules_row["cjk_docs"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
