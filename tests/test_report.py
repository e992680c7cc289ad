"""OUT/report.html: written by real runs, self-contained, bounded reads, never fails a run."""
import base64
import io
import json
import logging
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.document import REJECTED_SCHEMA
from dsdata.recipe import load_recipe
from dsdata.report import svgchart
from dsdata.report.charts import bar_chart, cutoffs_chart, histogram_chart
from dsdata.report.page import (KeptSample, build_html, funnel_chart, rejected_examples, stage_time_chart, stage_times,
                                write_report_safely)

REPO = Path(__file__).resolve().parents[1]


SVG = "{http://www.w3.org/2000/svg}"


class PageParts(HTMLParser):
    """Element ids, embedded images (id → SVG width/height) and every URL-bearing attribute,
    in the page and inside the embedded SVG documents."""

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
            prefix = "data:image/svg+xml;base64,"
            assert attrs["src"].startswith(prefix)
            root = svg_root(base64.b64decode(attrs["src"][len(prefix):]).decode("utf-8"))
            for element in root.iter():
                self.tags.add(element.tag.replace(SVG, "svg:"))
                self.urls.extend(v for k, v in element.attrib.items() if k.endswith("href") or "url(" in v)
            self.images[attrs["id"]] = (int(root.get("width")), int(root.get("height")))


def svg_root(text: str) -> ET.Element:
    """The parsed SVG document of a chart, checked: namespace, px size and matching viewBox, and
    every coordinate a finite number (no NaN/inf leaks into the drawing)."""
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag == SVG + "svg"
    w, h = int(root.get("width")), int(root.get("height"))
    assert w > 0 and h > 0 and root.get("viewBox") == f"0 0 {w} {h}"
    for element in root.iter():
        for name in ("x", "y", "width", "height", "x1", "y1", "x2", "y2"):
            if name in element.attrib:
                value = float(element.get(name))
                assert math.isfinite(value) and (value >= 0 or name not in ("width", "height")), (element.tag, name)
    return root


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
    assert not {"svg:script", "svg:image", "svg:foreignObject", "svg:use"} & page.tags  # charts draw, never fetch
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
    # The recipe's own glob is link-checked and handed on as the files it matched (as `dsdata run` does).
    assert info["inputs"] == [str(tmp_path / "in.jsonl")]
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


# ---------------------------------------------------------------------------------------------
# The SVG charts (dsdata.report.svgchart through report's chart functions)

ODD = 'a<b&"c" \'d\' > e'  # round-trips through XML escaping to the same text


def _bars(root: ET.Element, cls: str = "bar") -> list[ET.Element]:
    return [r for r in root.iter(SVG + "rect") if cls in (r.get("class") or "").split()]


def _texts(root: ET.Element, cls: str | None = None) -> list[str]:
    return [t.text or "" for t in root.iter(SVG + "text") if cls is None or t.get("class") == cls]


def _labels(root: ET.Element) -> set[str]:
    """Every text drawn plus every full label kept in data-label (drawn text may be cut with '…')."""
    return set(_texts(root)) | {e.get("data-label") for e in root.iter() if e.get("data-label") is not None}


def _tick_values(root: ET.Element, axis: str = "x") -> list[float]:
    units = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    out = []
    for t in _texts(root, axis + "tick"):
        out.append(float(t[:-1]) * units[t[-1]] if t[-1] in units else float(t))
    return out


def test_funnel_chart_draws_every_stage_kept_and_rejected_with_value_labels():
    stats = {"stages": {"read": {"kept_after": 200, "rejected": 0}, "lang": {"kept_after": 123, "rejected": 45},
                        ODD: {"kept_after": 100, "rejected": 23}}}
    root = svg_root(funnel_chart(stats))
    kept, rejected = _bars(root, "kept"), _bars(root, "rejected")
    assert [r.get("data-label") for r in kept] == ["read", "lang", ODD] == [r.get("data-label") for r in rejected]
    assert [r.get("data-value") for r in kept] == ["200", "123", "100"]
    assert [r.get("data-value") for r in rejected] == ["0", "45", "23"]
    assert {r.get("fill") for r in kept} == {"#4c78a8"} and {r.get("fill") for r in rejected} == {"#e45756"}
    assert _texts(root, "value") == [" 200", " 123  (−45)", " 100  (−23)"]  # spaces kept (xml:space)
    texts = _labels(root)
    assert {"Funnel: documents after each stage", "documents", "documents after the stage", "rejected by the stage",
            "read", "lang", ODD} <= texts
    # bars grow with the value: kept 200 is the longest, and the stacked rejected part starts where kept ends
    widths = [float(r.get("width")) for r in kept]
    assert widths[0] > widths[1] > widths[2] > 0
    assert float(rejected[1].get("x")) == pytest.approx(float(kept[1].get("x")) + widths[1], abs=0.11)
    ticks = _tick_values(root)
    assert ticks[0] == 0 and len(ticks) >= 3 and len({round(b - a, 9) for a, b in zip(ticks, ticks[1:])}) == 1


