"""OUT/report.html: written by real runs, self-contained, bounded reads, never fails a run."""
import base64
import json
import logging
import os
import struct
import subprocess
import sys
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.document import REJECTED_SCHEMA
from dsdata.recipe import load_recipe
from dsdata.beam.report import KeptSample, build_html, rejected_examples, stage_times, write_report_safely

REPO = Path(__file__).resolve().parents[1]


class PageParts(HTMLParser):
    """Element ids, embedded images (id → PNG width/height) and every URL-bearing attribute."""

    def __init__(self):
        super().__init__()
        self.ids, self.images, self.urls, self.tags = set(), {}, [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        for name in ("src", "href", "action", "data"):
            if name in attrs and not (attrs[name] or "").startswith(("#", "data:")):
                self.urls.append(attrs[name])
        if tag == "img":
            prefix = "data:image/png;base64,"
            assert attrs["src"].startswith(prefix)
            png = base64.b64decode(attrs["src"][len(prefix):])
            assert png[:8] == b"\x89PNG\r\n\x1a\n"
            self.images[attrs["id"]] = struct.unpack(">II", png[16:24])  # IHDR width, height


def parse(path: Path) -> PageParts:
    parts = PageParts()
    parts.feed(path.read_text(encoding="utf-8"))
    return parts


def _mixed_run(tmp_path: Path) -> tuple[Path, dict]:
    samples = [json.loads(line) for line in (REPO / "pipelines/samples/docs.jsonl").read_text(encoding="utf-8").splitlines()]
    lines = [json.dumps(s, ensure_ascii=False) for s in samples[:60]] + ["{broken json"]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "r.yaml").write_text("name: mixed\ninput: {paths: ['*.jsonl']}\nstages:\n"
                                     "  - lang: {keep: [zh, en], min_score: 0.5}\n  - rules: {}\n", encoding="utf-8")
    out = tmp_path / "out"
    stats = run_recipe(load_recipe(str(tmp_path / "r.yaml")), str(out))
    return out, stats


def test_run_writes_a_self_contained_report_with_funnel_reasons_and_histograms(tmp_path):
    out, stats = _mixed_run(tmp_path)
    page = parse(out / "report.html")
    assert page.urls == []  # nothing fetched: no links, scripts or images outside the file
    assert "script" not in page.tags and "link" not in page.tags
    assert {"funnel", "hist-length", "hist-lang", "hist-lang-score"} <= set(page.images)
    assert all(w > 100 and h > 100 for w, h in page.images.values())
    assert {"summary", "funnel-table", "reasons", "recipe"} <= page.ids
    # every (stage, reason) of the ledger has its row, with its count and an example's detail
    html = (out / "report.html").read_text(encoding="utf-8")
    rejected = pq.read_table(out / "rejected").to_pylist()
    for stage, reasons in stats["rejected"].items():
        for reason, count in reasons.items():
            assert f"reason-{stage}-{reason}" in page.ids
            assert f'<td>{reason}</td><td class="n">{count}</td>' in html
            details = [r["detail"] for r in rejected if (r["stage"], r["reason"]) == (stage, reason)]
            assert any(escape(d) in html for d in details)
    # every stage's CPU time, from stats.json's stage_time
    assert "stage-time" in page.images and set(stats["stage_time"]) >= {"lang", "rules"}
    # the recipe as run
    info = json.loads((out / "run.json").read_text())
    assert [s["name"] for s in info["stages"]] == ["lang", "rules"]
    assert info["stages"][0]["params"]["min_score"] == 0.5
    assert info["runner"].endswith("FnApiRunner") and info["beam_version"] and info["dsdata_version"]
    assert info["inputs"] == [str(tmp_path / "*.jsonl")]
    assert "&quot;min_score&quot;: 0.5" in html and info["beam_version"] in html


def _kept_file(path: Path, groups: int, rows: int) -> None:
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("metadata", pa.string()),
                        ("lang", pa.string()), ("lang_score", pa.float64())])
    with pq.ParquetWriter(path, schema) as writer:
        for g in range(groups):
            writer.write_table(pa.table({
                "id": [f"g{g}-{i}" for i in range(rows)], "text": ["x" * (g + 1)] * rows, "metadata": ["{}"] * rows,
                "lang": ["en" if g % 2 else "zh"] * rows, "lang_score": [g / groups] * rows}, schema))


