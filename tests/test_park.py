"""FlattenParked: a Flatten of documents and rejections whose records wait in spill files, not in
the runner (dsdata/beam/park.py), run as real Beam pipelines."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import apache_beam as beam
import pytest

import dsdata.beam.park as park
from dsdata.document import Document, Rejected


def _records() -> tuple[list, list]:
    docs = [Document(f"d{i:03d}", f"text {i} " * (i % 7 + 1), {"src": f"s{i % 3}", "n": i},
                     {"lang": "en", "score": i / 7}) for i in range(120)]
    # A time in a named zone is not in the spill format: this one travels as it is.
    zoned = dt.datetime(2024, 3, 31, 1, 30, tzinfo=__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
    docs.append(Document("zoned", "kept as it is", {"seen": zoned}))
    rejected = [Rejected(Document(f"r{i:03d}", "bad " * i, {}, {"lang": "zh"}, derived_from="d001"), "rules",
                         "too_short", f"detail {i}") for i in range(40)]
    return docs, rejected


def _run(spill_dir: str | None, out: Path) -> list[str]:
    docs, rejected = _records()
    with beam.Pipeline() as p:
        a = p | "Docs" >> beam.Create(docs)
        b = p | "Rejected" >> beam.Create(rejected)
        c = p | "More" >> beam.Create(docs[:10])
        ((a, b, c) | "All" >> park.FlattenParked(spill_dir)
         | beam.Map(lambda r: json.dumps(repr(r), sort_keys=True))
         | beam.io.WriteToText(str(out)))
    return sorted(line for f in out.parent.glob(out.name + "*") for line in f.read_text("utf-8").splitlines())


def test_parked_flatten_gives_every_record_back_exactly(tmp_path, monkeypatch):
    plain = _run(None, tmp_path / "plain" / "rows")
    monkeypatch.setattr(park, "PARK_FILE_BYTES", 500)  # many files per bundle
    spill = tmp_path / "run" / ".spill" / "parked"
    parked = _run(str(spill), tmp_path / "parked" / "rows")
    assert parked == plain and len(parked) == 121 + 40 + 10
    files = list(spill.glob("*.spill"))
    assert len(files) > 10, files  # the records went through files, not through the Flatten
    assert oct(spill.stat().st_mode & 0o777) == "0o700"
    assert any("zoned" in row for row in parked) and any("derived_from='d001'" in row for row in parked)


def test_a_one_input_flatten_parks_nothing(tmp_path):
    docs, _ = _records()
    spill = tmp_path / "spill"
    with beam.Pipeline() as p:
        got = (p | beam.Create(docs),) | park.FlattenParked(str(spill))
        got | beam.Map(lambda d: d.id) | beam.io.WriteToText(str(tmp_path / "ids"))
    assert not spill.exists()
    assert sum(len(f.read_text().splitlines()) for f in tmp_path.glob("ids*")) == len(docs)


@pytest.mark.parametrize("item", [Rejected(Document("x", "t"), "s", "r", "d"), Document("y", "u", {"k": [1, 2.5]})])
def test_records_pack_to_plain_values_and_back(item):
    from dsdata.beam.spill import decode, encode

    assert park.unpack_record(decode(encode(park.pack_record(item)))) == item


def test_a_run_passes_rejections_and_dedups_kept_documents_through_parked_files(tmp_path, monkeypatch):
    """In a real in-process run every rejection reaches the writer from a parked file, and dedup's
    decided documents reach the next stage from parked files: none waits in the runner's Flatten."""
    from dsdata.beam import spill
    from dsdata.beam.pipeline import run_recipe
    from dsdata.recipe import load_recipe

    import test_dedup_spill as corpus

    corpus._write_inputs(tmp_path)
    reads: dict[str, int] = {}

    def counting(path, _real=park.read_spill):
        folder = Path(str(path)).parent.name
        for record in _real(path):
            reads[folder] = reads.get(folder, 0) + 1
            yield record

    monkeypatch.setattr(park, "read_spill", counting)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: t\ninput: {paths: [in-0.jsonl, in-1.jsonl, in-2.parquet]}\nstages:\n"
                      "  - dedup: {threshold: 0.8, batch_size: 8}\n"
                      "  - pii: {}\n", "utf-8")
    stats = run_recipe(load_recipe(str(recipe)), str(tmp_path / "out"))
    assert stats["ledger_ok"] and stats["stages"]["dedup"]["rejected"] > 5
    # The zoned documents cannot be spilled: they travel in the Flatten itself, and only they do.
    zoned = {"kept": 1, "rejected": 1}
    assert reads["rejected"] == stats["rejected_total"] - zoned["rejected"], reads
    assert reads["dedup-decided"] == stats["kept"] + stats["stages"]["dedup"]["rejected"] - sum(zoned.values()), reads
    assert not (tmp_path / "out" / spill.SPILL_DIR).exists()
