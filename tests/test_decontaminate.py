"""decontaminate: benchmark passages (en and zh) planted in real documents are all rejected, every
other decision agrees with a naive string-set implementation, per-benchmark counts reach stats.json."""
from __future__ import annotations

import json
import random
import re
import unicodedata
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.document import Document, Rejected
from dsdata.recipe import RecipeError, load_recipe
from dsdata.stages import StageConfigError, stage_class
from dsdata.stages.decontaminate import DecontaminateStage

CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


def _naive_tokens(text: str) -> list[str]:
    """An independent tokenizer: characters one by one, CJK alone, other letters/digits in runs."""
    out, word = [], ""
    for ch in unicodedata.normalize("NFKC", text).casefold():
        if CJK.match(ch):
            if word:
                out.append(word)
                word = ""
            out.append(ch)
        elif ch.isalnum():
            word += ch
        elif word:
            out.append(word)
            word = ""
    if word:
        out.append(word)
    return out


def _naive_grams(text: str, n: int) -> set[tuple[str, ...]]:
    toks = _naive_tokens(text)
    return {tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)}


def _paragraphs(path: Path, lo: int, hi: int) -> list[str]:
    paras = [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n")]
    return [p for p in paras if lo <= len(p) <= hi]


@pytest.fixture
def corpus(tmp_path, shared_data):
    """Benchmarks cut from some real paragraphs; documents: other real paragraphs, some with a
    benchmark passage planted (re-cased, re-punctuated) in the middle."""
    rng = random.Random(7)
    en = _paragraphs(shared_data / "prose-en.txt", 400, 3000)
    zh = _paragraphs(shared_data / "prose-zh.txt", 150, 1500)
    rng.shuffle(en)
    rng.shuffle(zh)
    bench_en, docs_en = en[:30], en[30:230]
    bench_zh, docs_zh = zh[:30], zh[30:230]
    # JSONL benchmark with question/passage/answer fields (only question and passage are indexed)
    # and a plain-text benchmark, one item per line.
    with open(tmp_path / "qa-en.jsonl", "w", encoding="utf-8") as fh:
        for i, p in enumerate(bench_en):
            fh.write(json.dumps({"id": i, "question": f"What does this say? {p[:200]}", "passage": p,
                                 "answer": "yes"}) + "\n")
    (tmp_path / "reading-zh.txt").write_text("\n".join(p.replace("\n", " ") for p in bench_zh) + "\n", encoding="utf-8")

    docs, planted = [], {}
    for i, text in enumerate(docs_en + docs_zh):
        docs.append({"id": f"d{i:04d}", "text": text})
    for j in range(40):
        zh_doc = j % 2 == 1
        host = docs[rng.randrange(200, 400) if zh_doc else rng.randrange(0, 200)]
        src = bench_zh[j % 30] if zh_doc else bench_en[j % 30]
        toks_src = _naive_tokens(src)
        start = rng.randrange(0, max(1, len(toks_src) - 20))
        if zh_doc:
            passage = "，".join(" ".join(toks_src[start + k:start + k + 5]) for k in range(0, 20, 5))
        else:
            passage = " ".join(toks_src[start:start + 20]).upper()
        cut = len(host["text"]) // 2
        doc_id = f"p{j:03d}"
        docs.append({"id": doc_id, "text": host["text"][:cut] + "\n" + passage + "。\n" + host["text"][cut:]})
        planted[doc_id] = "reading-zh.txt" if zh_doc else "qa-en.jsonl"
    with open(tmp_path / "docs.jsonl", "w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    bench_text = {"qa-en.jsonl": [f"What does this say? {p[:200]}" for p in bench_en] + bench_en,
                  "reading-zh.txt": bench_zh}
    return tmp_path, docs, planted, bench_text


def _rows(out: Path, kind: str) -> list[dict]:
    return [r for f in sorted((out / kind).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_planted_benchmarks_are_removed_and_only_they(corpus):
    folder, docs, planted, bench_text = corpus
    (folder / "recipe.yaml").write_text(
        "name: decont\ninput: {paths: [docs.jsonl]}\nstages:\n"
        "  - decontaminate: {benchmarks: [qa-en.jsonl, reading-zh.txt], fields: [question, passage], min_tokens: 0}\n",
        encoding="utf-8")
    stats = run_recipe(load_recipe(str(folder / "recipe.yaml")), str(folder / "out"))
    assert stats["ledger_ok"] and stats["input"] == len(docs)
    rejected = {r["id"]: r for r in _rows(folder / "out", "rejected")}
    # Every planted passage is found, with its benchmark named and the n-gram shown.
    for doc_id, bench in planted.items():
        assert doc_id in rejected, doc_id
        assert rejected[doc_id]["reason"] == "contaminated"
        assert rejected[doc_id]["detail"].startswith(f"benchmark {bench}: 13-gram ")
    # Every decision equals the naive set-of-tuples answer (so no clean document is rejected).
    bench_grams = set()
    for items in bench_text.values():
        for item in items:
            bench_grams |= _naive_grams(item, 13)
    expected = {d["id"] for d in docs if _naive_grams(d["text"], 13) & bench_grams}
    assert set(rejected) == expected
    assert len(expected) >= len(planted)
    # Per-benchmark counts: stats.json's tally sums to the rejections.
    tally = stats["tallies"]["decontaminate_benchmark"]
    assert sum(tally.values()) == stats["rejected"]["decontaminate"]["contaminated"] == len(expected)
    assert tally["qa-en.jsonl"] >= 20 and tally["reading-zh.txt"] >= 20
    on_disk = json.loads((folder / "out" / "stats.json").read_text())
    assert on_disk["tallies"] == stats["tallies"]
    html = (folder / "out" / "report.html").read_text(encoding="utf-8")
    assert "decontaminate_benchmark" in html and "reading-zh.txt" in html


def test_cjk_detail_and_case_punctuation_insensitive(tmp_path):
    (tmp_path / "b.txt").write_text("巴黎是法国的首都，也是欧洲最大的城市之一。\nThe quick brown fox jumps over the lazy dog "
                                    "while the cat sleeps on the warm mat.\n", encoding="utf-8")
    stage = DecontaminateStage(benchmarks=[str(tmp_path / "b.txt")])
    zh = stage.process(Document("a", "旅游指南：巴黎是法國的首都……巴黎是法国的首都也是欧洲最大的城市之一，值得一去。"))
    assert isinstance(zh, Rejected) and zh.reason == "contaminated"
    assert "'巴黎是法国的首都也是欧洲最'" in zh.detail and "b.txt" in zh.detail
    en = stage.process(Document("b", "Note: THE QUICK, BROWN fox -- jumps over the lazy dog; while the cat sleeps!"))
    assert isinstance(en, Rejected)
    assert "'the quick brown fox jumps over the lazy dog while the cat sleeps'" in en.detail
    clean = stage.process(Document("c", "The quick brown fox jumps over the lazy dog while the dog sleeps on a mat."))
    assert isinstance(clean, Document)


def test_short_items_are_indexed_whole(tmp_path):
    (tmp_path / "q.jsonl").write_text(json.dumps({"q": "Who wrote the Republic of Plato?"}) + "\n", encoding="utf-8")
    stage = DecontaminateStage(benchmarks=[str(tmp_path / "q.jsonl")], fields=["q"], min_tokens=5)
    hit = stage.process(Document("a", "Trivia night. Who wrote the Republic of Plato? Nobody knew."))
    assert isinstance(hit, Rejected) and "6-gram 'who wrote the republic of plato'" in hit.detail
    assert isinstance(stage.process(Document("b", "Who wrote the Republic? Plato did.")), Document)


def test_a_benchmark_without_ngrams_stops_the_run_in_one_line(tmp_path):
    (tmp_path / "short.jsonl").write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n", encoding="utf-8")
    (tmp_path / "docs.jsonl").write_text(json.dumps({"id": "1", "text": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(StageConfigError, match="short.jsonl yields no n-gram"):
        DecontaminateStage(benchmarks=[str(tmp_path / "short.jsonl")])
    # A field that no item has: also no n-gram, also an error (not a silent no-op).
    (tmp_path / "qa.jsonl").write_text(json.dumps({"question": "a b c d e f g h i j k l m n o"}) + "\n")
    with pytest.raises(StageConfigError, match="fields passage have fewer"):
        DecontaminateStage(benchmarks=[str(tmp_path / "qa.jsonl")], fields=["passage"])
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    with pytest.raises(StageConfigError, match="bad.jsonl line 1 is not JSON"):
        DecontaminateStage(benchmarks=[str(tmp_path / "bad.jsonl")])
    (tmp_path / "r.yaml").write_text("name: r\ninput: {paths: [docs.jsonl]}\nstages:\n"
                                     "  - decontaminate: {benchmarks: [missing.jsonl]}\n")
    with pytest.raises((RecipeError, StageConfigError), match="missing.jsonl"):
        load_recipe(str(tmp_path / "r.yaml"))
    with pytest.raises(StageConfigError, match="needs benchmarks"):
        stage_class("decontaminate")()
