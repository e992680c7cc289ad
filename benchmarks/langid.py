#!/usr/bin/env python3
"""Language ID: dsdata's `lang` stage (fastText lid.176.ftz, and its langdetect backend) side by
side with the plain `langdetect` library, on the shared dev set (real text, labels from the
source package's language).

usage: python3 benchmarks/langid.py [--data ../shared/data/langid-dev.jsonl] [--limit N]

Prints accuracy (all languages; zh+en) and docs/s for each, the speed ratio, and as the last line
one JSON object.  Norwegian is labelled `nb` in the data and `no` by lid.176: counted as equal.
"""
import argparse
import json
import os
import time

from dsdata.stages.lang import LanguageStage

SAME = {("no", "nb"), ("nb", "no")}


def correct(pred: str, gold: str) -> bool:
    return pred == gold or (pred, gold) in SAME


def accuracy(preds, recs, langs=None):
    pairs = [(p, r["lang"]) for p, r in zip(preds, recs) if langs is None or r["lang"] in langs]
    return sum(correct(p, g) for p, g in pairs) / len(pairs)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(here, "..", "..", "shared", "data", "langid-dev.jsonl"))
    ap.add_argument("--limit", type=int, default=0, help="use the first N records (default: all)")
    args = ap.parse_args()
    with open(args.data, encoding="utf-8") as fh:
        recs = [json.loads(line) for line in fh]
    if args.limit:
        recs = recs[: args.limit]
    texts = [r["text"] for r in recs]
    results = {}

    stage = LanguageStage(backend="fasttext", keep=[], min_score=0)
    stage.setup()
    stage.predict(texts[:10])
    t = time.perf_counter()
    preds = [p[0] for p in stage.predict(texts)]
    results["dsdata_fasttext"] = (preds, time.perf_counter() - t)

    stage = LanguageStage(backend="langdetect", keep=[], min_score=0)
    stage.setup()
    t = time.perf_counter()
    preds = [p[0] for p in stage.predict(texts)]
    results["dsdata_langdetect"] = (preds, time.perf_counter() - t)

    from langdetect import DetectorFactory, detect
    from langdetect.lang_detect_exception import LangDetectException

    DetectorFactory.seed = 0

    def plain(text):
        try:
            code = detect(text)
        except LangDetectException:
            return "unknown"
        return "zh" if code.startswith("zh") else code

    t = time.perf_counter()
    preds = [plain(x) for x in texts]
    results["langdetect"] = (preds, time.perf_counter() - t)

    print(f"{len(recs)} records, {len({r['lang'] for r in recs})} languages ({args.data})")
    print(f"{'backend':<20} {'acc(all)':>9} {'acc(zh+en)':>11} {'docs/s':>10}")
    out = {"records": len(recs)}
    for name, (preds, secs) in results.items():
        acc_all, acc_zhen, dps = accuracy(preds, recs), accuracy(preds, recs, {"zh", "en"}), len(recs) / secs
        print(f"{name:<20} {acc_all:>9.4f} {acc_zhen:>11.4f} {dps:>10.0f}")
        out[name] = {"accuracy": round(acc_all, 4), "accuracy_zh_en": round(acc_zhen, 4), "docs_per_s": round(dps, 1)}
    ratio = out["dsdata_fasttext"]["docs_per_s"] / out["langdetect"]["docs_per_s"]
    print(f"speed: dsdata fasttext = {ratio:.1f}x plain langdetect")
    out["speedup_vs_langdetect"] = round(ratio, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
