"""Small hand-written SVG charts for OUT/report.html: each a standalone SVG document whose bars are
`<rect class="bar ..." data-label=".." data-value="..">` (histogram bins: `data-n`), so tests read
back what a chart shows; labels too wide are cut with "…".
"""
from __future__ import annotations

import math
import re
import unicodedata
from typing import Any, Iterable, Sequence

BLUE = "#4c78a8"
RED = "#e45756"
GREEN = "#54a24b"
TEAL = "#72b7b2"

FONT = 11            # px: tick labels, axis labels
SMALL = 10           # px: value labels, legends
TITLE = 13           # px: chart titles
TEXT = "#222"
AXIS = "#444"
GRID = "#e6e6e6"
MAX_LABEL_PX = 220   # a category label wider than this is cut with "…"

_INVALID_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def esc(value: Any) -> str:
    """`value` as text safe in an XML element or a double-quoted attribute."""
    s = _INVALID_XML.sub("\ufffd", str(value))
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def text_width(s: str, size: float = FONT) -> float:
    """An upper-ish estimate of `s`'s width in px in a sans-serif font (no font metrics at hand)."""
    w = 0.0
    for c in s[:500]:
        if unicodedata.combining(c):
            continue
        if unicodedata.east_asian_width(c) in "WF":
            w += 1.0
        elif c in "il.,:;|!'`[]()ijtf ":
            w += 0.34
        elif c.isupper() or c in "mwMW%@—−":
            w += 0.78
        else:
            w += 0.58
    return w * size


def fit(s: Any, max_px: float, size: float = FONT) -> str:
    """`s`, cut with "…" so that it is at most `max_px` wide."""
    s = str(s)
    if text_width(s, size) <= max_px:
        return s
    s = s[:400]
    lo, hi = 0, len(s)
    while lo < hi:  # longest prefix that fits with the ellipsis
        mid = (lo + hi + 1) // 2
        if text_width(s[:mid] + "…", size) <= max_px:
            lo = mid
        else:
            hi = mid - 1
    return s[:lo].rstrip() + "…"


def _f(v: float) -> str:
    """A coordinate: one decimal, no trailing zeros."""
    s = f"{v:.1f}"
    if s.endswith(".0"):
        s = s[:-2]
    return "0" if s == "-0" else s


def _value_str(v: float) -> str:
    """A data value for a data-* attribute: an int when it is one, else repr."""
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


_SUFFIXES = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]


def _unit(largest: float, step: float | None) -> tuple[float, str]:
    """The suffix of a tick (k, M, G, T); on a linear axis at most twice the step (0.5M, 1M; not 0.25G)."""
    for u, suffix in _SUFFIXES:
        if largest >= (u if step is None or u > 1e3 else 10 * u) and (step is None or 2 * step >= u * (1 - 1e-9)):
            return u, suffix
    return 1.0, ""


def tick_label(v: float, step: float | None = None, largest: float | None = None) -> str:
    """A tick value: 0.25, 40, 2.5k, 20M.  With `step` (linear axes) the decimals follow the step and
    the suffix the axis' `largest` tick; without it (log axes) the value is written on its own."""
    if v == 0:
        return "0"
    largest = abs(v) if largest is None else largest
    if largest >= 1e15 or (step is None and abs(v) < 1e-4):
        return f"{v:.3g}"
    unit, suffix = _unit(largest, step)
    if step is None:
        return f"{v / unit:g}{suffix}"
    step_u = step / unit
    decimals = max(0, -math.floor(math.log10(step_u) + 1e-9)) if step_u > 0 else 0
    if step_u > 0 and abs(step_u * 10 ** decimals - round(step_u * 10 ** decimals)) > 1e-6:
        decimals += 1  # 2.5 steps
    if decimals > 6:
        return f"{v:.3g}"
    out = f"{v / unit:.{decimals}f}"
    if "." in out:
        out = out.rstrip("0").rstrip(".")
    return ("0" if float(out) == 0 else out) + suffix


