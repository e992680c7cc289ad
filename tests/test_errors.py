"""A record whose processing raises is rejected (reason `error`), never the run: real Beam runs of
recipes with test-only stages (registered here) and faults injected into the project's own code, the
error budget, fatal environment errors as one line, and the per-stage CPU report in stats.json."""
from __future__ import annotations

import dataclasses

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import apache_beam as beam

import dsdata.beam.dedup.composite as beam_dedup
import dsdata.beam.pipeline as beam_pipeline
import dsdata.io.readers as readers
from dsdata import cli
from dsdata.beam.errors import ErrorBudget, ErrorBudgetExceeded, StageEnvironmentError
from dsdata.beam.pipeline import run_recipe
from dsdata.document import Document
from dsdata.recipe import load_recipe
from dsdata.stages import REGISTRY
from dsdata.stages.base import BatchStage, DocumentStage, Param
from dsdata.stages.difficulty import DifficultyStage
from dsdata.core.params import Text

REPO = Path(__file__).resolve().parents[1]
POISON = "POISON"


class PoisonDocStage(DocumentStage):
    """Raises a TypeError for every document whose text holds POISON (like fastText's pybind layer on
    a lone surrogate); annotates the others."""

    name = "poison_doc"
    description = "test-only"
    params = {"marker": Param(POISON, "text that makes the stage raise", Text())}

    def process(self, doc: Document):
        if self.marker in doc.text:
            raise TypeError(f"incompatible function arguments\nsecond line of {doc.id}")
        doc.metadata["seen_by_poison_doc"] = True
        return doc


class PoisonBatchStage(BatchStage):
    """A model stage whose whole batch fails when one document of it holds POISON."""

    name = "poison_batch"
    description = "test-only"
    batch_min = 50
    batch_max = 50

    def process_batch(self, docs):
        for doc in docs:
            if POISON in doc.text:
                raise IndexError("index out of range in self")
        for doc in docs:
            doc.metadata["batch_size_seen"] = len(docs)
        return docs


class TagDocStage(DocumentStage):
    """Rejects documents holding REJECTME (reason `tagged`), raises on BOOM, annotates the rest: the
    second link of a fused chain of per-document stages."""

    name = "tag_doc"
    description = "test-only"
    annotations = {"tag_seen": pa.int64()}

    def process(self, doc: Document):
        if "BOOM" in doc.text:
            raise ValueError("tag_doc exploded")
        if "REJECTME" in doc.text:
            return self.reject(doc, "tagged", f"{doc.id} holds the marker")
        doc.annotations["tag_seen"] = len(doc.text)
        return doc


class BrokenSetupStage(DocumentStage):
    name = "broken_setup"
    description = "test-only"

    def setup(self):
        raise FileNotFoundError("model file /nowhere/model.bin does not exist")

    def process(self, doc):
        return doc


class MissingModuleStage(DocumentStage):
    """An ImportError while processing is the environment's fault, not the record's."""

    name = "missing_module"
    description = "test-only"

    def process(self, doc):
        import dsdata_module_that_does_not_exist  # noqa: F401

        return doc


class DeclaredEnvironmentError(RuntimeError):
    pass


class DeclaredErrorStage(DocumentStage):
    name = "declared_error"
    description = "test-only"
    environment_errors = (DeclaredEnvironmentError,)

    def process(self, doc):
        raise DeclaredEnvironmentError("the GPU went away")


class PoisonDifficultyStage(DifficultyStage):
    """The real difficulty stage, whose scoring raises for documents holding POISON."""

    def score_batch(self, docs):
        if any(POISON in d.text for d in docs):
            raise ValueError("perplexity kernel failed")
        return super().score_batch(docs)


@pytest.fixture(autouse=True)
def test_stages(monkeypatch):
    for cls in (PoisonDocStage, TagDocStage, PoisonBatchStage, BrokenSetupStage, MissingModuleStage, DeclaredErrorStage):
        monkeypatch.setitem(REGISTRY, cls.name, f"{__name__}:{cls.__name__}")


