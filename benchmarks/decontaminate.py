"""Decontamination on planted held-out data: dsdata's `decontaminate` stage side by side with
datatrove's n-gram decontamination (NGramsDecontFilter) on the same documents and benchmark items.

    python benchmarks/decontaminate.py              # ~1-2 minutes on 2 busy cores

Data (benchmarks/decont_planted.py): real paragraphs of ../shared/data/prose-en.txt and prose-zh.txt
as benchmark passages, each planted in another real paragraph once per perturbation class (exact,
case, punct, space, width, window of 13-25 tokens, three words/characters substituted, mixed), clean
paragraphs, and a site footer that ends a quarter of the passages and ~30 % of the clean documents.
Printed per perturbation class and language: the share of planted documents each side rejects; then
clean documents rejected, and documents per CPU-second of the filter loop.

dsdata runs its stage as the pipeline does (every document's matches, the corpus-wide count per
n-gram, the decision under the default max_doc_frequency cap), in-process; datatrove indexes 13-grams
of the same items with its own normalisation and word tokenizer (spaCy for English, its default for
Chinese) — what NGramsDecontIndexer's compute_hashes does (the indexer class itself insists on
lighteval) — and filters with NGramsDecontFilter.  Each side runs in its own child process
(datatrove in the peers' venv, benchmarks/peer_venv.py) and times its filter loop with process_time
(one core); index building is timed apart.  Runs are interleaved --repeat times; medians.  "per_core"
= dsdata docs per CPU-second / datatrove's.  The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decont_planted  # noqa: E402
import peer_venv  # noqa: E402

REPO = peer_venv.REPO
SHARED = REPO.parent / "shared" / "data"
if not SHARED.is_dir():
    SHARED = Path("/work/shared/data")

_DSDATA = r"""
import collections, json, sys, time
from dsdata.document import Document, Rejected
from dsdata.stages.decontaminate import DecontaminateStage
job = json.loads(sys.argv[1])
t = time.process_time()
stage = DecontaminateStage(benchmarks=job["benchmarks"], fields=["passage"], ngram=job["ngram"])
build = time.process_time() - t
docs = [json.loads(line) for line in open(job["docs"], encoding="utf-8")]
t = time.process_time()
found = [stage.matches(Document(d["id"], d["text"])) for d in docs]
counts = collections.Counter(m.key for ms in found for m in ms)
capped = {k for k, n in counts.items() if n > stage.max_doc_frequency}
hits = {}
for d, ms in zip(docs, found):
    if ms:
        r = stage.decide(Document(d["id"], d["text"]), ms, capped)
        if isinstance(r, Rejected):
            hits[d["id"]] = r.detail
cpu = time.process_time() - t
print(json.dumps({"build_s": build, "cpu_s": cpu, "hits": hits, "ngrams": int(len(stage.index.hashes)),
                  "capped": len(capped)}))
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
out = {"build_s": 0.0, "cpu_s": 0.0, "hits": {}, "ngrams": 0}
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
    docs = [Document(text=d["text"], id=d["id"]) for d in map(json.loads, open(job["docs"], encoding="utf-8"))
            if d["id"].split("-")[1] == lang]
    t = time.process_time()
    for doc in docs:
        verdict = filt.filter(doc)
        if verdict is not True:
            out["hits"][doc.id] = str(verdict)
    out["cpu_s"] += time.process_time() - t
