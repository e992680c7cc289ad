"""Perplexity scorers: an n-gram model directory (SentencePiece + KenLM) or a Hugging Face causal LM,
each giving per document (Σ log10 p, predicted tokens): perplexity 10 ** (-Σ log10 p / Σ tokens) (CCNet).
"""
from __future__ import annotations

import logging
import math
import os
import time
from typing import Sequence

from dsdata.lm.normalize import normalize_line
from dsdata.io.untrusted_files import UntrustedFileError, confined_file, load_json_file
from dsdata.lm.training import META_FILE, SP_FILE
from dsdata.native_panics import hidden_panic_reports, silenced_fd2

LN10 = math.log(10.0)
log = logging.getLogger(__name__)
# Elements of the [batch, tokens, vocabulary] logits one forward pass may produce (128 MiB in fp32);
# one window is always allowed.
LOGITS_BUDGET = 1 << 25
PROGRESS_EVERY_S = 10.0
_ARPA_CANDIDATES = ("lm.binary", "lm.arpa.gz", "lm.arpa")


class ModelLoadError(ValueError):
    """A model directory that cannot be loaded; the message names it and what to do."""


def perplexity(log10_sum: float, n_tokens: int) -> float | None:
    """CCNet's perplexity from summed log10 probabilities; None when nothing was predicted."""
    if n_tokens <= 0:
        return None
    return 10.0 ** (-log10_sum / n_tokens)


def is_ngram_model_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, META_FILE))


def is_causal_lm_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def ngram_model_files(model_dir: str) -> tuple[dict, str, str]:
    """An n-gram folder's lm.json and the two files it names, each a regular file inside the folder
    (a name or link leading out of it, a FIFO or a folder is refused, not followed)."""
    meta_path = os.path.join(model_dir, META_FILE)
    try:
        meta = load_json_file(meta_path, f"n-gram model {META_FILE}")
    except UntrustedFileError as exc:
        raise ModelLoadError(f"{exc}; train one with `dsdata lm train --corpus F --lang L --out DIR/L`") from None
    if not isinstance(meta, dict):
        raise ModelLoadError(f"{meta_path}: holds a {type(meta).__name__}, not an object")
    arpa = meta.get("arpa")
    try:
        sp_path = confined_file(model_dir, meta.get("sentencepiece", SP_FILE), f"{meta_path} sentencepiece")
        if arpa:
            lm_path = confined_file(model_dir, arpa, f"{meta_path} arpa")
        else:
            found = [c for c in _ARPA_CANDIDATES if os.path.lexists(os.path.join(model_dir, c))]
            lm_path = confined_file(model_dir, found[0], f"n-gram model '{model_dir}'") if found else None
    except UntrustedFileError as exc:
        raise ModelLoadError(str(exc)) from None
    if lm_path is None:
        raise ModelLoadError(f"n-gram model '{model_dir}' lacks {SP_FILE} or an lm.arpa[.gz]/lm.binary file; "
                             "retrain it with `dsdata lm train`")
    return meta, sp_path, lm_path


class NgramScorer:
    """SentencePiece pieces scored by KenLM, line by line."""

    def __init__(self, model_dir: str):
        import kenlm
        import sentencepiece as spm

        self.meta, sp_path, lm_path = ngram_model_files(model_dir)
        try:
            self.sp = spm.SentencePieceProcessor(model_file=sp_path)
        except (OSError, RuntimeError) as exc:  # a damaged model: "could not parse ModelProto", …
            raise ModelLoadError(f"SentencePiece model '{sp_path}' does not load ({one_line_of(exc)}); "
                                 "retrain the folder with `dsdata lm train`") from None
        config = kenlm.Config()
        config.show_progress = False
        try:
            with silenced_fd2():  # KenLM's 'build a binary file' hint at every ARPA load
                self.lm = kenlm.Model(lm_path, config)
        except (OSError, RuntimeError) as exc:
            raise ModelLoadError(f"n-gram model '{lm_path}' does not load in KenLM ({one_line_of(exc)})") from None
        except UnicodeDecodeError:  # KenLM's own message quoted the damaged bytes, which its binding decodes
            raise ModelLoadError(f"n-gram model '{lm_path}' does not load in KenLM (damaged bytes in the file)") from None

    def score_documents(self, texts: Sequence[str]) -> list[tuple[float, int]]:
        """(Σ log10 p, predicted tokens) per text."""
        owners: list[int] = []
        lines: list[str] = []
        for i, text in enumerate(texts):
            for line in text.splitlines():
                line = normalize_line(line)
                if line:
                    owners.append(i)
                    lines.append(line)
        results = [[0.0, 0] for _ in texts]
        if lines:
            score, encode = self.lm.score, self.sp.encode
            # One line at a time: a list is encoded on sentencepiece's own threads, off the stage's clock.
            for owner, pieces in zip(owners, (encode(line, out_type=str) for line in lines)):
                if not pieces:
                    continue
                results[owner][0] += score(" ".join(pieces), bos=True, eos=True)
                results[owner][1] += len(pieces) + 1
        return [(s, n) for s, n in results]


