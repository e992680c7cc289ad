"""End-to-end runs of recipes on Beam: output layout, ledger law, runners, overrides."""
import gzip
import json
import logging
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe, stats_from_counts
from dsdata.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]


def _write_recipe(tmp_path: Path, stages: str, paths='["*.jsonl"]') -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: test\ninput: {{paths: {paths}}}\nstages:\n{stages}\n", encoding="utf-8")
    return recipe


def _rows(out: Path, kind: str) -> list[dict]:
    rows = []
    for f in sorted((out / kind).glob("*.parquet")):
        rows.extend(pq.read_table(f).to_pylist())
    return rows


def _mixed_input(tmp_path: Path) -> None:
    samples = [json.loads(line) for line in (REPO / "pipelines/samples/docs.jsonl").read_text(encoding="utf-8").splitlines()]
    zh_en = [s for s in samples if s["lang_label"] in ("zh", "en")]
    good = zh_en[:20] + zh_en[-20:] + [s for s in samples if s["lang_label"] not in ("zh", "en")][:3]
    lines = [json.dumps(s, ensure_ascii=False).encode() for s in good]
    lines += [b"{broken json", b'{"id": "nt", "title": "no text"}', b'{"id": "bad", "text": "\xff\xfe"}']
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines[:25]) + b"\n")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(b"\n".join(lines[25:]) + b"\n"))


def _check_ledger(out: Path, stats: dict) -> None:
    kept, rejected = _rows(out, "kept"), _rows(out, "rejected")
    assert stats["ledger_ok"]
    assert stats["kept"] == len(kept)
    assert stats["rejected_total"] == len(rejected)
    assert stats["input"] + stats["augmented"] == len(kept) + len(rejected)
    by_reason: dict = {}
    for row in rejected:
        by_reason.setdefault(row["stage"], {}).setdefault(row["reason"], 0)
        by_reason[row["stage"]][row["reason"]] += 1
    assert by_reason == stats["rejected"]
    on_disk = json.loads((out / "stats.json").read_text())
    assert on_disk["input"] == stats["input"]


def test_lang_and_rules_recipe_ledger_and_columns(tmp_path):
    _mixed_input(tmp_path)
    recipe = load_recipe(str(_write_recipe(tmp_path, '  - lang: {keep: [zh, en]}\n  - rules: {}', '["*.jsonl", "*.jsonl.gz"]')))
    out = tmp_path / "out"
    stats = run_recipe(recipe, str(out))
    assert stats["input"] == 46
    _check_ledger(out, stats)
    assert stats["rejected"]["read"] == {"bad_json": 1, "missing_text": 1, "invalid_utf8": 1}
    assert stats["rejected"]["lang"]["lang_not_kept"] == 3
    kept = _rows(out, "kept")
    assert set(kept[0]) >= {"id", "text", "metadata", "lang", "lang_score", "lang_script", "rules_cjk"}
    assert {r["lang"] for r in kept} <= {"zh", "en"}
    # metadata carries every input field other than id/text, unchanged
    meta = json.loads(kept[0]["metadata"])
    assert set(meta) == {"lang_label", "source"}
    assert stats["stages"]["rules"]["kept_after"] == stats["kept"]


def test_langid_recipe_rejects_only_unreadable(tmp_path, shared_data):
    lines = (shared_data / "langid-dev.jsonl").read_text(encoding="utf-8").splitlines()[:300]
    (tmp_path / "in.jsonl").write_text("\n".join(lines + ["not json"]) + "\n", encoding="utf-8")
    recipe = load_recipe(str(REPO / "pipelines" / "langid.yaml"))
    recipe.inputs = [str(tmp_path / "in.jsonl")]
    out = tmp_path / "out"
    stats = run_recipe(recipe, str(out))
    assert stats["input"] == 301 and stats["kept"] == 300
    assert stats["rejected"] == {"read": {"bad_json": 1}}
    kept = _rows(out, "kept")
    assert len({r["id"] for r in kept}) == 300
    assert all(0 <= r["lang_score"] <= 1 for r in kept)