@pytest.mark.parametrize("stages", [
    {"only": {"kept_after": 7, "rejected": 3}},
    {f"stage{i}": {"kept_after": 1000 - i, "rejected": 1} for i in range(30)},
    {"s" * 300: {"kept_after": 5, "rejected": 0}, "b": {"kept_after": 0, "rejected": 5}},
    {"huge": {"kept_after": 10 ** 15, "rejected": 10 ** 14}, "none": {"kept_after": 0, "rejected": 0}},
    {"nan": {"kept_after": float("nan"), "rejected": float("inf")}, "ok": {"kept_after": 3, "rejected": 1}},
    {},
])
def test_funnel_chart_edge_cases(stages):
    root = svg_root(funnel_chart({"stages": stages}))
    assert [r.get("data-label") for r in _bars(root, "kept")] == list(stages)
    assert len(_bars(root)) == 2 * len(stages)
    assert "Funnel: documents after each stage" in _labels(root) and set(stages) <= _labels(root)
    for text in _texts(root, "category"):
        assert svgchart.text_width(text) <= svgchart.MAX_LABEL_PX  # long names are cut, full name in data-label
    assert int(root.get("width")) <= 1200 and int(root.get("height")) < 100 + 30 * max(1, len(stages)) + 100
    if not stages:
        assert "no data" in _texts(root)


def test_histogram_chart_40_bins_overlay_and_threshold_lines():
    rng = np.random.default_rng(0)
    kept, rejected = rng.normal(0.8, 0.1, 500), rng.normal(0.3, 0.1, 120)
    root = svg_root(histogram_chart(kept, "Relevance " + ODD, "relevance_score", overlay=rejected,
                                    lines=[(0.5, "threshold 0.5", "#e45756")], labels=("kept", "rejected")))
    bars = _bars(root)
    assert len(bars) == 80  # 40 bins per series
    by_series = {label: [r for r in bars if r.get("data-label") == label] for label in ("kept", "rejected")}
    assert sum(int(r.get("data-n")) for r in by_series["kept"]) == 500
    assert sum(int(r.get("data-n")) for r in by_series["rejected"]) == 120
    assert {r.get("fill") for r in by_series["kept"]} == {"#4c78a8"}
    assert {r.get("fill") for r in by_series["rejected"]} == {"#e45756"} and by_series["rejected"][0].get("fill-opacity")
    lines = [e for e in root.iter(SVG + "line") if e.get("class") == "cutoff"]
    assert [e.get("data-label") for e in lines] == ["threshold 0.5"] and lines[0].get("stroke-dasharray")
    assert {"Relevance " + ODD, "relevance_score", "documents", "kept", "rejected", "threshold 0.5"} <= _labels(root)
    ticks = sorted(set(_tick_values(root)))
    assert all(round(t * 20, 6) == round(t * 20) for t in ticks)  # round values (multiples of 0.05)


def test_histogram_chart_log_x_ticks_are_powers_of_ten_and_zeros_are_clipped():
    values = np.array([0, -3, 1, 5, 50, 500, 5000, 50_000, np.nan, np.inf, -np.inf])
    root = svg_root(histogram_chart(values, "Document length", "characters (log scale)", log_x=True,
                                    overlay=np.array([2.0, 20_000.0])))
    bars = _bars(root)
    assert len(bars) == 80
    assert sum(int(r.get("data-n")) for r in bars if r.get("data-label") == "kept") == 8  # finite, ≤ 1 in bin 0
    assert int(bars[0].get("data-n")) == 3  # 0, -3 and 1 clipped to lo = 1
    ticks = [t for t in _tick_values(root)]
    assert ticks and all(math.log10(t) == round(math.log10(t)) for t in ticks)
    assert {"Document length", "characters (log scale)", "kept", "rejected"} <= _labels(root)


