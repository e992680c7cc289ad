"""decontaminate: benchmark passages (en and zh) planted in real documents are all rejected, every
other decision agrees with a naive string-set implementation, per-benchmark counts reach stats.json."""
from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.document import Document, Rejected
from dsdata.recipe import RecipeError, load_recipe
from dsdata.stages import StageConfigError, stage_class
from dsdata.stages import decontaminate as decontaminate_module
from dsdata.stages.decontaminate import DecontaminateStage, shown, tokens

CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


CLITICS = {"s", "t", "re", "ll", "ve", "d", "m"}
APOSTROPHES = "'\u2019\u02bc`\u00b4"


def _naive_tokens(text: str) -> list[str]:
    """An independent tokenizer: characters one by one, CJK alone, other letters/digits in runs; an
    English clitic after a letter and only an apostrophe or spaces joins the word before it."""
    out, word, gap, joinable = [], "", "", False

    def end_word(before_cjk: bool = False):
        nonlocal word, gap, joinable
        if word:
            gap_ok = gap.isspace() or (gap[:1] in APOSTROPHES and (gap[1:] == "" or gap[1:].isspace()))
            if word in CLITICS and joinable and gap_ok and not before_cjk:
                out[-1] += word
            else:
                out.append(word)
            joinable = "a" <= word[-1] <= "z"
            word, gap = "", ""

    for ch in unicodedata.normalize("NFKC", text).casefold():
        if CJK.match(ch):
            end_word(before_cjk=True)
            out.append(ch)
            joinable, gap = False, ""
        elif ch.isalnum():
            word += ch
        else:
            end_word()
            gap += ch
    end_word()
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


# --- held-out style: perturbed passages and shared boilerplate (benchmarks/decont_planted.py) ---------

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import decont_planted  # noqa: E402


def _footer_detail(detail: str) -> bool:
    """Whether a rejection's n-gram lies inside one of the planted footers."""
    gram = detail.split("-gram ", 1)[1].strip("'")
    return any(gram in shown(tokens(f)) for f in decont_planted.FOOTER.values())


def _planted_run(folder: Path, shared_data: Path, seed: int, extra: str = ""):
    planted = decont_planted.build((shared_data / "prose-en.txt").read_text(encoding="utf-8"),
                                   (shared_data / "prose-zh.txt").read_text(encoding="utf-8"), seed=seed)
    for lang, items in planted.items.items():
        with open(folder / f"bench-{lang}.jsonl", "w", encoding="utf-8") as fh:
            for i, item in enumerate(items):
                fh.write(json.dumps({"id": i, "passage": item, "answer": "n/a"}, ensure_ascii=False) + "\n")
    with open(folder / "docs.jsonl", "w", encoding="utf-8") as fh:
        for d in planted.docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    (folder / "recipe.yaml").write_text(
        "name: planted\ninput: {paths: [docs.jsonl]}\nstages:\n"
        f"  - decontaminate: {{benchmarks: [bench-en.jsonl, bench-zh.jsonl], fields: [passage]{extra}}}\n",
        encoding="utf-8")
    stats = run_recipe(load_recipe(str(folder / "recipe.yaml")), str(folder / "out"))
    rejected = {r["id"]: r["detail"] for r in _rows(folder / "out", "rejected")}
    return planted, stats, rejected


