"""A run's peak memory grows sub-linearly with its corpus (issue 48): the dedup stage's per-document
and per-band groupings wait in spill files, so the in-process runner holds no per-document state.

Two real `dsdata run` processes of the same recipe, 20k and 100k documents; each child's peak RSS
from wait4's rusage.  Before the spilled groupings the runner's GroupByKeys held ~4 KB of Python
objects per document (9 LSH band entries, an exact-hash record, the `where` joins): the 100k run
peaked ~1.8x the 20k one.  The documents are short, so that text-sized buffers (a Parquet writer's
table, the report's sample) stay small beside that per-document state."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = "name: memory\ninput: {paths: [\"*.jsonl\"]}\nstages:\n  - dedup: {threshold: 0.8}\n"


def _corpus(folder, n: int) -> None:
    """n documents of 20 words; every 20th an exact copy of an earlier one, every 20th + 1 a near copy."""
    rng = random.Random(7)
    vocab = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 8))) for _ in range(20000)]
    folder.mkdir()
    written: list[list[str]] = []
    with open(folder / "part.jsonl", "w", encoding="utf-8") as fh:
        for i in range(n):
            if written and i % 20 == 0:
                words = rng.choice(written)
            elif written and i % 20 == 1:
                words = list(rng.choice(written))
                words[rng.randrange(len(words))] = rng.choice(vocab)
            else:
                words = rng.choices(vocab, k=20)
                written.append(words)
            fh.write(json.dumps({"id": f"d{i:06d}", "text": " ".join(words)}) + "\n")


def _peak_mb(tmp_path, n: int) -> tuple[float, dict]:
    corpus, out = tmp_path / f"corpus-{n}", tmp_path / f"out-{n}"
    _corpus(corpus, n)
    recipe = tmp_path / "memory.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    with open(tmp_path / f"log-{n}.txt", "w+") as log:
        child = subprocess.Popen([sys.executable, "-m", "dsdata.cli", "run", str(recipe), "--input",
                                  str(corpus / "*.jsonl"), "--output", str(out), "--quiet"],
                                 cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        assert child.returncode == 0, log.read()[-3000:]
    with open(out / "stats.json", encoding="utf-8") as fh:
        stats = json.load(fh)
    return usage.ru_maxrss / 1024, stats


@pytest.mark.slow
def test_peak_rss_grows_sublinearly_with_the_corpus(tmp_path):
    small, small_stats = _peak_mb(tmp_path, 20_000)
    large, large_stats = _peak_mb(tmp_path, 100_000)
    print(f"peak RSS {small:.0f} MB at 20k documents, {large:.0f} MB at 100k")
    # The runs really deduplicated (exact copies and the near copies above the threshold), ledger balanced.
    for stats, n in ((small_stats, 20_000), (large_stats, 100_000)):
        assert stats["input"] == n and stats["ledger_ok"]
        reasons = stats["rejected"]["dedup"]
        assert reasons["exact_duplicate"] >= n // 20 - 1 and reasons["near_duplicate"] > 0
    # 5x the documents: a peak that grew with them would be ~1.8x; the spilled groupings keep it flat.
    assert large / small < 1.3, f"peak RSS {small:.0f} MB at 20k documents, {large:.0f} MB at 100k"