def test_empty_input_still_writes_layout(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    recipe = load_recipe(str(_write_recipe(tmp_path, "  - rules: {}")))
    stats = run_recipe(recipe, str(tmp_path / "out"))
    assert stats["input"] == 0 and stats["kept"] == 0 and stats["ledger_ok"]
    assert (tmp_path / "out" / "stats.json").exists()
    # One empty part file with its schema in each folder, and nothing else (no temporary folder).
    for sub in ("kept", "rejected"):
        (only,) = (tmp_path / "out" / sub).iterdir()
        assert only.name == "part-00000-of-00001.parquet" and pq.read_table(only).num_rows == 0


def test_rerun_replaces_previous_outputs(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n', encoding="utf-8")
    recipe = load_recipe(str(_write_recipe(tmp_path, "")))
    out = tmp_path / "out"
    (out / "kept").mkdir(parents=True)
    (out / "kept" / "part-stale.parquet").write_bytes(b"stale")
    run_recipe(recipe, str(out))
    assert not (out / "kept" / "part-stale.parquet").exists()
    assert len(_rows(out, "kept")) == 1
    assert [p.name for p in (out / "kept").iterdir()] == ["part-00000-of-00001.parquet"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [
        ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
        ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"],
    ],
    ids=["direct-multiprocessing", "portable-embedded"],
)
def test_other_runners_give_the_same_ledger(tmp_path, flags):
    _mixed_input(tmp_path)
    recipe = load_recipe(str(_write_recipe(tmp_path, '  - lang: {keep: [zh, en]}\n  - rules: {}', '["*.jsonl", "*.jsonl.gz"]')))
    base = run_recipe(recipe, str(tmp_path / "base"))
    other = run_recipe(recipe, str(tmp_path / "other"), flags)
    for key in ("input", "kept", "rejected", "stages"):
        assert other[key] == base[key]
    _check_ledger(tmp_path / "other", other)
    assert sorted(r["id"] for r in _rows(tmp_path / "other", "kept")) == sorted(r["id"] for r in _rows(tmp_path / "base", "kept"))


def test_stats_fold_counts_augmented_and_per_stage():
    counts = {("input",): 10, ("kept",): 10, ("rejected", "read", "bad_json"): 1, ("rejected", "rules", "x"): 2,
              ("augmented", "augment"): 2}
    stats = stats_from_counts(counts, ["rules", "augment"])
    assert stats["input"] == 11 and stats["augmented"] == 2 and stats["ledger_ok"]
    assert stats["stages"] == {"read": {"rejected": 1, "kept_after": 10}, "rules": {"rejected": 2, "kept_after": 8},
                               "augment": {"rejected": 0, "kept_after": 10}}


def _step_names(recipe, flags):
    import apache_beam as beam

    from dsdata.beam.pipeline import build_pipeline, pipeline_options

    graph = beam.Pipeline(options=pipeline_options(flags))  # built, never run
    build_pipeline(graph, recipe, "unused-out", recipe.build_stages())
    return {t.unique_name for t in graph.to_runner_api().components.transforms.values()}


def test_input_is_cut_or_documents_reshuffled_only_when_several_workers_run(tmp_path):
    """Several workers: plain JSON Lines input is cut into byte ranges (no document moves between
    workers); a big file that cannot be cut (gzip) makes the documents be reshuffled instead."""
    (tmp_path / "one.jsonl").write_text('{"id": "a", "text": "one document"}\n', encoding="utf-8")
    recipe = load_recipe(str(_write_recipe(tmp_path, "  - rules: {}")))
    spread, cut = "Read/SpreadDocuments", "Read/PlanRanges"
    for flags in ([], ["--direct_running_mode=multi_processing", "--direct_num_workers=1"]):
        assert not {spread, cut} & _step_names(recipe, flags)
    for workers in (2, 0):
        steps = _step_names(recipe, ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"])
        assert cut in steps and spread not in steps
    import random

    (tmp_path / "big.jsonl.gz").write_bytes(gzip.compress(random.Random(0).randbytes(3 << 20)))  # 3 MB, incompressible
    recipe = load_recipe(str(_write_recipe(tmp_path, "  - rules: {}", '["*.jsonl", "*.jsonl.gz"]')))
    steps = _step_names(recipe, ["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    assert spread in steps and cut not in steps


def test_matched_files_are_reshuffled_only_when_more_than_one_worker_reads(tmp_path):
    """One in-process worker reads every file: no Reshuffle of the matched files (a runner stage
    and bundle of start-up for nothing); several workers or threads, or another runner, get it."""
    (tmp_path / "one.jsonl").write_text('{"id": "a", "text": "one document"}\n', encoding="utf-8")
    recipe = load_recipe(str(_write_recipe(tmp_path, "  - rules: {}")))
    files = "Read/Spread"
    for flags in ([], ["--direct_num_workers=1"], ["--direct_running_mode=multi_processing", "--direct_num_workers=1"],
                  ["--direct_running_mode=multi_threading"]):
        assert not any(s == files or s.startswith(files + "/") for s in _step_names(recipe, flags)), flags
    for flags in (["--direct_running_mode=multi_threading", "--direct_num_workers=2"],
                  ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
                  ["--direct_running_mode=multi_processing", "--direct_num_workers=0"]):
        assert files in _step_names(recipe, flags), flags
    from apache_beam.options.pipeline_options import PipelineOptions

    from dsdata.beam.pipeline import runs_on_one_worker

    assert not runs_on_one_worker(PipelineOptions(["--runner=FlinkRunner"]))
    assert not runs_on_one_worker(PipelineOptions(["--runner=DataflowRunner"]))


@pytest.mark.slow
def test_one_input_file_on_two_workers_gives_the_rows_of_one_worker(tmp_path, caplog):
    # One file: before the documents were reshuffled after reading, one worker ran every stage.
    samples = (REPO / "pipelines/samples/docs.jsonl").read_text(encoding="utf-8")
    (tmp_path / "all.jsonl").write_text(samples + '{"id": "x", "text": "\\ud800 lone"}\n{broken\n', encoding="utf-8")
    recipe = load_recipe(str(_write_recipe(tmp_path, "  - lang: {keep: [zh, en]}\n  - rules: {}")))
    one = run_recipe(recipe, str(tmp_path / "one"))
    with caplog.at_level(logging.INFO):
        two = run_recipe(recipe, str(tmp_path / "two"), ["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    # The --direct_* flags go to the FnApiRunner itself: Beam's DirectRunner would first try Prism
    # (a download from GitHub, and a run that ignores the flags where the download works).
    assert not [r for r in caplog.records if "prism" in r.getMessage().lower()]
    assert not [r for r in caplog.records if r.name.startswith("apache_beam.runners.direct")]
    for key in ("input", "kept", "rejected", "stages", "ledger_ok"):
        assert two[key] == one[key], key
    for kind in ("kept", "rejected"):
        by_id = lambda rows: sorted(rows, key=lambda r: (r["id"], r.get("stage") or ""))  # noqa: E731
        assert by_id(_rows(tmp_path / "two", kind)) == by_id(_rows(tmp_path / "one", kind)), kind
    assert one["rejected"]["read"] == {"bad_json": 1} and two["stage_time"]["rules"]["cpu_s"] > 0


def test_arrow_batches_write_the_rows_beams_row_dict_writer_wrote(tmp_path):
    """kept/ and rejected/ are written as Arrow record batches built a column at a time; the files
    must hold exactly what Beam's WriteToParquet wrote from one row dict per record (kept_row,
    rejected_row): every annotation type the stages declare, missing annotations, metadata that is
    not JSON, long texts cut in rejected rows, and more records than one batch."""
    import datetime
    import random

    import apache_beam as beam
    import pyarrow as pa

    from dsdata.beam.pipeline import ARROW_BATCH_ROWS, ParquetParts, _ArrowTables, _ParquetPartFiles
    from dsdata.document import (REJECTED_SCHEMA, Document, Rejected, kept_columns, kept_row, kept_schema,
                                 rejected_columns, rejected_row)

    types = {"lang": pa.string(), "lang_score": pa.float64(), "rules_cjk": pa.bool_(), "dup_cluster_size": pa.int64(),
             "tokens": pa.list_(pa.uint32())}
    rng = random.Random(3)
    docs, rejected = [], []
    for i in range(2 * ARROW_BATCH_ROWS + 37):
        ann = {"lang": rng.choice(["en", "zh", None]), "lang_score": rng.random(), "rules_cjk": rng.random() < 0.5,
               "dup_cluster_size": rng.randrange(1, 9), "tokens": [rng.randrange(2 ** 32) for _ in range(rng.randrange(4))]}
        for name in list(ann):
            if rng.random() < 0.2:
                del ann[name]
        meta = {} if i % 3 else {"when": datetime.datetime(2026, 1, 1, i % 24), "n": i, "tags": ["a", "段"]}
        doc = Document(f"d{i}", "文本 text " * rng.randrange(1, 40), meta, ann)
        docs.append(doc)
        rejected.append(Rejected(doc, "rules", "too_short", "detail " * rng.randrange(0, 600)))
    names = list(types)
    schema = kept_schema(types)

    def written(folder):
        return pq.read_table(str(tmp_path / folder)).to_pylist()

    with beam.Pipeline() as p:
        kept = p | "Docs" >> beam.Create(docs)
        rej = p | "Rejected" >> beam.Create(rejected)
        kept | "Rows" >> beam.Map(kept_row, names) | "Dicts" >> beam.io.WriteToParquet(
            str(tmp_path / "dicts" / "part"), schema, file_name_suffix=".parquet")
        (kept | "Tables" >> beam.ParDo(_ArrowTables(schema, lambda d: kept_columns(d, names)))
         | "Batched" >> beam.io.WriteToParquetBatched(str(tmp_path / "arrow" / "part"), schema, file_name_suffix=".parquet"))
        rej | "RRows" >> beam.Map(rejected_row) | "RDicts" >> beam.io.WriteToParquet(
            str(tmp_path / "rdicts" / "part"), REJECTED_SCHEMA, file_name_suffix=".parquet")
        (rej | "RTables" >> beam.ParDo(_ArrowTables(REJECTED_SCHEMA, rejected_columns))
         | "RBatched" >> beam.io.WriteToParquetBatched(str(tmp_path / "rarrow" / "part"), REJECTED_SCHEMA,
                                                       file_name_suffix=".parquet"))
        # What the pipeline writes with: one part file per bundle, committed after a GroupByKey.
        for label, pcoll, parts, columns in (
                ("K", kept, ParquetParts(str(tmp_path), "parts", schema, "run"), lambda d: kept_columns(d, names)),
                ("R", rej, ParquetParts(str(tmp_path), "rparts", REJECTED_SCHEMA, "run"), rejected_columns)):
            (pcoll | f"{label}Parts" >> beam.ParDo(_ParquetPartFiles(parts, columns))
             | f"{label}Group" >> beam.GroupByKey()
             | f"{label}Commit" >> beam.Map(lambda kv, parts=parts: parts.commit([v[2] for v in kv[1]])))
    by_id = lambda rows: sorted(rows, key=lambda r: r["id"])  # noqa: E731
    assert by_id(written("arrow")) == by_id(written("dicts")) and len(written("arrow")) == len(docs)
    assert by_id(written("parts")) == by_id(written("arrow")) and by_id(written("rparts")) == by_id(written("rarrow"))
    for ours, beams in (("parts", "arrow"), ("rparts", "rarrow")):
        (mine,), (theirs,) = (tmp_path / ours).iterdir(), (tmp_path / beams).iterdir()
        assert mine.name == "part-00000-of-00001.parquet" and theirs.name == mine.name
        a, b = pq.ParquetFile(mine).metadata, pq.ParquetFile(theirs).metadata
        assert a.schema == b.schema and a.num_row_groups == b.num_row_groups and a.num_rows == b.num_rows
        assert [a.row_group(0).column(i).compression for i in range(a.num_columns)] == [
            b.row_group(0).column(i).compression for i in range(b.num_columns)]
    assert by_id(written("rarrow")) == by_id(written("rdicts")) and len(written("rarrow")) == len(rejected)
    assert pq.read_schema(next((tmp_path / "arrow").glob("*.parquet"))) == pq.read_schema(
        next((tmp_path / "dicts").glob("*.parquet")))
    assert by_id(written("arrow"))[0] == kept_row(docs[0], names)


def test_part_files_are_committed_once_in_name_order_and_what_failed_bundles_left_is_removed(tmp_path):
    """ParquetParts.commit: the files the run reported become part-SSSSS-of-NNNNN.parquet in name
    order; a file in the temporary folder that no bundle reported (a failed or retried attempt) is
    not committed and is removed with the folder; a commit retried after its renames finds them
    done; a report whose file is gone is an error, not a silent loss; no file at all still leaves
    one empty Parquet file with the schema (as Beam's sink does)."""
    import pyarrow as pa

    from dsdata.beam.pipeline import ParquetParts

    schema = pa.schema([("id", pa.string())])
    parts = ParquetParts(str(tmp_path), "kept", schema, "r1")
    os.makedirs(parts.temp)

    def write(name, ids):
        path = os.path.join(parts.temp, name)
        fh, writer = parts.open(path)
        writer.write_table(pa.table({"id": ids}, schema=schema))
        writer.close()
        fh.close()
        return path

    reported = [write("c.parquet", ["c"]), write("a.parquet", ["a1", "a2"]), write("b.parquet", [])]
    write("failed-attempt.parquet", ["lost"])
    parts.commit(reported)
    names = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert names == [f"part-0000{i}-of-00003.parquet" for i in range(3)]
    assert [pq.read_table(tmp_path / "kept" / n).column("id").to_pylist() for n in names] == [["a1", "a2"], [], ["c"]]
    parts.commit(reported)  # a retried commit
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == names
    with pytest.raises(OSError, match="is gone"):
        parts.commit(reported + [os.path.join(parts.temp, "d.parquet")])

    empty = ParquetParts(str(tmp_path), "rejected", schema, "r1")
    os.makedirs(empty.folder)
    empty.commit([])
    (only,) = (tmp_path / "rejected").iterdir()
    assert only.name == "part-00000-of-00001.parquet" and pq.read_table(only).schema == schema
    assert pq.read_table(only).num_rows == 0


def test_the_arrow_table_dofn_draws_no_beam_warning(caplog):
    """Beam reads a ParDo's `process` source and warns about a literal "return None" (every run's
    output would carry that line twice)."""
    import logging

    import apache_beam as beam

    from dsdata.beam.pipeline import _ArrowTables
    from dsdata.document import REJECTED_SCHEMA, rejected_columns

    with caplog.at_level(logging.WARNING):
        beam.ParDo(_ArrowTables(REJECTED_SCHEMA, rejected_columns))
    assert not [r for r in caplog.records if "returned None" in r.getMessage()]
