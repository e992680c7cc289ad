"""PII: dsdata's `pii` stage side by side with datatrove's PIIFormatter on the same documents —
recall and precision per kind, and documents per CPU-second.

    python benchmarks/pii.py            # ~2 minutes on 2 busy cores

Two corpora:
  dense  held-out style documents from tests/pii_planted.py: real en/zh paragraphs (Faker text when
         ../shared/data is absent) with 3 items of PII (e-mail, IPv4/IPv6, phones, identity and card
         numbers, made by Faker en_US/zh_CN and independent templates) and 2 hard negatives each
  clean  the real paragraphs of ../shared/data (prose-en, prose-zh, langid-dev) as they are
Both sides redact and hand back their output texts; a planted item counts as found when its value is
gone from the output, a hard negative as a false positive when it is gone.  datatrove's formatter
knows e-mail and IPv4 only, so dsdata runs twice: `types: [email, ip]` (like for like) and with every
kind.  Each side runs in its own child process (datatrove in the peers' venv, benchmarks/peer_venv.py)
and times its loop with process_time (CPU seconds, one core) after one warm-up document (what a
side loads on first use: dsdata's compiled pii pass, datatrove's regexes); interleaved --repeat
times, medians.
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
from decontaminate import SHARED  # noqa: E402

REPO = peer_venv.REPO
sys.path.insert(0, str(REPO / "tests"))
from pii_planted import KINDS, Generator  # noqa: E402

_DSDATA = r"""
import json, sys, time
from dsdata.document import Document
from dsdata.stages.pii import PiiStage
job = json.loads(sys.argv[1])
stage = PiiStage(mode="redact", types=job["types"])
docs = [Document(str(i), t) for i, t in enumerate(json.load(open(job["docs"], encoding="utf-8")))]
stage.process(Document("warm-up", docs[0].text))
t = time.process_time()
out = [stage.process(doc).text for doc in docs]
cpu = time.process_time() - t
json.dump(out, open(job["out"], "w", encoding="utf-8"), ensure_ascii=False)
print(json.dumps({"cpu_s": cpu}))
"""

_DATATROVE = r"""
import json, sys, time
from datatrove.pipeline.formatters import PIIFormatter
job = json.loads(sys.argv[1])
fmt = PIIFormatter()
texts = json.load(open(job["docs"], encoding="utf-8"))
fmt.format(texts[0])
t = time.process_time()
out = [fmt.format(text) for text in texts]
cpu = time.process_time() - t
json.dump(out, open(job["out"], "w", encoding="utf-8"), ensure_ascii=False)
print(json.dumps({"cpu_s": cpu}))
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


def scores(corpus, outputs: list[str]) -> dict:
    """Recall per kind (value gone from the output) and precision against the hard negatives."""
    found: dict[str, list[int]] = {k: [0, 0] for k in KINDS}
    fp = 0
    for (_, planted), out in zip(corpus, outputs):
        for p in planted:
            gone = p.value not in out
            if p.kind is None:
                fp += gone
            else:
                found[p.kind][0] += gone
                found[p.kind][1] += 1
    tp = sum(a for a, _ in found.values())
    return {"recall": round(tp / sum(n for _, n in found.values()), 3),
            "recall_per_kind": {k: round(a / n, 3) for k, (a, n) in found.items()},
            "precision": round(tp / (tp + fp), 3) if tp + fp else 1.0, "false_positives": fp}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dense", type=int, default=3000, help="held-out style documents with planted PII")
    ap.add_argument("--clean", type=int, default=10000, help="real paragraphs as they are")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    py = peer_venv.python()
    corpus = Generator(20261206, SHARED if SHARED.is_dir() else None).corpus(args.dense)
    texts = real_texts()
    clean = [texts[i % len(texts)] for i in range(args.clean)]
    random.Random(0).shuffle(clean)
    sides = {"dsdata_email_ip": ["email", "ip"], "dsdata_all_kinds": list(KINDS), "datatrove": None}
    speed: dict[str, dict[str, float]] = {}
    quality: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="pii-bench-") as tmp:
        for name, docs in (("dense", [t for t, _ in corpus]), ("clean", clean)):
            path = Path(tmp) / f"{name}.json"
            path.write_text(json.dumps(docs, ensure_ascii=False), encoding="utf-8")
            cpu: dict[str, list[float]] = {side: [] for side in sides}
            for _ in range(args.repeat):
                for side, types in sides.items():
                    job = {"docs": str(path), "out": str(Path(tmp) / f"{name}-{side}.out.json"), "types": types}
                    cmd = [str(py), "-c", _DATATROVE] if types is None else [sys.executable, "-c", _DSDATA]
                    proc, _, _ = peer_venv.timed_child([*cmd, json.dumps(job)], cwd=str(REPO) if types else tmp,
                                                       **({"env": peer_venv.dsdata_env()} if types else {}))
                    cpu[side].append(peer_venv.last_json(proc.stdout)["cpu_s"])
                    if name == "dense" and side not in quality:
                        quality[side] = scores(corpus, json.loads(Path(job["out"]).read_text(encoding="utf-8")))
            speed[name] = {side: round(len(docs) / statistics.median(v), 1) for side, v in cpu.items()}
    print(f"{'':18s}{'recall':>8s}{'precision':>10s}  " + "".join(f"{k:>7s}" for k in KINDS)
          + f"{'dense docs/CPU-s':>18s}{'clean docs/CPU-s':>18s}")
    for side in sides:
        q = quality[side]
        print(f"{side:18s}{q['recall']:>8.3f}{q['precision']:>10.3f}  "
              + "".join(f"{q['recall_per_kind'][k]:>7.3f}" for k in KINDS)
              + f"{speed['dense'][side]:>18.1f}{speed['clean'][side]:>18.1f}")
    ratios = {f"{name}_{side}_vs_datatrove": round(speed[name][side] / speed[name]["datatrove"], 2)
              for name in speed for side in ("dsdata_email_ip", "dsdata_all_kinds")}
    print(f"documents per CPU-second, dsdata / datatrove (median of {args.repeat}): "
          + ", ".join(f"{k} {v}x" for k, v in ratios.items()))
    print(json.dumps({"benchmark": "pii", "dense_documents": args.dense, "clean_documents": args.clean, **ratios,
                      "docs_per_cpu_s": speed, "quality_dense": quality}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
