"""Decontamination throughput: dsdata's `decontaminate` stage side by side with datatrove's n-gram
decontamination (NGramsDecontFilter) on the same documents and the same benchmark items.

    python benchmarks/decontaminate.py                     # ~2 minutes on 2 busy cores
    python benchmarks/decontaminate.py --bench-items 200000  # an index of millions of n-grams

Documents: real paragraphs of ../shared/data/prose-en.txt and prose-zh.txt (pipelines/samples when
absent), repeated to --docs; benchmark items: other paragraphs of the same files, and a
benchmark passage planted in --planted of the documents.  Both sides index 13-grams of the same
items: dsdata through its stage (one sorted uint64 array), datatrove with its own text
normalisation, word tokenizer (spaCy for English), n-grams and xxhash — what NGramsDecontIndexer's
compute_hashes does (the indexer class itself insists on lighteval, which only fetches tasks) —
written as its .index.hashes file and loaded by NGramsDecontFilter.  Each side runs in its own
child process (datatrove in the peers' venv, benchmarks/peer_venv.py), and times its filter loop
with process_time (CPU seconds, one core); index building is timed apart.  Runs are interleaved
--repeat times; medians.  "per_core" = dsdata docs per CPU-second / datatrove's.  datatrove splits
Chinese on whitespace only (its tokenizer assignment for zho), so it finds the planted Chinese
passages only where they happen to be separated by spaces; found counts are printed.
The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_venv  # noqa: E402

REPO = peer_venv.REPO
SHARED = REPO.parent / "shared" / "data"
if not SHARED.is_dir():
    SHARED = Path("/work/shared/data")

_DSDATA = r"""
import json, sys, time
from dsdata.document import Document, Rejected
from dsdata.stages.decontaminate import DecontaminateStage
job = json.loads(sys.argv[1])
t = time.process_time()
stage = DecontaminateStage(benchmarks=job["benchmarks"], ngram=job["ngram"], min_tokens=0)
build = time.process_time() - t
docs = [json.loads(line) for line in open(job["docs"], encoding="utf-8")]
t = time.process_time()
hits = [d["id"] for d in docs if isinstance(stage.process(Document(d["id"], d["text"])), Rejected)]
cpu = time.process_time() - t
print(json.dumps({"build_s": build, "cpu_s": cpu, "hits": hits, "ngrams": int(len(stage.index.hashes))}))
"""

_DATATROVE = r"""
import json, os, sys, time
import numpy as np
from datatrove.data import Document
from datatrove.pipeline.decont.n_grams import NGramsDecontConfig, NGramsDecontFilter
from datatrove.utils.hashing import create_hash_func
from datatrove.utils.text import ngrams, simplify_text
from datatrove.utils.typeshelper import Languages
from datatrove.utils.word_tokenizers import load_word_tokenizer
job = json.loads(sys.argv[1])
config = NGramsDecontConfig(n_grams=job["ngram"])
out = {"build_s": 0.0, "cpu_s": 0.0, "hits": [], "ngrams": 0}
for lang, code in (("en", Languages.english), ("zh", Languages.chinese)):
    t = time.process_time()
    # NGramsDecontIndexer.compute_hashes, for items without a query (label n-grams only).
    tokenizer = load_word_tokenizer(code)
    hash_func = create_hash_func(config.hash_config)
    hashes = set()
    for item in json.load(open(job["items"][lang], encoding="utf-8")):
        toks = tokenizer.word_tokenize(simplify_text(item, config.norm_config))
        hashes.update(map(hash_func, map(" ".join, ngrams(toks, config.n_grams))))
    folder = os.path.join(job["work"], "dt-index-" + lang)
    os.makedirs(folder, exist_ok=True)
    np.array(sorted(hashes), dtype=config.hash_config.np_descr).tofile(os.path.join(folder, "bench.index.hashes"))
    filt = NGramsDecontFilter(folder, config=config, language=code)
    filt.load_index_hashes()
    out["build_s"] += time.process_time() - t
    out["ngrams"] += len(hashes)
    docs = [Document(text=d["text"], id=d["id"]) for d in map(json.loads, open(job["docs"][lang], encoding="utf-8"))]
    t = time.process_time()
    for doc in docs:
        verdict = filt.filter(doc)
        if verdict is not True:
            out["hits"].append(doc.id)
    out["cpu_s"] += time.process_time() - t
