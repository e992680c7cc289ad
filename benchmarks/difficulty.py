"""Difficulty scoring throughput on real text, side by side in one run.

* n-gram scorer: SentencePiece + KenLM queries of the shipped models (pipelines/models/lm), per line;
* the same n-gram model queried through dsdata's own numpy backoff (`KneserNeyModel.prob`), the
  reference the KenLM numbers are checked against (same log10 probabilities);
* causal-LM scorer: a GPT-2-shaped model built from a config (random weights: speed does not depend
  on them), batched, on GPU when present.

Prints docs/s and ratios; the last line is one JSON object.
  python benchmarks/difficulty.py [--docs 600] [--causal-docs 120] [--layers 4 --width 256]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "data"
MODELS = REPO / "pipelines" / "models" / "lm"


def load_docs(per_lang: int) -> dict[str, list[str]]:
    docs = {"en": [], "zh": []}
    with open(SHARED / "langid-dev.jsonl", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec["lang"] in docs and len(docs[rec["lang"]]) < per_lang:
                docs[rec["lang"]].append(rec["text"])
    return docs


def bench_ngram(docs: dict[str, list[str]], repeats: int) -> dict:
    from dsdata.lm.scorers import NgramScorer

    out = {}
    for lang, texts in docs.items():
        scorer = NgramScorer(str(MODELS / lang))
        scorer.score_documents(texts[:20])
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            scorer.score_documents(texts)
            best = min(best, time.perf_counter() - start)
        out[lang] = {"docs": len(texts), "docs_per_s": round(len(texts) / best, 1),
                     "chars_per_s": round(sum(map(len, texts)) / best)}
    return out


def bench_query_engines(texts: list[str], corpus_lines: int) -> dict:
    """KenLM vs dsdata's numpy backoff on one model trained here (same ARPA, same probabilities)."""
    import kenlm
    import sentencepiece as spm

    from dsdata.lm.arpa import write_arpa
    from dsdata.lm.kneser_ney import estimate
    from dsdata.lm.normalize import normalize_line
    from dsdata.lm.scorers import _load_quietly

    sp = spm.SentencePieceProcessor(model_file=str(MODELS / "en" / "sp.model"))
    lines = []
    with open(SHARED / "prose-en.txt", encoding="utf-8") as fh:
        for raw in fh:
            line = normalize_line(raw)
            if line:
                lines.append(line)
            if len(lines) >= corpus_lines:
                break
    ids = sp.encode(lines, out_type=int)
    start = time.perf_counter()
    model = estimate(ids, 3, sp.get_piece_size(), bos=sp.bos_id(), eos=sp.eos_id(), unk=sp.unk_id())
    est_s = time.perf_counter() - start
    n_tokens = sum(map(len, ids))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lm.arpa")
        write_arpa(model, [sp.id_to_piece(i) for i in range(sp.get_piece_size())], path)
        config = kenlm.Config()
        config.show_progress = False
        lm = _load_quietly(kenlm.Model, path, config)
    sents = [sp.encode(normalize_line(t)) for t in texts]
    queries = sum(len(s) + 1 for s in sents)
    start = time.perf_counter()
    ours = 0.0
    for s in sents:
        history = [sp.bos_id()]
        for w in s + [sp.eos_id()]:
            ours += math.log10(model.prob(w, history))
            history.append(w)
    numpy_s = time.perf_counter() - start
    words = [[sp.id_to_piece(i) for i in s] for s in sents]
    start = time.perf_counter()
    theirs = sum(lm.score(" ".join(w), bos=True, eos=True) for w in words)
    kenlm_s = time.perf_counter() - start
    return {"estimate_tokens": n_tokens, "estimate_tokens_per_s": round(n_tokens / est_s),
            "queries": queries, "numpy_queries_per_s": round(queries / numpy_s),
            "kenlm_queries_per_s": round(queries / kenlm_s), "kenlm_speedup": round(numpy_s / kenlm_s, 1),
            "log10_total_abs_diff": round(abs(ours - theirs), 6)}


def bench_causal(texts: list[str], layers: int, width: int, max_length: int) -> dict:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from dsdata.lm.scorers import CausalLMScorer

    torch.set_num_threads(1)  # 2 threads ran 3x slower than 1 on this shared 2-core machine
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8000, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    config = GPT2Config(vocab_size=len(fast), n_positions=max_length, n_embd=width, n_layer=layers,
                        n_head=max(1, width // 64))
    with tempfile.TemporaryDirectory() as tmp:
        GPT2LMHeadModel(config).save_pretrained(tmp)
        fast.save_pretrained(tmp)
        scorer = CausalLMScorer(tmp, device="auto", max_length=max_length)
        scorer.score_documents(texts[:8])
        start = time.perf_counter()
        results = scorer.score_documents(texts)
        seconds = time.perf_counter() - start
    tokens = sum(n for _, n in results)
    params = sum(p.numel() for p in scorer.model.parameters())
    return {"docs": len(texts), "docs_per_s": round(len(texts) / seconds, 1), "tokens_per_s": round(tokens / seconds),
            "device": str(scorer.device), "parameters": params, "layers": layers, "width": width}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=600, help="documents per language for the n-gram scorer")
    parser.add_argument("--causal-docs", type=int, default=120, help="documents (half en, half zh) for the causal LM")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--estimate-lines", type=int, default=20000, help="prose-en lines for the estimator timing")
    args = parser.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"shared data not found at {SHARED}")
    docs = load_docs(max(args.docs, args.causal_docs))
    ngram = bench_ngram({k: v[: args.docs] for k, v in docs.items()}, args.repeats)
    for lang, r in ngram.items():
        print(f"n-gram scorer {lang}: {r['docs_per_s']} docs/s ({r['chars_per_s']} chars/s) on {r['docs']} docs")
    engines = bench_query_engines(docs["en"][:100], args.estimate_lines)
    print(f"KN estimator: {engines['estimate_tokens_per_s']} tokens/s ({engines['estimate_tokens']} tokens, order 3)")
    print(f"queries: KenLM {engines['kenlm_queries_per_s']}/s vs dsdata numpy backoff "
          f"{engines['numpy_queries_per_s']}/s -> KenLM x{engines['kenlm_speedup']} "
          f"(same log10 total within {engines['log10_total_abs_diff']})")
    half = args.causal_docs // 2
    causal = bench_causal(docs["en"][:half] + docs["zh"][:half], args.layers, args.width, args.max_length)
    print(f"causal-LM scorer ({causal['parameters'] / 1e6:.1f} M params, {causal['device']}): "
          f"{causal['docs_per_s']} docs/s ({causal['tokens_per_s']} tokens/s)")
    ngram_rate = (ngram["en"]["docs_per_s"] + ngram["zh"]["docs_per_s"]) / 2
    ratio = round(ngram_rate / causal["docs_per_s"], 1)
    print(f"n-gram / causal-LM docs/s: x{ratio}")
    print(json.dumps({"ngram_docs_per_s": {k: v["docs_per_s"] for k, v in ngram.items()},
                      "causal_lm_docs_per_s": causal["docs_per_s"], "causal_lm_device": causal["device"],
                      "causal_lm_params": causal["parameters"], "ngram_over_causal": ratio,
                      "kenlm_queries_per_s": engines["kenlm_queries_per_s"],
                      "numpy_queries_per_s": engines["numpy_queries_per_s"],
                      "kenlm_over_numpy": engines["kenlm_speedup"],
                      "estimator_tokens_per_s": engines["estimate_tokens_per_s"],
                      # Shared 2-core machines make absolute rates drift; the load says how busy it was.
                      "load_avg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