def _corpus(tmp_path: Path, n: int = 40, poison: tuple[int, ...] = (7,)) -> Path:
    lines = []
    for i in range(n):
        text = f"Document number {i} talks about rivers, bridges and the trains that cross them every day."
        if i in poison:
            text += f" {POISON}"
        lines.append(json.dumps({"id": f"doc{i:03d}", "text": text}))
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _recipe(tmp_path: Path, stages: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"name: errors\ninput: {{paths: [\"*.jsonl\"]}}\nstages:\n{stages}\n", encoding="utf-8")
    return path


def _rows(out: Path, kind: str) -> list[dict]:
    return [r for f in sorted((out / kind).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def _cli(args: list[str], capsys) -> tuple[int, list[str]]:
    code = cli.main(["run", *args, "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dsdata:")]
    return code, err


def test_document_stage_exception_rejects_that_record_and_the_run_goes_on(tmp_path, capsys):
    _corpus(tmp_path, poison=(7,))
    out = tmp_path / "out"
    code, err = _cli([str(_recipe(tmp_path, "  - poison_doc: {}")), "--output", str(out), "--max-errors", "1"], capsys)
    assert code == 0 and err == []
    rejected = _rows(out, "rejected")
    assert [(r["id"], r["stage"], r["reason"], r["detail"]) for r in rejected] == [
        ("doc007", "poison_doc", "error", "TypeError: incompatible function arguments")]
    kept = _rows(out, "kept")
    assert len(kept) == 39 and all(json.loads(r["metadata"])["seen_by_poison_doc"] for r in kept)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["rejected"] == {"poison_doc": {"error": 1}} and stats["ledger_ok"]
    assert stats["errors"] == {"count": 1, "by_stage": {"poison_doc": 1}, "budget": "1", "over_budget": False}


def test_poison_record_in_a_batch_takes_no_batch_mate_with_it(tmp_path):
    _corpus(tmp_path, n=120, poison=(3, 77))
    recipe = load_recipe(str(_recipe(tmp_path, "  - poison_batch: {}")))
    stats = run_recipe(recipe, str(tmp_path / "out"), max_errors="2")
    assert stats["rejected"] == {"poison_batch": {"error": 2}} and stats["kept"] == 118
    rejected = _rows(tmp_path / "out", "rejected")
    assert sorted(r["id"] for r in rejected) == ["doc003", "doc077"]
    assert {r["detail"] for r in rejected} == {"IndexError: index out of range in self"}
    # The batch-mates were processed (in batches of one after their batch failed, else whole).
    assert all("batch_size_seen" in json.loads(r["metadata"]) for r in _rows(tmp_path / "out", "kept"))


def test_difficulty_composite_rejects_the_document_its_scoring_raises_on(tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, "difficulty", f"{__name__}:PoisonDifficultyStage")
    _corpus(tmp_path, n=60, poison=(11,))
    recipe = load_recipe(str(_recipe(tmp_path, "  - difficulty: {lang: en}")),
                         [f"difficulty.model_dir={REPO / 'pipelines' / 'models' / 'lm'}"])
    stats = run_recipe(recipe, str(tmp_path / "out"), max_errors="1")
    assert stats["rejected"]["difficulty"] == {"error": 1} and stats["ledger_ok"]
    assert [r["id"] for r in _rows(tmp_path / "out", "rejected")] == ["doc011"]
    kept = _rows(tmp_path / "out", "kept")
    assert len(kept) == 59 and all(r["perplexity"] is not None and r["difficulty"] for r in kept)
    summary = json.loads((tmp_path / "out" / "difficulty.json").read_text())
    assert summary["languages"]["en"]["rejected"] == {"error": 1}


def test_dedup_composite_rejects_the_document_its_hashing_raises_on(tmp_path, monkeypatch):
    real_hash = beam_dedup.exact_hash

    def exact_hash(text, folded):
        if POISON in text:
            raise UnicodeEncodeError("utf-8", text, 0, 1, "surrogates not allowed")
        return real_hash(text, folded)

    monkeypatch.setattr(beam_dedup, "exact_hash", exact_hash)
    path = _corpus(tmp_path, n=30, poison=(4,))
    # Two exact copies: dedup still works around the failed document.
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "zcopy", "text": json.loads(path.read_text().splitlines()[0])["text"]}) + "\n")
    recipe = load_recipe(str(_recipe(tmp_path, "  - dedup: {threshold: 0.8}")))
    stats = run_recipe(recipe, str(tmp_path / "out"), max_errors="1")
    assert stats["rejected"]["dedup"] == {"error": 1, "exact_duplicate": 1}, stats["rejected"]
    errors = [r for r in _rows(tmp_path / "out", "rejected") if r["reason"] == "error"]
    assert [r["id"] for r in errors] == ["doc004"] and errors[0]["detail"].startswith("UnicodeEncodeError: ")
    assert stats["ledger_ok"] and stats["kept"] == 29