def nice_ticks(lo: float, hi: float, target: int = 5, integer: bool = False) -> tuple[list[float], float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k steps) inside [lo, hi], and the step."""
    if not hi > lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    step = 10 * mag
    for m in (1, 2, 2.5, 5, 10):
        if integer and m == 2.5 and mag < 10:
            continue
        if raw <= m * mag * (1 + 1e-9):
            step = m * mag
            break
    if integer and step < 1:
        step = 1.0
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    last = min(last, first + 1000)  # cannot happen with a sane target; guards against float trouble
    return [i * step for i in range(first, last + 1)], step


def log_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Powers of ten inside [lo, hi] (every 2nd, 3rd… over many decades); over fewer than three
    decades 2× and 5× as well, and more multiples when the range is narrower still."""
    a, b = math.log10(lo), math.log10(hi)
    decades = list(range(math.ceil(a - 1e-9), math.floor(b + 1e-9) + 1))
    if len(decades) >= 3:
        every = max(1, math.ceil(len(decades) / max(1, target)))
        return [10.0 ** d for d in decades if d % every == 0] or [10.0 ** decades[0]]
    ticks: list[float] = []
    for mult in ((1, 2, 5), (1, 2, 3, 4, 5, 6, 8)):
        ticks = [m * 10.0 ** d for d in range(math.floor(a) - 1, math.ceil(b) + 1) for m in mult
                 if lo * (1 - 1e-9) <= m * 10.0 ** d <= hi * (1 + 1e-9)]
        if len(ticks) >= 3:
            break
    if len(ticks) < 2:  # a very narrow range: round values in linear space
        ticks = [t for t in nice_ticks(lo, hi, 3)[0] if t > 0]
    return ticks


