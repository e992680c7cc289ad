"""PII throughput: dsdata's `pii` stage side by side with datatrove's PIIFormatter on the same documents.

    python benchmarks/pii.py            # ~1 minute on 2 busy cores

Documents: the real paragraphs of ../shared/data/prose-en.txt, prose-zh.txt and langid-dev.jsonl
(pipelines/samples when absent), with e-mail addresses, IPv4 addresses, mainland mobiles, identity
and card numbers planted in --planted of them.  datatrove's formatter finds e-mail and IPv4
addresses only, so dsdata runs twice: `types: [email, ip]` (the like-for-like figure, "per_core")
and with every type (e-mail, IPv4/IPv6, phones, identity numbers, bank cards: "per_core_all_types").
Each side runs in its own child process (datatrove in the peers' venv, benchmarks/peer_venv.py) and
times its loop over the documents with process_time (CPU seconds, one core); interleaved --repeat
times, medians.  The redactions each side made are counted (datatrove replaces with example
addresses, dsdata with <EMAIL>/<IP>/…).  The last line printed is one JSON object.
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
from decontaminate import SHARED  # noqa: E402

REPO = peer_venv.REPO

_DSDATA = r"""
import json, sys, time
from dsdata.document import Document
from dsdata.stages.pii import PiiStage
job = json.loads(sys.argv[1])
stage = PiiStage(mode="redact", types=job["types"])
docs = [Document(d["id"], d["text"]) for d in map(json.loads, open(job["docs"], encoding="utf-8"))]
t = time.process_time()
found = {}
for doc in docs:
    for kind, n in stage.process(doc).annotations["pii_counts"].items():
        found[kind] = found.get(kind, 0) + n
print(json.dumps({"cpu_s": time.process_time() - t, "found": found}))
"""

_DATATROVE = r"""
import json, sys, time
from datatrove.pipeline.formatters import PIIFormatter
job = json.loads(sys.argv[1])
fmt = PIIFormatter()
texts = [d["text"] for d in map(json.loads, open(job["docs"], encoding="utf-8"))]
t = time.process_time()
changed = sum(fmt.format(text) != text for text in texts)
print(json.dumps({"cpu_s": time.process_time() - t, "changed_docs": changed}))
"""


def real_texts() -> list[str]:
    texts: list[str] = []
    for lang in ("en", "zh"):
        path = SHARED / f"prose-{lang}.txt"
        if path.exists():
            texts += [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    if (SHARED / "langid-dev.jsonl").exists():
        texts += [json.loads(line)["text"] for line in (SHARED / "langid-dev.jsonl").open(encoding="utf-8")]
    if not texts:
        texts = [json.loads(line)["text"] for line in (REPO / "pipelines/samples/docs.jsonl").open(encoding="utf-8")]
    return texts


def planted_value(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return f"user{rng.randrange(1000)}@example{rng.randrange(9)}.com"
    if kind == 1:
        return f"{rng.randrange(11, 200)}.{rng.randrange(10, 250)}.{rng.randrange(250)}.{rng.randrange(1, 250)}"
    if kind == 2:
        return f"1{rng.choice('3589')}{rng.randrange(10**8, 10**9)}"
    if kind == 3:
        return "11010519491231002X"
    return "4539 1488 0343 6467"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--planted", type=float, default=0.1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    py = peer_venv.python()
    rng = random.Random(0)
    texts = real_texts()
    with tempfile.TemporaryDirectory(prefix="pii-bench-") as tmp:
        docs_path = Path(tmp) / "docs.jsonl"
        chars = 0
        with open(docs_path, "w", encoding="utf-8") as fh:
            for i in range(args.docs):
                text = texts[i % len(texts)]
                if rng.random() < args.planted:
                    cut = text.rfind(" ", 0, len(text) // 2) + 1
                    text = f"{text[:cut]}{planted_value(rng)} {text[cut:]}"
                chars += len(text)
                fh.write(json.dumps({"id": f"d{i}", "text": text}, ensure_ascii=False) + "\n")
        runs: dict[str, list[dict]] = {"dsdata": [], "dsdata_all_types": [], "datatrove": []}
        for _ in range(args.repeat):
            for name, types in (("dsdata", ["email", "ip"]), ("dsdata_all_types", ["email", "ip", "phone", "id", "card"])):
                job = {"docs": str(docs_path), "types": types}
                proc, _, _ = peer_venv.timed_child([sys.executable, "-c", _DSDATA, json.dumps(job)], cwd=str(REPO),
                                                   env=peer_venv.dsdata_env())
                runs[name].append(peer_venv.last_json(proc.stdout))
            proc, _, _ = peer_venv.timed_child([str(py), "-c", _DATATROVE, json.dumps({"docs": str(docs_path)})], cwd=tmp)
            runs["datatrove"].append(peer_venv.last_json(proc.stdout))
    speed = {name: args.docs / statistics.median(r["cpu_s"] for r in rs) for name, rs in runs.items()}
    for name in runs:
        extra = runs[name][0].get("found") or {"documents changed": runs[name][0]["changed_docs"]}
        print(f"{name:17s} {speed[name]:>10.1f} docs/CPU-s  {extra}")
    ratio = round(speed["dsdata"] / speed["datatrove"], 2)
    ratio_all = round(speed["dsdata_all_types"] / speed["datatrove"], 2)
    print(f"per core: dsdata (email+ip) / datatrove = {ratio}x; dsdata (all five types) / datatrove = {ratio_all}x "
          f"({args.docs} documents, {chars / args.docs:.0f} characters each on average, median of {args.repeat})")
    print(json.dumps({"benchmark": "pii", "documents": args.docs, "per_core": ratio, "per_core_all_types": ratio_all,
                      **{f"{name}_docs_per_cpu_s": round(v, 1) for name, v in speed.items()},
                      "dsdata_found": runs["dsdata_all_types"][0]["found"],
                      "datatrove_changed_docs": runs["datatrove"][0]["changed_docs"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