def test_kept_sample_reads_spread_row_groups_not_the_whole_output(tmp_path):
    (tmp_path / "kept").mkdir()
    _kept_file(tmp_path / "kept" / "part-0.parquet", groups=10, rows=1000)
    sample = KeptSample(str(tmp_path), sample_rows=2500)
    assert sample.total_rows == 10_000
    assert 2500 <= sample.sample_rows < 10_000
    lengths = set(sample.numbers("text_length"))
    assert len(lengths) >= 3 and max(lengths) >= 9  # row groups from the end too, not only the first
    assert sample.numbers("relevance_score") is None  # absent column: no histogram


def test_examples_find_a_rare_reason_and_stop_at_the_limit(tmp_path):
    (tmp_path / "rejected").mkdir()
    rows = [{"id": f"d{i}", "text": "t" * 1000, "text_length": 1000, "metadata": "{}", "stage": "rules",
             "reason": "common", "detail": f"value {i} < 3", "annotations": "{}"} for i in range(5000)]
    rows.append({**rows[0], "id": "rare", "reason": "rare", "detail": "0.1 < 0.2"})
    with pq.ParquetWriter(tmp_path / "rejected" / "part-0.parquet", REJECTED_SCHEMA) as w:
        for start in range(0, len(rows), 1000):
            w.write_table(pa.Table.from_pylist(rows[start:start + 1000], REJECTED_SCHEMA))
    found = rejected_examples(str(tmp_path), [("rules", "common"), ("rules", "rare")], per_reason=3)
    assert [e["id"] for e in found[("rules", "common")]] == ["d0", "d1", "d2"]
    assert [e["detail"] for e in found[("rules", "rare")]] == ["0.1 < 0.2"]
    assert len(found[("rules", "common")][0]["text"]) < 1000  # truncated


def test_stage_times_reads_cpu_seconds_and_is_empty_without_timing():
    stats = {"stages": {"lang": {"kept_after": 90, "rejected": 10}}}
    assert stage_times(stats) == []
    assert stage_times({**stats, "stage_time_unavailable": "no metrics"}) == []
    assert stage_times({**stats, "stage_time": {"lang": {"cpu_s": 4, "docs": 28, "docs_per_s": 7}}}) == [("lang", 4.0, 7.0)]


def test_no_stage_time_section_without_timing(tmp_path):
    out, stats = _mixed_run(tmp_path)
    on_disk = json.loads((out / "stats.json").read_text())
    del on_disk["stage_time"]
    (out / "stats.json").write_text(json.dumps(on_disk))
    page = PageParts()
    page.feed(build_html(str(out)))
    assert "stage-time" not in page.images  # a runner that returned no metrics: no chart, no zeros


def test_a_broken_output_only_warns(tmp_path, caplog):
    (tmp_path / "stats.json").write_text(json.dumps({"input": 1, "kept": 1, "stages": {}, "rejected": {}}))
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "part-0.parquet").write_bytes(b"not parquet")
    with caplog.at_level(logging.WARNING, logger="dsdata"):
        assert write_report_safely(str(tmp_path)) is None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "report.html" in warnings[0].getMessage()
    assert "the run itself succeeded" in warnings[0].getMessage()


def test_dsdata_report_rebuilds_and_rejects_a_directory_without_a_run(tmp_path):
    out, _ = _mixed_run(tmp_path)
    (out / "report.html").unlink()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run([sys.executable, "-m", "dsdata.cli", "report", str(out)], env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(out / "report.html") and "funnel" in parse(out / "report.html").images
    bad = subprocess.run([sys.executable, "-m", "dsdata.cli", "report", str(tmp_path / "nothing")], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("dsdata: error: ") and "Traceback" not in bad.stderr


def test_a_rerun_replaces_the_report(tmp_path):
    out, _ = _mixed_run(tmp_path)
    (tmp_path / "r.yaml").write_text("name: second\ninput: {paths: ['*.jsonl']}\nstages:\n  - rules: {}\n")
    run_recipe(load_recipe(str(tmp_path / "r.yaml")), str(out))
    assert [s["name"] for s in json.loads((out / "run.json").read_text())["stages"]] == ["rules"]
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "<title>dsdata run report: second</title>" in html and "reasons-lang" not in html