def log_minor_ticks(lo: float, hi: float) -> list[float]:
    """2…9 × 10^k inside [lo, hi] (short unlabelled ticks), none over more than 12 decades."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    if b - a > 12:
        return []
    return [m * 10.0 ** d for d in range(a, b + 1) for m in range(2, 10) if lo <= m * 10.0 ** d <= hi]


class Scale:
    """Maps data values in [lo, hi] onto pixels [a, b]; `log` maps log10 of the value."""

    def __init__(self, lo: float, hi: float, a: float, b: float, log: bool = False):
        self.log = log
        self.lo, self.hi = lo, hi
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        if not hi > lo:
            hi = lo + 1.0
        self._lo, self._hi, self.a, self.b = lo, hi, a, b

    def __call__(self, v: float) -> float:
        if self.log:
            v = math.log10(v) if v > 0 else self._lo
        return self.a + (v - self._lo) / (self._hi - self._lo) * (self.b - self.a)

    def ticks(self, target: int, integer: bool = False) -> list[tuple[float, str]]:
        if self.log:
            return [(t, tick_label(t)) for t in log_ticks(self.lo, self.hi, target)]
        values, step = nice_ticks(self.lo, self.hi, target, integer)
        largest = max([abs(t) for t in values] + [0.0])
        return [(t, tick_label(t, step, largest)) for t in values]


class Svg:
    """An SVG document built element by element."""

    def __init__(self, width: float, height: float):
        self.width, self.height = int(math.ceil(width)), int(math.ceil(height))
        self.parts: list[str] = []

    def rect(self, x: float, y: float, w: float, h: float, fill: str, *, opacity: float | None = None,
             cls: str | None = None, data: dict[str, Any] | None = None, stroke: str | None = None) -> None:
        attrs = [f'x="{_f(x)}" y="{_f(y)}" width="{_f(max(0.0, w))}" height="{_f(max(0.0, h))}" fill="{fill}"']
        if opacity is not None:
            attrs.append(f'fill-opacity="{opacity:g}"')
        if stroke:
            attrs.append(f'stroke="{stroke}"')
        self.parts.append(f"<rect {' '.join(attrs)}{_cls(cls)}{_data(data)}/>")

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = AXIS, *, width: float = 1.0,
             dash: str | None = None, cls: str | None = None, data: dict[str, Any] | None = None) -> None:
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{_f(x1)}" y1="{_f(y1)}" x2="{_f(x2)}" y2="{_f(y2)}" stroke="{stroke}" '
                          f'stroke-width="{width:g}"{extra}{_cls(cls)}{_data(data)}/>')

    def text(self, x: float, y: float, s: str, *, size: float = FONT, anchor: str = "start", middle: bool = False,
             rotate: float | None = None, cls: str | None = None, data: dict[str, Any] | None = None) -> None:
        attrs = f'x="{_f(x)}" y="{_f(y)}"'
        if size != FONT:
            attrs += f' font-size="{size:g}"'
        if anchor != "start":
            attrs += f' text-anchor="{anchor}"'
        if middle:
            attrs += ' dy=".35em"'
        if rotate is not None:
            attrs += f' transform="rotate({rotate:g} {_f(x)} {_f(y)})"'
        if s[:1].isspace() or s[-1:].isspace() or "  " in s:
            attrs += ' xml:space="preserve"'  # (Chromium honours it on the text element, not on the root)
        self.parts.append(f"<text {attrs}{_cls(cls)}{_data(data)}>{esc(s)}</text>")

    def title(self, s: str, y: float = 19, size: float = TITLE) -> None:
        self.text(self.width / 2, y, fit(s, self.width - 12, size), size=size, anchor="middle", cls="title",
                  data={"label": s})

    def no_data(self, x: float, y: float) -> None:
        self.text(x, y, "no data", anchor="middle", middle=True, cls="no-data")

    def render(self) -> str:
        w, h = self.width, self.height
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
                f'font-family="sans-serif" font-size="{FONT}" fill="{TEXT}">'
                f'<rect width="{w}" height="{h}" fill="#fff"/>' + "".join(self.parts) + "</svg>")


def _cls(cls: str | None) -> str:
    return f' class="{esc(cls)}"' if cls else ""


def _data(data: dict[str, Any] | None) -> str:
    return "".join(f' data-{k}="{esc(v)}"' for k, v in (data or {}).items())


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _x_axis(svg: Svg, scale: Scale, y: float, top: float, target: int) -> None:
    """Ticks, labels and vertical grid lines of a horizontal axis at height `y`."""
    lo, hi = min(scale.a, scale.b), max(scale.a, scale.b)
    for value, label in scale.ticks(target):
        x = scale(value)
        if x < lo - 0.5 or x > hi + 0.5:
            continue
        svg.line(x, top, x, y, GRID)
        svg.line(x, y, x, y + 4, AXIS)
        svg.text(x, y + 15, label, anchor="middle", cls="xtick")
    if scale.log:
        for value in log_minor_ticks(scale.lo, scale.hi):
            svg.line(scale(value), y, scale(value), y + 2.5, AXIS, width=0.8)
    svg.line(lo, y, hi, y, AXIS)


def _y_axis(svg: Svg, scale: Scale, x: float, right: float, target: int, *, integer: bool = False) -> None:
    """Ticks, labels and horizontal grid lines of a vertical axis at `x`."""
    lo, hi = min(scale.a, scale.b), max(scale.a, scale.b)
    for value, label in scale.ticks(target, integer):
        y = scale(value)
        if y < lo - 0.5 or y > hi + 0.5:
            continue
        svg.line(x, y, right, y, GRID)
        svg.line(x - 4, y, x, y, AXIS)
        svg.text(x - 6, y, label, anchor="end", middle=True, cls="ytick")
    if scale.log:
        for value in log_minor_ticks(scale.lo, scale.hi):
            svg.line(x - 2.5, scale(value), x, scale(value), AXIS, width=0.8)
    svg.line(x, lo, x, hi, AXIS)


def _y_tick_width(scale: Scale, target: int, integer: bool = False) -> float:
    return max([text_width(label) for _, label in scale.ticks(target, integer)] + [8.0])


def _legend(svg: Svg, entries: Sequence[tuple[str, str, str, float]], x: float, y: float, *,
            anchor: str = "start", row: bool = False) -> None:
    """Entries (label, colour, "patch" | "line", opacity), in a boxed column at (x, y) top-left
    (top-right with anchor="end"), or in one row centred on x (row=True)."""
    if not entries:
        return
    labels = [fit(label, 240, SMALL) for label, _, _, _ in entries]
    widths = [22 + text_width(label, SMALL) for label in labels]
    if row:
        total = sum(widths) + 18 * (len(widths) - 1)
        cx = x - total / 2
        svg.rect(cx - 6, y - 2, total + 12, 18, "#fff", stroke="#ccc", cls="legend")
        for (label, color, kind, opacity), text, w in zip(entries, labels, widths):
            _legend_key(svg, cx, y + 7, color, kind, opacity)
            svg.text(cx + 20, y + 7, text, size=SMALL, middle=True, cls="legend-label", data={"label": label})
            cx += w + 18
        return
    box_w, box_h = max(widths) + 12, 16 * len(entries) + 6
    left = x - box_w if anchor == "end" else x
    svg.rect(left, y, box_w, box_h, "#fff", opacity=0.85, stroke="#ccc", cls="legend")
    for i, ((label, color, kind, opacity), text) in enumerate(zip(entries, labels)):
        cy = y + 11 + 16 * i
        _legend_key(svg, left + 6, cy, color, kind, opacity)
        svg.text(left + 26, cy, text, size=SMALL, middle=True, cls="legend-label", data={"label": label})


def _legend_key(svg: Svg, x: float, cy: float, color: str, kind: str, opacity: float) -> None:
    if kind == "line":
        svg.line(x, cy, x + 16, cy, color, width=1.5, dash="4 2")
    else:
        svg.rect(x + 2, cy - 5, 12, 10, color, opacity=opacity if opacity < 1 else None)


def hbar_chart(rows: Sequence[tuple[str, Sequence[tuple[float, str, str]], str]], *, title: str, xlabel: str,
               legend: Sequence[tuple[str, str]] = (), width: float = 700, row_height: float = 26) -> str:
    """Horizontal bars, one row per (label, segments [(value, colour, class)], value label), top to
    bottom in the given order; segments stack left to right and the value label follows the bar."""
    n = len(rows)
    label_w = min(MAX_LABEL_PX, max([text_width(label) for label, _, _ in rows] + [30.0]))
    left = label_w + 16
    top, right = 32.0, 14.0
    bottom = 22 + 20 + (26 if legend else 0) + 6
    height = top + max(1, n) * row_height + bottom
    width = max(width, left + right + 160)
    pw = width - left - right
    totals = [sum(max(0.0, _finite(v) or 0.0) for v, _, _ in segs) for _, segs, _ in rows]
    value_w = [text_width(v, SMALL) + 4 for _, _, v in rows]
    if value_w and max(value_w) > 0.6 * pw:  # very long value labels: a wider chart
        width += max(value_w) - 0.6 * pw
        pw = width - left - right
    hi = max(totals + [0.0]) or 1.0
    for t, vw in zip(totals, value_w):  # room for each value label right of its bar
        if t > 0:
            hi = max(hi, t * pw / max(0.4 * pw, pw - vw))
    svg = Svg(width, height)
    svg.title(title)
    plot_bottom = top + max(1, n) * row_height
    xs = Scale(0.0, hi, left, left + pw)
    _x_axis(svg, xs, plot_bottom, top, max(2, int(pw / 75)))
    svg.line(left, top, left, plot_bottom, AXIS)
    if n == 0:
        svg.no_data(left + pw / 2, top + row_height / 2)
    for i, ((label, segs, value_label), total) in enumerate(zip(rows, totals)):
        cy = top + (i + 0.5) * row_height
        acc = 0.0
        for value, color, cls in segs:
            v = max(0.0, _finite(value) or 0.0)
            x0, x1 = xs(acc), xs(acc + v)
            svg.rect(x0, cy - 0.38 * row_height, x1 - x0, 0.76 * row_height, color, cls=f"bar {cls}",
                     data={"label": label, "value": _value_str(v)})
            acc += v
        svg.line(left - 4, cy, left, cy, AXIS)
        svg.text(left - 6, cy, fit(label, label_w), anchor="end", middle=True, cls="category", data={"label": label})
        if value_label:
            svg.text(xs(total), cy, value_label, size=SMALL, middle=True, cls="value")
    svg.text(left + pw / 2, plot_bottom + 34, xlabel, anchor="middle", cls="xlabel")
    if legend:
        _legend(svg, [(label, color, "patch", 1.0) for label, color in legend], width / 2, height - 26, row=True)
    return svg.render()


def bar_chart(labels: Sequence[Any], counts: Sequence[Any], *, title: str, xlabel: str, ylabel: str = "documents",
              color: str = BLUE, width: float = 600, height: float = 320, rotate_above: int = 8,
              log_ratio: float = 50.0) -> str:
    """Vertical bars over categories; the y axis turns logarithmic (and says so) when the counts
    span more than `log_ratio`×.  Non-finite counts are dropped with their label."""
    pairs = [(str(label), f) for label, c in zip(labels, counts) if (f := _finite(c)) is not None]
    n = len(pairs)
    lo, hi, log_y = _bar_range([v for _, v in pairs], log_ratio)
    if log_y:
        ylabel += " (log scale)"
    rotate = n > rotate_above
    label_ws = [text_width(label) for label, _ in pairs]
    top, right = 32.0, 12.0
    xlabel_h = 18
    if rotate:
        longest = min(110.0, max(label_ws + [10.0]))
        bottom = 12 + longest * 0.72 + 8 + xlabel_h
    else:
        bottom = 22 + xlabel_h + 4
    height = max(height, top + bottom + 120)
    plot_bottom = height - bottom
    ys = Scale(lo, hi, plot_bottom, top, log=log_y)
    target = max(2, int((plot_bottom - top) / 45))
    left = 22 + _y_tick_width(ys, target, integer=not log_y) + 10
    width = max(width, left + right + 14 * n)
    pw = width - left - right
    svg = Svg(width, height)
    svg.title(title)
    _y_axis(svg, ys, left, left + pw, target, integer=not log_y)
    svg.line(left, plot_bottom, left + pw, plot_bottom, AXIS)
    if n == 0:
        svg.no_data(left + pw / 2, (top + plot_bottom) / 2)
    slot = pw / max(1, n)
    base = ys(lo) if log_y else ys(0.0)
    for i, (label, v) in enumerate(pairs):
        cx = left + (i + 0.5) * slot
        y = ys(max(v, lo)) if log_y else ys(v)
        svg.rect(cx - 0.4 * slot, min(y, base), 0.8 * slot, abs(base - y), color, cls="bar",
                 data={"label": label, "value": _value_str(v)})
        _category_label(svg, label, cx, plot_bottom, slot, rotate)
    svg.text(left + pw / 2, height - 6, xlabel, anchor="middle", cls="xlabel")
    svg.text(12, (top + plot_bottom) / 2, ylabel, anchor="middle", middle=True, rotate=-90, cls="ylabel")
    return svg.render()


def _counted_panel(p: dict[str, Any], plot_height: float, log_x: bool):
    """(panel, edges, [(counts, label, colour, opacity)], ymax, x range, y tick label width)."""
    import numpy as np

    edges = np.asarray(p["edges"], dtype="float64")
    counts = []
    for values, label, color, opacity in p.get("series", []):
        v = finite_values(values)
        c = np.histogram(np.clip(v, edges[0], edges[-1]), bins=edges)[0] if len(v) else np.zeros(len(edges) - 1, int)
        counts.append((c, label, color, opacity))
    ymax = max([int(c.max()) for c, *_ in counts if len(c)] + [0])
    ys = Scale(0.0, max(1.0, ymax * 1.05), plot_height, 0.0)
    tick_width = _y_tick_width(ys, max(2, int(plot_height / 40)), integer=True)
    xlo, xhi = float(edges[0]), float(edges[-1])
    for x, *_ in p.get("lines", []):
        x = _finite(x)
        if x is not None and (x > 0 or not log_x):
            xlo, xhi = min(xlo, x), max(xhi, x)
    return p, edges, counts, ymax, xlo, xhi, tick_width


def _histogram_panel(svg: "Svg", p: dict[str, Any], edges, counts, ymax: int, xlo: float, xhi: float, top: float,
                     plot_height: float, left: float, pw: float, log_x: bool) -> float:
    """Draw one panel of histogram_panels with its plot's top at `top`; returns the plot's bottom."""
    svg.title(p.get("title", ""), y=top - 8, size=p.get("title_size", TITLE))
    bottom = top + plot_height
    if log_x:
        a, b = math.log10(xlo), math.log10(xhi)
        pad = 0.02 * (b - a if b > a else 1.0)
        xs = Scale(10 ** (a - pad), 10 ** (b + pad), left, left + pw, log=True)
    else:
        pad = 0.02 * (xhi - xlo if xhi > xlo else 1.0)
        xs = Scale(xlo - pad, xhi + pad, left, left + pw)
    ys = Scale(0.0, max(1.0, ymax * 1.05), bottom, top)
    _y_axis(svg, ys, left, left + pw, max(2, int(plot_height / 40)), integer=True)
    _x_axis(svg, xs, bottom, top, max(2, int(pw / 80)))
    if not any(c.sum() for c, *_ in counts):
        svg.no_data(left + pw / 2, (top + bottom) / 2)
    for c, label, color, opacity in counts:
        for i, n in enumerate(c):
            x0, x1 = xs(float(edges[i])), xs(float(edges[i + 1]))
            y = ys(float(n))
            svg.rect(x0, y, x1 - x0, bottom - y, color, opacity=opacity, cls="bar",
                     data={"label": label, "n": int(n)})
    entries = [(label, color, "patch", opacity) for _, label, color, opacity in counts]
    for x, label, color in p.get("lines", []):
        xv = _finite(x)
        if xv is not None and (xv > 0 or not log_x):
            px = xs(xv)
            svg.line(px, top, px, bottom, color, width=1.3, dash="5 3", cls="cutoff", data={"label": label})
        entries.append((label, color, "line", 1.0))
    if p.get("legend", len(counts) > 1 or bool(p.get("lines"))):
        # the upper corner over the lower bars ("best" location, cheaply)
        n_bins = len(edges) - 1
        third = max(1, n_bins // 3)
        left_h = max([int(c[:third].max()) for c, *_ in counts if len(c)] + [0])
        right_h = max([int(c[-third:].max()) for c, *_ in counts if len(c)] + [0])
        if right_h <= left_h:
            _legend(svg, entries, left + pw - 6, top + 4, anchor="end")
        else:
            _legend(svg, entries, left + 6, top + 4)
    svg.text(12, (top + bottom) / 2, p.get("ylabel", "documents"), anchor="middle", middle=True, rotate=-90,
             cls="ylabel")
    return bottom


def _bar_range(values: list[float], log_ratio: float) -> tuple[float, float, bool]:
    """(low, high, logarithmic?) of bar_chart's y axis."""
    positive = [v for v in values if v > 0]
    if positive and max(values) > log_ratio * max(1.0, min(positive)):
        lo = 10.0 ** math.floor(math.log10(min(positive)) - 0.3)
        span = math.log10(max(positive)) - math.log10(lo)
        return lo, 10.0 ** (math.log10(max(positive)) + 0.06 * span), True
    lo, hi = min(values + [0.0]), max(values + [0.0])
    lo, hi = (lo * 1.05, hi * 1.05) if hi > lo else (0.0, 1.0)
    return lo, hi, False


