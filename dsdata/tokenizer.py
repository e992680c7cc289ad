"""Byte-level BPE tokenizers: train one with Hugging Face `tokenizers` (tokenizer.json plus a
tokenizer_config.json naming EOS, so AutoTokenizer loads it), and load any tokenizer the `tokenize`
stage accepts (our directories, a bare tokenizer.json, an AutoTokenizer directory).
"""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from dsdata.io.outfiles import file_sha256
from dsdata.io.untrusted_files import load_json_file
from dsdata.native_panics import hidden_panic_reports

EOS_TOKEN = "<|endoftext|>"
# Tried in this order when a tokenizer's config does not name its EOS token.
_EOS_CANDIDATES = (EOS_TOKEN, "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>", "[SEP]")


class TokenizerError(ValueError):
    """A tokenizer path or file a user gave cannot be used; the message says what to do."""


def iter_training_texts(patterns: list[str], text_field: str = "text") -> Iterator[str]:
    """Texts from files matching `patterns`: .txt (documents separated by a blank line), .jsonl
    (field `text_field`) or .parquet (column `text_field`, e.g. a run's kept/*.parquet)."""
    paths: list[str] = []
    from dsdata.io.untrusted_files import UntrustedFileError, regular_file

    for pattern in patterns:
        matched = sorted(glob.glob(pattern))
        if not matched:
            raise TokenizerError(f"no files match --input '{pattern}'; check the path or quote the glob")
        try:  # a FIFO would wait for a writer, /dev/zero never end
            paths.extend(regular_file(path, "--input") for path in matched)
        except UntrustedFileError as exc:
            raise TokenizerError(str(exc)) from None
    for path in paths:
        lower = path.lower()
        if lower.endswith(".parquet"):
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pq.read_table(pa.OSFile(os.fsencode(path)), columns=[text_field])
            for text in table.column(text_field).to_pylist():
                if text:
                    yield text
        elif lower.endswith((".jsonl", ".json", ".ndjson")):
            with open(path, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    if line.strip():
                        try:
                            record = json.loads(line)
                        except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
                            raise TokenizerError(f"{path}:{n}: not a JSON record; fix or remove that line") from None
                        text = record.get(text_field) if isinstance(record, dict) else None
                        if isinstance(text, str) and text:
                            yield text
        else:
            with open(path, encoding="utf-8", errors="replace") as fh:
                block: list[str] = []
                for line in fh:
                    if line.strip():
                        block.append(line)
                    elif block:
                        yield "".join(block)
                        block = []
                if block:
                    yield "".join(block)


def train_bpe(texts: Iterable[str], vocab_size: int, out_dir: str, min_frequency: int = 2,
              provenance: dict[str, Any] | None = None) -> str:
    """Train a byte-level BPE tokenizer on `texts` into `out_dir` (EOS `<|endoftext|>` is id 0, the 256
    byte symbols always in the vocabulary); returns tokenizer.json's path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 300:
        raise TokenizerError(f"--vocab-size {vocab_size} is too small: byte-level BPE needs 256 byte symbols plus merges (use >= 300)")
    if vocab_size > 1 << 32:
        raise TokenizerError(f"--vocab-size {vocab_size} is too large (token ids are stored as uint32)")
    tokenizer = Tokenizer(models.BPE())
    # GPT-2's split: words, numbers and punctuation runs; CJK runs stay whole so merges learn words.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    tmp = path + ".tmp"
    tokenizer.save(tmp)
    os.replace(tmp, path)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "bos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2)
        fh.write("\n")
    if provenance is not None:
        info = dict(provenance)
        info.update(vocab_size=tokenizer.get_vocab_size(with_added_tokens=True), eos_token=EOS_TOKEN,
                    eos_id=tokenizer.token_to_id(EOS_TOKEN), tokenizer_sha256=file_sha256(path))
        with open(os.path.join(out_dir, "training.json"), "w", encoding="utf-8") as fh:
            json.dump(info, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
    return path


@dataclass
class LoadedTokenizer:
    """A tokenizer ready to encode batches; `describe()` is what the shard manifest records."""

    path: str
    kind: str  # "tokenizers" (tokenizer.json) or "transformers" (AutoTokenizer)
    vocab_size: int
    eos_id: int
    eos_token: str
    sha256: str | None
    _encode_batch: Callable[[list[str]], list[list[int]]]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens (the caller appends EOS)."""
        return self._encode_batch(texts)

    @property
    def dtype(self) -> np.dtype:
        """The smallest unsigned dtype that holds every id."""
        return np.dtype(np.uint16) if self.vocab_size <= 1 << 16 else np.dtype(np.uint32)

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id,
                "eos_token": self.eos_token, "sha256": self.sha256}


