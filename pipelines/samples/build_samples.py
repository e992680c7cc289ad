#!/usr/bin/env python3
"""Rebuild the sample corpus in this folder from the project's shared dev data.

usage: python3 pipelines/samples/build_samples.py [SHARED_DATA_DIR]   (default: ../shared/data)

docs.jsonl: real documentation paragraphs from Debian packages (the shared langid dev set),
regrouped into documents: all paragraphs of one source page in paragraph order.  zh and en pages
plus a handful of pages in other languages (the `lang` stage rejects those by default), and two
mirror copies of one English page under other ids (what `dedup` removes).  Each record keeps its
`source` (package:path) so its licence can be looked up; see README.md.
html/: four real pages from the shared HTML dev set, byte for byte.
"""
import json
import os
import shutil
import sys
from collections import defaultdict

HTML_PAGES = ["py-library-bisect", "py-library-netrc", "maintguide-en-upload", "maintguide-zh-cn-upload"]
SKIP_PACKAGES = {"fortunes", "jargon-text"}  # not documentation


def main() -> None:
    data = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
    here = os.path.dirname(os.path.abspath(__file__))
    pages = defaultdict(list)
    with open(os.path.join(data, "langid-dev.jsonl"), encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            path, _, para = rec["source"].partition("#")
            if path.split(":")[0] in SKIP_PACKAGES:
                continue
            pages[(rec["lang"], path)].append((int(para) if para.isdigit() else 0, rec["text"]))
    docs, other = [], defaultdict(int)
    for (lang, path), paras in sorted(pages.items()):
        if lang in ("zh", "en"):
            if len(paras) < 2:
                continue
        elif len(paras) < 3 or other[lang] >= 1 or len(other) >= 12:
            continue
        else:
            other[lang] += 1
        text = "\n\n".join(t for _, t in sorted(paras))
        docs.append({"id": f"{lang}/{path}", "text": text, "lang_label": lang, "source": path})
    en = next(d for d in docs if d["lang_label"] == "en" and len(d["text"]) > 1500)
    for mirror in ("mirror-a", "mirror-b"):
        docs.append(dict(en, id=f"{mirror}/{en['source']}", source=f"{mirror}:{en['source']}"))
    with open(os.path.join(here, "docs.jsonl"), "w", encoding="utf-8") as out:
        for doc in docs:
            out.write(json.dumps(doc, ensure_ascii=False) + "\n")
    for name in HTML_PAGES:
        shutil.copyfile(os.path.join(data, "html-dev", f"{name}.html"), os.path.join(here, "html", f"{name}.html"))
    counts = defaultdict(int)
    for d in docs:
        counts[d["lang_label"]] += 1
    print(f"{len(docs)} documents ({dict(counts)}), {len(HTML_PAGES)} HTML pages")


if __name__ == "__main__":
    main()
