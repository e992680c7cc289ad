"""`dsdata run --limit N` (the first N records, the same on every runner) and the .txt/.md and
CSV/TSV readers, through real `dsdata run` processes and Beam runs."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.io.readers import read_local
from dsdata.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]


def _rows(out: Path, kind: str) -> list[dict]:
    return [r for f in sorted((out / kind).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def _dsdata(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "dsdata.cli", "run", *args, "--quiet"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("flags", [[], ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]])
def test_limit_reads_the_first_n_records_in_path_order(tmp_path, flags):
    samples = (REPO / "pipelines/samples/docs.jsonl").read_text(encoding="utf-8").splitlines()
    # Two files; b.jsonl sorts after a.jsonl, and a.jsonl has a broken line among its first records.
    (tmp_path / "a.jsonl").write_text("\n".join(samples[:30] + ["{broken"] + samples[30:40]) + "\n", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text("\n".join(samples[40:100]) + "\n", encoding="utf-8")
    (tmp_path / "r.yaml").write_text("name: l\ninput: {paths: ['*.jsonl']}\nstages:\n  - rules: {}\n")
    proc = _dsdata("r.yaml", "--output", "out", "--limit", "55", *flags, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["input"] == 55 and stats["ledger_ok"] and stats["limit"] == 55
    ids = {r["id"] for r in _rows(tmp_path / "out", "kept")} | {r["id"] for r in _rows(tmp_path / "out", "rejected")}
    expected = {json.loads(line)["id"] for line in samples[:40] + samples[40:54]} | {str(tmp_path / "a.jsonl") + ":31"}
    assert ids == expected
    assert stats["rejected"]["read"] == {"bad_json": 1}


def test_limit_is_checked_and_larger_than_the_corpus_reads_all(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"id": "1", "text": "one"}) + "\n")
    (tmp_path / "r.yaml").write_text("name: l\ninput: {paths: ['*.jsonl']}\nstages: []\n")
    proc = _dsdata("r.yaml", "--output", "out", "--limit", "0", cwd=tmp_path)
    assert proc.returncode != 0 and "--limit: must be a positive whole number, got '0'" in proc.stderr
    proc = _dsdata("r.yaml", "--output", "out", "--limit", "1000", cwd=tmp_path)
    assert proc.returncode == 0 and json.loads((tmp_path / "out" / "stats.json").read_text())["input"] == 1


def test_text_markdown_csv_tsv_readers_in_a_run(tmp_path, shared_data):
    paras = [p for p in (shared_data / "prose-en.txt").read_text(encoding="utf-8").split("\n\n") if len(p) > 400][:6]
    zh = [p for p in (shared_data / "prose-zh.txt").read_text(encoding="utf-8").split("\n\n") if len(p) > 200][:4]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "guide.md").write_text("# Guide\n\n" + paras[0], encoding="utf-8")
    (tmp_path / "data" / "notes.txt").write_bytes(b"\xef\xbb\xbf" + zh[0].encode("utf-8"))
    (tmp_path / "data" / "empty.txt").write_text("  \n")
    (tmp_path / "data" / "latin1.txt").write_bytes("café déjà vu".encode("latin-1"))
    with open(tmp_path / "data" / "rows.csv", "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["doc_id", "body", "source"])
        for i, p in enumerate(paras[1:5]):
            w.writerow([f"en{i}", p, "prose-en"])  # real paragraphs: commas, quotes, newlines inside cells
        w.writerow(["short", "two", "fields", "too many"])
        w.writerow(["blank", "", "x"])
    with open(tmp_path / "data" / "rows.tsv", "w", encoding="utf-8", newline="") as fh:
        fh.write("doc_id\tbody\n")
        for i, p in enumerate(zh[1:]):
            fh.write(f"zh{i}\t{' '.join(p.split())}\n")
    (tmp_path / "r.yaml").write_text("name: t\ninput: {paths: ['data/*'], text_field: body, id_field: doc_id}\n"
                                     "stages:\n  - clean: {}\n", encoding="utf-8")
    recipe = load_recipe(str(tmp_path / "r.yaml"))
    stats = run_recipe(recipe, str(tmp_path / "out"))
    assert stats["ledger_ok"]
    kept = {r["id"]: r for r in _rows(tmp_path / "out", "kept")}
    rejected = {r["id"]: r for r in _rows(tmp_path / "out", "rejected")}
    # .md/.txt: the file is the document (id = its path; the text field setting does not apply).
    md = str(tmp_path / "data" / "guide.md")
    assert kept[md]["text"].startswith("# Guide") and json.loads(kept[md]["metadata"])["content_type"] == "text/markdown"
    assert kept[str(tmp_path / "data" / "notes.txt")]["text"].startswith(zh[0].strip()[:20])  # BOM dropped
    assert rejected[str(tmp_path / "data" / "empty.txt")]["reason"] == "empty_text"
    assert rejected[str(tmp_path / "data" / "latin1.txt")]["reason"] == "invalid_utf8"
    # CSV cells survive quoting intact; other columns are metadata.
    for i, p in enumerate(paras[1:5]):
        assert kept[f"en{i}"]["text"] == " ".join(p.split()) or kept[f"en{i}"]["text"].split() == p.split()
        assert json.loads(kept[f"en{i}"]["metadata"]) == {"source": "prose-en"}
    bad = rejected[str(tmp_path / "data" / "rows.csv") + ":5"]
    assert bad["reason"] == "bad_row" and "4 fields, the header has 3" in bad["detail"]
    assert rejected["blank"]["reason"] == "empty_text"
    assert {f"zh{i}" for i in range(3)} <= set(kept)
    assert stats["input"] == 4 + 6 + 3


def test_csv_without_the_text_column_is_one_row(tmp_path):
    (tmp_path / "a.csv").write_text("id,body\n1,x\n2,y\n")
    rows = read_local(str(tmp_path / "a.csv"))
    assert len(rows) == 1 and rows[0].reason == "missing_text_column" and "columns: id, body" in rows[0].detail
    (tmp_path / "q.csv").write_text('id,text\n1,"unterminated\n')
    rows = read_local(str(tmp_path / "q.csv"))
    assert [r.reason for r in rows] == ["bad_row"] or [getattr(r, "reason", None) for r in rows][-1] == "bad_row"