print(json.dumps(out))
"""


def build(work: Path, seed: int) -> tuple[decont_planted.Planted, dict]:
    planted = decont_planted.build((SHARED / "prose-en.txt").read_text(encoding="utf-8"),
                                   (SHARED / "prose-zh.txt").read_text(encoding="utf-8"), seed=seed)
    job = {"benchmarks": [], "items": {}, "docs": str(work / "docs.jsonl")}
    for lang, items in planted.items.items():
        path = work / f"bench-{lang}.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for item in items:
                fh.write(json.dumps({"passage": item}, ensure_ascii=False) + "\n")
        job["benchmarks"].append(str(path))
        (work / f"items-{lang}.json").write_text(json.dumps(items, ensure_ascii=False), encoding="utf-8")
        job["items"][lang] = str(work / f"items-{lang}.json")
    with open(work / "docs.jsonl", "w", encoding="utf-8") as fh:
        for d in planted.docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    return planted, job


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ngram", type=int, default=13)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in ("prose-en.txt", "prose-zh.txt"):
        if not (SHARED / name).is_file():
            print(f"benchmarks/decontaminate.py: {SHARED / name} not found (the shared dev data)", file=sys.stderr)
            return 2
    py = peer_venv.python()
    with tempfile.TemporaryDirectory(prefix="decont-bench-") as tmp:
        work = Path(tmp)
        planted, job = build(work, args.seed)
        n_docs = len(planted.docs)
        ours_job = {"benchmarks": job["benchmarks"], "docs": job["docs"], "ngram": args.ngram}
        peer_job = {"items": job["items"], "docs": job["docs"], "ngram": args.ngram, "work": str(work)}
        runs: dict[str, list[dict]] = {"dsdata": [], "datatrove": []}
        for _ in range(args.repeat):
            proc, _, _ = peer_venv.timed_child([sys.executable, "-c", _DSDATA, json.dumps(ours_job)],
                                               cwd=str(REPO), env=peer_venv.dsdata_env())
            runs["dsdata"].append(peer_venv.last_json(proc.stdout))
            proc, _, _ = peer_venv.timed_child([str(py), "-c", _DATATROVE, json.dumps(peer_job)], cwd=tmp)
            runs["datatrove"].append(peer_venv.last_json(proc.stdout))
    result, recall = {}, {}
    texts = {d["id"]: d["text"] for d in planted.docs}
    for name, rs in runs.items():
        cpu = statistics.median(r["cpu_s"] for r in rs)
        hits = rs[0]["hits"]
        score = decont_planted.scores(planted, hits, lambda detail: False)
        recall[name] = score["recall"]
        clean_footer = [i for i in hits if i.startswith("c-") and any(f in texts[i] for f in decont_planted.FOOTER.values())]
        result[name] = {"docs_per_cpu_s": round(n_docs / cpu, 1), "filter_cpu_s": round(cpu, 3),
                        "index_build_cpu_s": round(statistics.median(r["build_s"] for r in rs), 3),
                        "ngrams_indexed": rs[0]["ngrams"], "recall": score["recall"]["all"],
                        "recall_en": score["recall"]["en"], "recall_zh": score["recall"]["zh"],
                        "recall_window": score["recall"]["window"],
                        "clean_rejected": score["clean_rejected"], "clean_with_footer_rejected": len(clean_footer)}
    print(f"{len(planted.planted)} planted documents ({len(decont_planted.CLASSES)} classes x 2 languages), "
          f"{score['clean_docs']} clean ({planted.footer_docs} ending with a shared footer)")
    print(f"{'recall':18s} {'dsdata':>8s} {'datatrove':>10s}")
    for key in ["all", "en", "zh", *decont_planted.CLASSES,
                *(f"{lang}/{c}" for lang in ("en", "zh") for c in decont_planted.CLASSES)]:
        print(f"{key:18s} {recall['dsdata'][key]:8.3f} {recall['datatrove'][key]:10.3f}")
    for name, r in result.items():
        print(f"{name:10s} clean rejected {r['clean_rejected']:>4d} of {score['clean_docs']} "
              f"({r['clean_with_footer_rejected']} on the footer)  {r['docs_per_cpu_s']:>9.1f} docs/CPU-s  "
              f"index {r['ngrams_indexed']} n-grams in {r['index_build_cpu_s']:.2f} s")
    ratio = round(result["dsdata"]["docs_per_cpu_s"] / result["datatrove"]["docs_per_cpu_s"], 2)
    print(f"per core: dsdata / datatrove = {ratio}x  ({n_docs} documents, {args.ngram}-grams, median of {args.repeat})")
    print(json.dumps({"benchmark": "decontaminate", "documents": n_docs, "planted": len(planted.planted),
                      "ngram": args.ngram, "per_core": ratio,
                      **{f"{k}_{m}": v for k, r in result.items() for m, v in r.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
