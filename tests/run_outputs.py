"""Comparing two runs' outputs, for the tests that promise identical ones (other runners, a resumed
run): kept and rejected rows (sorted by id), stats.json without what a run measured rather than
produced, side files, and every shard file byte for byte."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq

# What a run measured rather than produced: wall time, per-stage CPU time (which a runner without
# metrics reports as unavailable), and what a resumed run reused.
MEASURED = ("seconds", "stage_time", "stage_time_unavailable", "resume")


def rows(out: Path, kind: str) -> list[dict]:
    found = []
    for f in sorted((out / kind).glob("*.parquet")):
        found.extend(pq.read_table(f).to_pylist())
    return sorted(found, key=lambda r: (r["id"], json.dumps(r, sort_keys=True, default=str)))


def stats(out: Path) -> dict:
    produced = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    for key in MEASURED:
        produced.pop(key, None)
    return produced


def shard_digests(out: Path) -> dict[str, str]:
    """Every file under shards/ (the bundled tokenizer's directory included) by its sha256."""
    root = out / "shards"
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_outputs(base: Path, other: Path, side_files: tuple[str, ...] = ("difficulty.json",),
                        shards: bool = True) -> None:
    for kind in ("kept", "rejected"):
        assert rows(other, kind) == rows(base, kind), f"{kind} rows differ"
        leftovers = [p.name for p in (other / kind).iterdir() if p.name.startswith("beam-temp")]
        assert not leftovers, f"temporary write directories left in {kind}/: {leftovers}"
    assert stats(other) == stats(base)
    for name in side_files:
        assert (other / name).read_bytes() == (base / name).read_bytes(), f"{name} differs"
    if shards:
        assert shard_digests(other) == shard_digests(base)