def one_line_of(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


class CausalLMScorer:
    """Any Hugging Face causal LM, batched, on GPU when present: each document is BOS (or EOS) + tokens
    + EOS in `max_length` windows overlapping by one token; a forward pass holds ≤ `logits_budget` logits."""

    def __init__(self, model_dir: str, device: str = "auto", max_length: int = 1024, batch_tokens: int = 16384,
                 logits_budget: int = LOGITS_BUDGET):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not is_causal_lm_dir(model_dir):
            raise ModelLoadError(f"causal LM '{model_dir}' has no config.json; give a directory saved with "
                                 "save_pretrained (model + tokenizer)")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False)
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"causal LM '{model_dir}' does not load ({str(exc).splitlines()[0]})") from None
        from dsdata.tokenizer import TokenizerError, check_transformers_tokenizer

        try:
            check_transformers_tokenizer(self.tokenizer, f"of causal LM '{model_dir}'")
        except TokenizerError as exc:
            raise ModelLoadError(str(exc)) from None
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model.to(self.device).eval()
        self.torch = torch
        limit = getattr(self.model.config, "max_position_embeddings", None) or max_length
        self.max_length = max(2, min(max_length, int(limit)))
        head = self.model.get_output_embeddings()
        self.vocab = int(head.weight.shape[0]) if head is not None else int(self.model.config.vocab_size)
        self.batch_tokens = max(1, min(batch_tokens, logits_budget // max(1, self.vocab)))
        tok = self.tokenizer
        self.start_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        self.end_id = tok.eos_token_id
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else (self.end_id or 0)
        self._docs = self._tokens = 0
        self._seconds = 0.0
        self._last_log = time.monotonic()
        params = sum(p.numel() for p in self.model.parameters())
        log.info("causal LM %s: %.1fM parameters, vocabulary %d, on %s; windows of %d tokens, up to %d tokens "
                 "per forward pass (logits ≤ %d MiB)", model_dir, params / 1e6, self.vocab, self.device,
                 self.max_length, max(self.batch_tokens, self.max_length),
                 max(self.batch_tokens, self.max_length) * self.vocab * 4 >> 20)

    def _sequence(self, text: str) -> list[int]:
        with hidden_panic_reports():  # a panic is this record's error (a row), its report no line
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        seq = ([self.start_id] if self.start_id is not None else []) + list(ids)
        if self.end_id is not None:
            seq.append(self.end_id)
        return seq

    def _batches(self, windows: list[tuple[int, list[int]]]):
        """Longest first; a batch is bounded by its padded tokens (at least one window) and closed
        before a window shorter than half its width joins, so padding never exceeds the real tokens."""
        windows.sort(key=lambda w: -len(w[1]))
        at = 0
        while at < len(windows):
            width = len(windows[at][1])
            end = at + 1
            while (end < len(windows) and (end - at + 1) * width <= self.batch_tokens
                   and 2 * len(windows[end][1]) >= width):
                end += 1
            yield windows[at:end]
            at = end

    def _window_logprobs(self, batch: list[tuple[int, list[int]]]):
        """Σ ln p(token) and predicted tokens per window of one batch."""
        torch = self.torch
        width = len(batch[0][1])
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (_, seq) in enumerate(batch):
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        sums, counts = [], []
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask).logits
            for row, (_, seq) in enumerate(batch):
                n = len(seq) - 1
                # log p(target) = logit(target) - logsumexp(logits), one window at a time
                row_logits = logits[row, :n].float()
                target = row_logits.gather(-1, ids[row, 1:n + 1, None]).squeeze(-1)
                sums.append(float((target - torch.logsumexp(row_logits, dim=-1)).double().sum()))
                counts.append(n)
                del row_logits
            del logits
        return sums, counts

    def score_documents(self, texts: Sequence[str]) -> list[tuple[float, int]]:
        """(Σ log10 p, predicted tokens) per text."""
        windows: list[tuple[int, list[int]]] = []
        step = self.max_length - 1
        for i, text in enumerate(texts):
            seq = self._sequence(text) if text.strip() else []
            for start in range(0, max(len(seq) - 1, 0), step):
                windows.append((i, seq[start:start + self.max_length]))
        totals = [[0.0, 0] for _ in texts]
        started = time.monotonic()
        for batch in self._batches(windows):
            sums, counts = self._window_logprobs(batch)
            for (owner, _), s, n in zip(batch, sums, counts):
                totals[owner][0] += s / LN10
                totals[owner][1] += int(n)
                self._tokens += int(n)
            self._progress(started)
        self._docs += len(texts)
        self._progress(started)
        self._seconds += time.monotonic() - started
        return [(s, n) for s, n in totals]

    def _progress(self, started: float) -> None:
        now = time.monotonic()
        if now - self._last_log >= PROGRESS_EVERY_S:
            self._last_log = now
            seconds = self._seconds + now - started
            log.info("causal LM: %d tokens scored in %.0f s (%.0f tokens/s), %d documents done", self._tokens,
                     seconds, self._tokens / seconds if seconds > 0 else 0.0, self._docs)


def language_model_dirs(model_dir: str, backend: str) -> dict[str, str]:
    """Language → model directory under `model_dir` ("*" when `model_dir` itself is one model)."""
    if not os.path.isdir(model_dir):
        raise ModelLoadError(f"difficulty.model_dir '{model_dir}' is not a directory; give a directory with one "
                             "subdirectory per language (e.g. models/lm/en, models/lm/zh)")
    is_model = is_ngram_model_dir if backend == "ngram" else is_causal_lm_dir
    if is_model(model_dir):
        return {"*": model_dir}
    found = {name: os.path.join(model_dir, name) for name in sorted(os.listdir(model_dir))
             if is_model(os.path.join(model_dir, name))}
    if not found:
        what = f"{META_FILE} (from `dsdata lm train`)" if backend == "ngram" else "config.json (a save_pretrained directory)"
        raise ModelLoadError(f"difficulty.model_dir '{model_dir}' has no language subdirectory with {what}")
    return found


def make_scorer(backend: str, path: str, device: str = "auto", max_length: int = 1024):
    if backend == "ngram":
        return NgramScorer(path)
    return CausalLMScorer(path, device=device, max_length=max_length)