def _eos_from_config(directory: str) -> str | None:
    config_path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(config_path):
        return None
    try:
        eos = load_json_file(config_path, "tokenizer_config.json").get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(eos, dict):  # AddedToken serialised by transformers
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def _pick_eos(token_to_id: Callable[[str], int | None], configured: str | None, where: str) -> tuple[str, int]:
    for name in ([configured] if configured else []) + list(_EOS_CANDIDATES):
        token_id = token_to_id(name)
        if token_id is not None:
            return name, int(token_id)
    wanted = configured or " / ".join(_EOS_CANDIDATES)
    raise TokenizerError(f"tokenizer {where} has no end-of-text token ({wanted}); set tokenize.eos_token to one it has")


# A tokenizer.json's own regexes run on Oniguruma, which panics past its backtracking limit.  Nested
# quantifiers ((a+)+$) blow up on a run of one kind of character followed by one that fails them:
# probe texts are such runs (256 for exponential patterns, 4096 for quadratic ones), then each end.
_PROBE_CHARS = ("a", "A", "1", " ", "\t", "\n", ".", "-", "'", "_", ",", "\u4e2d", "\u00e9", "\u3042", "\U0001f600",
                "e\u0301")
_PROBE_ENDS = ("", "!", "a", " ", "\n", "1", ".", "\u4e2d", "\x00")
# (run, times, end): the text run * times + end.
REGEX_PROBES = tuple([(c, 256, end) for c in _PROBE_CHARS for end in _PROBE_ENDS if end != c]
                     + [(pair, 128, "!") for pair in ("ab", "a ", ". ", "a1", "aA", "\r\n", "a.")]
                     + [(c, 4096, "!") for c in ("a", " ", "\n", "1", ".")])


def _regexes(spec: Any) -> list[str]:
    """Every regex a tokenizer.json holds ({"Regex": PATTERN} anywhere in it)."""
    if isinstance(spec, dict):
        found = [spec["Regex"]] if isinstance(spec.get("Regex"), str) else []
        return found + [r for value in spec.values() for r in _regexes(value)]
    if isinstance(spec, list):
        return [r for value in spec for r in _regexes(value)]
    return []


