"""The report's charts of what stages wrote: one renderer per chart kind (`KINDS`), drawn for the
`Chart`s the run's stages declare (`Stage.charts`); the report names no stage.  A renderer takes
(chart, the kept sample, the stage's parameters, its side outputs as JSON by name) and returns the
chart's HTML, or None when there is nothing to draw.
"""
from __future__ import annotations

import html
import math
from collections import Counter
from typing import Any, Callable

from dsdata.core.chart import Chart
from dsdata.report import svgchart
from dsdata.report.cjkfont import FAMILY, cjk_characters, embedded_font


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def img(element_id: str, svg: str, alt: str) -> str:
    """An SVG chart as an <img> with a base64 data URI.  An image sees none of the page's fonts: a
    chart with CJK labels carries the glyphs of its own characters."""
    import base64

    if cjk_characters(svg):
        font_face, _ = embedded_font(svg)
        if font_face:
            root_end = svg.index(">") + 1
            svg = (svg[:root_end].replace('font-family="sans-serif"', f"font-family=\"sans-serif,'{FAMILY}'\"")
                   + f"<style>{font_face}</style>" + svg[root_end:])
    b64 = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f'<img id="{element_id}" alt="{_e(alt)}" src="data:image/svg+xml;base64,{b64}">'


def histogram_chart(values, title: str, xlabel: str, *, lines: list[tuple[float, str, str]] = (),
                    log_x: bool = False, overlay=None, labels: tuple[str, str] = ("kept", "rejected")) -> str:
    import numpy as np

    data = [svgchart.finite_values(values)]
    if overlay is not None and len(overlay):
        data.append(svgchart.finite_values(overlay))
    present = [d for d in data if len(d)]
    if log_x:
        lo = max(1.0, min((float(np.min(d)) for d in present), default=1.0))
        hi = max(lo * 10, max((float(np.max(d)) for d in present), default=0.0))
        edges = svgchart.log_edges(lo, hi, 40)  # values below lo are counted in the first bin
    else:
        edges = svgchart.linear_edges(data, 40)
    series = [(data[0], labels[0], svgchart.BLUE, 0.85)]
    if len(data) > 1:
        series.append((data[1], labels[1], svgchart.RED, 0.6))
    panel = {"title": title, "edges": edges, "series": series, "ylabel": "documents",
             "lines": [(x, label, color) for x, label, color in lines], "legend": len(data) > 1 or bool(lines)}
    return svgchart.histogram_panels([panel], xlabel=xlabel, log_x=log_x)


def bar_chart(labels: list[str], counts: list[int], title: str, xlabel: str, ylabel: str = "documents") -> str:
    # A long tail (cluster sizes, rare languages) turns the y axis logarithmic: counts spanning > 50×.
    return svgchart.bar_chart(labels, counts, title=title, xlabel=xlabel, ylabel=ylabel, color=svgchart.BLUE)


def _histogram(chart, sample, params: dict[str, Any], sides: dict[str, Any]) -> str | None:
    values = sample.numbers(chart.column)
    if values is None:
        return None
    lines = []
    value = params.get(chart.threshold) if chart.threshold else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        lines.append((value, f"{chart.threshold} {value:g}", "#e45756"))
    return img(chart.element_id, histogram_chart(values, chart.title, chart.label, lines=lines), chart.alt)


def _categories(chart, sample, params: dict[str, Any], sides: dict[str, Any]) -> str | None:
    values = sample.strings(chart.column)
    if values is None:
        return None
    counts: dict[str, int] = {}
    for value, n in Counter(values).items():  # counted at C speed, then keyed by str (None → "None")
        counts[str(value)] = counts.get(str(value), 0) + n
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:20]
    return img(chart.element_id, bar_chart([k for k, _ in top], [v for _, v in top], chart.title, chart.label),
               chart.alt)


def _cutoff_label(kind: str, sign: str, value: Any) -> str:
    return f"{kind} {sign} {value:g}" if isinstance(value, (int, float)) else f"{kind} {sign} {value}"


def cutoffs_chart(sample, graded: dict[str, Any] | None, column: str, group: str) -> str | None:
    """`column` per value of `group` (log scale; the 6 largest groups of `graded`["languages"]) with
    that group's easy/medium/hard cut-offs; one panel of all values when `graded` has no groups."""
    import numpy as np

    every = sample.numbers(column)
    if every is None:
        return None
    col = sample.columns[column].to_numpy(zero_copy_only=False).astype("float64")
    labels = sample.strings(group) or [None] * len(col)
    per_group = (graded or {}).get("languages") or {}
    groups: list[tuple[str, Any, dict]] = []
    if per_group:
        arr = np.array([str(x) for x in labels])
        for name, info in sorted(per_group.items(), key=lambda kv: -kv[1].get("documents", 0))[:6]:
            values = col[(arr == name) & np.isfinite(col)]
            if len(values):
                groups.append((name, values, info.get("cutoffs") or {}))
    if not groups:
        groups = [("all", every, (graded or {}).get("cutoffs") or {})]
    panels = []
    for name, values, cutoffs in groups:
        lo, hi = max(1e-3, float(values.min())), float(values.max())
        lines = []
        if cutoffs.get("easy_below") is not None:
            lines.append((cutoffs["easy_below"], _cutoff_label("easy", "<", cutoffs["easy_below"]), svgchart.GREEN))
        if cutoffs.get("hard_above") is not None:
            lines.append((cutoffs["hard_above"], _cutoff_label("hard", ">", cutoffs["hard_above"]), svgchart.RED))
        panels.append({"title": f"{column}, {group} {name} ({len(values)} documents)", "title_size": 12,
                       "edges": svgchart.log_edges(lo, max(hi, lo * 1.01), 40),  # values below lo: first bin
                       "series": [(values, "kept", svgchart.BLUE, 1.0)], "lines": lines, "ylabel": "documents",
                       "legend": bool(cutoffs)})
    return svgchart.histogram_panels(panels, xlabel=f"{column} (log scale); between the lines: medium", log_x=True,
                                     plot_height=140)


