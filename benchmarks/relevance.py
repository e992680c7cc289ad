"""Relevance classifiers side by side on CPU: held-out accuracy / F1 / AUC and docs/s of the BERT
model (our length-sorted, head+tail scorer, and the transformers text-classification pipeline on the
same model as the peer) and of the shipped fastText model, on the grouped held-out split of
relevance-dev.jsonl.  Last line: one JSON object.

  python benchmarks/relevance.py --bert-model DIR          # DIR from `dsdata classifier train --backend bert
                                                           #   --data relevance-dev.jsonl --holdout 0.2 --out DIR`
  python benchmarks/relevance.py --bert-model DIR --limit 0  # all 448 held-out records (default: 200)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dsdata.relevance.data import load_labelled, split_grouped  # noqa: E402
from dsdata.relevance.evaluation import classification_report  # noqa: E402
from dsdata.relevance.scorer import load_scorer  # noqa: E402


def measure(name: str, score, texts, labels) -> dict:
    score(texts[:8])  # warm-up: first-call allocations are not throughput
    start = time.perf_counter()
    scores = score(texts)
    seconds = time.perf_counter() - start
    report = classification_report(scores, labels)
    report.update(docs_per_s=round(len(texts) / seconds, 1), seconds=round(seconds, 2))
    print(f"{name:<24} acc {report['accuracy']:.4f}  f1 {report['f1']:.4f}  auc {report['auc']:.4f}  "
          f"{report['docs_per_s']:>8.1f} docs/s", flush=True)
    return report


def hf_pipeline_scorer(model_dir: str, max_length: int):
    """The peer: transformers' text-classification pipeline, first window only, unsorted batches."""
    from transformers import pipeline

    clf = pipeline("text-classification", model=model_dir, device=-1, top_k=None)

    def score(texts):
        out = clf(list(texts), batch_size=32, truncation=True, max_length=max_length)
        return [next(d["score"] for d in row if d["label"] in ("relevant", "LABEL_1")) for row in out]

    return score


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "relevance-dev.jsonl"))
    p.add_argument("--holdout", type=float, default=0.2)
    p.add_argument("--bert-model", default=None, help="BERT relevance model dir (skip BERT if absent)")
    p.add_argument("--fasttext-model", default=str(REPO / "pipelines" / "models" / "relevance-fasttext"))
    p.add_argument("--limit", type=int, default=200, help="held-out records to score (0 = all)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (docs/s are per this many)")
    p.add_argument("--no-peer", action="store_true", help="skip the transformers pipeline peer")
    args = p.parse_args()
    if not os.path.isfile(args.data):
        print(f"error: {args.data} not found (pass --data relevance-dev.jsonl)", file=sys.stderr)
        return 2
    _, valid = split_grouped(load_labelled(args.data), args.holdout)
    if args.limit:
        valid = valid[: args.limit]
    texts, labels = [r.text for r in valid], [r.label for r in valid]
    print(f"{len(valid)} held-out records ({args.holdout:g} of the groups of {os.path.basename(args.data)}), "
          f"{args.threads} torch thread(s)")
    results: dict = {"records": len(valid), "threads": args.threads}
    ft = load_scorer(args.fasttext_model, backend="fasttext")
    results["fasttext"] = measure("fasttext (.ftz)", ft.score, texts, labels)
    if args.bert_model:
        import torch

        torch.set_num_threads(args.threads)
        bert = load_scorer(args.bert_model, backend="bert", device="cpu")
        results["bert"] = measure("bert (dsdata scorer)", bert.score, texts, labels)
        if not args.no_peer:
            peer = hf_pipeline_scorer(args.bert_model, bert.windows.max_length)
            results["bert_hf_pipeline"] = measure("bert (hf pipeline)", peer, texts, labels)
            results["ratio_docs_per_s_dsdata_vs_hf_pipeline"] = round(
                results["bert"]["docs_per_s"] / results["bert_hf_pipeline"]["docs_per_s"], 2)
        results["ratio_docs_per_s_fasttext_vs_bert"] = round(
            results["fasttext"]["docs_per_s"] / results["bert"]["docs_per_s"], 1)
        results["accuracy_bert_minus_fasttext"] = round(
            results["bert"]["accuracy"] - results["fasttext"]["accuracy"], 4)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