def _probes_for(patterns: list[str]) -> list[tuple[str, int, str]]:
    """REGEX_PROBES, then runs of each character a pattern names literally ((x+x+)+y needs x's)."""
    literal = sorted({c for p in patterns for c in re.sub(r"\\.", "", p)
                      if c.isprintable() and c not in "()[]{}?*+|^$.\\"})[:64]
    if not literal:
        return list(REGEX_PROBES)
    # also each run followed by the literals: a pattern's required literal ('z' in (\d|1)+z) is sought first
    named = "!" + "".join(literal)
    joined = "".join(literal)  # (q|z|qz)+$ on qzqz…
    return (list(REGEX_PROBES) + [(c, 256, end) for c in literal for end in ("", "!", "\x00", named) if c not in _PROBE_CHARS]
            + [(c, 256, named) for c in _PROBE_CHARS]
            + [(joined, max(1, 256 // len(joined)), end) for end in ("", "!", "\x00")])


def check_regexes(tokenizer: Any, where: str) -> None:
    """Encode probe texts with `tokenizer` once, at load: a regex that gives up on them (the binding
    panics) is a one-line TokenizerError naming the pattern and the text, before any record meets it."""
    try:
        patterns = _regexes(json.loads(tokenizer.to_str()))
    except Exception:  # noqa: BLE001 - the fixed probes still run
        patterns = []
    failed = None
    with hidden_panic_reports():
        for run, times, end in _probes_for(patterns):  # one at a time: a bad pattern costs its retry limit once
            try:
                tokenizer.encode(run * times + end, add_special_tokens=False)
            except BaseException as exc:  # noqa: BLE001 - a PanicException is a BaseException
                # The text's failure (a panic included), not a stop (KeyboardInterrupt, SystemExit).
                if not (isinstance(exc, Exception) or type(exc).__name__ == "PanicException"):
                    raise
                failed = (run, times, end, exc)
                break
    if failed is not None:
        run, times, end, exc = failed
        named = ", ".join(repr(p) for p in patterns[:3]) or "its regexes"
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise TokenizerError(
            f"tokenizer {where}: {named} fails on {times} × {run!r}" + (f" then {end!r}" if end else "")
            + f" ({type(exc).__name__}: {reason}); the regex engine gives up "
            "past its backtracking limit, so documents like it would fail: rewrite the pattern without nested "
            "quantifiers such as (a+)+") from None


def check_transformers_tokenizer(auto: Any, where: str) -> None:
    """check_regexes for a transformers tokenizer backed by a `tokenizers.Tokenizer` (a fast one)."""
    if getattr(auto, "is_fast", False):
        check_regexes(auto.backend_tokenizer, where)


def load_tokenizer(path: str, eos_token: str | None = None) -> LoadedTokenizer:
    """Load a tokenizer directory (tokenizer.json inside, or any local AutoTokenizer directory) or a
    bare tokenizer.json file.  `eos_token` overrides the EOS token named in the tokenizer's config."""
    if not os.path.exists(path):
        raise TokenizerError(
            f"tokenizer '{path}' not found; train one with 'dsdata tokenizer train --input GLOB --out DIR' "
            "or pass a directory holding tokenizer.json"
        )
    json_path = path if os.path.isfile(path) else os.path.join(path, "tokenizer.json")
    directory = os.path.dirname(json_path) if os.path.isfile(path) else path
    configured = eos_token or _eos_from_config(directory)
    if os.path.isfile(json_path):
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(json_path)
        except Exception as exc:  # noqa: BLE001 - any parse error means the file is not a tokenizer
            raise TokenizerError(f"tokenizer file '{json_path}' cannot be read by `tokenizers` ({exc}); "
                                 "pass a tokenizer.json written by 'dsdata tokenizer train' or transformers") from None
        name, eos_id = _pick_eos(tokenizer.token_to_id, configured, json_path)
        check_regexes(tokenizer, f"file '{json_path}'")

        def encode_batch(texts: list[str]) -> list[list[int]]:
            with hidden_panic_reports():  # a panic is the record's error (a row), its report no line
                return [enc.ids for enc in tokenizer.encode_batch(texts, add_special_tokens=False)]

        return LoadedTokenizer(path, "tokenizers", tokenizer.get_vocab_size(with_added_tokens=True), eos_id,
                               name, file_sha256(json_path), encode_batch)
    # A directory without tokenizer.json (e.g. a SentencePiece model): let transformers load it, offline.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a bad directory
        raise TokenizerError(f"'{path}' holds no tokenizer.json and AutoTokenizer cannot load it ({exc})") from None
    vocab = auto.get_vocab()
    name, eos_id = _pick_eos(vocab.get, configured or auto.eos_token, path)
    check_transformers_tokenizer(auto, f"'{path}'")

    def encode_auto(texts: list[str]) -> list[list[int]]:
        with hidden_panic_reports():
            return auto(texts, add_special_tokens=False)["input_ids"]

    return LoadedTokenizer(path, "transformers", len(auto), eos_id, name, None, encode_auto)
