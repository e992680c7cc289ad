"""dedup's URL and line/span kinds on documents built from real pages, through real Beam runs,
against naive reference implementations."""
from __future__ import annotations

import json
import random
import re
import unicodedata
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.dedup.spans import normalise_url
from dsdata.recipe import RecipeError, load_recipe
from dsdata.stages import StageConfigError
from dsdata.stages.dedup import DedupStage

REPO = Path(__file__).resolve().parents[1]


def _rows(out: Path, kind: str) -> list[dict]:
    return [r for f in sorted((out / kind).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def _run(folder: Path, docs: list[dict], params: str, flags: list[str] | None = None) -> tuple[dict, list, list]:
    with open(folder / "docs.jsonl", "w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    (folder / "recipe.yaml").write_text(f"name: d\ninput: {{paths: [docs.jsonl]}}\nstages:\n  - dedup: {params}\n",
                                        encoding="utf-8")
    out = folder / ("out" + "".join(f.replace("-", "").replace("=", "_") for f in flags or []))
    stats = run_recipe(load_recipe(str(folder / "recipe.yaml")), str(out), flags or [])
    assert stats["ledger_ok"] and stats["input"] == len(docs)
    return stats, _rows(out, "kept"), _rows(out, "rejected")


def test_url_normalisation():
    same = ["https://www.Example.com/a/b/?utm_source=x&b=2&a=1#top", "http://example.com:80/a/b?a=1&b=2",
            "HTTP://EXAMPLE.COM/a/b?b=2&a=1&fbclid=zz"]
    assert len({normalise_url(u) for u in same}) == 1
    assert normalise_url("http://example.com/a/B") != normalise_url("http://example.com/a/b")  # paths keep case
    assert normalise_url("http://example.com:8080/") != normalise_url("http://example.com/")
    assert normalise_url("not a url") is None and normalise_url(None) is None and normalise_url("http://[::1") is None


def test_url_dedup_keeps_one_per_normalised_url(tmp_path):
    samples = [json.loads(line) for line in (REPO / "pipelines/samples/docs.jsonl").read_text(encoding="utf-8").splitlines()]
    rng = random.Random(5)
    docs, expected_kept = [], set()
    for i, s in enumerate(samples[:60]):
        page = s["source"].split(":", 1)[1]
        base = f"https://www.debian.org/{page}"
        doc_id = f"d{i:03d}"
        docs.append({"id": doc_id, "text": s["text"], "url": base})
        if i % 3 == 0:  # a later snapshot: the same page under another spelling of its URL, text edited
            variant = rng.choice([base.replace("https://www.", "http://"), base + "?utm_source=feed#x",
                                  base.replace("debian.org", "DEBIAN.org") + "/"])
            later = f"c{i:03d}" if i % 2 else f"a{i:03d}"  # sorts after / before the first copy
            docs.append({"id": later, "text": s["text"] + "\n\nUpdated.", "url": variant})
            expected_kept.add(min(doc_id, later))
        else:
            expected_kept.add(doc_id)
    docs += [{"id": "nourl1", "text": samples[0]["text"]}, {"id": "nourl2", "text": "x", "url": "not a url"}]
    stats, kept, rejected = _run(tmp_path, docs, "{url: true, exact: false, near: false}")
    assert {r["id"] for r in kept} == expected_kept | {"nourl1", "nourl2"}
    assert {r["reason"] for r in rejected} == {"duplicate_url"} and len(rejected) == 20
    by_id = {d["id"]: d for d in docs}
    for r in rejected:
        kept_id = re.match(r"same URL as (\S+): ", r["detail"]).group(1)
        assert kept_id in expected_kept and kept_id < r["id"]
        assert normalise_url(by_id[kept_id]["url"]) == normalise_url(by_id[r["id"]]["url"])


def _normal(line: str) -> str:
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", line)).strip().casefold()


def _reference_line_dedup(docs: list[dict], min_chars: int, min_doc: int) -> dict[str, str | None]:
    """Naive: documents in id order; a line seen in any earlier document is removed."""
    seen: set[str] = set()
    result: dict[str, str | None] = {}
    for d in sorted(docs, key=lambda d: d["id"]):
        lines = d["text"].split("\n")
        keep = [ln for ln in lines if len(_normal(ln)) < min_chars or _normal(ln) not in seen]
        seen.update(_normal(ln) for ln in lines if len(_normal(ln)) >= min_chars)
        text = "\n".join(keep)
        result[d["id"]] = d["text"] if len(keep) == len(lines) else (text if len(text.strip()) >= min_doc else None)
    return result


def test_line_dedup_on_real_pages_matches_the_naive_reference(tmp_path, shared_data):
    pages = sorted((shared_data / "html-dev").glob("*.gold.txt"))
    texts = [p.read_text(encoding="utf-8") for p in pages]
    rng = random.Random(2)
    # Site boilerplate: real lines of one page, put around other pages; some pages twice with a new head.
    chrome = [ln for ln in texts[0].split("\n") if len(ln.strip()) > 25][:6]
    docs = []
    for i, text in enumerate(texts[1:41]):
        lines = text.split("\n")
        body = "\n".join(lines[: 40 + rng.randrange(40)])
        docs.append({"id": f"p{rng.randrange(10**6):06d}-{i}", "text": "\n".join(chrome[:3]) + "\n" + body + "\n" + chrome[-1]})
        if i % 4 == 0:
            docs.append({"id": f"q{i:03d}", "text": "A new introduction written for this copy of the page.\n" + body})
        if i % 7 == 0:  # a page that is nothing but lines seen elsewhere: rejected as too short
            docs.append({"id": f"z{i:03d}", "text": "\n".join(chrome) + "\nok"})
    stats, kept, rejected = _run(tmp_path, docs, "{lines: true, exact: false, near: false, lines_min_chars: 20, "
                                                 "lines_min_doc_chars: 100}")
    expected = _reference_line_dedup(docs, 20, 100)
    got = {r["id"]: r["text"] for r in kept}
    assert got == {k: v for k, v in expected.items() if v is not None}
    assert {r["id"] for r in rejected} == {k for k, v in expected.items() if v is None}
    assert rejected and all(r["reason"] == "duplicate_lines" and "characters left < lines_min_doc_chars 100" in r["detail"]
                            for r in rejected)
    assert sum(r["dup_lines_removed"] > 0 for r in kept) >= 30
    # The same corpus on two workers (multi_processing) gives the same documents: "earlier" is id order.
    _, kept2, rejected2 = _run(tmp_path, docs, "{lines: true, exact: false, near: false, lines_min_chars: 20, "
                                                "lines_min_doc_chars: 100}",
                               ["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    assert {r["id"]: r["text"] for r in kept2} == got and {r["id"] for r in rejected2} == {r["id"] for r in rejected}


def test_three_sentence_spans_cjk_aware_with_document_dedup(tmp_path, shared_data):
    paras = [p.strip() for p in (shared_data / "prose-zh.txt").read_text(encoding="utf-8").split("\n\n")
             if p.strip().count("。") >= 6 and "\n" not in p.strip()][:30]
    quote = "。".join(paras[0].split("。")[1:4]) + "。"  # three real Chinese sentences
    docs = [{"id": f"a{i:02d}", "text": p} for i, p in enumerate(paras)]
    docs.append({"id": "b01", "text": "开头的一句话。" + quote + "结尾的一句话在这里，足够长。" * 3})
    docs.append({"id": "b02", "text": paras[5]})  # an exact duplicate: the document-level step removes it
    stats, kept, rejected = _run(tmp_path, docs, "{lines: true, lines_unit: sentences, lines_min_chars: 10, "
                                                 "lines_min_doc_chars: 10}")
    got = {r["id"]: r for r in kept}
    assert quote not in got["b01"]["text"] and re.sub(r"\s", "", got["b01"]["text"]).startswith("开头的一句话。结尾")
    assert got["b01"]["dup_lines_removed"] == 3
    assert got["a00"]["text"] == paras[0] and got["a00"]["dup_lines_removed"] == 0
    assert {(r["id"], r["reason"]) for r in rejected} == {("b02", "exact_duplicate")}


def test_a_dedup_with_nothing_to_do_is_one_line():
    with pytest.raises(StageConfigError, match="at least one of exact, near, url and lines"):
        DedupStage(exact=False, near=False)


def test_index_then_against_drops_what_a_previous_run_kept(tmp_path):
    samples = [json.loads(line) for line in (REPO / "pipelines/samples/docs.jsonl").read_text(encoding="utf-8").splitlines()]
    first = [{"id": f"old{i:03d}", "text": s["text"]} for i, s in enumerate(samples[:100])]
    run1 = tmp_path / "run1"
    run1.mkdir()
    stats1, kept1, _ = _run(run1, first, "{index: index}")
    manifest = json.loads((run1 / "index" / "manifest.json").read_text())
    assert manifest["documents"] == stats1["kept"] and manifest["num_perm"] == 128
    ids = [i for part in manifest["parts"] for i in json.loads((run1 / "index" / f"{part}.ids.json").read_text())]
    assert sorted(ids) == sorted(r["id"] for r in kept1)
    # A new crawl: near-copies of ten kept documents (a few words edited), and unseen documents.
    rng = random.Random(4)
    copies = {}
    second = []
    long_ones = [r for r in kept1 if len(r["text"]) >= 2000]  # three edits leave J > 0.95
    assert len(long_ones) >= 10
    for r in rng.sample(long_ones, 10):
        text = r["text"]
        for _ in range(3):
            at = rng.randrange(len(text))
            text = text[:at] + "X" + text[at + 1:]
        second.append({"id": f"new-{r['id']}", "text": text})
        copies[f"new-{r['id']}"] = r["id"]
    second += [{"id": f"fresh{i:03d}", "text": s["text"]} for i, s in enumerate(samples[100:160])]
    run2 = tmp_path / "run2"
    run2.mkdir()
    import shutil

    shutil.copytree(run1 / "index", run2 / "index")
    stats2, kept2, rejected2 = _run(run2, second, "{against: index}")
    by_id = {r["id"]: r for r in rejected2}
    for new_id, old_id in copies.items():
        assert by_id[new_id]["reason"] == "indexed_duplicate"
        assert by_id[new_id]["detail"].startswith(f"near-duplicate of {old_id} in the index ")
    assert {r["id"] for r in kept2} | set(by_id) == {d["id"] for d in second}
    assert all(r["id"].startswith("fresh") for r in kept2) and len(kept2) >= 55
    # Signatures made with other MinHash parameters are not comparable: one line before the run.
    (run2 / "recipe.yaml").write_text("name: d\ninput: {paths: [docs.jsonl]}\nstages:\n"
                                      "  - dedup: {against: index, num_perm: 64}\n", encoding="utf-8")
    with pytest.raises((RecipeError, StageConfigError), match=r"built with num_perm=128 \(this stage: 64\)"):
        run_recipe(load_recipe(str(run2 / "recipe.yaml")), str(run2 / "out-bad"))
    (run2 / "index" / "manifest.json").write_text('{"format": "pickle"}')
    with pytest.raises(StageConfigError, match="is not a dsdata-minhash-index version 1 manifest"):
        DedupStage(against=str(run2 / "index"))
