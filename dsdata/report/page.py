"""OUT/report.html: one self-contained page that shows a whole run, its SVG charts embedded as data
URIs.  Reading is bounded: histograms read their columns from a spread of row groups (`SAMPLE_ROWS`),
examples read a row group's text only when it holds a reason still lacking them.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import logging
import math
from typing import Any, Iterable

from dsdata.report import charts, svgchart
from dsdata.report.charts import _e, histogram_chart, img  # _e: HTML-escape for text and attributes
from dsdata.report.cjkfont import embedded_font
from dsdata.report.files import LOCAL, files_for
from dsdata.core.names import shown_path

log = logging.getLogger("dsdata")

REPORT_NAME = "report.html"
RUN_INFO_NAME = "run.json"
SAMPLE_ROWS = 100_000
EXAMPLES_PER_REASON = 3
EXAMPLE_TEXT_CHARS = 400
# Scanning for examples of a rare reason stops after this many rejected rows.
EXAMPLE_SCAN_ROWS = 2_000_000


def write_run_info(output: str, info: dict[str, Any]) -> None:
    """OUT/run.json: what the run was (dsdata/beam/run_files.py), read back by the report."""
    data = json.dumps(info, indent=2, ensure_ascii=False).encode("utf-8")  # before the file is created
    fs = files_for(output)
    with fs.create(fs.join(output, RUN_INFO_NAME)) as fh:
        fh.write(data)


def is_run_output(output: str) -> bool:
    """Whether `output` (local or remote) holds a finished run's stats.json."""
    fs = files_for(output)
    return fs.exists(fs.join(output, "stats.json"))


def return_freed_memory() -> None:
    """Hand the C heap's free pages back to the system: glibc keeps what Python and Arrow freed (a
    16 MB row group of text read in batches left ~30 MB); elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def write_report_safely(output: str, info: dict[str, Any] | None = None) -> str | None:
    """Write run.json (when `info` is given) and report.html; on any error log ONE warning, never raise."""
    try:
        if info is not None:
            write_run_info(output, info)
        return_freed_memory()  # the run's, before the report reads its outputs
        return write_report(output)
    except Exception as exc:  # noqa: BLE001 - the report must never fail a finished run
        log.warning("warning: could not write %s: %s: %s (the run itself succeeded; "
                    "retry with 'dsdata report %s')", shown_path(output.rstrip("/") + "/" + REPORT_NAME),
                    type(exc).__name__, exc, shown_path(output))
        return None


def remove_report(output: str) -> None:
    """Delete an earlier run's report.html and run.json, so a failed run leaves no stale report."""
    try:
        fs = files_for(output)
        paths = [fs.join(output, n) for n in (REPORT_NAME, RUN_INFO_NAME)]
        existing = [p for p in paths if fs.exists(p)]
        if existing:
            fs.delete(existing)
    except Exception as exc:  # noqa: BLE001 - cleaning up is best effort; the new run overwrites them
        log.debug("could not remove an earlier report in %s: %s", output, exc)


def _read_json(output: str, name: str) -> dict[str, Any] | None:
    fs = files_for(output)
    path = fs.join(output, name)
    if not fs.exists(path):
        return None
    with fs.open(path) as fh:
        data = fh.read()
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # OUT is untrusted: a damaged or hostile file is one line
        raise ValueError(f"{shown_path(path)} is not a JSON file dsdata wrote ({type(exc).__name__})") from None


def _parquet_files(output: str, sub: str) -> list[str]:
    fs = files_for(output)
    return sorted(fs.files_in(fs.join(output, sub), ".parquet"))