def _cutoff_caption(graded: dict[str, Any] | None, column: str) -> str:
    """The cut-offs drawn on the cutoffs chart, as text."""
    groups = dict((graded or {}).get("languages") or {})
    if not groups and (graded or {}).get("cutoffs"):
        groups = {"all": graded}
    items = []
    for name, info in groups.items():
        c = info.get("cutoffs") or {}
        if c:
            items.append(f"{_e(name)}: easy &lt; {_e(c.get('easy_below'))}, hard &gt; {_e(c.get('hard_above'))}"
                         f" ({_e(info.get('cutoff_source', 'cut-offs'))})")
    if not items:
        return ""
    return f'<p id="{_e(column)}-cutoffs" class="muted">Difficulty cut-offs ({_e(column)}) — {"; ".join(items)}.</p>'


def _cutoffs(chart, sample, params: dict[str, Any], sides: dict[str, Any]) -> str | None:
    graded = sides.get(chart.side_output)
    svg = cutoffs_chart(sample, graded, chart.column, chart.group)
    if svg is None:
        return None
    return img(chart.element_id, svg, chart.alt) + _cutoff_caption(graded, chart.column)


def _grades(chart, sample, params: dict[str, Any], sides: dict[str, Any]) -> str | None:
    counts = (sides.get(chart.side_output) or {}).get("counts")
    if sample.strings(chart.column) is None or not counts:
        return None
    return img(chart.element_id, bar_chart(list(counts), list(counts.values()), chart.title, chart.label),
               chart.alt)


def _clusters(chart, sample, params: dict[str, Any], sides: dict[str, Any]) -> str | None:
    """Bars of cluster sizes (powers of two past 30 distinct sizes)."""
    sizes = sample.numbers(chart.column)
    if sizes is None and chart.also and chart.also in sample.columns:
        import numpy as np

        per_cluster = Counter(sample.strings(chart.also))
        sizes = np.array(list(per_cluster.values()), dtype="float64") if per_cluster else None
    if sizes is None:
        return None
    size_counts = Counter(int(s) for s in sizes.astype(int))
    keys = sorted(size_counts)
    if len(keys) > 30:  # long tail: bucket by powers of two
        buckets: Counter = Counter()
        for k in keys:
            b = 2 ** int(math.log2(max(k, 1)))
            buckets[f"{b}-{2 * b - 1}" if b > 1 else "1"] += size_counts[k]
        labels, counts = list(buckets), list(buckets.values())
    else:
        labels, counts = [str(k) for k in keys], [size_counts[k] for k in keys]
    return img(chart.element_id, bar_chart(labels, counts, chart.title, chart.label, "clusters"), chart.alt)


# Chart kind → renderer, in the order the report shows them.
KINDS: dict[str, Callable[..., str | None]] = {
    "categories": _categories,
    "histogram": _histogram,
    "cutoffs": _cutoffs,
    "grades": _grades,
    "clusters": _clusters,
}


def declared_charts(stages: list[dict[str, Any]]) -> list[tuple[Chart, dict[str, Any]]]:
    """(chart, its stage's parameters) for every chart the run's stages declared (run.json "stages"),
    in `KINDS` order; a chart of a kind this report does not know, or that is malformed, is left out."""
    fields = set(Chart.__dataclass_fields__)
    found = []
    for spec in stages:
        declared = spec.get("charts") if isinstance(spec, dict) else None
        for raw in declared if isinstance(declared, list) else ():
            if isinstance(raw, dict) and set(raw) <= fields and raw.get("kind") in KINDS \
                    and all(isinstance(v, str) for v in raw.values()):
                try:
                    found.append((Chart(**raw), spec.get("params") or {}))
                except TypeError:  # a required field missing
                    continue
    order = list(KINDS)
    return sorted(found, key=lambda c: order.index(c[0].kind))


def chart_columns(charts: list[tuple[Any, dict[str, Any]]]) -> list[str]:
    """The kept columns the charts read."""
    columns: list[str] = []
    for chart, _ in charts:
        for name in (chart.column, chart.group, chart.also):
            if name and name not in columns:
                columns.append(name)
    return columns