def test_reader_that_raises_mid_file_keeps_what_it_read_and_rejects_the_rest(tmp_path, monkeypatch):
    real = readers.READERS["jsonl"].read

    def breaks_after_three(path, raw, **kwargs):
        for i, result in enumerate(real(path, raw, **kwargs)):
            if i == 3:
                raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")
            yield result

    monkeypatch.setitem(readers.READERS, "jsonl", dataclasses.replace(readers.READERS["jsonl"], read=breaks_after_three))
    _corpus(tmp_path, n=10, poison=())
    recipe = load_recipe(str(_recipe(tmp_path, "  - poison_doc: {}")))
    stats = run_recipe(recipe, str(tmp_path / "out"), max_errors="1")
    assert sorted(r["id"] for r in _rows(tmp_path / "out", "kept")) == ["doc000", "doc001", "doc002"]
    (row,) = _rows(tmp_path / "out", "rejected")
    assert (row["stage"], row["reason"]) == ("read", "error")
    assert row["detail"].startswith("RecursionError: maximum recursion depth exceeded")
    assert "the rest of the file at byte " in row["detail"]
    assert stats["input"] == 4 and stats["ledger_ok"]


def test_errors_over_the_budget_fail_the_run_in_one_line_after_writing_outputs(tmp_path, capsys):
    _corpus(tmp_path, n=40, poison=(1, 2, 3))
    out = tmp_path / "out"
    code, err = _cli([str(_recipe(tmp_path, "  - poison_doc: {}")), "--output", str(out), "--max-errors", "5%"], capsys)
    assert code == 1
    assert err == [f"dsdata: error: 3 records (7.5 %) failed with an exception, over the budget of 5% of 40 input "
                   f"records (2 records); see {out}/rejected (reason error)"]
    assert len(_rows(out, "kept")) == 37 and len(_rows(out, "rejected")) == 3
    assert json.loads((out / "stats.json").read_text())["errors"]["over_budget"] is True


def test_default_budget_is_a_tenth_of_a_percent(tmp_path):
    _corpus(tmp_path, n=40, poison=(5,))
    recipe = load_recipe(str(_recipe(tmp_path, "  - poison_doc: {}")))
    with pytest.raises(ErrorBudgetExceeded, match="over the budget of 0.1% of 40 input records"):
        run_recipe(recipe, str(tmp_path / "out"))
    assert ErrorBudget.parse(None).allowed(2000) == pytest.approx(2.0)


