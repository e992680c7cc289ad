"""Every stage that runs on batches retries a failing batch one document at a time through ONE
helper (dsdata/beam/errors.py retry_one_at_a_time), and that helper honours the stage's
`environment_errors`: an error class the stage declares as the environment's fault stops the run
with one line — it is never blamed on the document that happened to meet it.  One test per batch
site: a batched stage leading the recipe (BatchChainDoFn), one after a composite (BatchStageDoFn),
and the difficulty, relevance and dedup composites.  Real pipelines on the in-process runner."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsdata.beam.dedup.composite as beam_dedup
import dsdata.beam.relevance as beam_relevance
from dsdata import cli
from dsdata.stages import REGISTRY
from dsdata.stages.base import BatchStage
from dsdata.stages.dedup import DedupStage
from dsdata.stages.difficulty import DifficultyStage
from dsdata.stages.relevance import RelevanceStage

REPO = Path(__file__).resolve().parents[1]
POISON = "POISON"


class DeviceLost(RuntimeError):
    """What a stage declares as the environment's fault (a GPU gone, a model server down)."""


class EnvBatchStage(BatchStage):
    name = "env_batch"
    description = "test-only: a batched stage whose device fails on the batch holding POISON"
    environment_errors = (DeviceLost,)
    batch_min = 8
    batch_max = 8

    def process_batch(self, docs):
        if any(POISON in d.text for d in docs):
            raise DeviceLost("CUDA error: device lost")
        return docs


class EnvDifficultyStage(DifficultyStage):
    environment_errors = (DeviceLost,)

    def score_batch(self, docs):
        if any(POISON in d.text for d in docs):
            raise DeviceLost("CUDA error: device lost")
        return super().score_batch(docs)


class EnvRelevanceStage(RelevanceStage):
    environment_errors = (DeviceLost,)


class EnvDedupStage(DedupStage):
    environment_errors = (DeviceLost,)


class _DeviceLostScorer:
    """The real fastText relevance scorer, whose device fails on a batch holding POISON."""

    def __init__(self, real):
        self.real = real

    def score(self, texts):
        if any(POISON in t for t in texts):
            raise DeviceLost("CUDA error: device lost")
        return self.real.score(texts)


def _corpus(tmp_path: Path, n: int = 30, poison: int = 7) -> None:
    samples = [json.loads(line)["text"] for line in
               (REPO / "pipelines/samples/docs.jsonl").read_text(encoding="utf-8").splitlines()]
    docs = [{"id": f"doc{i:03d}", "text": samples[i % len(samples)] + f" (copy {i})"} for i in range(n)]
    docs[poison]["text"] += f" {POISON}"
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs),
                                       encoding="utf-8")


def _run(tmp_path: Path, stages: str, capsys, sets: tuple[str, ...] = ()) -> tuple[int, list[str]]:
    (tmp_path / "r.yaml").write_text(f"input: {{paths: [in.jsonl]}}\nstages:\n{stages}\n", encoding="utf-8")
    code = cli.main(["run", str(tmp_path / "r.yaml"), "--output", str(tmp_path / "out"), "--quiet",
                     "--max-errors", "100%", *[arg for item in sets for arg in ("--set", item)]])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("dsdata:")]


LM = REPO / "pipelines" / "models" / "lm"
RELEVANCE = REPO / "pipelines" / "models" / "relevance-fasttext"


@pytest.mark.parametrize("site, stages, sets", [
    ("leading batched stage (BatchChainDoFn)", "  - env_batch: {}", ()),
    ("batched stage after a composite (BatchStageDoFn)", "  - dedup: {}\n  - env_batch: {}", ()),
    ("difficulty composite", "  - difficulty: {}", (f"difficulty.model_dir={LM}",)),
    ("relevance composite (RunInference)", "  - relevance: {threshold: 0.5}", (f"relevance.model={RELEVANCE}",)),
    ("dedup composite", "  - dedup: {}", ()),
])
def test_a_declared_environment_error_stops_the_run_and_is_blamed_on_no_record(tmp_path, monkeypatch, capsys,
                                                                               site, stages, sets):
    for cls in (EnvBatchStage, EnvDifficultyStage, EnvRelevanceStage, EnvDedupStage):
        monkeypatch.setitem(REGISTRY, cls.name, f"{__name__}:{cls.__name__}")
    real_load = beam_relevance.load_scorer
    monkeypatch.setattr(beam_relevance, "load_scorer", lambda *a, **k: _DeviceLostScorer(real_load(*a, **k)))
    real_hash = beam_dedup.exact_hash

    def exact_hash(text, folded):
        if POISON in text:
            raise DeviceLost("CUDA error: device lost")
        return real_hash(text, folded)

    if site == "dedup composite":
        monkeypatch.setattr(beam_dedup, "exact_hash", exact_hash)
    _corpus(tmp_path)
    code, err = _run(tmp_path, stages, capsys, sets)
    name = "env_batch" if "batched" in site else site.split()[0]
    assert code == 1, err
    assert err == [f"dsdata: error: stage '{name}': DeviceLost: CUDA error: device lost"], (site, err)
    # No rejected row blames doc007 for the device: the run stopped before writing a complete output.
    assert not (tmp_path / "out" / "stats.json").exists()


def test_an_undeclared_error_of_one_document_is_still_that_documents_rejection(tmp_path, monkeypatch, capsys):
    """The same failure, undeclared: the batch is retried one document at a time and only the
    document that raises alone is rejected (reason `error`), so the helper's two rules differ."""
    monkeypatch.setitem(REGISTRY, "env_batch", f"{__name__}:EnvBatchStage")
    monkeypatch.setattr(EnvBatchStage, "environment_errors", ())
    _corpus(tmp_path)
    code, err = _run(tmp_path, "  - env_batch: {}", capsys)
    assert code == 0, err
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["rejected"] == {"env_batch": {"error": 1}} and stats["kept"] == 29 and stats["ledger_ok"]
