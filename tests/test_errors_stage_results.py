"""A custom stage that misbehaves for one record — returns None or another type, a list of the wrong
length, calls sys.exit(), changes its batch in place before it raises — costs that record (a rejected
row, reason `error`, saying what the stage did), never the run nor its batch-mates' text; only the
user's stop (KeyboardInterrupt) still ends the run.  Real Beam runs of recipes with test-only stages."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dsdata
from dsdata.beam.errors import copy_document, retry_one_at_a_time
from dsdata.beam.pipeline import run_recipe
from dsdata.document import Document, Rejected
from dsdata.recipe import load_recipe
from dsdata.stages import REGISTRY
from dsdata.stages.base import BatchStage, DocumentStage

SEEN = " [seen]"


class MisbehavingStage(DocumentStage):
    """Per marker in the text: returns None, a string, a Document whose text is None, a Rejected of a
    string, a Document whose int64 annotation holds a string, or calls sys.exit(0); every other
    document is kept."""

    name = "misbehaving_doc"
    description = "test-only"
    annotations = {"score": pa.int64()}

    def process(self, doc: Document):
        doc.annotations["score"] = "high" if "BAD_ANNOTATION" in doc.text else len(doc.text)
        if "RETURN_NONE" in doc.text:
            return None
        if "RETURN_STR" in doc.text:
            return doc.text
        if "TEXT_NONE" in doc.text:
            doc.text = None
            return doc
        if "REJECT_STR" in doc.text:
            return Rejected("not a document", self.name, "odd")
        if "EXIT" in doc.text:
            sys.exit(0)
        return doc


class MisbehavingBatchStage(BatchStage):
    """Marks every document of its batch in place, then raises when one holds POISON; leaves out the
    documents holding DROP from its result (a list shorter than the batch); returns None for the ones
    holding RETURN_NONE."""

    name = "misbehaving_batch"
    description = "test-only"
    batch_min = 20
    batch_max = 20

    def process_batch(self, docs):
        for doc in docs:
            doc.text += SEEN
            doc.metadata.setdefault("marks", []).append(1)
        if any("POISON" in d.text for d in docs):
            raise ValueError("model failed on this batch")
        return [None if "RETURN_NONE" in d.text else d for d in docs if "DROP" not in d.text]


class InterruptingStage(DocumentStage):
    name = "interrupting_doc"
    description = "test-only"

    def process(self, doc):
        if "STOP" in doc.text:
            raise KeyboardInterrupt
        return doc


class ExitingSetupStage(DocumentStage):
    name = "exiting_setup"
    description = "test-only"

    def setup(self):
        sys.exit(0)

    def process(self, doc):
        return doc


class FailingValidateStage(DocumentStage):
    """Its constructor's check raises RuntimeError (or, with the marker in its name, calls sys.exit(0))."""

    name = "failing_validate"
    description = "test-only"

    def validate(self):
        raise RuntimeError("cannot configure\nsecond line")

    def process(self, doc):
        return doc


class ExitingValidateStage(FailingValidateStage):
    name = "exiting_validate"

    def validate(self):
        sys.exit(0)


@pytest.fixture(autouse=True)
def test_stages(monkeypatch):
    for cls in (MisbehavingStage, MisbehavingBatchStage, InterruptingStage, ExitingSetupStage, FailingValidateStage,
                ExitingValidateStage):
        monkeypatch.setitem(REGISTRY, cls.name, f"{__name__}:{cls.__name__}")


