"""Train one language's reference model: SentencePiece, then a Kneser-Ney n-gram model as ARPA,
written as sp.model, lm.arpa.gz and lm.json (docs/difficulty.md).
"""
from __future__ import annotations

import gzip
import io
import json
import os
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterator

from dsdata.io.outfiles import file_sha256
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
    lang_field: str = "lang"    # "" : take every record (a one-language corpus without such a field)
    seed: int = 0


_TEXT_SUFFIXES = (".txt", ".text", ".txt.gz", ".text.gz")
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz", ".json", ".json.gz")
_PARQUET_SUFFIXES = (".parquet", ".pq")


def corpus_format(path: str) -> str:
    """txt, jsonl or parquet from the file name; anything else is refused (never read as text)."""
    name = path.lower()
    for fmt, suffixes in (("txt", _TEXT_SUFFIXES), ("jsonl", _JSONL_SUFFIXES), ("parquet", _PARQUET_SUFFIXES)):
        if name.endswith(suffixes):
            return fmt
    raise TrainingError(f"corpus '{path}': cannot tell its format from the name; --corpus takes .txt "
                        "(one sentence or paragraph per line), .jsonl or .parquet (optionally .gz for text/JSONL)")


def _matches(value, lang: str) -> bool:
    """'en' matches en, EN, en-US; 'zh-Hant' matches only zh-Hant (case-insensitive)."""
    if not isinstance(value, str):
        return False
    value, lang = value.lower().replace("_", "-"), lang.lower().replace("_", "-")
    return value == lang or ("-" not in lang and value.split("-")[0] == lang)