def _category_label(svg: "Svg", label: str, cx: float, plot_bottom: float, slot: float, rotate: bool) -> None:
    """A bar's tick and its category under the axis (turned 45° when there are many)."""
    svg.line(cx, plot_bottom, cx, plot_bottom + 4, AXIS)
    if rotate:
        svg.text(cx + 3, plot_bottom + 10, fit(label, 110), anchor="end", rotate=-45, cls="category",
                 data={"label": label})
    else:
        svg.text(cx, plot_bottom + 15, fit(label, max(slot - 2, 12)), anchor="middle", cls="category",
                 data={"label": label})


def finite_values(values: Any):
    """`values` as a float64 array without NaN/inf (an empty array for None)."""
    import numpy as np

    if values is None:
        return np.zeros(0)
    arr = np.asarray(values, dtype="float64").ravel()
    return arr[np.isfinite(arr)]


def linear_edges(datasets: Iterable[Any], bins: int = 40):
    """`bins` equal bins over the finite values of all datasets (±0.5 around a single value)."""
    import numpy as np

    arrays = [a for a in (finite_values(d) for d in datasets) if len(a)]
    if not arrays:
        lo, hi = 0.0, 1.0
    else:
        lo, hi = min(float(a.min()) for a in arrays), max(float(a.max()) for a in arrays)
        if not hi > lo:
            lo, hi = lo - 0.5, hi + 0.5
    t = np.arange(bins + 1) / bins
    edges = lo * (1 - t) + hi * t  # no overflow for huge ranges, exact end points
    edges[0], edges[-1] = lo, hi
    return edges