def _open_parquet(path: str):
    import pyarrow.parquet as pq

    import pyarrow as pa

    fs = files_for(path)
    # Read through a small buffer, page by page, not a whole column chunk at a time: the text
    # column is read only for its lengths (text_row_lengths), and a row group holds ~16 MB of it.
    opts = {"pre_buffer": False, "buffer_size": 1 << 20}
    if fs is not LOCAL:
        # A seekable handle: pyarrow reads the footer and the column chunks it needs, not the file.
        return pq.ParquetFile(fs.open(path), **opts)
    # As bytes: pyarrow writes a str path as UTF-8, and OUT's path need not be.
    return pq.ParquetFile(pa.OSFile(os.fsencode(path)), **opts)


# Text bytes from which utf8_lengths hands the column to pyarrow.compute (a costly import).
UTF8_COMPUTE_BYTES = 2 << 20
# Rows of text decoded at a time (kept lengths, rejected examples).
TEXT_BATCH_ROWS = 1024


def utf8_lengths(column, compute_bytes: int | None = None) -> Any:
    """Characters of each string of an Arrow string column, nulls kept, as int64: Python's len()
    below `compute_bytes` of text, so that a small run does not import pyarrow.compute."""
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    limit = UTF8_COMPUTE_BYTES if compute_bytes is None else compute_bytes
    if sum(c.nbytes for c in chunks) >= limit:
        import pyarrow.compute as pc

        lengths = pc.utf8_length(column)
        lengths = lengths.combine_chunks() if isinstance(lengths, pa.ChunkedArray) else lengths
        return lengths.cast(pa.int64())
    return pa.array([None if s is None else len(s) for c in chunks for s in c.to_pylist()], type=pa.int64())


class KeptSample:
    """Columns of kept/*.parquet read from a spread of row groups: at most ~SAMPLE_ROWS rows."""

    def __init__(self, output: str, sample_rows: int = SAMPLE_ROWS, columns: Iterable[str] | None = None):
        """`columns`: the kept columns to read besides the length (None: all but text, id, metadata)."""
        import pyarrow as pa

        self.total_rows = 0
        self.columns: dict[str, Any] = {}
        files = [_open_parquet(p) for p in _parquet_files(output, "kept")]
        groups = []
        names: set[str] = set()
        for f in files:
            names.update(f.schema_arrow.names)
            self.total_rows += f.metadata.num_rows
            groups.extend((f, i, f.metadata.row_group(i).num_rows) for i in range(f.num_row_groups))
        self.names = names
        if columns is None:
            columns = sorted(names - {"text", "id", "metadata"})
        wanted = [c for c in columns if c in names]
        # Evenly spaced row groups, not the first ones: the first files hold the first inputs.
        step = max(1, self.total_rows // max(1, sample_rows))
        chosen, rows = [], 0
        for g in groups[::step]:
            chosen.append(g)
            rows += g[2]
            if rows >= sample_rows:
                break
        tables = []
        for f, i, _ in chosen:
            t = f.read_row_group(i, columns=wanted)
            if "text" in names:
                # The text a batch at a time, for its lengths only: never a row group's text at once.
                batches = f.iter_batches(batch_size=TEXT_BATCH_ROWS, row_groups=[i], columns=["text"], use_threads=False)
                t = t.append_column("text_length", pa.concat_arrays([utf8_lengths(b.column(0)) for b in batches]))
                return_freed_memory()  # the row group's decoded pages
            tables.append(t)
        if tables:
            table = pa.concat_tables(tables, promote_options="default")
            self.columns = {name: table.column(name) for name in table.column_names}
        self.sample_rows = sum(len(t) for t in tables)

    def numbers(self, name: str):
        import numpy as np

        col = self.columns.get(name)
        if col is None:
            return None
        values = col.to_numpy(zero_copy_only=False).astype("float64", copy=False)
        values = values[np.isfinite(values)]
        return values if len(values) else None

    def strings(self, name: str) -> list[str | None] | None:
        col = self.columns.get(name)
        return None if col is None else col.to_pylist()


def rejected_lengths(output: str, sample_rows: int = SAMPLE_ROWS):
    """text_length of up to ~sample_rows rejected rows (the column costs nothing to read)."""
    import numpy as np

    values, n = [], 0
    for path in _parquet_files(output, "rejected"):
        f = _open_parquet(path)
        if "text_length" not in f.schema_arrow.names:
            continue
        for i in range(f.num_row_groups):
            arr = f.read_row_group(i, columns=["text_length"]).column(0).to_numpy()
            values.append(arr)
            n += len(arr)
            if n >= sample_rows:
                break
        if n >= sample_rows:
            break
    return np.concatenate(values).astype("float64") if values else None


def rejected_examples(output: str, wanted: Iterable[tuple[str, str]], per_reason: int = EXAMPLES_PER_REASON,
                      scan_rows: int = EXAMPLE_SCAN_ROWS) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """A few rejected rows per (stage, reason): id, truncated text, detail (measured value vs threshold)."""
    need = {key: per_reason for key in wanted}
    found: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key in need}
    scanned = 0
    for path in _parquet_files(output, "rejected"):
        f = _open_parquet(path)
        cols = [c for c in ("id", "text", "text_length", "detail") if c in f.schema_arrow.names]
        for i in range(f.num_row_groups):
            if not any(need.values()) or scanned >= scan_rows:
                return found
            keys = f.read_row_group(i, columns=["stage", "reason"])
            scanned += len(keys)
            stages, reasons = keys.column("stage").to_pylist(), keys.column("reason").to_pylist()
            rows = []
            for j, key in enumerate(zip(stages, reasons)):
                if need.get(key, 0) > 0:
                    need[key] -= 1
                    rows.append((j, key))
            if not rows:
                continue
            # Only now read the heavy text column, of this row group, a batch at a time.
            group, start, want = [], 0, [j for j, _ in rows]
            for batch in f.iter_batches(batch_size=TEXT_BATCH_ROWS, row_groups=[i], columns=cols, use_threads=False):
                picked = [j - start for j in want if start <= j < start + len(batch)]
                group += batch.take(picked).to_pylist() if picked else []
                start += len(batch)
            for row, (_, key) in zip(group, rows):
                text = row.get("text") or ""
                found.setdefault(key, []).append({
                    "id": row.get("id"),
                    "text": text[:EXAMPLE_TEXT_CHARS] + ("…" if len(text) > EXAMPLE_TEXT_CHARS else ""),
                    "length": row.get("text_length", len(text)),
                    "detail": row.get("detail") or "",
                })
    return found


