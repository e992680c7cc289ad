"""Back-translation throughput on CPU: sentences/s for a tiny random MarianMT model and for any
real translation model in the local Hugging Face cache.

Side by side in one run, on the same sentences:
  * hf_per_sentence — plain transformers, model.generate one sentence at a time (what a script
    without batching does; transformers 5 has no translation pipeline any more),
  * translator      — dsdata's Seq2SeqTranslator (length-sorted batches of --batch-size),
  * beam_round_trip — the whole augment stage through Beam (split, RunInference twice, reassemble,
    chrF window) via run_recipe on pipelines/augment.yaml; counted as source sentences per second
    (each goes through two models).
Random models rarely emit end-of-sentence, so every output runs to --max-new-tokens: numbers are
for fixed-length outputs.  --opus-size adds a random model with opus-mt's architecture (MarianConfig
defaults: 6+6 layers, d_model 512, 65k vocab) to estimate what a real opus-mt model would cost.
The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(REPO, "..", "shared", "data")
REAL_MODEL_IDS = ["Helsinki-NLP/opus-mt-en-zh", "Helsinki-NLP/opus-mt-zh-en"]


def load_sentences(count: int) -> tuple[list[str], str]:
    """`count` real en/zh sentences from the dev prose when present, else made-up ones."""
    from dsdata.augment.sentences import split_sentences
    from benchmarks.tiny_models import sample_sentences

    out: list[str] = []
    sources = [os.path.join(DATA, "prose-en.txt"), os.path.join(DATA, "prose-zh.txt")]
    if all(os.path.exists(p) for p in sources):
        pools = []
        for path in sources:
            with open(path, encoding="utf-8") as fh:
                text = fh.read(400_000)
            pools.append([s for s in split_sentences(text, 300).sentences if 20 <= len(s) <= 200])
        for i in range(count):
            pool = pools[i % 2]
            out.append(pool[(i // 2) * 7 % len(pool)])
        return out, "prose-en.txt / prose-zh.txt sentences (20-200 chars), alternating en/zh"
    return sample_sentences(count, seed=1), "made-up sentences (shared/data absent)"


def cached_real_models() -> list[dict]:
    """Translation models found in the HF cache (the opus-mt defaults and any Marian model)."""
    found = []
    try:
        from huggingface_hub import scan_cache_dir

        for repo in scan_cache_dir().repos:
            if repo.repo_type == "model" and ("opus-mt" in repo.repo_id or "marian" in repo.repo_id.lower()):
                revision = sorted(repo.revisions, key=lambda r: r.last_modified)[-1]
                found.append({"repo_id": repo.repo_id, "dir": str(revision.snapshot_path)})
    except Exception as exc:  # noqa: BLE001 - no cache directory at all is the common case
        print(f"# no Hugging Face cache to scan ({type(exc).__name__}: {exc})", file=sys.stderr)
    return found


def per_sentence_generate(model_dir: str, sentences: list[str], settings) -> float:
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, local_files_only=True).eval()
    start = time.perf_counter()
    with torch.inference_mode():
        for sentence in sentences:
            encoded = tokenizer([sentence], return_tensors="pt", truncation=True, max_length=512)
            model.generate(**encoded, num_beams=settings.num_beams, max_new_tokens=settings.max_new_tokens)
    return len(sentences) / (time.perf_counter() - start)


def batched_translator(model_dir: str, sentences: list[str], settings, batch_size: int) -> float:
    from dsdata.augment.translate import Seq2SeqTranslator

    translator = Seq2SeqTranslator(model_dir, "model_en_zh")
    start = time.perf_counter()
    translator.translate(sentences, list(range(len(sentences))), settings, batch_size)
    return len(sentences) / (time.perf_counter() - start)


def beam_round_trip(model_en_zh: str, model_zh_en: str, sentences: list[str], settings, batch_size: int,
                    threads: int, workdir: str) -> dict:
    """Whole-stage rate; also the same run with fraction=0 (read, write, ledger, no translation) so
    the fixed cost of a Beam run can be told from the per-sentence cost."""
    from dsdata.beam.pipeline import run_recipe
    from dsdata.recipe import load_recipe

    path = os.path.join(workdir, "docs.jsonl")
    en = [s for s in sentences if not any("\u4e00" <= c <= "\u9fff" for c in s)]
    zh = [s for s in sentences if s not in en]
    with open(path, "w", encoding="utf-8") as fh:  # 8 sentences per document
        for lang, pool in (("en", en), ("zh", zh)):
            for i in range(0, len(pool), 8):
                fh.write(json.dumps({"id": f"{lang}-{i}", "text": (" " if lang == "en" else "").join(pool[i:i + 8])},
                                    ensure_ascii=False) + "\n")
    def run(fraction: float) -> tuple[dict, float]:
        recipe = load_recipe(os.path.join(REPO, "pipelines", "augment.yaml"), [
            f"augment.model_en_zh={model_en_zh}", f"augment.model_zh_en={model_zh_en}", f"augment.fraction={fraction}",
            "augment.min_sim=0", "augment.max_sim=1", f"augment.num_beams={settings.num_beams}",
            f"augment.max_new_tokens={settings.max_new_tokens}", f"augment.batch_size={batch_size}",
            f"augment.threads={threads}", "augment.max_sentence_chars=300",
        ])
        recipe.inputs = [path]
        start = time.perf_counter()
        stats = run_recipe(recipe, os.path.join(workdir, "out"))
        return stats, time.perf_counter() - start

    _, idle_seconds = run(0.0)
    stats, seconds = run(1.0)
    with open(os.path.join(workdir, "out", "augment.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    from dsdata.augment.sentences import split_sentences

    with open(path, encoding="utf-8") as fh:
        n_sentences = sum(len(split_sentences(json.loads(line)["text"], 300).sentences) for line in fh)
    return {"sentences_per_s": round(n_sentences / seconds, 2), "sentences": n_sentences, "seconds": round(seconds, 2),
            "seconds_without_translation": round(idle_seconds, 2),
            "marginal_sentences_per_s": round(n_sentences / max(seconds - idle_seconds, 1e-9), 2),
            "augmented": stats["augmented"], "ledger_ok": stats["ledger_ok"], "made": report["total"]["made"]}


def measure(label: str, en_zh: str, zh_en: str, sentences: list[str], args, workdir: str) -> dict:
    from dsdata.augment.translate import GenerationSettings

    settings = GenerationSettings(num_beams=args.num_beams, max_new_tokens=args.max_new_tokens)
    row = {"model": label}
    row["hf_per_sentence_per_s"] = round(per_sentence_generate(en_zh, sentences, settings), 2)
    row["translator_per_s"] = round(batched_translator(en_zh, sentences, settings, args.batch_size), 2)
    row["batched_vs_per_sentence"] = round(row["translator_per_s"] / row["hf_per_sentence_per_s"], 2)
    if not args.skip_beam:
        os.makedirs(workdir, exist_ok=True)
        row["beam_round_trip"] = beam_round_trip(en_zh, zh_en, sentences, settings, args.batch_size, args.threads, workdir)
        # A round trip runs two translations per sentence: compare against half the one-way rate.
        row["beam_round_trip_vs_translator_half"] = round(
            row["beam_round_trip"]["marginal_sentences_per_s"] / (row["translator_per_s"] / 2), 2)
    print(f"{label}: per-sentence generate {row['hf_per_sentence_per_s']} sent/s, batched translator "
          f"{row['translator_per_s']} sent/s ({row['batched_vs_per_sentence']}x)"
          + (f", Beam round trip {row['beam_round_trip']['sentences_per_s']} sent/s "
             f"({row['beam_round_trip']['marginal_sentences_per_s']} sent/s beyond the "
             f"{row['beam_round_trip']['seconds_without_translation']} s of a run without translation; "
             f"{row['beam_round_trip_vs_translator_half']}x of half the one-way batched rate)" if not args.skip_beam else ""))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the dev box has 2 shared cores)")
    parser.add_argument("--opus-size", action="store_true", help="also time a random model of opus-mt's size")
    parser.add_argument("--opus-sentences", type=int, default=16, help="sentences for the opus-size model (slow on CPU)")
    parser.add_argument("--skip-beam", action="store_true", help="skip the end-to-end Beam run")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from benchmarks.tiny_models import build_tiny_marian

    sentences, source = load_sentences(args.sentences)
    print(f"# {len(sentences)} {source}; num_beams={args.num_beams} max_new_tokens={args.max_new_tokens} "
          f"batch_size={args.batch_size} threads={args.threads}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tiny = [build_tiny_marian(os.path.join(tmp, "tiny_en_zh"), seed=1), build_tiny_marian(os.path.join(tmp, "tiny_zh_en"), seed=2)]
        results.append(measure("tiny-random-marian (d_model 32, 1+1 layers)", *tiny, sentences, args, os.path.join(tmp, "run-tiny")))
        if args.opus_size:
            opus = [build_tiny_marian(os.path.join(tmp, f"opus_{d}"), seed=i, d_model=512, layers=6, init_std=0.02, pad_vocab_to=65001)
                    for i, d in enumerate(("en_zh", "zh_en"))]
            results.append(measure("random-marian opus-mt size (d_model 512, 6+6 layers, 65001 vocab)", *opus,
                                   sentences[: args.opus_sentences], args, os.path.join(tmp, "run-opus")))
        real = cached_real_models()
        if not real:
            print("# no real translation model in the local Hugging Face cache (looked for opus-mt / marian repos); "
                  "nothing downloaded")
        by_id = {m["repo_id"]: m["dir"] for m in real}
        if all(m in by_id for m in REAL_MODEL_IDS):
            results.append(measure("Helsinki-NLP/opus-mt-en-zh + zh-en", by_id[REAL_MODEL_IDS[0]], by_id[REAL_MODEL_IDS[1]],
                                   sentences, args, os.path.join(tmp, "run-real")))
    print(json.dumps({"benchmark": "augment", "device": "cpu", "threads": args.threads, "sentences": len(sentences),
                      "num_beams": args.num_beams, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
                      "real_models_found": [m["repo_id"] for m in real], "results": results}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
