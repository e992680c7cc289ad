"""The causal_lm backend with tiny GPT-2 / Llama models built from configs and saved to a temp dir."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from dsdata.beam.pipeline import run_recipe  # noqa: E402
from dsdata.lm.scorers import CausalLMScorer, ModelLoadError, perplexity  # noqa: E402
from dsdata.recipe import load_recipe  # noqa: E402

TEXTS = [
    "The file is opened for reading and its lines are returned one by one.",
    "PostgreSQL 将查询结果写入临时文件。",
    "short",
    "Options are passed on the command line; each option has a long and a short form. " * 6,
]


def _save_tiny_model(directory: Path, kind: str) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 3, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")
    torch.manual_seed(0)
    if kind == "gpt2":
        config = GPT2Config(vocab_size=len(fast), n_positions=32, n_embd=32, n_layer=2, n_head=2,
                            bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
        model = GPT2LMHeadModel(config)
    else:
        config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                             bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                             pad_token_id=fast.pad_token_id)
        model = LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def tiny_model(request, tmp_path_factory) -> Path:
    return _save_tiny_model(tmp_path_factory.mktemp(request.param), request.param)


def test_perplexity_matches_the_models_own_loss(tiny_model):
    scorer = CausalLMScorer(str(tiny_model), device="cpu", max_length=32)
    tok, model = scorer.tokenizer, scorer.model
    results = scorer.score_documents(TEXTS)
    for text, (log10_sum, n) in zip(TEXTS[:3], results[:3]):
        seq = [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert len(seq) <= 32 and n == len(seq) - 1
        with torch.no_grad():
            loss = model(input_ids=torch.tensor([seq]), labels=torch.tensor([seq])).loss.item()
        assert perplexity(log10_sum, n) == pytest.approx(math.exp(loss), rel=1e-4)


def test_long_documents_are_scored_in_windows_and_batching_changes_nothing(tiny_model):
    scorer = CausalLMScorer(str(tiny_model), device="cpu", max_length=32)
    long_text = TEXTS[3]
    seq_len = len(scorer.tokenizer(long_text, add_special_tokens=False)["input_ids"]) + 2
    assert seq_len > 64  # spans several windows
    together = scorer.score_documents(TEXTS)
    alone = [scorer.score_documents([t])[0] for t in TEXTS]
    assert together[3][1] == seq_len - 1  # every token after the first predicted exactly once
    for (s1, n1), (s2, n2) in zip(together, alone):
        assert n1 == n2 and s1 == pytest.approx(s2, rel=1e-4, abs=1e-4)
    assert scorer.score_documents([""]) == [(0.0, 0)]


def test_not_a_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        CausalLMScorer(str(tmp_path))


@pytest.mark.slow
def test_causal_lm_backend_through_the_pipeline(tmp_path, tiny_model):
    docs = [{"id": f"d{i}", "text": f"{t} ({i})", "lang": "en" if i % 2 else "zh"} for i, t in enumerate(TEXTS * 10)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: t\ninput: {paths: [docs.jsonl]}\nstages:\n"
                      "  - difficulty: {backend: causal_lm, device: cpu, max_length: 32, batch_size: 8}\n",
                      encoding="utf-8")
    out = tmp_path / "out"
    stats = run_recipe(load_recipe(str(recipe), [f"difficulty.model_dir={tiny_model}"]), str(out))
    assert stats["ledger_ok"] and stats["kept"] == len(docs)
    kept = [r for f in (out / "kept").glob("*.parquet") for r in pq.read_table(f).to_pylist()]
    # One model directory serves every language.
    assert all(r["perplexity"] is not None and r["perplexity"] > 1 for r in kept)
    summary = json.loads((out / "difficulty.json").read_text(encoding="utf-8"))
    assert summary["backend"] == "causal_lm" and set(summary["languages"]) == {"en", "zh"}
    assert all(e["cutoff_source"] == "percentiles" for e in summary["languages"].values())


def test_logits_per_forward_pass_stay_within_the_budget_and_scores_do_not_change(tmp_path, caplog):
    """Issue 17: batches were bounded by tokens only, so the logits (and logsumexp's fp32 copy)
    grew with the vocabulary: 2.67 GB for 178 documents with a 1M-parameter model."""
    import logging

    from dsdata.lm import scorers
    from transformers import LlamaForCausalLM

    directory = _save_tiny_model(tmp_path / "m", "llama")
    # A 4,096-entry output layer (the tokenizer uses the first 400): 16,384 tokens of logits per
    # forward pass were 67M floats before the budget.
    model = LlamaForCausalLM.from_pretrained(directory)
    model.resize_token_embeddings(4096)
    model.save_pretrained(directory)
    texts = [f"{t} {i}" for i in range(30) for t in TEXTS[:2]]
    seen: list[int] = []

    def record(scorer):
        scorer.model.register_forward_hook(lambda module, args, out: seen.append(out.logits.numel()))
        return scorer

    assert scorers.LOGITS_BUDGET * 4 <= 128 << 20  # the default: 128 MiB of fp32 logits per pass
    budget = 128 * 4096  # 128 tokens' logits: a few forward passes for these texts
    with caplog.at_level(logging.INFO, logger="dsdata.lm.scorers"):
        bounded = record(CausalLMScorer(str(directory), device="cpu", max_length=32, logits_budget=budget))
    assert bounded.vocab == 4096
    assert "vocabulary 4096" in caplog.text and "per forward pass" in caplog.text
    results = bounded.score_documents(texts)
    assert len(seen) > 2 and max(seen) <= budget
    seen.clear()
    # One window per forward pass (the smallest budget) gives the same figures.
    tiny = record(CausalLMScorer(str(directory), device="cpu", max_length=32, logits_budget=1))
    again = tiny.score_documents(texts)
    assert [n for _, n in again] == [n for _, n in results]
    assert [s for s, _ in again] == pytest.approx([s for s, _ in results], rel=1e-5, abs=1e-5)
    assert max(seen) <= 32 * 4096


def test_scoring_logs_progress(tiny_model, caplog, monkeypatch):
    import logging

    from dsdata.lm import scorers

    monkeypatch.setattr(scorers, "PROGRESS_EVERY_S", 0.0)
    scorer = CausalLMScorer(str(tiny_model), device="cpu", max_length=32)
    with caplog.at_level(logging.INFO, logger="dsdata.lm.scorers"):
        scorer.score_documents(TEXTS)
    assert "tokens scored in" in caplog.text and "documents done" in caplog.text