def _count(value: Any) -> int | float:
    """A count from stats.json as a number to draw (0 for a missing or non-finite one)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value  # exact, however large
    try:
        f = float(value)
    except (TypeError, ValueError):
        return 0
    if not math.isfinite(f):
        return 0
    return int(f) if f.is_integer() else f


def funnel_chart(stats: dict[str, Any]) -> str:
    rows = []
    for name, v in (stats.get("stages") or {}).items():
        v = v if isinstance(v, dict) else {}
        k, r = _count(v.get("kept_after")), _count(v.get("rejected"))
        rows.append((str(name), [(k, svgchart.BLUE, "kept"), (r, svgchart.RED, "rejected")],
                     f" {k}" + (f"  (−{r})" if r else "")))
    return svgchart.hbar_chart(rows, title="Funnel: documents after each stage", xlabel="documents", width=700,
                               legend=[("documents after the stage", svgchart.BLUE),
                                       ("rejected by the stage", svgchart.RED)])


def stage_time_chart(rows: list[tuple[str, float, float | None]]) -> str:
    bars = []
    for name, sec, rate in rows:
        ok = isinstance(sec, (int, float)) and math.isfinite(sec)
        label = (f" {sec:.2f} s" if ok else " ? s") + (f", {rate:.0f} docs/s" if rate and math.isfinite(rate) else "")
        bars.append((str(name), [(sec if ok else 0.0, svgchart.TEAL, "time")], label))
    return svgchart.hbar_chart(bars, title="CPU time per stage", xlabel="CPU seconds (all workers)", width=700,
                               row_height=24)


def stage_times(stats: dict[str, Any]) -> list[tuple[str, float, float | None]]:
    """(stage, CPU seconds, docs/s) from stats.json's "stage_time"; [] when absent."""
    timing = stats.get("stage_time")
    if not isinstance(timing, dict):
        return []
    rows = []
    for stage, value in timing.items():
        if not isinstance(value, dict) or not isinstance(value.get("cpu_s"), (int, float)):
            continue
        rate = value.get("docs_per_s")
        rows.append((str(stage), float(value["cpu_s"]), float(rate) if isinstance(rate, (int, float)) and rate else None))
    return rows


