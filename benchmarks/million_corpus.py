"""Generate an N-document JSONL corpus (default one million) from real text, for benchmarks/million.py.

    python benchmarks/million_corpus.py OUT_DIR --docs 1000000      # ~2.5 GB in 200 files
    python benchmarks/million_corpus.py OUT_DIR --docs 20000        # a quick check

Text: paragraphs of ../shared/data/prose-en.txt and prose-zh.txt, langid-dev.jsonl (32 languages),
relevance-dev.jsonl's off-topic texts, and the plain-text README/changelog files under /usr/share/doc
(Debian documentation; absent on machines without it, which then get a corpus without them: the
summary line counts each source).  A document is several paragraphs drawn at random from one
language's pool with a few words substituted, so documents are distinct while being real prose.  So
that every stage has real work, a fixed share of documents are:

  other_lang   a paragraph in another language (the lang stage rejects it)
  offtopic     a relevance-dev text labelled off-topic (relevance rejects most)
  junk         navigation-like fragments and repeated lines (clean/rules reject them)
  exact_dup    an earlier document again under a new id (dedup, exact)
  near_dup     an earlier document with 2–4 % of its words edited (dedup, near: J ≈ 0.8–0.95)

Deterministic for a given --seed and inputs.  Prints one JSON line: documents per kind, bytes, files.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("DSDATA_SHARED_DATA") or REPO.parent / "shared" / "data")  # as tests/conftest.py
DEBIAN_DOC = Path("/usr/share/doc")

SHARES = {"other_lang": 0.05, "offtopic": 0.02, "junk": 0.02, "exact_dup": 0.04, "near_dup": 0.04}
_WORD = re.compile(r"\S+")


MAX_PARAGRAPH = 1500  # characters: keeps documents ~2–3 KB on average (1M documents ≈ a few GB)


def _paragraphs(path: Path, min_chars: int) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [p.strip()[:MAX_PARAGRAPH] for p in text.split("\n\n") if len(p.strip()) >= min_chars]


def _debian_paragraphs(limit_files: int = 400) -> list[str]:
    """Prose paragraphs from /usr/share/doc README*/changelog* files (plain or .gz)."""
    if not DEBIAN_DOC.is_dir():
        return []
    files = sorted(p for p in DEBIAN_DOC.rglob("*") if p.is_file() and
                   (p.name.startswith(("README", "NEWS")) or p.name.startswith("changelog")))[:limit_files]
    out = []
    for f in files:
        try:
            raw = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
            continue
        for block in re.split(r"\n\s*\n", text):
            block = " ".join(block.split())
            # Prose, not tables of versions: long enough and mostly letters.
            if len(block) >= 200 and sum(c.isalpha() for c in block) > 0.6 * len(block):
                out.append(block[:MAX_PARAGRAPH])
    return out


def _edit_words(text: str, rate: float, rnd: random.Random, vocab: list[str]) -> str:
    words = text.split(" ")
    for i in range(len(words)):
        if rnd.random() < rate:
            words[i] = rnd.choice(vocab)
    return " ".join(words)


def _edit_chars(text: str, rate: float, rnd: random.Random) -> str:
    # Chinese has no spaces: substitute characters with other characters of the same text.
    chars = list(text)
    for i in range(len(chars)):
        if rnd.random() < rate:
            chars[i] = chars[rnd.randrange(len(chars))]
    return "".join(chars)


class Corpus:
    def __init__(self, seed: int):
        self.rnd = random.Random(seed)
        self.en = _paragraphs(DATA / "prose-en.txt", 80)
        self.debian = _debian_paragraphs()
        self.zh = _paragraphs(DATA / "prose-zh.txt", 30)
        langid = [json.loads(line) for line in (DATA / "langid-dev.jsonl").read_text(encoding="utf-8").splitlines()]
        self.other = [r["text"] for r in langid if r["lang"] not in ("en", "zh")]
        relevance = [json.loads(line) for line in (DATA / "relevance-dev.jsonl").read_text(encoding="utf-8").splitlines()]
        self.offtopic = [r["text"] for r in relevance if r["label"] == 0]
        self.vocab = [w for p in self.en[:400] for w in p.split() if w.isascii() and w.isalpha()]
        self.recent: list[dict] = []  # earlier documents that duplicates copy from

    def _prose(self, lang: str) -> str:
        rnd = self.rnd
        if lang == "zh":
            parts = rnd.sample(self.zh, rnd.randint(3, 8))
            return _edit_chars("\n\n".join(parts), 0.01, rnd)
        pool = self.en if not self.debian or rnd.random() < 0.8 else self.debian
        parts = rnd.sample(pool, rnd.randint(1, 3))
        return _edit_words("\n\n".join(parts), 0.01, rnd, self.vocab)

    def _junk(self) -> str:
        rnd = self.rnd
        if rnd.random() < 0.5:
            line = rnd.choice(["Prev Up Next", "Home | Contents | Index", "Copyright © All rights reserved",
                               "Click here to subscribe", "Share this page"])
            return "\n".join([line] * rnd.randint(5, 40))
        return " | ".join(rnd.choice(self.vocab) for _ in range(rnd.randint(3, 12)))

    def document(self, i: int) -> tuple[str, dict]:
        rnd = self.rnd
        roll, kind = rnd.random(), "prose"
        for name, share in SHARES.items():
            if roll < share:
                kind = name
                break
            roll -= share
        if kind in ("exact_dup", "near_dup") and not self.recent:
            kind = "prose"
        doc_id = f"m{i:08d}"
        if kind == "exact_dup":
            src = rnd.choice(self.recent)
            return kind, {"id": doc_id, "text": src["text"], "source": f"dup-of:{src['id']}"}
        if kind == "near_dup":
            src = rnd.choice(self.recent)
            rate = rnd.uniform(0.02, 0.04)
            text = (_edit_chars(src["text"], rate, rnd) if src["lang"] == "zh"
                    else _edit_words(src["text"], rate, rnd, self.vocab))
            return kind, {"id": doc_id, "text": text, "source": f"near-dup-of:{src['id']}"}
        if kind == "other_lang":
            return kind, {"id": doc_id, "text": rnd.choice(self.other), "source": "langid-dev"}
        if kind == "offtopic":
            return kind, {"id": doc_id, "text": rnd.choice(self.offtopic), "source": "relevance-dev:offtopic"}
        if kind == "junk":
            return kind, {"id": doc_id, "text": self._junk(), "source": "junk"}
        lang = "zh" if rnd.random() < 0.35 else "en"
        doc = {"id": doc_id, "text": self._prose(lang), "source": f"prose-{lang}"}
        self.recent.append({"id": doc_id, "text": doc["text"], "lang": lang})
        if len(self.recent) > 5000:
            self.recent.pop(rnd.randrange(len(self.recent)))
        return kind, doc


def generate(out_dir: Path, n_docs: int, docs_per_file: int = 5000, seed: int = 1) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("part-*.jsonl"):
        old.unlink()
    corpus = Corpus(seed)
    counts: dict[str, int] = {}
    total_bytes = n_files = 0
    for start in range(0, n_docs, docs_per_file):
        path = out_dir / f"part-{start // docs_per_file:05d}.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for i in range(start, min(n_docs, start + docs_per_file)):
                kind, doc = corpus.document(i)
                counts[kind] = counts.get(kind, 0) + 1
                fh.write(json.dumps(doc, ensure_ascii=False) + "\n")
        total_bytes += path.stat().st_size
        n_files += 1
    summary = {"docs": n_docs, "files": n_files, "bytes": total_bytes, "kinds": dict(sorted(counts.items())),
               "pools": {"en": len(corpus.en), "debian_doc": len(corpus.debian), "zh": len(corpus.zh),
                         "other_lang": len(corpus.other), "offtopic": len(corpus.offtopic)}}
    (out_dir / "corpus.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--docs-per-file", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if not (DATA / "prose-en.txt").is_file():
        print(f"million_corpus: error: shared dev data not found at {DATA}", file=sys.stderr)
        return 2
    print(json.dumps(generate(args.out_dir, args.docs, args.docs_per_file, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