def log_edges(lo: float, hi: float, bins: int = 40):
    """`bins` bins of equal width in log space over [lo, hi] (lo > 0)."""
    import numpy as np

    if not hi > lo:
        hi = lo * 10
    edges = np.logspace(math.log10(lo), math.log10(hi), bins + 1)
    edges[0], edges[-1] = lo, hi
    return edges


def histogram_panels(panels: Sequence[dict[str, Any]], *, xlabel: str, log_x: bool = False, width: float = 600,
                     plot_height: float = 150) -> str:
    """One histogram per panel, stacked vertically: {"title", "edges", "series": [(values, label,
    colour, opacity)], "lines": [(x, label, colour)], "ylabel", "legend", "title_size"}."""
    title_h, ticks_h, gap = 26.0, 22.0, 14.0
    xlabel_h = 20.0
    height = sum(title_h + plot_height + ticks_h for _ in panels) + gap * max(0, len(panels) - 1) + xlabel_h + 4
    prepared = [_counted_panel(p, plot_height, log_x) for p in panels]
    widest = max([8.0] + [w for *_, w in prepared])
    left, right = 24 + widest + 10, 14.0
    width = max(width, left + right + 200)
    pw = width - left - right
    svg = Svg(width, height)
    y0 = 0.0
    for p, edges, counts, ymax, xlo, xhi, _ in prepared:
        bottom = _histogram_panel(svg, p, edges, counts, ymax, xlo, xhi, y0 + title_h, plot_height, left, pw, log_x)
        y0 = bottom + ticks_h + gap
    svg.text(left + pw / 2, height - 8, xlabel, anchor="middle", cls="xlabel")
    return svg.render()