print(json.dumps(out))
"""


def paragraphs(lang: str) -> list[str]:
    path = SHARED / f"prose-{lang}.txt"
    if path.exists():
        paras = path.read_text(encoding="utf-8").split("\n\n")
    else:
        lab = "en" if lang == "en" else "zh"
        paras = [json.loads(line)["text"] for line in (REPO / "pipelines/samples/docs.jsonl").open(encoding="utf-8")
                 if json.loads(line).get("lang_label") == lab]
    return [p.strip() for p in paras if len(p.strip()) >= (200 if lang == "en" else 80)]


def build(work: Path, n_docs: int, bench_items: int, planted: float, seed: int) -> dict:
    rng = random.Random(seed)
    job = {"docs": {}, "items": {}, "benchmarks": [], "n": {}}
    for lang in ("en", "zh"):
        paras = paragraphs(lang)
        rng.shuffle(paras)
        n_bench = min(len(paras) // 3, 300)
        bench, pool = paras[:n_bench], paras[n_bench:]
        # More items (--bench-items) come from every n-gram window's neighbourhood: shuffled sentence mixes.
        items = list(bench)
        while len(items) < bench_items // 2:
            a, b = rng.choice(pool), rng.choice(bench)
            items.append(b[len(b) // 3:] + " " + a[: len(a) // 3])
        docs = []
        for i in range(n_docs // 2):
            text = pool[i % len(pool)]
            if rng.random() < planted:
                src = rng.choice(bench)
                start = rng.randrange(0, max(1, len(src) - 300))
                cut = len(text) // 2
                text = text[:cut] + " " + src[start:start + (300 if lang == "en" else 60)] + " " + text[cut:]
            docs.append({"id": f"{lang}{i:06d}", "text": text})
        (work / f"items-{lang}.json").write_text(json.dumps(items, ensure_ascii=False), encoding="utf-8")
        with open(work / f"bench-{lang}.txt", "w", encoding="utf-8") as fh:
            fh.write("\n".join(" ".join(it.split()) for it in items) + "\n")
        with open(work / f"docs-{lang}.jsonl", "w", encoding="utf-8") as fh:
            for d in docs:
                fh.write(json.dumps(d, ensure_ascii=False) + "\n")
        job["docs"][lang] = str(work / f"docs-{lang}.jsonl")
        job["items"][lang] = str(work / f"items-{lang}.json")
        job["benchmarks"].append(str(work / f"bench-{lang}.txt"))
        job["n"][lang] = len(docs)
    with open(work / "docs-all.jsonl", "w", encoding="utf-8") as out:
        for lang in ("en", "zh"):
            out.write((work / f"docs-{lang}.jsonl").read_text(encoding="utf-8"))
    return job


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=8000, help="documents (half English, half Chinese)")
    ap.add_argument("--bench-items", type=int, default=600, help="benchmark items (half per language)")
    ap.add_argument("--planted", type=float, default=0.05, help="share of documents given a benchmark passage")
    ap.add_argument("--ngram", type=int, default=13)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    py = peer_venv.python()
    with tempfile.TemporaryDirectory(prefix="decont-bench-") as tmp:
        work = Path(tmp)
        job = build(work, args.docs, args.bench_items, args.planted, seed=0)
        n_docs = sum(job["n"].values())
        ours_job = {"benchmarks": job["benchmarks"], "docs": str(work / "docs-all.jsonl"), "ngram": args.ngram}
        peer_job = {"items": job["items"], "docs": job["docs"], "ngram": args.ngram, "work": str(work)}
        runs: dict[str, list[dict]] = {"dsdata": [], "datatrove": []}
        for _ in range(args.repeat):
            proc, _, _ = peer_venv.timed_child([sys.executable, "-c", _DSDATA, json.dumps(ours_job)],
                                               cwd=str(REPO), env=peer_venv.dsdata_env())
            runs["dsdata"].append(peer_venv.last_json(proc.stdout))
            proc, _, _ = peer_venv.timed_child([str(py), "-c", _DATATROVE, json.dumps(peer_job)], cwd=tmp)
            runs["datatrove"].append(peer_venv.last_json(proc.stdout))
    result = {}
    for name, rs in runs.items():
        cpu = statistics.median(r["cpu_s"] for r in rs)
        hits = set(rs[0]["hits"])
        result[name] = {"docs_per_cpu_s": round(n_docs / cpu, 1), "filter_cpu_s": round(cpu, 3),
                        "index_build_cpu_s": round(statistics.median(r["build_s"] for r in rs), 3),
                        "ngrams_indexed": rs[0]["ngrams"], "rejected": len(hits),
                        "rejected_en": sum(h.startswith("en") for h in hits),
                        "rejected_zh": sum(h.startswith("zh") for h in hits)}
        print(f"{name:10s} {result[name]['docs_per_cpu_s']:>10.1f} docs/CPU-s  index {result[name]['ngrams_indexed']:>9d} "
              f"n-grams in {result[name]['index_build_cpu_s']:.2f} s  rejected en {result[name]['rejected_en']} "
              f"zh {result[name]['rejected_zh']}")
    ratio = round(result["dsdata"]["docs_per_cpu_s"] / result["datatrove"]["docs_per_cpu_s"], 2)
    print(f"per core: dsdata / datatrove = {ratio}x  ({n_docs} documents, {args.ngram}-grams, median of {args.repeat})")
    print(json.dumps({"benchmark": "decontaminate", "documents": n_docs, "ngram": args.ngram,
                      "per_core": ratio, **{f"{k}_{m}": v for k, r in result.items() for m, v in r.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
