"""Model stages and their limits: a tiny MarianMT with 256 positions under a stage that truncates at
512 tokens, and a RunInference batch in which one document's scoring raises."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import dsdata.beam.relevance as beam_relevance
from benchmarks.tiny_models import build_tiny_marian
from dsdata.augment.translate import GenerationSettings, Seq2SeqTranslator
from dsdata.beam.pipeline import run_recipe
from dsdata.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]
POSITIONS = 256
# One "sentence" of ~600 SentencePiece tokens: no sentence break for the splitter to cut at.
LONG_SENTENCE = " ".join(f"the river{i % 7} bridge train{i % 5} data model" for i in range(120))

pytestmark = pytest.mark.slow


def _short_marian(directory: Path, seed: int) -> str:
    """A tiny random MarianMT whose position table has POSITIONS rows (the stage truncates at 512)."""
    from transformers import MarianConfig, MarianMTModel

    build_tiny_marian(str(directory), seed=seed)
    config = MarianConfig.from_pretrained(str(directory))
    config.max_position_embeddings = POSITIONS
    MarianMTModel(config).save_pretrained(str(directory))
    return str(directory)


@pytest.fixture(scope="module")
def short_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("short-marian")
    return {"en_zh": _short_marian(root / "en_zh", 1), "zh_en": _short_marian(root / "zh_en", 2)}


def test_translator_truncates_at_the_models_own_positions(short_models):
    translator = Seq2SeqTranslator(short_models["en_zh"], "model_en_zh")
    assert len(translator.tokenizer(LONG_SENTENCE)["input_ids"]) > 2 * POSITIONS
    assert translator.max_input_tokens == POSITIONS and translator.max_output_tokens == POSITIONS - 1
    # 512 input tokens and 300 new ones, both past the 256-row position table: no IndexError.
    settings = GenerationSettings(num_beams=1, max_new_tokens=300, max_input_tokens=512)
    (out,) = translator.translate([LONG_SENTENCE], [0], settings, 1)
    assert isinstance(out, str)


def test_back_translation_of_long_sentences_runs_on_a_256_position_model(short_models, tmp_path):
    docs = [{"id": f"en-{i}", "text": LONG_SENTENCE + f" number {i}."} for i in range(3)]
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    recipe = load_recipe(str(REPO / "pipelines" / "augment.yaml"), [
        f"augment.model_en_zh={short_models['en_zh']}", f"augment.model_zh_en={short_models['zh_en']}",
        "augment.fraction=1.0", "augment.min_sim=0", "augment.max_sim=1", "augment.num_beams=1",
        "augment.max_new_tokens=300", "augment.batch_size=2", "augment.threads=1",
        "augment.max_sentence_chars=100000"])
    recipe.inputs = [str(corpus)]
    stats = run_recipe(recipe, str(tmp_path / "out"), max_errors="0")
    assert stats["rejected"] == {} and stats["ledger_ok"]
    report = json.loads((tmp_path / "out" / "augment.json").read_text())
    assert report["back_translation"]["selected"] == 3 and report["back_translation"]["made"] == 3


class _PoisonScorer:
    """The real fastText relevance scorer, raising for a batch that holds a marked document."""

    def __init__(self, real):
        self.real = real

    def score(self, texts):
        if any("POISON" in t for t in texts):
            raise TypeError("incompatible function arguments")
        return self.real.score(texts)


def test_relevance_runinference_rejects_only_the_document_whose_scoring_raises(tmp_path, monkeypatch):
    real_load = beam_relevance.load_scorer
    monkeypatch.setattr(beam_relevance, "load_scorer", lambda *a, **k: _PoisonScorer(real_load(*a, **k)))
    samples = [json.loads(line) for line in (REPO / "pipelines/samples/docs.jsonl").read_text(encoding="utf-8").splitlines()]
    docs = [{"id": f"d{i:03d}", "text": s["text"]} for i, s in enumerate(samples[:40])]
    docs[13]["text"] += " POISON"
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    recipe = load_recipe(str(REPO / "pipelines" / "relevance.yaml"))
    recipe.inputs = [str(tmp_path / "in.jsonl")]
    stats = run_recipe(recipe, str(tmp_path / "out"), max_errors="1")
    assert stats["rejected"]["relevance"].get("error") == 1 and stats["ledger_ok"]
    rows = [r for f in sorted((tmp_path / "out" / "rejected").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    errors = [r for r in rows if r["reason"] == "error"]
    assert [(r["id"], r["stage"], r["detail"]) for r in errors] == [
        ("d013", "relevance", "TypeError: incompatible function arguments")]
    assert stats["kept"] + sum(stats["rejected"]["relevance"].values()) == 40
    assert stats["stage_time"]["relevance"]["cpu_s"] > 0


def test_input_limit_is_the_smallest_of_positions_and_a_sane_tokenizer_limit():
    from transformers import BertConfig, MarianConfig, RobertaConfig

    from dsdata.model_limits import input_token_limit, output_token_limit

    class Tok:
        def __init__(self, limit):
            self.model_max_length = limit

    assert input_token_limit(BertConfig(max_position_embeddings=64)) == 64
    assert input_token_limit(BertConfig(max_position_embeddings=64), Tok(32)) == 32
    # transformers' "no limit" (int(1e30)) is not a limit.
    assert input_token_limit(BertConfig(max_position_embeddings=64), Tok(int(1e30))) == 64
    # RoBERTa numbers positions from padding_idx + 1: 514 rows hold 512 tokens.
    assert input_token_limit(RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512
    assert output_token_limit(MarianConfig(max_position_embeddings=256)) == 255


def test_bert_scorer_window_respects_the_tokenizers_model_max_length(tmp_path):
    from test_relevance import build_tiny_bert
    from transformers import AutoTokenizer

    from dsdata.relevance.bert_backend import BertScorer

    model_dir = build_tiny_bert(tmp_path / "bert")  # 64 positions
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.model_max_length = 32
    tokenizer.save_pretrained(str(model_dir))
    scorer = BertScorer(str(model_dir), device="cpu", max_length=512)
    assert scorer.windows.max_length == 32
    (score,) = scorer.score([" ".join(["alpha", "beta", "gamma"] * 200)])
    assert 0.0 <= score <= 1.0


def test_a_translation_model_that_cannot_be_loaded_stops_the_run_in_one_line(short_models, tmp_path, capsys):
    import shutil

    from dsdata import cli

    broken = tmp_path / "broken"
    shutil.copytree(short_models["en_zh"], broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"id": "en-1", "text": "The data model is small. Open the file."}) + "\n",
                      encoding="utf-8")
    code = cli.main(["run", str(REPO / "pipelines" / "augment.yaml"), "--input", str(corpus), "--output",
                     str(tmp_path / "out"), "--quiet", "--max-errors", "100%",
                     "--set", f"augment.model_en_zh={broken}", "--set", f"augment.model_zh_en={short_models['zh_en']}",
                     "--set", "augment.fraction=1.0"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dsdata:")]
    assert code == 1
    assert len(err) == 1 and err[0].startswith(
        "dsdata: error: stage 'augment' cannot start: ModelNotFoundError: augment.model_en_zh: cannot load")


def test_augment_copy_whose_making_raises_is_a_rejected_copy_and_the_original_stays(tmp_path, monkeypatch):
    import dsdata.beam.augment as beam_augment

    real_chrf = beam_augment.chrf

    def chrf(hypothesis, reference):
        if "POISON" in reference:
            raise ZeroDivisionError("float division by zero")
        return real_chrf(hypothesis, reference)

    monkeypatch.setattr(beam_augment, "chrf", chrf)
    (tmp_path / "syn.tsv").write_text("data\tinformation\nfile\tdocument\n", encoding="utf-8")
    docs = [{"id": f"d{i}", "text": f"Open the data file number {i} and read the data."} for i in range(6)]
    docs[2]["text"] += " POISON"
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (tmp_path / "recipe.yaml").write_text(
        "name: t\ninput: {paths: [\"*.jsonl\"]}\nstages:\n"
        "  - augment: {method: synonym, synonyms: syn.tsv, fraction: 1.0, replace_prob: 1.0}\n", encoding="utf-8")
    stats = run_recipe(load_recipe(str(tmp_path / "recipe.yaml")), str(tmp_path / "out"), max_errors="1")
    assert stats["ledger_ok"] and stats["input"] == 6 and stats["augmented"] == 6
    assert stats["kept"] == 11 and stats["rejected"] == {"augment": {"error": 1}}
    (row,) = [r for f in sorted((tmp_path / "out" / "rejected").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert row["detail"] == "synonym: ZeroDivisionError: float division by zero"
    assert json.loads(row["annotations"])["source_id"] == "d2"
    kept_ids = {r["id"] for f in (tmp_path / "out" / "kept").glob("*.parquet") for r in pq.read_table(f).to_pylist()}
    assert {f"d{i}" for i in range(6)} <= kept_ids
    report = json.loads((tmp_path / "out" / "augment.json").read_text())
    assert report["synonym"]["dropped"] == {"error": 1} and report["synonym"]["kept"] == 5


class _DeviceLost(RuntimeError):
    """What the augment stage is made to declare as the environment's fault in the test below."""


