"""Relevance stage: a tiny BERT (built from BertConfig, saved with save_pretrained) through the same
Beam RunInference path users run, the long-document policy, the fastText backend, the ledger law."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dsdata.beam.pipeline import run_recipe  # noqa: E402
from dsdata.recipe import RecipeError, load_recipe  # noqa: E402
from dsdata.relevance.bert_backend import BertScorer, WindowTokenizer  # noqa: E402
from dsdata.stages import StageConfigError  # noqa: E402
from dsdata.stages.relevance import RelevanceStage  # noqa: E402

WORDS = [f"w{i}" for i in range(60)] + ["alpha", "beta", "gamma", "omega", "sigma", "delta", "the", "a"]


def build_tiny_bert(directory: Path, classifier: bool = True, seed: int = 0, init_range: float = 0.5) -> Path:
    """A 2-layer BERT with a word-level vocab, saved the way users save models.

    init_range: weight init scale; large values spread a random classifier's scores for routing tests."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab=str(vocab), do_lower_case=True)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2, initializer_range=init_range)
    model = BertForSequenceClassification(config) if classifier else BertModel(config)
    model.eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def sample_texts(n: int) -> list[str]:
    out = []
    for i in range(n):
        length = 1 + (i * 7) % 50  # several lengths, some past the 64-token window
        out.append(" ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(length)))
    return out


def write_jsonl(path: Path, texts: list[str]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for i, text in enumerate(texts):
            fh.write(json.dumps({"id": f"d{i:03d}", "text": text}) + "\n")


def write_recipe(directory: Path, params: dict) -> Path:
    recipe = directory / "recipe.yaml"
    lines = ["name: relevance-test", "input:", "  paths: [docs.jsonl]", "output: out", "stages:",
             "  - relevance:"] + [f"      {k}: {json.dumps(v)}" for k, v in params.items()]
    recipe.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return recipe


def read_outputs(out: Path):
    kept = pq.read_table(out / "kept").to_pylist() if list((out / "kept").glob("*.parquet")) else []
    rejected = pq.read_table(out / "rejected").to_pylist() if list((out / "rejected").glob("*.parquet")) else []
    return kept, rejected


def test_window_tokenizer_head_tail_policy(tiny_bert):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    words = [f"w{i}" for i in range(40)]
    head_tail = WindowTokenizer(tok, max_length=16, long_policy="head_tail").windows([" ".join(words), "w1 w2"])
    assert [w.doc for w in head_tail] == [0, 0, 1]
    as_words = [tok.convert_ids_to_tokens(w.ids) for w in head_tail]
    assert as_words[0] == ["[CLS]", *words[:14], "[SEP]"]
    assert as_words[1] == ["[CLS]", *words[-14:], "[SEP]"]
    assert as_words[2] == ["[CLS]", "w1", "w2", "[SEP]"]
    head_only = WindowTokenizer(tok, max_length=16, long_policy="head").windows([" ".join(words)])
    assert len(head_only) == 1 and tok.convert_ids_to_tokens(head_only[0].ids) == ["[CLS]", *words[:14], "[SEP]"]
    # A text far longer than the character cut still yields its true last tokens.
    huge = " ".join(["w5"] * 5000 + words[-14:])
    tail = WindowTokenizer(tok, max_length=16).windows([huge])[1]
    assert tok.convert_ids_to_tokens(tail.ids) == ["[CLS]", *words[-14:], "[SEP]"]


def test_long_document_score_is_mean_of_head_and_tail(tiny_bert):
    scorer = BertScorer(str(tiny_bert), device="cpu", max_length=16)
    words = [f"w{i}" for i in range(40)]
    long_score, head, tail = scorer.score([" ".join(words), " ".join(words[:14]), " ".join(words[-14:])])
    assert long_score == pytest.approx((head + tail) / 2, abs=1e-5)
    assert head != pytest.approx(tail, abs=1e-6)  # the two windows really differ, so the test can fail


def test_length_sorted_batches_return_scores_in_input_order(tiny_bert):
    texts = sample_texts(40)
    scorer = BertScorer(str(tiny_bert), device="cpu", batch_size=4)
    together = scorer.score(texts)
    alone = [scorer.score([t])[0] for t in texts]
    assert together == pytest.approx(alone, abs=1e-5)
    assert len(set(round(s, 6) for s in together)) > 10


def test_tiny_bert_through_runinference_recipe(tiny_bert, tmp_path):
    texts = sample_texts(60)
    scores = BertScorer(str(tiny_bert), device="cpu").score(texts)
    threshold = sorted(scores)[len(scores) // 2]
    write_jsonl(tmp_path / "docs.jsonl", texts)
    recipe = load_recipe(str(write_recipe(tmp_path, {"backend": "bert", "threshold": threshold, "device": "cpu"})),
                         [f"relevance.model={tiny_bert}"])
    stats = run_recipe(recipe, str(tmp_path / "out"))
    assert stats["ledger_ok"] and stats["input"] == 60
    kept, rejected = read_outputs(tmp_path / "out")
    assert len(kept) + len(rejected) == 60 and kept and rejected
    assert stats["rejected"] == {"relevance": {"low_relevance": len(rejected)}}
    expected = {f"d{i:03d}": s for i, s in enumerate(scores)}
    for row in kept:
        assert row["relevance_score"] == pytest.approx(expected[row["id"]], abs=1e-5)
        assert row["relevance_score"] >= threshold
    for row in rejected:
        assert row["stage"] == "relevance" and row["reason"] == "low_relevance"
        score = json.loads(row["annotations"])["relevance_score"]
        assert score == pytest.approx(expected[row["id"]], abs=1e-5) and score < threshold


@pytest.mark.slow
@pytest.mark.parametrize("threshold,kept_all", [(0.0, True), (1.0, False)])
def test_ledger_law_at_the_extremes_with_bad_input_lines(tiny_bert, tmp_path, threshold, kept_all):
    texts = sample_texts(12)
    write_jsonl(tmp_path / "docs.jsonl", texts)
    with (tmp_path / "docs.jsonl").open("a", encoding="utf-8") as fh:
        fh.write("{not json\n")
        fh.write(json.dumps({"id": "empty", "text": ""}) + "\n")
    # The model path in the recipe is relative to the recipe's directory: copy the model beside it.
    shutil.copytree(tiny_bert, tmp_path / tiny_bert.name)
    recipe = load_recipe(str(write_recipe(tmp_path, {"model": tiny_bert.name, "threshold": threshold})))
    stats = run_recipe(recipe, str(tmp_path / "out"))
    assert stats["ledger_ok"]
    assert stats["input"] == stats["kept"] + stats["rejected_total"] == 14
    relevance_rejected = stats["rejected"].get("relevance", {}).get("low_relevance", 0)
    read_rejected = sum(stats["rejected"].get("read", {}).values())
    assert read_rejected >= 1  # the broken line is a counted rejection, not a silent drop
    if kept_all:
        assert relevance_rejected == 0
    else:
        assert stats["kept"] == 0 and relevance_rejected == 14 - read_rejected


def test_process_batch_matches_scores_and_rejects(tiny_bert):
    from dsdata.document import Document, Rejected

    texts = sample_texts(10)
    scores = BertScorer(str(tiny_bert), device="cpu").score(texts)
    threshold = sorted(scores)[5]
    stage = RelevanceStage(model=str(tiny_bert), threshold=threshold, device="cpu")
    results = stage.process_batch([Document(f"d{i}", t) for i, t in enumerate(texts)])
    assert len(results) == 10
    for result, score in zip(results, scores):
        if score >= threshold:
            assert isinstance(result, Document) and result.annotations["relevance_score"] == pytest.approx(score)
        else:
            assert isinstance(result, Rejected) and result.reason == "low_relevance"


def test_user_errors_are_one_line(tiny_bert, tmp_path):
    with pytest.raises(StageConfigError, match="relevance.model .* does not exist"):
        RelevanceStage(model=str(tmp_path / "missing"))
    with pytest.raises(StageConfigError, match="needs model="):
        RelevanceStage()
    with pytest.raises(StageConfigError, match="is a bert model but backend=fasttext"):
        RelevanceStage(model=str(tiny_bert), backend="fasttext")
    with pytest.raises(StageConfigError, match="threshold"):
        RelevanceStage(model=str(tiny_bert), threshold=1.5)
    (tmp_path / "docs.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(RecipeError, match="escapes"):
        load_recipe(str(write_recipe(tmp_path, {"model": "../elsewhere"})))
    encoder_only = build_tiny_bert(tmp_path / "encoder-only", classifier=False)
    stage = RelevanceStage(model=str(encoder_only))
    with pytest.raises(StageConfigError, match="not a sequence classifier"):
        stage.setup()
