"""A stage's CPU seconds (stats.json stage_time) count every element: cheap elements are timed one
in sixteen, and an untimed element that runs long (one pathological document) is still counted; a
per-document stage run on a batch is timed once per batch, its process() calls and nothing else; a
library's work for a stage is done on the thread whose clock counts it."""
from pathlib import Path
from time import process_time, thread_time

from dsdata.beam.transforms import _SAMPLE_STRIDE, StageCounters, batchable_run
from dsdata.document import Document
from dsdata.stages.base import DocumentStage
from dsdata.stages.tokenize import TokenizeStage

REPO = Path(__file__).resolve().parents[1]


def _busy(seconds: float) -> None:
    end = thread_time() + seconds
    while thread_time() < end:
        pass


def test_a_slow_element_between_samples_is_counted():
    counters = StageCounters()
    counters._init_counters("probe")
    for _ in range(200):  # cheap elements: the clock falls back to one sample in _SAMPLE_STRIDE
        counters._clock_stop(counters._clock_start())
    assert counters._stride == _SAMPLE_STRIDE
    start = counters._clock_start()
    assert start is None  # this element is not one of the sampled ones
    _busy(0.2)
    counters._clock_stop(start)
    assert counters._cpu >= 0.2


def test_cheap_elements_are_estimated_from_samples():
    counters = StageCounters()
    counters._init_counters("probe")
    for _ in range(1000):
        counters._clock_stop(counters._clock_start())
    assert 0 < counters._cpu < 0.05  # no element is taken for an outlier


class _Slow(DocumentStage):
    """Burns 0.1 CPU-s on documents whose text says 'slow'; rejects 'bad' ones; raises on 'boom'."""

    name = "slow"

    def process(self, doc):
        if doc.text == "boom":
            raise ValueError("boom")
        if doc.text == "slow":
            _busy(0.1)
        return self.reject(doc, "bad") if doc.text == "bad" else doc


def test_a_document_stage_on_a_batch_is_timed_once_for_all_its_documents():
    run = batchable_run(_Slow())
    docs = [Document(str(i), text) for i, text in enumerate(["ok"] * 40 + ["slow", "bad", "boom", "slow"])]
    rejected = []
    kept = run.run_batch(docs, rejected)
    assert [d.id for d in kept] == [str(i) for i in range(40)] + ["40", "43"]
    assert [(r.doc.id, r.reason) for r in rejected] == [("41", "bad"), ("42", "error")]
    assert 0.2 <= run._cpu < 0.4  # the two slow documents; the rest costs microseconds
    assert (run._in.value, run._kept.value) == (44, 42)


def test_the_tokenizers_and_the_ngram_scorers_work_is_on_the_stage_clock():
    # Hugging Face tokenizers encodes a batch on Rust threads of its own unless told not to: their
    # CPU would be the run's, not the tokenize stage's.
    run = batchable_run(TokenizeStage(tokenizer=str(REPO / "pipelines/models/tokenizer")))
    words = "data pipeline shards tokens 数据 管道 分片 词元 quality filter".split()
    docs = [Document(str(i), " ".join(words[(i * j) % len(words)] for j in range(600))) for i in range(300)]
    before = process_time()
    kept = run.run_batch(docs, [])
    spent = process_time() - before
    assert len(kept) == 300 and all(d.annotations["num_tokens"] > 600 for d in kept)
    assert run._cpu >= 0.8 * spent
    # sentencepiece encodes a list of lines on threads of its own (difficulty's n-gram scorer).
    from dsdata.lm.scorers import NgramScorer

    scorer = NgramScorer(str(REPO / "pipelines/models/lm/en"))
    texts = ["\n".join(f"{d.text[:200]} line {j}" for j in range(20)) for d in docs]
    before, before_thread = process_time(), thread_time()
    scores = scorer.score_documents(texts)
    spent, on_thread = process_time() - before, thread_time() - before_thread
    assert len(scores) == 300 and all(n > 0 for _, n in scores)
    assert on_thread >= 0.8 * spent