class CorpusReader:
    """Normalised non-empty lines of one language from a .txt (all `lang`), .jsonl or .parquet corpus:
    records whose `lang_field` holds `lang` (en takes en-US); none matching is refused in one line."""

    def __init__(self, path: str, lang: str, text_field: str = "text", lang_field: str = "lang"):
        if not os.path.isfile(path):
            raise TrainingError(f"corpus '{path}' not found; pass a .txt, .jsonl or .parquet file with --corpus")
        self.path, self.lang, self.text_field, self.lang_field = path, lang, text_field, lang_field
        self.format = corpus_format(path)
        self.records = self.used = self.without_field = 0
        self.other: Counter = Counter()

    def __iter__(self) -> Iterator[str]:
        if self.format == "txt":
            yield from self._text_lines()
            return
        for lineno, text, value in (self._jsonl() if self.format == "jsonl" else self._parquet()):
            self.records += 1
            if self.lang_field:
                if value is None:
                    self.without_field += 1
                    continue
                if not _matches(value, self.lang):
                    self.other[str(value)] += 1
                    continue
            if not isinstance(text, str):
                raise TrainingError(f"{self.path}:{lineno}: record has no string field '{self.text_field}' "
                                    "(set --text-field)")
            self.used += 1
            for line in text.splitlines():
                line = normalize_line(line)
                if line:
                    yield line
        self._check_filter()

    def _text_lines(self) -> Iterator[str]:
        opener = gzip.open if self.path.endswith(".gz") else open
        try:
            with opener(self.path, "rt", encoding="utf-8") as fh:
                for raw in fh:
                    line = normalize_line(raw)
                    if line:
                        yield line
        except UnicodeDecodeError as exc:
            raise TrainingError(f"corpus '{self.path}' is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                                "--corpus takes .txt, .jsonl or .parquet") from None

    def _jsonl(self):
        opener = gzip.open if self.path.endswith(".gz") else open
        try:
            with opener(self.path, "rt", encoding="utf-8") as fh:
                for lineno, raw in enumerate(fh, start=1):
                    if not raw.strip():
                        continue
                    try:
                        record = json.loads(raw)
                    except (json.JSONDecodeError, RecursionError):  # RecursionError: nested past the limit
                        raise TrainingError(f"{self.path}:{lineno}: not a JSON object; fix the line or use a .txt "
                                            "corpus") from None
                    if not isinstance(record, dict):
                        raise TrainingError(f"{self.path}:{lineno}: not a JSON object")
                    yield lineno, record.get(self.text_field), record.get(self.lang_field) if self.lang_field else None
        except UnicodeDecodeError as exc:
            raise TrainingError(f"corpus '{self.path}' is not UTF-8 JSONL ({exc.reason})") from None

    def _parquet(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(pa.OSFile(os.fsencode(self.path)))
        except (pa.ArrowException, OSError) as exc:
            raise TrainingError(f"corpus '{self.path}' is not a readable Parquet file ({exc})") from None
        names = pf.schema_arrow.names
        if self.text_field not in names:
            raise TrainingError(f"{self.path}: no column '{self.text_field}' (columns: {', '.join(names)}); "
                                "set --text-field")
        columns = [self.text_field] + ([self.lang_field] if self.lang_field in names else [])
        row = 0
        for batch in pf.iter_batches(columns=columns, batch_size=4096):
            texts = batch.column(0).to_pylist()
            langs = batch.column(1).to_pylist() if len(columns) > 1 else [None] * len(texts)
            for text, value in zip(texts, langs):
                yield f"row {row}", text, value
                row += 1

    def _check_filter(self) -> None:
        if not self.lang_field or self.used:
            return
        if self.records and self.without_field == self.records:
            raise TrainingError(
                f"{self.path}: no record has the language field '{self.lang_field}' that --lang {self.lang} filters "
                "on; name the field with --lang-field NAME, or pass --lang-field '' to use every record "
                "(a corpus in one language)")
        seen = ", ".join(f"{k} {v}" for k, v in self.other.most_common(8)) or "none"
        raise TrainingError(f"{self.path}: no record has {self.lang_field} = '{self.lang}' ({self.records} records; "
                            f"{self.lang_field} values seen: {seen}); check --lang or --lang-field")

    def summary(self) -> str:
        if self.format == "txt":
            return f"{self.path} (plain text): every line is taken as '{self.lang}'"
        if not self.lang_field:
            return f"{self.path} ({self.format}): all {self.used} records used (no language filter)"
        other = sum(self.other.values())
        return (f"{self.path} ({self.format}): {self.used} of {self.records} records have "
                f"{self.lang_field} = '{self.lang}' (field '{self.lang_field}'); {other} in other languages, "
                f"{self.without_field} without the field, not used")


def train_model(corpus: str, lang: str, out_dir: str, options: TrainOptions, log=print) -> dict:
    """Train SentencePiece + n-gram model on `corpus` into `out_dir`; returns the metadata written."""
    import sentencepiece as spm

    if not re.fullmatch(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]+)*", lang):
        raise TrainingError(f"--lang '{lang}' is not a language code like en, zh or zh-Hant")
    if options.order < 1 or options.order > 9:
        raise TrainingError(f"--order must be between 1 and 9 (got {options.order})")
    reader = CorpusReader(corpus, lang, options.text_field, options.lang_field)
    lines = list(reader)
    log(f"lm train: {reader.summary()}")
    if options.max_lines and len(lines) > options.max_lines:
        lines = lines[: options.max_lines]
    if len(lines) < 10:
        raise TrainingError(f"corpus '{corpus}' has only {len(lines)} usable line(s) for language '{lang}'; "
                            "a model needs real text (thousands of lines)")
    log(f"lm train: {len(lines)} lines from {corpus}")
    model_bytes = _train_sentencepiece(lines, lang, options)
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
    meta = _metadata(lang, options, reader, corpus, model, counts, vocab, len(lines), n_tokens)
    with open(os.path.join(out_dir, META_FILE), "w", encoding="utf-8") as fh:
        json.dump(meta, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    log(f"lm train: wrote {out_dir} (n-grams per order {counts}, {os.path.getsize(arpa_path)} bytes ARPA.gz)")
    return meta


def _train_sentencepiece(lines: list[str], lang: str, options: TrainOptions) -> io.BytesIO:
    """A unigram SentencePiece model (serialized) trained on a seeded sample of `lines`."""
    import sentencepiece as spm

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
    return model_bytes


def _metadata(lang: str, options: TrainOptions, reader: CorpusReader, corpus: str, model, counts, vocab: int,
              training_lines: int, n_tokens: int) -> dict:
    """What a model folder's metadata file says of the model and of the corpus it was trained on."""
    return {
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
        "training_lines": training_lines,
        "training_tokens": n_tokens,
        "corpus": os.path.basename(corpus),
        "corpus_format": reader.format,
        "lang_field": options.lang_field if reader.format != "txt" else None,
        "corpus_records_used": reader.used if reader.format != "txt" else None,
        "corpus_sha256": file_sha256(corpus),
    }