# The last family is the page's own CJK glyphs (cjkfont.embedded_font), for machines without a CJK font.
_CSS = """
pre,code{font-family:ui-monospace,monospace,'dsdata Noto Sans CJK SC'}
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif,'dsdata Noto Sans CJK SC';margin:0 auto;max-width:1100px;padding:1em 2em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
h3{font-size:1em;margin:1em 0 .3em} table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top} th{background:#f5f5f5}
td.n{text-align:right;font-variant-numeric:tabular-nums} img{max-width:100%;height:auto;display:block;margin:.5em 0}
.ok{color:#2a7a2a;font-weight:bold} .bad{color:#b00;font-weight:bold} .muted{color:#777;font-size:.85em}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.8em} .ex{font-size:.85em;white-space:pre-wrap;max-width:60em}
nav a{margin-right:1em;font-size:.9em}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:.5em 1.5em}
"""


def tallies_section(stats: dict[str, Any]) -> list[str]:
    """stats.json's "tallies" ({name: {kind: count}}) and each stage's stage_stats.STAGE.notes
    ({title: {key: count}}), as one table each."""
    tables = [(name, name, counts) for name, counts in (stats.get("tallies") or {}).items()]
    for stage, stage_stats in (stats.get("stage_stats") or {}).items():
        notes = stage_stats.get("notes") if isinstance(stage_stats, dict) else None
        for i, (title, counts) in enumerate((notes or {}).items()):
            tables.append((f"{stage}-note{i}", f"{stage}: {title}", counts))
    if not tables:
        return []
    parts = ['<section id="tallies"><h2>Counts by kind</h2>']
    for anchor, title, counts in tables:
        parts.append(f'<h3 id="tally-{_e(anchor)}">{_e(title)}</h3><table><tr><th>kind</th><th>count</th></tr>')
        parts.extend(f'<tr><td>{_e(k)}</td><td class="n">{_e(n)}</td></tr>'
                     for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        if not counts:
            parts.append('<tr><td colspan=2 class="muted">none</td></tr>')
        parts.append("</table>")
    parts.append("</section>")
    return parts


def build_html(output: str) -> str:
    stats = _read_json(output, "stats.json")
    if stats is None:
        raise FileNotFoundError(f"{shown_path(files_for(output).join(output, 'stats.json'))} not found: "
                                f"is {shown_path(output)} the output of a dsdata run?")
    info = _read_json(output, RUN_INFO_NAME) or {}
    parts: list[str] = []
    nav = [("summary", "Summary"), ("funnel-section", "Funnel"), ("reasons", "Rejections")]
    _summary_section(parts, shown_path(output), stats, info)
    _rejections_section(parts, output, stats)
    _distributions_section(parts, nav, output, info)
    _time_section(parts, nav, stats)
    _recipe_section(parts, nav, stats, info)

    title = f"dsdata run report: {info.get('recipe', stats.get('recipe', ''))}"
    nav_html = "<nav>" + "".join(f'<a href="#{i}">{_e(t)}</a>' for i, t in nav) + "</nav>"
    body = f"<h1>{_e(title)}</h1>{nav_html}{''.join(parts)}"
    font_face, font_note = embedded_font(title + body)
    if font_note:
        body += f'<p id="cjk-font-note" class="muted">{_e(font_note)}</p>'
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{_e(title)}</title>"
            f"<style>{font_face}{_CSS}</style></head><body>{body}"
            f'<p class="muted">Written by dsdata {_e(info.get("dsdata_version", ""))}; rebuild with '
            f"<code>dsdata report {_e(shown_path(output))}</code>.</p></body></html>\n")