def test_a_declared_environment_error_in_back_translation_stops_the_run(short_models, tmp_path, monkeypatch, capsys):
    """The back-translation handler retries a failing batch sentence by sentence through the one
    retry helper, which honours the stage's environment_errors: a device fault met on one sentence
    stops the run in one line instead of rejecting that document's copy."""
    import dsdata.beam.augment as beam_augment
    from dsdata import cli
    from dsdata.stages import REGISTRY
    from dsdata.stages.augment import AugmentStage

    class Translator:
        def __init__(self, real):
            self.real = real

        def translate(self, texts, seeds, settings, batch_size):
            if any("POISON" in t for t in texts):
                raise _DeviceLost("CUDA error: device lost")
            return self.real.translate(texts, seeds, settings, batch_size)

    real_load = beam_augment.load_translator
    monkeypatch.setattr(beam_augment, "load_translator", lambda *a, **k: Translator(real_load(*a, **k)))
    monkeypatch.setattr(AugmentStage, "environment_errors", (_DeviceLost,))
    assert REGISTRY["augment"].endswith(":AugmentStage")
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"en-{i}", "text": f"The data model number {i} is small."
                                          + (" POISON" if i == 1 else "")}) + "\n" for i in range(4)),
                      encoding="utf-8")
    code = cli.main(["run", str(REPO / "pipelines" / "augment.yaml"), "--input", str(corpus), "--output",
                     str(tmp_path / "out"), "--quiet", "--max-errors", "100%",
                     "--set", f"augment.model_en_zh={short_models['en_zh']}",
                     "--set", f"augment.model_zh_en={short_models['zh_en']}", "--set", "augment.fraction=1.0",
                     "--set", "augment.num_beams=1", "--set", "augment.threads=1"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dsdata:")]
    assert code == 1
    assert err == ["dsdata: error: stage 'augment': _DeviceLost: CUDA error: device lost"]
    assert not (tmp_path / "out" / "stats.json").exists()