def _corpus(tmp_path: Path, markers: dict[int, str], n: int = 60) -> None:
    lines = [json.dumps({"id": f"doc{i:03d}", "text": f"Document {i} is about rivers {markers.get(i, '')}".strip()})
             for i in range(n)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _run(tmp_path: Path, stage: str, **kwargs) -> dict:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: results\ninput: {{paths: [\"*.jsonl\"]}}\nstages:\n  - {stage}: {{}}\n", encoding="utf-8")
    return run_recipe(load_recipe(str(recipe)), str(tmp_path / "out"), max_errors="100%", **kwargs)


def _rows(tmp_path: Path, kind: str) -> list[dict]:
    return [r for f in sorted((tmp_path / "out" / kind).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_a_document_stage_returning_no_document_or_exiting_rejects_that_record_only(tmp_path):
    _corpus(tmp_path, {3: "RETURN_NONE", 9: "RETURN_STR", 17: "TEXT_NONE", 22: "REJECT_STR", 40: "EXIT",
                       51: "BAD_ANNOTATION"})
    stats = _run(tmp_path, "misbehaving_doc")
    assert stats["input"] == 60 and stats["kept"] == 54 and stats["ledger_ok"]
    assert stats["rejected"] == {"misbehaving_doc": {"error": 6}}
    assert all(isinstance(r["score"], int) for r in _rows(tmp_path, "kept"))
    details = {r["id"]: r["detail"] for r in _rows(tmp_path, "rejected")}
    assert details == {
        "doc003": "StageResultError: stage 'misbehaving_doc' returned NoneType, not a Document or Rejected",
        "doc009": "StageResultError: stage 'misbehaving_doc' returned str, not a Document or Rejected",
        "doc017": "StageResultError: stage 'misbehaving_doc' returned a Document whose text is NoneType, not str",
        "doc022": "StageResultError: stage 'misbehaving_doc' returned a Rejected of str, not of a Document",
        "doc040": "SystemExit: 0",
        # an annotation its declared column cannot hold failed the kept/ writer for the whole run
        "doc051": "StageResultError: stage 'misbehaving_doc' set annotation 'score' to str 'high', which its "
                  "declared column cannot hold",
    }


def test_the_python_api_reports_a_wrong_return_type_as_a_rejected_row_not_an_attribute_error(tmp_path):
    _corpus(tmp_path, {5: "RETURN_NONE"}, n=10)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: results\ninput: {paths: [\"*.jsonl\"]}\nstages:\n  - misbehaving_doc: {}\n", encoding="utf-8")
    stats = dsdata.run(str(recipe), output=str(tmp_path / "out"), max_errors=1)
    assert stats["kept"] == 9 and stats["rejected"] == {"misbehaving_doc": {"error": 1}}


def test_a_batch_stage_retries_from_the_documents_as_they_were_and_wrong_results_reject_one_record(tmp_path):
    # doc005 poisons its batch (docs 0-19) after the stage marked them all in place; doc030 is left out
    # of its batch's result (a short list), doc050 gets None.
    _corpus(tmp_path, {5: "POISON", 30: "DROP", 50: "RETURN_NONE"})
    stats = _run(tmp_path, "misbehaving_batch")
    assert stats["input"] == 60 and stats["kept"] == 57 and stats["ledger_ok"]
    kept = _rows(tmp_path, "kept")
    # Each kept text carries the stage's change once, whether its batch failed (then retried alone) or not.
    assert all(r["text"].count(SEEN) == 1 and json.loads(r["metadata"])["marks"] == [1] for r in kept), \
        [r["text"] for r in kept if r["text"].count(SEEN) != 1]
    rejected = {r["id"]: r for r in _rows(tmp_path, "rejected")}
    assert sorted(rejected) == ["doc005", "doc030", "doc050"]
    assert rejected["doc005"]["detail"] == "ValueError: model failed on this batch"
    assert rejected["doc005"]["text"] == "Document 5 is about rivers POISON"  # as it was before any attempt
    assert rejected["doc030"]["detail"] == ("StageResultError: stage 'misbehaving_batch' returned 0 results for a "
                                           "batch of 1: process_batch must return a list of one Document or "
                                           "Rejected per input")
    assert rejected["doc050"]["detail"] == ("StageResultError: stage 'misbehaving_batch' returned NoneType, "
                                           "not a Document or Rejected")


def test_a_keyboard_interrupt_from_a_stage_still_stops_the_run(tmp_path):
    _corpus(tmp_path, {4: "STOP"}, n=10)
    with pytest.raises(BaseException) as stopped:
        _run(tmp_path, "interrupting_doc")
    assert "KeyboardInterrupt" in repr(stopped.value) or isinstance(stopped.value, KeyboardInterrupt)
    assert not (tmp_path / "out" / "stats.json").exists()


def test_retries_start_from_copies_and_a_stop_passes():
    docs = [Document(f"d{i}", "text", {"nested": {"list": [i]}}, {"a": 1}) for i in range(3)]

    def mutate_then_fail(batch):
        for doc in batch:
            doc.metadata["nested"]["list"].append("changed")
            doc.annotations["a"] += 1
        if len(batch) > 1 or batch[0].id == "d1":
            raise ValueError("fails")
        return batch

    out = retry_one_at_a_time("s", docs, mutate_then_fail, lambda doc, exc: ("failed", doc), fresh=copy_document)
    assert out[0].metadata == {"nested": {"list": [0, "changed"]}} and out[0].annotations == {"a": 2}
    assert out[1] == ("failed", Document("d1", "text", {"nested": {"list": [1]}}, {"a": 1}))
    with pytest.raises(KeyboardInterrupt):
        retry_one_at_a_time("s", docs, lambda batch: (_ for _ in ()).throw(KeyboardInterrupt), lambda d, e: d)


@pytest.mark.parametrize("stage, code, line", [
    # sys.exit(0) in setup() was a 136-line traceback; in the constructor it ended the run with exit 0
    # and no word; any other exception there was a 31-line traceback.
    ("exiting_setup", 1, "dsdata: error: stage 'exiting_setup' cannot start: SystemExit: 0"),
    ("exiting_validate", 2, "stage 'exiting_validate' cannot be built: SystemExit: 0"),
    ("failing_validate", 2, "stage 'failing_validate' cannot be built: RuntimeError: cannot configure"),
])
def test_a_stage_that_exits_or_raises_while_built_or_set_up_is_one_line(tmp_path, capsys, stage, code, line):
    from dsdata import cli

    _corpus(tmp_path, {}, n=5)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: results\ninput: {{paths: [\"*.jsonl\"]}}\nstages:\n  - {stage}: {{}}\n", encoding="utf-8")
    assert cli.main(["run", str(recipe), "--output", str(tmp_path / "out"), "--quiet"]) == code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("dsdata: error: ") and err[0].endswith(line), err