@pytest.mark.parametrize("values,log_x", [
    (np.array([]), False), (np.array([]), True), (np.array([7.0]), False), (np.array([3.0] * 50), False),
    (np.array([3.0] * 50), True), (np.array([np.nan, np.inf, 2.0, 2.5]), False), (np.array([0.0, 0.0, -1.0]), True),
    (np.array([1e300, -1e300, 0.0]), False), (np.array([1, 10 ** 12]), True),
])
def test_histogram_chart_edge_cases(values, log_x):
    root = svg_root(histogram_chart(values, "T " + ODD, "x " + ODD, log_x=log_x, lines=[(float("nan"), "nan line", "#e45756")]))
    finite = int(np.isfinite(values).sum())
    bars = _bars(root)
    assert len(bars) == 40 and sum(int(r.get("data-n")) for r in bars) == finite
    assert {"T " + ODD, "x " + ODD, "nan line"} <= _labels(root)  # an undrawable line keeps its legend entry
    if not finite:
        assert "no data" in _texts(root)


def test_bar_chart_categories_rotation_and_log_scale():
    root = svg_root(bar_chart(["en", "zh", ODD], [120, 80, 3], "Language mix (kept)", "lang"))
    bars = _bars(root)
    assert [r.get("data-label") for r in bars] == ["en", "zh", ODD] and [r.get("data-value") for r in bars] == ["120", "80", "3"]
    assert {r.get("fill") for r in bars} == {"#4c78a8"}
    assert float(bars[0].get("height")) > float(bars[1].get("height")) > float(bars[2].get("height")) > 0
    assert "documents" in _texts(root, "ylabel") and {"Language mix (kept)", "lang", "en", ODD} <= _labels(root)
    assert not any(t.get("transform") for t in root.iter(SVG + "text") if t.get("class") == "category")

    labels = [f"{2 ** i}-{2 ** (i + 1) - 1}" for i in range(12)]
    counts = [10 ** (6 - i // 2) for i in range(12)]  # spans 10^6 / 1: log scale
    root = svg_root(bar_chart(labels, counts, "Duplicate-cluster sizes", "cluster size (documents)", "clusters"))
    assert [r.get("data-label") for r in _bars(root)] == labels
    assert _texts(root, "ylabel") == ["clusters (log scale)"]
    assert all(t.get("transform", "").startswith("rotate(-45") for t in root.iter(SVG + "text") if t.get("class") == "category")
    ticks = _tick_values(root, "y")
    assert len(ticks) >= 3 and all(math.log10(t) == round(math.log10(t)) for t in ticks)
    # on a log axis every positive count keeps a visible bar, and bigger counts draw taller bars
    heights = [float(r.get("height")) for r in _bars(root)]
    assert all(h > 0 for h in heights) and heights[0] > heights[-1]


@pytest.mark.parametrize("labels,counts,bars", [
    ([], [], 0), (["one"], [5], 1), (["a", "b"], [0, 0], 2), (["x" * 200, "y"], [1, 2], 2),
    ([f"l{i}" for i in range(30)], list(range(30)), 30), (["nan", "inf", "ok"], [float("nan"), float("inf"), 4], 1),
    (["big", "small"], [10 ** 15, 1], 2), (["neg", "pos"], [-5, 5], 2),
])
def test_bar_chart_edge_cases(labels, counts, bars):
    root = svg_root(bar_chart(labels, counts, "T " + ODD, "x"))
    drawn = _bars(root)
    assert len(drawn) == bars
    assert [r.get("data-label") for r in drawn] == [l for l, c in zip(labels, counts) if math.isfinite(c)]
    assert "T " + ODD in _labels(root)
    if not bars:
        assert "no data" in _texts(root)


def perplexity_chart(sample, difficulty):
    """The difficulty stage's declared cutoffs chart: perplexity per language."""
    return cutoffs_chart(sample, difficulty, "perplexity", "lang")


class _Sample(KeptSample):
    """A KeptSample over given columns (no Parquet)."""

    def __init__(self, **columns):
        self.columns = {name: pa.chunked_array([pa.array(values)]) for name, values in columns.items()}


def test_perplexity_chart_one_panel_per_language_with_cutoffs():
    rng = np.random.default_rng(1)
    en, zh = list(rng.lognormal(5, 0.5, 70)), list(rng.lognormal(6, 0.3, 30)) + [0.0, float("nan")]
    sample = _Sample(perplexity=en + zh, lang=["en"] * 70 + ["zh"] * 32)
    difficulty = {"languages": {
        "en": {"documents": 70, "cutoffs": {"easy_below": 123.456, "hard_above": 200.0}},
        "zh": {"documents": 32, "cutoffs": {"easy_below": 300.5, "hard_above": 500.25}},
        "fr": {"documents": 0, "cutoffs": {"easy_below": 1, "hard_above": 2}}}}  # no documents: no panel
    root = svg_root(perplexity_chart(sample, difficulty))
    titles = _texts(root, "title")
    assert titles == ["perplexity, lang en (70 documents)", "perplexity, lang zh (31 documents)"]
    bars = _bars(root)
    assert len(bars) == 80 and sum(int(r.get("data-n")) for r in bars[:40]) == 70
    assert sum(int(r.get("data-n")) for r in bars[40:]) == 31  # the zero clipped into the first bin, NaN dropped
    cutoffs = [e for e in root.iter(SVG + "line") if e.get("class") == "cutoff"]
    assert [e.get("data-label") for e in cutoffs] == ["easy < 123.456", "hard > 200", "easy < 300.5", "hard > 500.25"]
    assert [e.get("stroke") for e in cutoffs] == ["#54a24b", "#e45756"] * 2
    assert _texts(root, "xlabel") == ["perplexity (log scale); between the lines: medium"]
    ticks = _tick_values(root)
    assert ticks and all(t > 0 for t in ticks)


def test_perplexity_chart_without_languages_or_values():
    assert perplexity_chart(_Sample(lang=["en"]), None) is None
    assert perplexity_chart(_Sample(perplexity=[float("nan")]), None) is None
    root = svg_root(perplexity_chart(_Sample(perplexity=[5.0, 5.0, 5.0]), {"cutoffs": {"easy_below": 5}}))
    assert _texts(root, "title") == ["perplexity, lang all (3 documents)"]
    assert sum(int(r.get("data-n")) for r in _bars(root)) == 3 and "easy < 5" in _labels(root)


def test_stage_time_chart_bars_and_labels():
    rows = [("read", 1.234, 456.0), (ODD, 0.5, None), ("nan", float("nan"), None)] + [(f"s{i}", i / 10, 10.0) for i in range(27)]
    root = svg_root(stage_time_chart(rows))
    bars = _bars(root)
    assert [r.get("data-label") for r in bars] == [r[0] for r in rows] and {r.get("fill") for r in bars} == {"#72b7b2"}
    values = _texts(root, "value")
    assert values[:2] == [" 1.23 s, 456 docs/s", " 0.50 s"] and len(values) == 30
    assert {"CPU time per stage", "CPU seconds (all workers)", ODD} <= _labels(root)


def test_svg_text_is_escaped_and_stays_well_formed():
    for raw in [ODD, "]]><!--", "&amp;", "ctrl\x00\x08\x1b chars", "\ud800 lone surrogate", "中文 ünï"]:
        root = svg_root(bar_chart([raw], [1], raw, raw, raw))
        label = _bars(root)[0].get("data-label")
        if any(c in raw for c in "\x00\x08\x1b\ud800"):
            assert "\ufffd" in label  # characters XML cannot hold are replaced, never break the document
        else:
            assert label == raw and raw in _texts(root, "title")


def test_nice_ticks_are_round():
    for lo, hi in [(0, 1), (0, 7), (0, 182), (0, 10 ** 9), (-3.3, 12.1), (0.001, 0.0042), (5, 5)]:
        ticks, step = svgchart.nice_ticks(lo, hi, 5)
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert round(mantissa, 6) in (1, 2, 2.5, 5) and 2 <= len(ticks) <= 11
        assert all(lo - 1e-9 <= t <= max(hi, lo + 1) + 1e-9 for t in ticks)
    assert all(math.log10(t) == round(math.log10(t)) for t in svgchart.log_ticks(1, 10 ** 6))
    assert svgchart.log_ticks(90, 800) == [100, 200, 500]  # under three decades: 2× and 5× as well
    assert [svgchart.tick_label(t, 250e6, 1.25e9) for t in (0, 250e6, 1.25e9)] == ["0", "250M", "1250M"]


def test_building_a_report_does_not_import_matplotlib(tmp_path):
    out, _ = _mixed_run(tmp_path)
    code = ("import sys; from dsdata.report import page as report; page = report.build_html(sys.argv[1]); "
            "assert 'data:image/svg+xml;base64,' in page; print('matplotlib' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_utf8_lengths_equal_pyarrow_compute_on_every_kind_of_string_column():
    """report.utf8_lengths gives pyarrow.compute.utf8_length's answer as int64, on both of its
    paths (Python's len() below compute_bytes, so a small run does not import pyarrow.compute;
    pyarrow.compute itself from there): 1- to 4-byte characters, empty strings, nulls, sliced
    arrays (an offset into the buffers), several chunks, large_string, no chunks."""
    import random

    import pyarrow as pa
    import pyarrow.compute as pc

    from dsdata.report.page import utf8_lengths

    rng = random.Random(3)
    alphabet = ["a", " ", "é", "ß", "中", "文", "\u3000", "😀", "\U0010fffd", "\x00", "\n"]
    values = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(500)]
    values[::7] = [None] * len(values[::7])
    values[3] = ""
    for typ in (pa.string(), pa.large_string()):
        whole = pa.array(values, type=typ)
        cases = [whole, whole.slice(13, 200), pa.chunked_array([whole.slice(0, 250), whole.slice(250)], type=typ),
                 pa.array(["", ""], type=typ), pa.array([None, None], type=typ), pa.chunked_array([], type=typ),
                 pa.array(["", "中a", "", "", "😀", ""], type=typ), pa.array(["é" * 70_000] * 3 + [""], type=typ)]
        for column in cases:
            want = pc.utf8_length(column)
            want = want.combine_chunks() if isinstance(want, pa.ChunkedArray) else want
            for compute_bytes in (1 << 62, 0):
                got = utf8_lengths(column, compute_bytes=compute_bytes)
                assert got.type == pa.int64() and got.to_pylist() == want.to_pylist()
    # The default switches by size: a small column stays on Python's len().
    # pandas is hidden: where it is installed, pa.array() itself imports pyarrow.compute.
    code = ("import sys\n"
            "class NoPandas:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.partition('.')[0] == 'pandas': raise ImportError(name)\n"
            "sys.meta_path.insert(0, NoPandas())\n"
            "import pyarrow as pa; from dsdata.report.page import utf8_lengths; "
            "assert utf8_lengths(pa.array(['中文', None, 'ab'])).to_pylist() == [2, None, 2]; "
            "print('pyarrow.compute' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


# ---------------------------------------------------------------------------------------------
# Chinese without a system CJK font: the page embeds the glyphs it uses (dsdata/report/cjkfont.py)


def test_the_page_embeds_the_cjk_glyphs_it_uses_and_names_those_it_lacks(tmp_path):
    from fontTools.ttLib import TTFont

    from dsdata.beam.pipeline import run_recipe
    from dsdata.recipe import load_recipe
    from dsdata.report.cjkfont import FAMILY, cjk_characters

    long_zh = "数据清洗之后的中文句子，用来检查报告页面能否显示汉字。" * 6
    docs = [{"id": f"zh{i}", "text": long_zh} for i in range(5)]
    # Too short for the rules stage: rejected, so their text is shown as examples on the page:
    # Simplified, Traditional (the samples' zh_TW pages), Japanese kana and kanji, Hangul, and one
    # hanzi of an extension block the shipped font does not have.
    # (Three texts: a page shows three examples per rejection reason.)
    shown = {"short-zh-tw": "太短，繁體說話", "short-ja-ko": "ひらがなカタカナ漢字 한국", "short-rare": "\U00020000"}
    docs += [{"id": key, "text": text} for key, text in shown.items()]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(d, ensure_ascii=False) for d in docs) + "\n",
                                       encoding="utf-8")
    (tmp_path / "r.yaml").write_text("input: {paths: [in.jsonl]}\nstages:\n  - clean: {}\n  - rules: {}\n")
    out = tmp_path / "out"
    run_recipe(load_recipe(str(tmp_path / "r.yaml")), str(out), [], progress="off")
    page = (out / "report.html").read_text(encoding="utf-8")
    assert all(text in page for text in shown.values())

    prefix = f"@font-face{{font-family:'{FAMILY}';src:url(data:font/woff;base64,"
    assert prefix in page
    data = base64.b64decode(page.split(prefix, 1)[1].split(")", 1)[0])
    assert len(data) < 64 << 10  # the page's glyphs, not the shipped font
    font = TTFont(io.BytesIO(data))
    covered = {chr(c) for c in font.getBestCmap()}
    used = cjk_characters(page)
    # Every CJK character the page shows has a glyph in the embedded font, but the one it lacks...
    assert used - covered == {"\U00020000"}
    assert set("数据清洗之后的中文句子，太短繁體說話ひらがなカタカナ漢字한국") <= covered
    # ...and nothing else of the shipped font came along.
    assert covered <= used | {" "}
    # What the font lacks is named on the page, in one line.
    note = page.split('id="cjk-font-note"', 1)[1].split("</p>", 1)[0]
    assert "not in the embedded font" in note and "\U00020000" in note and "體" not in note and "한" not in note
    assert "font-family:system-ui" in page and f"'{FAMILY}'" in page.split("body{", 1)[1].split("}", 1)[0]


def test_a_chart_with_cjk_labels_carries_the_glyphs_of_its_own_characters():
    """A chart is an <img> of an SVG, which sees none of the page's fonts: one whose labels hold CJK
    characters (a language or stage named in Chinese) embeds their glyphs itself."""
    from fontTools.ttLib import TTFont

    from dsdata.report import svgchart
    from dsdata.report.cjkfont import FAMILY, cjk_characters
    from dsdata.report.charts import img

    svg = svgchart.bar_chart(["中文", "繁體中文", "ひらがな", "한국어", "en"], [5, 4, 3, 2, 1], title="語言 (kept)", xlabel="lang")
    shown = base64.b64decode(img("hist-lang", svg, "language mix").split("base64,", 1)[1].split('"', 1)[0])
    shown = shown.decode("utf-8")
    prefix = f"@font-face{{font-family:'{FAMILY}';src:url(data:font/woff;base64,"
    font = TTFont(io.BytesIO(base64.b64decode(shown.split(prefix, 1)[1].split(")", 1)[0])))
    assert cjk_characters(svg) <= {chr(c) for c in font.getBestCmap()} and "體" in cjk_characters(svg)
    assert f"'{FAMILY}'" in shown.split(">", 1)[0]  # the root's font-family falls back to it
    assert "@font-face" not in base64.b64decode(img("x", svgchart.bar_chart(["en"], [1], title="t", xlabel="lang"), "x")
                                                .split("base64,", 1)[1].split('"', 1)[0]).decode("utf-8")


def test_a_page_without_cjk_embeds_no_font():
    from dsdata.report.cjkfont import embedded_font

    assert embedded_font("<p>English only, and é, ß, — dashes.</p>") == ("", "")


def test_freed_memory_goes_back_to_the_system_before_and_during_the_report():
    """glibc keeps freed heap chunks below one still in use: RSS stays up until malloc_trim. The
    report step calls return_freed_memory() after the run and after each row group it decodes."""
    import ctypes.util

    from dsdata.report.page import return_freed_memory

    if not ctypes.util.find_library("c") or os.uname().sysname != "Linux":
        pytest.skip("glibc's malloc_trim: Linux only")

    def rss_mb() -> int:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) // 1024 for line in fh if line.startswith("VmRSS"))

    blocks = [bytearray(100_000) for _ in range(1000)]  # ~100 MB in 100 KB heap chunks
    del blocks[:-1]  # the last one keeps the top of the heap in use: free() alone cannot shrink it
    held = rss_mb()
    return_freed_memory()
    assert rss_mb() < held - 50, (held, rss_mb())