@pytest.mark.parametrize("value", ["-1", "abc", "101%", "1.5"])
def test_bad_max_errors_is_one_line(tmp_path, capsys, value):
    _corpus(tmp_path, n=3, poison=())
    code, err = _cli([str(_recipe(tmp_path, "  - poison_doc: {}")), "--output", str(tmp_path / "o"),
                      f"--max-errors={value}"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("dsdata: error: --max-errors must be")


@pytest.mark.parametrize("stage, line", [
    ("broken_setup", "dsdata: error: stage 'broken_setup' cannot start: FileNotFoundError: model file "
                     "/nowhere/model.bin does not exist"),
    ("missing_module", "dsdata: error: stage 'missing_module': ModuleNotFoundError: No module named "
                       "'dsdata_module_that_does_not_exist'"),
    ("declared_error", "dsdata: error: stage 'declared_error': DeclaredEnvironmentError: the GPU went away"),
])
def test_environment_errors_stop_the_run_in_one_line_whatever_the_budget(tmp_path, capsys, stage, line):
    _corpus(tmp_path, n=5, poison=())
    code, err = _cli([str(_recipe(tmp_path, f"  - {stage}: {{}}")), "--output", str(tmp_path / "out"),
                      "--max-errors", "100%"], capsys)
    assert code == 1
    assert err == [line]


def test_environment_error_is_raised_by_run_recipe(tmp_path):
    _corpus(tmp_path, n=5, poison=())
    recipe = load_recipe(str(_recipe(tmp_path, "  - broken_setup: {}")))
    with pytest.raises(StageEnvironmentError, match=r"^stage 'broken_setup' cannot start: FileNotFoundError"):
        run_recipe(recipe, str(tmp_path / "out"), max_errors="100%")


def test_stats_report_each_stages_cpu_time_and_input(tmp_path):
    _corpus(tmp_path, n=80, poison=(9,))
    recipe = load_recipe(str(_recipe(tmp_path, "  - poison_doc: {}\n  - lang: {keep: [en]}\n"
                                               "  - dedup: {threshold: 0.8}")))
    stats = run_recipe(recipe, str(tmp_path / "out"), max_errors="1")
    on_disk = json.loads((tmp_path / "out" / "stats.json").read_text())
    times = on_disk["stage_time"]
    assert list(times) == ["read", "poison_doc", "lang", "dedup"]
    assert times["read"]["docs"] == stats["input"] == 80
    assert times["poison_doc"]["docs"] == 80
    # Each stage's docs are its input: what the stage before it kept.
    order = on_disk["stage_order"]
    for before, stage in zip(order, order[1:]):
        assert times[stage]["docs"] == on_disk["stages"][before]["kept_after"]
    assert times["lang"]["docs"] == 79 and times["dedup"]["docs"] > 0
    for name, entry in times.items():
        assert entry["cpu_s"] > 0, name
        assert entry["docs_per_s"] == pytest.approx(entry["docs"] / entry["cpu_s"], rel=1e-3, abs=0.1)


def test_lone_surrogate_reaching_fasttext_is_one_rejected_record_not_a_dead_run(tmp_path, capsys):
    # "\ud800" is valid JSON; fastText's pybind layer raises TypeError on the unencodable string.  A
    # reader that scrubs surrogates lets the document through instead: either way it is accounted for
    # and its row is writable.
    lines = [json.dumps({"id": f"d{i}", "text": f"Plain English sentence {i} about rivers and bridges."
                         + (" \ud800 here" if i in (3, 8) else "")}) for i in range(12)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    code, err = _cli([str(REPO / "pipelines" / "langid.yaml"), "--input", str(tmp_path / "in.jsonl"),
                      "--output", str(out), "--max-errors", "2"], capsys)
    assert code == 0 and err == []
    stats = json.loads((out / "stats.json").read_text())
    assert stats["ledger_ok"] and stats["input"] == 12
    kept = {r["id"] for r in _rows(out, "kept")}
    failed = {r["id"]: r for r in _rows(out, "rejected")}
    assert kept | set(failed) == {f"d{i}" for i in range(12)} and not kept & set(failed)
    for row in failed.values():
        assert (row["stage"], row["reason"]) == ("lang", "error") and row["detail"].startswith("TypeError: ")
        assert "\ufffd" in row["text"]


def test_environment_error_from_a_worker_process_is_one_line(tmp_path):
    # On multi_processing the worker's exception comes back as text inside the runner's error.
    _corpus(tmp_path, n=5, poison=())
    not_a_model = tmp_path / "model.ftz"
    not_a_model.write_bytes(b"this is not a fastText model")
    recipe = load_recipe(str(_recipe(tmp_path, "  - lang: {}")), [f"lang.model={not_a_model}"])
    with pytest.raises(StageEnvironmentError) as caught:
        run_recipe(recipe, str(tmp_path / "out"), ["--direct_running_mode=multi_processing", "--direct_num_workers=1"])
    message = str(caught.value)
    assert "\n" not in message and "[while running" not in message
    assert message.startswith(f"lang: '{not_a_model}' is not a fastText model")


def test_environment_error_is_found_in_a_remote_traceback():
    from dsdata.beam.errors import find_environment_error

    remote = RuntimeError("Pipeline failed:\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                          "dsdata.beam.errors.StageEnvironmentError: stage 'lang' cannot start: OSError: gone "
                          "[while running 'Run']\n\nmore lines")
    assert str(find_environment_error(remote)) == "stage 'lang' cannot start: OSError: gone"
    assert find_environment_error(RuntimeError("something else")) is None


def _graph_run(recipe, out: Path):
    """build_pipeline's graph run in-process into `out`: (Beam result, stats.json, its counters but CPU time)."""
    p = beam.Pipeline(options=beam_pipeline.pipeline_options([]))
    beam_pipeline.build_pipeline(p, recipe, str(out), recipe.build_stages())
    result = p.run()
    result.wait_until_finish()
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    counters = {(c.key.metric.namespace, c.key.metric.name): c.committed
                for c in result.metrics().query()["counters"] if c.key.metric.name != "cpu_us"}
    return result, stats, counters


def test_stages_run_on_batches_or_fused_with_every_stage_counted_as_if_alone(tmp_path, monkeypatch):
    """The same recipe three ways: its stages on the reader's Batches in one step (the default), as
    one fused per-document step plus the batched lang stage, and each stage alone: the same rows,
    stats and per-stage counters."""
    # Real documents (the rules keep most of them), four of them marked for the test stages.
    records = [json.loads(line) for line in
               (REPO / "pipelines" / "samples" / "docs.jsonl").read_text(encoding="utf-8").splitlines()[:60]]
    for i, marker in ((7, POISON), (30, POISON), (11, "REJECTME"), (12, "BOOM"), (40, "REJECTME"), (30, "BOOM")):
        records[i]["text"] += f" {marker}"
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    ids = [r["id"] for r in records]
    recipe = load_recipe(str(_recipe(tmp_path, "  - poison_doc: {}\n  - tag_doc: {}\n  - rules: {}\n  - lang: {}")))
    stages = recipe.build_stages()
    graph = beam.Pipeline()  # built, never run: which steps the stages became
    beam_pipeline.build_pipeline(graph, recipe, str(tmp_path / "graph"), stages)
    labels = [t.unique_name for t in graph.to_runner_api().components.transforms.values()]
    runs = sorted(label for label in labels if label.endswith("/Run"))
    assert runs == ["00_poison_doc+tag_doc+rules+lang/Run"], runs
    assert "AllRejected" not in labels and "Unbatch" not in labels

    def run(name):
        """The run's stats.json, its stage_time and its Beam counters other than CPU time."""
        result, stats, counters = _graph_run(recipe, tmp_path / name)
        return stats, beam_pipeline.stage_times(result, stats), counters

    batched, batched_time, batched_counters = run("batched")
    monkeypatch.setattr(beam_pipeline, "batchable", lambda stage: False)
    fused, fused_time, fused_counters = run("fused")
    monkeypatch.setattr(beam_pipeline, "fusable", lambda stage: False)
    alone, alone_time, alone_counters = run("alone")

    def rows(name, kind):
        return sorted(_rows(tmp_path / name, kind), key=lambda r: r["id"])

    assert rows("fused", "kept") == rows("alone", "kept") and len(rows("fused", "kept")) > 0
    assert rows("fused", "rejected") == rows("alone", "rejected")
    assert rows("batched", "kept") == rows("alone", "kept")
    assert rows("batched", "rejected") == rows("alone", "rejected")
    why = {r["id"]: (r["stage"], r["reason"], r["detail"]) for r in rows("fused", "rejected")}
    assert why[ids[7]] == ("poison_doc", "error", "TypeError: incompatible function arguments")
    assert why[ids[30]][:2] == ("poison_doc", "error")  # the first stage's error: the second never sees it
    assert why[ids[11]] == ("tag_doc", "tagged", f"{ids[11]} holds the marker")
    assert why[ids[12]] == ("tag_doc", "error", "ValueError: tag_doc exploded")
    assert {r["stage"] for r in rows("fused", "rejected")} >= {"poison_doc", "tag_doc", "rules"}
    for key in ("input", "kept", "rejected", "stages", "ledger_ok"):
        assert fused[key] == alone[key], key
        assert batched[key] == alone[key], key
    assert fused["rejected"]["tag_doc"] == {"error": 1, "tagged": 2}
    # The per-stage Metrics (progress line, in / kept / rejected per reason) as if each ran alone.
    assert fused_counters == alone_counters
    assert batched_counters == alone_counters
    assert fused_counters[("dsdata.tag_doc", "in")] == 58
    assert fused_counters[("dsdata.tag_doc", "rejected.tagged")] == 2
    assert fused_counters[("dsdata.rules", "in")] == 55
    for name in ("poison_doc", "tag_doc", "rules", "lang"):
        assert fused_time[name]["docs"] == alone_time[name]["docs"] == batched_time[name]["docs"]
        assert fused_time[name]["cpu_s"] > 0 and batched_time[name]["cpu_s"] > 0, name


@pytest.mark.parametrize("batch_docs,batch_chars", [(1, 1 << 20), (7, 1 << 20), (1000, 300), (1000, 16 << 20)])
def test_batch_boundaries_change_nothing(tmp_path, monkeypatch, batch_docs, batch_chars):
    """Batches of 1 and 7 records, and batches cut by text size (300 characters: a document or two),
    give the rows, stats and counters of the per-document graph; a batched stage still sees its
    batch_max chunks and its poison record takes no batch mate with it; unreadable lines are rejected
    by the reader inside the batches."""
    import dsdata.beam.transforms as transforms

    path = _corpus(tmp_path, n=130, poison=(7, 12, 31))  # all in the first chunk of 50
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{broken\n{"id": "nt"}\n' + json.dumps({"id": "rej", "text": "REJECTME now"}) + "\n")
    recipe = load_recipe(str(_recipe(tmp_path, "  - poison_batch: {}\n  - tag_doc: {}\n  - rules: {}")))

    def run(name):
        _, stats, counters = _graph_run(recipe, tmp_path / name)
        rows = {kind: sorted(_rows(tmp_path / name, kind), key=lambda r: (r["id"], r.get("stage") or ""))
                for kind in ("kept", "rejected")}
        return stats, counters, rows

    monkeypatch.setattr(beam_pipeline, "BATCH_DOCS", batch_docs)
    monkeypatch.setattr(transforms, "BATCH_CHARS", batch_chars)
    batched = run("batched")
    monkeypatch.setattr(beam_pipeline, "batchable", lambda stage: False)
    single = run("single")
    assert batched[1] == single[1]

    def without_batch_size(rows):  # which batch a record was in is all that may differ
        out = {}
        for kind, kind_rows in rows.items():
            out[kind] = [{**r, "metadata": json.dumps({k: v for k, v in json.loads(r["metadata"]).items()
                                                       if k != "batch_size_seen"})} for r in kind_rows]
        return out

    assert without_batch_size(batched[2]) == without_batch_size(single[2])
    for key in ("input", "kept", "rejected", "stages", "ledger_ok"):
        assert batched[0][key] == single[0][key], key
    stats = batched[0]
    assert stats["input"] == 133 and stats["rejected"]["read"] == {"bad_json": 1, "missing_text": 1}
    assert stats["rejected"]["poison_batch"] == {"error": 3}
    assert stats["rejected"]["tag_doc"] == {"tagged": 1}
    # The rules reject these short texts: what the batched stage saw is in the rejected rows' metadata.
    seen = {json.loads(r["metadata"]).get("batch_size_seen") for r in batched[2]["rejected"] if r["stage"] == "rules"}
    assert None not in seen and max(seen) <= 50 and len(batched[2]["rejected"]) == 133
    if batch_chars > 1000:
        assert max(seen) == min(batch_docs, 50)
