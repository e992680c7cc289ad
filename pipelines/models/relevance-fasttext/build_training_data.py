"""Build the training set of the shipped relevance-fasttext model (see README.md beside this file).

    python pipelines/models/relevance-fasttext/build_training_data.py --shared ../shared/data \
        --out /tmp/relevance-train.jsonl

The relevance-dev set alone (1,552 training records) has 156 Traditional-Chinese records in each
label and almost no Chinese licence text, so the model rejected real Traditional-Chinese
documentation and kept Chinese licence preambles.  This adds, from the same kind of sources:

- langid-dev.jsonl paragraphs in en/zh: documentation paragraphs → 1; fortune cookies and the
  licence pages of the doc packages (GPL/GFDL appendices, legal notices) → 0;
- prose-en.txt / prose-zh.txt documents (documentation prose, zh_CN and zh_TW man pages,
  LibreOffice help, Debian guides) → 1, cut at sentence ends into pieces of the dev set's lengths;
- the licence texts in /usr/share/common-licenses (when present) → 0, paragraph by paragraph;
- with --fortunes DIR (the files of the Debian packages fortunes, fortunes-min and fortunes-zh,
  e.g. `apt-get download fortunes fortunes-min fortunes-zh` + `dpkg -x`): fortune cookies, Tang/Song
  poems and modern Chinese quotations → 0 (fortunes were the most common held-out error);

and balances the two labels per language by repeating negatives (fastText has no sample weights).

What is never trained on: the held-out part of relevance-dev's grouped split (the same group hash
as `dsdata classifier train --holdout 0.2 --seed 0`), any added record from a page (group) that has
a held-out record, and any text sharing half of its character 5-grams with a held-out text or with
an evaluation text given by --exclude (the HTML dev pages' gold texts, which hold the Traditional-
Chinese networking page of issue 17) or --exclude-openings (the first two paragraphs of each sample
corpus document: the Chinese GPL preamble of issue 17; the rest of that GPL translation is in
langid-dev and is trained on as licence text).
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import random
import re
import sys
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))

from dsdata.relevance.data import group_key  # noqa: E402

# Licence pages inside documentation packages: their paragraphs are licence text, not docs.
_LICENCE_PAGE = re.compile(r"apf\.html|gfdl|fdl-|legal|licen[cs]e|copying|copyright|gpl", re.I)
_JUNK_PACKAGES = {"fortunes", "fortunes-zh", "jargon-text", "bible-kjv-text"}
_SENTENCE_END = re.compile(r"(?<=[.!?。！？；;])\s*")
_WS = re.compile(r"\s+")


def held_out(group: str, fraction: float, seed: int) -> bool:
    """The bucket test of dsdata.relevance.data.split_grouped."""
    digest = hashlib.sha256(f"{seed}:{group}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def shingles(text: str, n: int = 5) -> set[str]:
    text = re.sub(r"\W+", "", text.lower())
    return {text[i:i + n] for i in range(max(1, len(text) - n + 1))}


class NearDuplicates:
    """Texts sharing at least `threshold` of the smaller text's character 5-grams with a protected
    text, and at least MIN_SHARED of them (one shared licence phrase is not a copy)."""

    MIN_SHARED = 25

    def __init__(self, texts, threshold: float = 0.5):
        self.threshold = threshold
        self.index: dict[str, set[int]] = {}
        self.sizes = []
        for i, text in enumerate(texts):
            grams = shingles(text)
            self.sizes.append(len(grams))
            for g in grams:
                self.index.setdefault(g, set()).add(i)

    def hit(self, text: str) -> bool:
        grams = shingles(text)
        counts: Counter = Counter()
        for g in grams:
            for i in self.index.get(g, ()):
                counts[i] += 1
        return any(c >= self.MIN_SHARED and c >= self.threshold * min(len(grams), self.sizes[i])
                   for i, c in counts.items())


def pieces(text: str, rng: random.Random, lo: int = 60, hi: int = 1400) -> list[str]:
    """Cut a document at sentence ends into pieces of random length in [lo, hi] characters."""
    text = _WS.sub(" ", text).strip()
    out, current, target = [], "", rng.randint(lo, hi)
    for sentence in _SENTENCE_END.split(text):
        if not sentence:
            continue
        current = f"{current} {sentence}".strip() if current else sentence
        if len(current) >= target:
            out.append(current[:hi])
            current, target = "", rng.randint(lo, hi)
    if len(current) >= lo:
        out.append(current)
    return out


def is_cjk_text(text: str) -> bool:
    cjk = sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")
    letters = sum(1 for ch in text if ch.isalpha())
    return cjk >= 10 and cjk >= 0.3 * max(1, letters)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", required=True, help="the shared data folder (relevance-dev.jsonl, langid-dev.jsonl, prose-*.txt)")
    p.add_argument("--out", required=True)
    p.add_argument("--licenses", default="/usr/share/common-licenses")
    p.add_argument("--exclude", nargs="*", default=[], help="JSONL (field text) or text files never to train on")
    p.add_argument("--exclude-openings", nargs="*", default=[],
                   help="JSONL files whose records' first two paragraphs are never trained on (the sample "
                        "corpus: its zh GPL document opens with the preamble the tour scored)")
    p.add_argument("--fortunes", default=None, help="folder of fortune files (usr/share/games/fortunes)")
    p.add_argument("--fortunes-per-language", type=int, default=600)
    p.add_argument("--holdout", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prose-per-language", type=int, default=700, help="pieces of prose-en/zh to add per language")
    args = p.parse_args()
    rng = random.Random(args.seed)

    dev = [json.loads(line) for line in open(os.path.join(args.shared, "relevance-dev.jsonl"), encoding="utf-8")]
    for rec in dev:
        rec["group"] = group_key(rec, rec["id"])
    train = [dict(r, origin="relevance-dev") for r in dev if not held_out(r["group"], args.holdout, args.seed)]
    protected = [r["text"] for r in dev if held_out(r["group"], args.holdout, args.seed)]
    held_out_groups = {r["group"] for r in dev if held_out(r["group"], args.holdout, args.seed)}
    for path in args.exclude:
        for file in sorted(glob.glob(path)):
            with open(file, encoding="utf-8") as fh:
                if file.endswith(".jsonl"):
                    protected += [json.loads(line)["text"] for line in fh if line.strip()]
                else:
                    protected += [part for part in re.split(r"\n\s*\n", fh.read()) if len(part) > 40]
    for file in args.exclude_openings:
        with open(file, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    paragraphs = [p for p in re.split(r"\n\s*\n", json.loads(line)["text"]) if p.strip()]
                    protected += paragraphs[:2]
    guard = NearDuplicates(protected)
    seen = NearDuplicates([r["text"] for r in train], threshold=0.9)
    added: list[dict] = []

    def add(text: str, label: int, lang: str, source: str, origin: str) -> None:
        group = group_key({"source": source}, source)
        if group in held_out_groups or guard.hit(text) or seen.hit(text):
            return
        added.append({"text": text, "label": label, "lang": lang, "source": source, "origin": origin})

    for line in open(os.path.join(args.shared, "langid-dev.jsonl"), encoding="utf-8"):
        rec = json.loads(line)
        if rec["lang"] not in ("en", "zh") or (rec["lang"] == "zh" and not is_cjk_text(rec["text"])):
            continue
        package, _, path = rec["source"].partition(":")
        junk = package in _JUNK_PACKAGES or bool(_LICENCE_PAGE.search(path))
        add(_WS.sub(" ", rec["text"]).strip(), 0 if junk else 1, rec["lang"], rec["source"], "langid-dev")

    for lang in ("en", "zh"):
        with open(os.path.join(args.shared, f"prose-{lang}.txt"), encoding="utf-8") as fh:
            docs = [d for d in re.split(r"\n\s*\n", fh.read()) if d.strip()]
        candidates = [(i, piece) for i, doc in enumerate(docs) for piece in pieces(doc, rng)
                      if lang == "en" or is_cjk_text(piece)]
        rng.shuffle(candidates)
        before = len(added)
        for i, piece in candidates:
            if len(added) - before >= args.prose_per_language:
                break
            add(piece, 1, lang, f"prose-{lang}:doc{i}", "prose")

    if os.path.isdir(args.licenses):
        for file in sorted(os.listdir(args.licenses)):
            full = os.path.join(args.licenses, file)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            with open(full, encoding="utf-8", errors="replace") as fh:
                paragraphs = [_WS.sub(" ", part).strip() for part in re.split(r"\n\s*\n", fh.read())]
            for n, para in enumerate(paragraphs):
                if len(para) >= 60:
                    add(para[:1400], 0, "en", f"common-licenses:usr/share/common-licenses/{file}#{n}", "common-licenses")

    if args.fortunes and os.path.isdir(args.fortunes):
        items = {"en": [], "zh": []}
        for file in sorted(os.listdir(args.fortunes)):
            full = os.path.join(args.fortunes, file)
            if file.endswith((".dat", ".u8")) or os.path.islink(full) or not os.path.isfile(full):
                continue
            data = open(full, "rb").read()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = data.decode("gb18030", errors="replace")
            package = "fortunes-zh" if file in ("chinese", "song100", "tang300") else "fortunes"
            for n, item in enumerate(re.split(r"\n%\n", text)):
                item = _WS.sub(" ", item).strip()
                if not 40 <= len(item) <= 1400:
                    continue
                lang = "zh" if is_cjk_text(item) else "en" if item.isascii() else None
                if lang:
                    items[lang].append((item, f"{package}:usr/share/games/fortunes/{file}#{n}"))
        for lang, found in items.items():
            rng.shuffle(found)
            before = len(added)
            for item, source in found:
                if len(added) - before >= args.fortunes_per_language:
                    break
                add(item, 0, lang, source, "fortunes")

    rows = train + added
    # Balance the labels per language by repeating negatives.
    final = []
    for lang in ("en", "zh"):
        pos = [r for r in rows if r["lang"] == lang and r["label"] == 1]
        neg = [r for r in rows if r["lang"] == lang and r["label"] == 0]
        reps = [neg[i % len(neg)] for i in range(max(len(pos), len(neg)))] if neg else []
        final += pos + reps
    rng.shuffle(final)
    with open(args.out, "w", encoding="utf-8") as out:
        for i, r in enumerate(final):
            out.write(json.dumps({"id": f"train-{i:05d}", "text": r["text"], "label": r["label"], "lang": r["lang"],
                                  "source": r["source"], "origin": r["origin"]}, ensure_ascii=False) + "\n")
    counts = Counter((r["origin"], r["lang"], r["label"]) for r in rows)
    print(json.dumps({"records": len(final), "unique": len(rows),
                      "by_origin_lang_label": {f"{o}/{lg}/{lb}": n for (o, lg, lb), n in sorted(counts.items())}}))


if __name__ == "__main__":
    main()
