"""benchmarks/e2e.py's measuring: a real process tree's CPU (grandchildren included) and peak memory
(of the tree and of its largest process), and the corpus's language labels (a duplicate takes its
original's language)."""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import e2e  # noqa: E402

# A parent holding ~120 MB starts a child that holds ~200 MB and burns CPU, and waits for it.
TREE = r"""
import subprocess, sys, time
CHILD = "import time\nblock = bytearray(200 << 20)\nblock[::4096] = b'x' * len(block[::4096])\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\ntime.sleep(0.5)\n"
held = bytearray(120 << 20)
held[::4096] = b'y' * len(held[::4096])
subprocess.run([sys.executable, "-c", CHILD], check=True)
print("done")
"""


def test_run_tree_counts_the_whole_tree():
    proc, measured = e2e.run_tree([sys.executable, "-c", TREE])
    assert proc.stdout.strip() == "done"
    assert measured["cpu_s"] >= 0.4  # the grandchild's CPU is in the parent's RUSAGE_CHILDREN
    assert measured["largest_mb"] >= 200  # the child's own peak
    assert measured["tree_mb"] >= 310  # both at once: 120 + 200 MB sampled together
    assert measured["tree_mb"] >= measured["largest_mb"]


def test_a_failed_child_is_an_error_not_a_measurement():
    try:
        e2e.run_tree([sys.executable, "-c", "import sys; sys.exit('broken')"])
    except RuntimeError as exc:
        assert "broken" in str(exc)
    else:
        raise AssertionError("a failing child was measured")


def test_languages_follow_duplicates_to_their_original(tmp_path):
    e2e.million_corpus.generate(tmp_path, 400, docs_per_file=150)
    lang = e2e.languages(tmp_path)
    recs = [json.loads(line) for path in sorted(tmp_path.glob("*.jsonl")) for line in path.open(encoding="utf-8")]
    assert len(lang) == 400
    by_id = {r["id"]: r for r in recs}
    dups = [r for r in recs if r["source"].startswith(("dup-of:", "near-dup-of:"))]
    assert dups and {lang[r["id"]] for r in recs if r["source"] == "prose-zh"} == {"zh"}
    for r in dups:
        original = by_id[r["source"].split(":", 1)[1]]
        assert lang[r["id"]] == {"prose-en": "en", "prose-zh": "zh"}[original["source"]]
    assert {lang[r["id"]] for r in recs if r["source"] in ("langid-dev", "junk")} <= {"other"}
    assert e2e.by_lang(set(lang), lang) == {k: sum(v == k for v in lang.values()) for k in ("en", "zh", "other")}
