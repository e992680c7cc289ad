"""CPU cost of HTML cleaning against nesting depth and width: dsdata's `dom` extractor vs selectolax body text.

Wide pages too (issue 35): N sibling <option>s in a <select> (lexbor's "in select" mode is ~N²: the
peer shows it), list items and table rows, at N = 5·depth and 4·N.

Pages of N nested containers (several shapes: plain <div>, furniture-named <div class>, <main>/<article>,
<section id> with headings, hidden <div>s holding scripts) each holding one paragraph, at depth D and 4·D.
Linear cost means a ratio near 4 (the page is 4× larger); the tree builder's cost alone (selectolax
body text, the peer) shows what parsing contributes.  Times are CPU seconds of this process (best
of --repeat), not wall time, because the machine is shared.

usage: python benchmarks/html_nesting.py [--depth 2000] [--repeat 3]
Last line: one JSON object with the figures.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsdata.clean.html import extract_dom, extract_selectolax_body  # noqa: E402

SHAPES = {
    "div": ("<div>", "</div>"),
    "div_class": ("<div class='sidebar-wrapper content'>", "</div>"),
    "main_article": ("<main><article>", "</article></main>"),
    "section_id": ("<section id='related-work'><h2>related work</h2>", "</section>"),
    "hidden_script": ("<div hidden><script>var x = 1;</script>", "</div>"),
}


WIDE = {
    "select_options": ("<select name='pick'>", "<option value='{i}'>option {i}</option>", "</select>"),
    "list_items": ("<ul>", "<li>item {i}</li>", "</ul>"),
    "table_rows": ("<table>", "<tr><td>row {i}</td></tr>", "</table>"),
}


def wide_page(shape: str, width: int) -> str:
    start, item, end = WIDE[shape]
    return ("<html><body><p>Some text.</p>" + start + "".join(item.format(i=i) for i in range(width)) + end
            + "</body></html>")


def page(shape: str, depth: int) -> str:
    open_tag, close_tag = SHAPES[shape]
    return ("<html><body>" + "".join(f"{open_tag}<p>w{i} text</p>" for i in range(depth))
            + close_tag * depth + "</body></html>")


def cpu(fn, html: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn(html)
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    results = {}
    cases = [(shape, page(shape, args.depth), page(shape, 4 * args.depth)) for shape in SHAPES]
    cases += [(shape, wide_page(shape, 5 * args.depth), wide_page(shape, 20 * args.depth)) for shape in WIDE]
    for shape, small, large in cases:
        row = {}
        for name, fn in (("dom", extract_dom), ("selectolax_body", extract_selectolax_body)):
            a, b = cpu(fn, small, args.repeat), cpu(fn, large, args.repeat)
            row[name] = {"cpu_s": round(a, 5), "cpu_s_4x": round(b, 5), "ratio_4x": round(b / max(a, 1e-9), 2)}
        results[shape] = row
        print(f"{shape:>14}: dom {row['dom']['cpu_s']:.4f}s -> {row['dom']['cpu_s_4x']:.4f}s "
              f"({row['dom']['ratio_4x']}x); selectolax body {row['selectolax_body']['ratio_4x']}x")
    print(json.dumps({"benchmark": "html_nesting", "depth": args.depth, "results": results}))


if __name__ == "__main__":
    main()