def test_perturbed_passages_are_found_and_shared_footers_never_reject(tmp_path, shared_data):
    """Real paragraphs as benchmark passages, planted in other real paragraphs re-cased, re-punctuated,
    re-spaced, in full width, as 13+-token windows, with words substituted; a site footer ends a quarter
    of the passages and ~30 % of the clean documents.  A real Beam run with the default cap."""
    planted, stats, rejected = _planted_run(tmp_path, shared_data, seed=3)
    assert stats["ledger_ok"] and stats["input"] == len(planted.docs)
    assert stats["input"] == stats["kept"] + stats["rejected"]["decontaminate"]["contaminated"] == \
        stats["kept"] + len(rejected)
    score = decont_planted.scores(planted, rejected, _footer_detail)
    recall = score["recall"]
    print(json.dumps(score))
    assert recall["all"] >= 0.98 and recall["zh"] >= 0.97 and recall["en"] >= 0.97, recall
    assert recall["window"] >= 0.95, recall
    for cls in decont_planted.CLASSES:
        assert recall[cls] >= 0.95, (cls, recall)
    assert score["clean_rejected"] == 0, sorted(i for i in rejected if i.startswith("c-"))[:10]
    assert score["footer_rejections"] == 0
    # The footer's n-grams are counted, set aside and listed (with their document counts) in stats.json
    # and the report.
    decon = stats["stage_stats"]["decontaminate"]
    assert decon["max_doc_frequency"] == 20 and decon["capped_ngrams"] > 0
    (listed,) = decon["notes"].values()
    assert listed and all(n > 20 for n in listed.values())
    assert all(any(g in shown(tokens(f)) for f in decont_planted.FOOTER.values()) for g in listed)
    assert min(listed.values()) >= planted.footer_docs // 2 - 10
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert html.count("not used to reject") == 1 and next(iter(listed)) in html


def test_without_the_cap_the_shared_footer_rejects_clean_documents(tmp_path, shared_data):
    """The control: max_doc_frequency null (one document at a time, as before) rejects the clean
    documents that carry the footer, on the footer — what the cap exists to prevent."""
    planted, stats, rejected = _planted_run(tmp_path, shared_data, seed=4, extra=", max_doc_frequency: null")
    assert stats["ledger_ok"] and "decontaminate" not in stats.get("stage_stats", {})
    clean_rejected = [i for i in rejected if i.startswith("c-")]
    assert len(clean_rejected) >= planted.footer_docs * 0.9
    texts = {d["id"]: d["text"] for d in planted.docs}
    assert all(any(f in texts[i] for f in decont_planted.FOOTER.values()) for i in clean_rejected)


def test_a_passage_copied_into_many_documents_is_still_rejected_while_its_footer_is_not(tmp_path, shared_data):
    """The cap sets aside n-grams shared by many documents, but a document holding most of one item
    is a copy of it however many documents hold it: 30 verbatim copies (over the cap of 20) are all
    rejected, and the 40 clean documents ending with the item's footer all kept.  A real Beam run."""
    paras = _paragraphs(shared_data / "prose-en.txt", 400, 1500)
    footer = decont_planted.FOOTER["en"]
    passage, clean = paras[0], paras[1:41]
    (tmp_path / "bench.txt").write_text(passage + " " + footer + "\n", encoding="utf-8")
    docs = [{"id": f"copy{i}", "text": f"{clean[i % 40][:200]}\n{passage.upper()} {footer}"} for i in range(30)]
    docs += [{"id": f"clean{i}", "text": f"{text}\n{footer}"} for i, text in enumerate(clean)]
    with open(tmp_path / "docs.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(d) + "\n" for d in docs)
    (tmp_path / "recipe.yaml").write_text("name: copies\ninput: {paths: [docs.jsonl]}\nstages:\n"
                                          "  - decontaminate: {benchmarks: [bench.txt]}\n", encoding="utf-8")
    stats = run_recipe(load_recipe(str(tmp_path / "recipe.yaml")), str(tmp_path / "out"))
    rejected = {r["id"] for r in _rows(tmp_path / "out", "rejected")}
    assert stats["ledger_ok"] and rejected == {f"copy{i}" for i in range(30)}
    assert stats["stage_stats"]["decontaminate"]["capped_ngrams"] > 0


@pytest.mark.parametrize("name, content, why", [
    ("blob.jsonl", b"\x00\x01\x02binary\xff\xfe\n" * 10, "line 1 holds a NUL byte"),
    ("latin1.txt", "caf\u00e9 au lait served with a croissant on the terrace of the little station\n".encode("latin-1"),
     "line 1 is not UTF-8"),
    ("image.txt", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, "is not UTF-8"),
    ("lies.jsonl.gz", b"this is not gzip at all, whatever its name says\n", "cannot be decompressed"),
    ("hidden.jsonl", gzip.compress(b'{"q": "a b c d e f g h i j k l m n o p"}\n'), "is gzip-compressed but not named .gz"),
    ("cut.txt.gz", gzip.compress(b"one two three four five six seven eight nine ten eleven twelve thirteen\n" * 500)[:-6],
     "cannot be decompressed"),
    ("deep.jsonl", b"[" * 100000 + b"]" * 100000 + b"\n", "line 1 is not JSON"),
    ("empty.txt", b"", "yields no n-gram"),
    ("blank.jsonl", b"\n\n   \n", "yields no n-gram"),
])
def test_a_benchmark_file_that_is_not_text_is_refused_in_one_line(tmp_path, name, content, why):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(StageConfigError, match=re.escape(why)) as err:
        DecontaminateStage(benchmarks=[str(tmp_path / name)])
    assert "\n" not in str(err.value) and name in str(err.value)


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(decontaminate_module, "MAX_LINE_BYTES", 1 << 16)
    (tmp_path / "huge.txt").write_bytes(b"word " * (1 << 15) + b"\n")
    with pytest.raises(StageConfigError, match="line 1 is longer than"):
        DecontaminateStage(benchmarks=[str(tmp_path / "huge.txt")])


def test_a_binary_benchmark_stops_the_cli_in_one_line(tmp_path):
    (tmp_path / "bench.bin").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "docs.jsonl").write_text(json.dumps({"id": "1", "text": "x"}) + "\n", encoding="utf-8")
    (tmp_path / "r.yaml").write_text("name: r\ninput: {paths: [docs.jsonl]}\nstages:\n"
                                     "  - decontaminate: {benchmarks: [bench.bin]}\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", str(tmp_path / "r.yaml"), "--output",
                           str(tmp_path / "out"), "--quiet"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "apitools" not in ln]
    assert len(lines) == 1 and "bench.bin" in lines[0] and "NUL byte" in lines[0], proc.stderr
    assert not (tmp_path / "out" / "stats.json").exists()