def _summary_section(parts: list[str], output: str, stats: dict[str, Any], info: dict[str, Any]) -> None:
    """The run in numbers and whether its ledger holds; `output` as shown (shown_path)."""
    ok = stats.get("ledger_ok")
    seconds = info.get("seconds", stats.get("seconds"))
    parts.append('<section id="summary"><h2>Summary</h2><table>')
    for label, value in [("recipe", info.get("recipe", stats.get("recipe"))), ("output", output),
                         ("input documents", stats.get("input")), ("kept", stats.get("kept")),
                         ("augmented", stats.get("augmented")), ("rejected", stats.get("rejected_total")),
                         ("seconds", seconds), ("finished (UTC)", info.get("finished_utc"))]:
        if value is not None:
            parts.append(f"<tr><th>{_e(label)}</th><td>{_e(value)}</td></tr>")
    ledger = '<span class="ok">ok</span>' if ok else '<span class="bad">BROKEN</span>'
    parts.append(f"<tr><th>ledger (input + augmented = kept + rejected)</th><td>{ledger}</td></tr></table></section>")


def _rejections_section(parts: list[str], output: str, stats: dict[str, Any]) -> None:
    """The funnel, then each stage's rejection reasons with a few examples each."""
    parts.append('<section id="funnel-section"><h2>Funnel</h2>')
    if stats.get("stages"):
        parts.append(img("funnel", funnel_chart(stats), "documents after each stage"))
    parts.append('<table id="funnel-table"><tr><th>stage</th><th>rejected</th><th>documents after</th></tr>')
    for stage, v in stats.get("stages", {}).items():
        parts.append(f'<tr><td>{_e(stage)}</td><td class="n">{v["rejected"]}</td><td class="n">{v["kept_after"]}</td></tr>')
    parts.append("</table></section>")

    rejected = stats.get("rejected", {})
    order = [s for s in stats.get("stage_order", []) if s in rejected] + sorted(set(rejected) - set(stats.get("stage_order", [])))
    wanted = [(s, r) for s in order for r in rejected[s]]
    examples = rejected_examples(output, wanted) if wanted else {}
    parts.append('<section id="reasons"><h2>Rejections by stage and reason</h2>')
    if not wanted:
        parts.append("<p>No document was rejected.</p>")
    for stage in order:
        parts.append(f'<h3 id="reasons-{_e(stage)}">{_e(stage)}: {sum(rejected[stage].values())} rejected</h3>')
        parts.append('<table><tr><th>reason</th><th>count</th><th>examples (measured value vs threshold, text)</th></tr>')
        for reason, count in sorted(rejected[stage].items(), key=lambda kv: -kv[1]):
            cells = []
            for ex in examples.get((stage, reason), []):
                cells.append(f'<div class="ex"><b>{_e(ex["id"])}</b> ({_e(ex["length"])} chars) — '
                             f'<i>{_e(ex["detail"] or "no detail")}</i><br>{_e(ex["text"])}</div>')
            parts.append(f'<tr id="reason-{_e(stage)}-{_e(reason)}"><td>{_e(reason)}</td><td class="n">{count}</td>'
                         f'<td>{"<hr>".join(cells) or "<span class=muted>no example found</span>"}</td></tr>')
        parts.append("</table>")
    parts.append("</section>")
    parts.extend(tallies_section(stats))


