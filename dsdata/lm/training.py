"""Train one language's reference model: SentencePiece, then a Kneser-Ney n-gram model as ARPA.

A model directory holds:
  sp.model      SentencePiece model (unigram LM), applied after `normalize_line`
  lm.arpa.gz    the n-gram model (gzip ARPA; KenLM loads it directly)
  lm.json       metadata: language, order, vocabulary, pruning, discounts, n-gram counts, corpus
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import re
from dataclasses import dataclass
from typing import Iterator

from dsdata.lm.arpa import write_arpa
from dsdata.lm.kneser_ney import estimate
from dsdata.lm.normalize import normalize_line

META_FILE = "lm.json"
SP_FILE = "sp.model"
ARPA_FILE = "lm.arpa.gz"
# Languages written without spaces need SentencePiece to keep rare characters as pieces.
_CJK_LANGS = {"zh", "ja", "ko", "yue", "wuu", "th", "my", "km", "lo"}


class TrainingError(ValueError):
    """The corpus or options cannot produce a model; the message says what to change."""


@dataclass
class TrainOptions:
    order: int = 5
    vocab_size: int = 8000
    prune: tuple[int, ...] = ()
    max_lines: int = 0          # 0: every line
    sp_sample_lines: int = 200_000
    text_field: str = "text"
    seed: int = 0


def read_corpus_lines(path: str, lang: str, text_field: str = "text") -> Iterator[str]:
    """Normalised non-empty lines of a .txt (documents split by blank lines) or .jsonl corpus.

    JSONL records with a `lang` field that differs from `lang` are skipped, so one mixed-language
    file (e.g. a language-id dev set) can train every language's model.
    """
    if not os.path.isfile(path):
        raise TrainingError(f"corpus '{path}' not found; pass a .txt or .jsonl file with --corpus")
    is_jsonl = path.endswith((".jsonl", ".jsonl.gz", ".ndjson"))
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if is_jsonl:
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw)
                except json.JSONDecodeError:
                    raise TrainingError(f"{path}:{lineno}: not a JSON object; fix the line or use a .txt corpus") from None
                if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                    raise TrainingError(f"{path}:{lineno}: record has no string field '{text_field}' (set --text-field)")
                if record.get("lang") not in (None, lang):
                    continue
                for line in record[text_field].splitlines():
                    line = normalize_line(line)
                    if line:
                        yield line
            else:
                line = normalize_line(raw)
                if line:
                    yield line


def train_model(corpus: str, lang: str, out_dir: str, options: TrainOptions, log=print) -> dict:
    """Train SentencePiece + n-gram model on `corpus` into `out_dir`; returns the metadata written."""
    import sentencepiece as spm

    if not re.fullmatch(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]+)*", lang):
        raise TrainingError(f"--lang '{lang}' is not a language code like en, zh or zh-Hant")
    if options.order < 1 or options.order > 9:
        raise TrainingError(f"--order must be between 1 and 9 (got {options.order})")
    lines = list(read_corpus_lines(corpus, lang, options.text_field))
    if options.max_lines and len(lines) > options.max_lines:
        lines = lines[: options.max_lines]
    if len(lines) < 10:
        raise TrainingError(f"corpus '{corpus}' has only {len(lines)} usable line(s) for language '{lang}'; "
                            "a model needs real text (thousands of lines)")
    log(f"lm train: {len(lines)} lines from {corpus}")
    rng = random.Random(options.seed)
    sp_lines = lines if len(lines) <= options.sp_sample_lines else rng.sample(lines, options.sp_sample_lines)
    model_bytes = io.BytesIO()
    base = lang.split("-")[0].split("_")[0].lower()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sp_lines), model_writer=model_bytes, vocab_size=options.vocab_size,
        model_type="unigram", character_coverage=0.9995 if base in _CJK_LANGS else 1.0,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, hard_vocab_limit=False, num_threads=2,
        minloglevel=2, seed_sentencepiece_size=200_000, max_sentence_length=1 << 16,
    )
    sp = spm.SentencePieceProcessor(model_proto=model_bytes.getvalue())
    vocab = sp.get_piece_size()
    ids = sp.encode(lines, out_type=int)
    n_tokens = sum(len(x) for x in ids)
    log(f"lm train: SentencePiece vocabulary {vocab}, {n_tokens} tokens; estimating order {options.order}")
    model = estimate(ids, options.order, vocab, bos=sp.bos_id(), eos=sp.eos_id(), unk=sp.unk_id(),
                     prune=list(options.prune) or None)
    del ids
    words = [sp.id_to_piece(i) for i in range(vocab)]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, SP_FILE), "wb") as fh:
        fh.write(model_bytes.getvalue())
    arpa_path = os.path.join(out_dir, ARPA_FILE)
    counts = write_arpa(model, words, arpa_path)
    sha = hashlib.sha256()
    with open(corpus, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    digest = sha.hexdigest()
    meta = {
        "format": "dsdata-ngram-lm/1",
        "lang": lang,
        "order": options.order,
        "smoothing": "interpolated modified Kneser-Ney",
        "normalization": "nfkc+lower+strip_accents+digits_to_0+collapse_spaces",
        "sentencepiece": SP_FILE,
        "arpa": ARPA_FILE,
        "vocab_size": vocab,
        "prune": list(options.prune),
        "discounts": [list(d) for d in model.discounts],
        "ngrams": counts,
        "training_lines": len(lines),
        "training_tokens": n_tokens,
        "corpus": os.path.basename(corpus),
        "corpus_sha256": digest,
    }
    with open(os.path.join(out_dir, META_FILE), "w", encoding="utf-8") as fh:
        json.dump(meta, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    log(f"lm train: wrote {out_dir} (n-grams per order {counts}, {os.path.getsize(arpa_path)} bytes ARPA.gz)")
    return meta