def test_clitics_apostrophes_and_width_do_not_change_tokens():
    same = ["Don't you're it's", "DONT YOURE ITS", "don t  you re\nit s", "Ｄｏｎ’ｔ　ｙｏｕ’ｒｅ　ｉｔ’ｓ"]
    assert len({tuple(tokens(s)) for s in same}) == 1
    assert tokens("巴 黎\n是，法國") == tokens("巴黎是法國")


def test_thirteen_words_with_a_dash_among_them_are_caught(tmp_path):
    """A reader cutting 13 words counts a "-" between spaces as one: 12 tokens, still a window."""
    (tmp_path / "b.txt").write_text("First you set the mode - then you restart the server and wait for the log "
                                    "to say it is ready.\n巴黎是法国的首都 - 也是欧洲最大的城市之一，值得一去。\n", encoding="utf-8")
    stage = DecontaminateStage(benchmarks=[str(tmp_path / "b.txt")])
    for window in ("set the mode - then you restart the server and wait for the",
                   "SET THE MODE: THEN YOU RESTART THE SERVER AND WAIT FOR THE"):
        hit = stage.process(Document("w", f"Notes. {window} (copied)."))
        assert isinstance(hit, Rejected) and "12-gram 'set the mode then you" in hit.detail, window
    # 12 words (11 tokens) are not a window; nor are Chinese characters around a dash.
    assert isinstance(stage.process(Document("s", "mode - then you restart the server and wait for the log")), Document)
    assert isinstance(stage.process(Document("z", "法国的首都 - 也是欧洲最大")), Document)


def test_a_benchmark_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path):
    """A FIFO (a read would wait forever), a folder, a link to /dev/zero (a read would never end)."""
    os.mkfifo(tmp_path / "fifo.txt")
    (tmp_path / "folder.jsonl").mkdir()
    (tmp_path / "zero.txt").symlink_to("/dev/zero")
    for name in ("fifo.txt", "folder.jsonl", "zero.txt"):
        with pytest.raises(StageConfigError, match=f"{name} is not a file"):
            DecontaminateStage(benchmarks=[str(tmp_path / name)])