def _distributions_section(parts: list[str], nav: list[tuple[str, str]], output: str, info: dict[str, Any]) -> None:
    """Histograms of what was kept: document length, then the charts the run's stages declare."""
    declared = charts.declared_charts(info.get("stages", []))
    sample = KeptSample(output, columns=charts.chart_columns(declared))
    hists: list[str] = []
    note = (f'<p class="muted">From {sample.sample_rows} of {sample.total_rows} kept documents '
            f'(whole row groups spread over the output).</p>')
    lengths = sample.numbers("text_length")
    rej_lengths = rejected_lengths(output)
    if lengths is not None or rej_lengths is not None:
        main, over = (lengths, rej_lengths) if lengths is not None else (rej_lengths, None)
        labels = ("kept", "rejected") if lengths is not None else ("rejected", "")
        hists.append(img("hist-length", histogram_chart(main, "Document length", "characters (log scale)",
                                                         log_x=True, overlay=over, labels=labels), "document length"))
    sides: dict[str, Any] = {}
    for chart, params in declared:
        if chart.side_output and chart.side_output not in sides:
            sides[chart.side_output] = _read_json(output, chart.side_output)
        shown = charts.KINDS[chart.kind](chart, sample, params, sides)
        if shown is not None:
            hists.append(shown)
    if hists:
        nav.append(("histograms", "Distributions"))
        parts.append('<section id="histograms"><h2>Distributions</h2>' + note + '<div class="grid">'
                     + "".join(f"<div>{h}</div>" for h in hists) + "</div></section>")


def _time_section(parts: list[str], nav: list[tuple[str, str]], stats: dict[str, Any]) -> None:
    """CPU time per stage, when the run measured it."""
    times = stage_times(stats)
    if times:
        nav.append(("stage-time-section", "Time"))
        parts.append('<section id="stage-time-section"><h2>Time per stage</h2>')
        parts.append(img("stage-time", stage_time_chart(times), "time per stage"))
        parts.append('<table><tr><th>stage</th><th>seconds</th><th>docs/s</th></tr>' + "".join(
            f'<tr><td>{_e(s)}</td><td class="n">{sec:.3f}</td><td class="n">{"" if r is None else f"{r:.0f}"}</td></tr>'
            for s, sec, r in times) + "</table></section>")


def _recipe_section(parts: list[str], nav: list[tuple[str, str]], stats: dict[str, Any], info: dict[str, Any]) -> None:
    """The recipe as run: runner, versions, inputs, each stage's parameters."""
    nav.append(("recipe", "Recipe"))
    parts.append('<section id="recipe"><h2>Recipe as run</h2>')
    if info:
        parts.append("<table>")
        for label, key in [("recipe file", "recipe_path"), ("runner", "runner"), ("input format", "input_format"),
                           ("dsdata", "dsdata_version"), ("Apache Beam", "beam_version"), ("Python", "python_version")]:
            if info.get(key) is not None:
                parts.append(f"<tr><th>{_e(label)}</th><td>{_e(info[key])}</td></tr>")
        parts.append(f'<tr><th>inputs</th><td>{"<br>".join(_e(i) for i in info.get("inputs", []))}</td></tr></table>')
        parts.append("<h3>Stages and parameters</h3><table><tr><th>stage</th><th>parameters</th></tr>")
        for s in info.get("stages", []):
            parts.append(f'<tr><td>{_e(s["name"])}</td><td><pre>{_e(json.dumps(s.get("params", {}), indent=1, ensure_ascii=False))}</pre></td></tr>')
        parts.append("</table>")
        if info.get("pipeline_options"):
            parts.append(f'<h3>Pipeline options</h3><pre>{_e(json.dumps(info["pipeline_options"], indent=1))}</pre>')
    else:
        parts.append(f"<p>{_e(RUN_INFO_NAME)} is missing (a run by an older dsdata); stage order: "
                     f"{_e(' → '.join(stats.get('stage_order', [])))}</p>")
    parts.append("</section>")


def write_report(output: str) -> str:
    """Build OUTPUT/report.html from the run's outputs and return its path."""
    page = build_html(output).encode("utf-8")  # before the file is created: a failure leaves none
    fs = files_for(output)
    path = fs.join(output, REPORT_NAME)
    with fs.create(path) as fh:
        fh.write(page)
    return path
