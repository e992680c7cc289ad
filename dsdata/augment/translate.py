"""Seq2seq translation for back-translation: find the model (a local directory or a repo id already
in the HF cache: never downloaded), load it once, translate batches.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from dsdata.model_limits import input_token_limit, output_token_limit
from dsdata.native_panics import hidden_panic_reports

DEFAULT_MODELS = {"en_zh": "Helsinki-NLP/opus-mt-en-zh", "zh_en": "Helsinki-NLP/opus-mt-zh-en"}


class ModelNotFoundError(ValueError):
    """A translation model that is neither a local directory nor in the local HF cache."""


def _cached_snapshot(repo_id: str) -> str | None:
    """The local snapshot directory of `repo_id` in the HF cache, or None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        config = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id (HFValidationError): then it is not in the cache either
        return None
    return os.path.dirname(config) if isinstance(config, str) else None


def _repo_id_candidates(value: str) -> list[str]:
    """Repo ids `value` may name: 'org/name' as given, or the last two parts of a path that --set
    made absolute (…/Helsinki-NLP/opus-mt-en-zh)."""
    parts = [p for p in value.replace("\\", "/").split("/") if p]
    candidates = []
    if not os.path.isabs(value) and len(parts) == 2:
        candidates.append("/".join(parts))
    if len(parts) >= 2:
        candidates.append("/".join(parts[-2:]))
    return list(dict.fromkeys(candidates))


def resolve_model_dir(value: str, param: str) -> str:
    """A loadable model directory for parameter `param`, or ModelNotFoundError saying what to do."""
    if not isinstance(value, str) or not value:
        raise ModelNotFoundError(f"augment.{param}: give a model directory or a Hugging Face repo id")
    if os.path.isdir(value):
        if not os.path.isfile(os.path.join(value, "config.json")):
            raise ModelNotFoundError(
                f"augment.{param}: '{value}' has no config.json; point it at a directory written by "
                "save_pretrained() (a seq2seq model such as MarianMT, with its tokenizer)"
            )
        return value
    for repo_id in _repo_id_candidates(value):
        snapshot = _cached_snapshot(repo_id)
        if snapshot:
            return snapshot
    default = DEFAULT_MODELS.get(param.removeprefix("model_"), "Helsinki-NLP/opus-mt-…")
    raise ModelNotFoundError(
        f"augment.{param}: '{value}' is not a model directory and not in the local Hugging Face cache "
        f"(models are never downloaded at run time); fetch it once where there is network, e.g. "
        f"`hf download {default}`, or pass --set augment.{param}=DIR with a saved seq2seq model"
    )


@dataclass(frozen=True)
class GenerationSettings:
    """Decoding settings; sampling is seeded per sentence (see SeededGumbelSampling)."""

    num_beams: int = 4
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 256
    max_input_tokens: int = 512
    extra: tuple[tuple[str, Any], ...] = field(default_factory=tuple)  # more model.generate arguments


def _seeded_sampling_processor(seeds: list[int]):
    import torch
    from transformers import LogitsProcessor

    class SeededGumbelSampling(LogitsProcessor):
        """Sampling by the Gumbel-max trick with noise seeded by (sentence seed, step), so a
        sentence's sample does not depend on which sentences share its batch."""

        def __call__(self, input_ids, scores):
            step = input_ids.shape[1]
            noise = torch.empty(scores.shape, dtype=torch.float32)
            for row, seed in enumerate(seeds):
                generator = torch.Generator().manual_seed((seed + step * 0x9E3779B97F4A7C15) % 2**63)
                uniform = torch.rand(scores.shape[1], generator=generator).clamp_(1e-20, 1.0)
                noise[row] = -torch.log(-torch.log(uniform))
            return scores + noise.to(device=scores.device, dtype=scores.dtype)

    return SeededGumbelSampling()


class Seq2SeqTranslator:
    """One loaded translation model; `translate` keeps input order and batches by length."""

    def __init__(self, model_dir: str, param: str, device: str = "cpu", source_prefix: str = ""):
        os.environ["HF_HUB_OFFLINE"] = "1"
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one "Loading weights" bar per worker and model clutters run logs
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False)
            self.model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False)
        except Exception as exc:  # noqa: BLE001 - any loading failure is the same user-facing problem
            raise ModelNotFoundError(
                f"augment.{param}: cannot load a seq2seq model and tokenizer from '{model_dir}' "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            ) from None
        from dsdata.tokenizer import TokenizerError, check_transformers_tokenizer

        try:
            check_transformers_tokenizer(self.tokenizer, f"of augment.{param} '{model_dir}'")
        except TokenizerError as exc:
            raise ModelNotFoundError(str(exc)) from None
        self.device = torch.device(device)
        self.model.to(self.device).eval()
        # multi-target opus-mt models need a target token (>>cmn_Hans<<), when their vocabulary has it
        vocab = self.tokenizer.get_vocab()
        self.source_prefix = f"{source_prefix} " if source_prefix and source_prefix in vocab else ""
        # the model's own limits (its position table) cap the configured ones
        self.max_input_tokens = input_token_limit(self.model.config, self.tokenizer)
        self.max_output_tokens = output_token_limit(self.model.config)

    def translate(self, texts: list[str], seeds: list[int], settings: GenerationSettings, batch_size: int) -> list[str]:
        import torch
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        order = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
        out: list[str] = [""] * len(texts)
        max_input = min(x for x in (settings.max_input_tokens, self.max_input_tokens) if x is not None)
        max_new = min(x for x in (settings.max_new_tokens, self.max_output_tokens) if x is not None)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            with hidden_panic_reports():  # a panic is the batch's error (then each record's), its report no line
                encoded = self.tokenizer(
                    [self.source_prefix + texts[i] for i in rows],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=max_input,
                ).to(self.device)
            kwargs: dict[str, Any] = dict(settings.extra)
            kwargs.update(max_new_tokens=max_new, do_sample=False)
            if settings.do_sample:
                processors = []
                if settings.temperature != 1.0:
                    processors.append(TemperatureLogitsWarper(settings.temperature))
                if settings.top_k > 0:
                    processors.append(TopKLogitsWarper(settings.top_k))
                if settings.top_p < 1.0:
                    processors.append(TopPLogitsWarper(settings.top_p))
                processors.append(_seeded_sampling_processor([seeds[i] for i in rows]))
                kwargs.update(num_beams=1, logits_processor=LogitsProcessorList(processors))
            else:
                kwargs.update(num_beams=settings.num_beams)
            with torch.inference_mode():
                generated = self.model.generate(**encoded, **kwargs)
            decoded = self.tokenizer.batch_decode(generated, skip_special_tokens=True)
            for i, text in zip(rows, decoded):
                out[i] = text.strip()
        return out


_LOADED: dict[tuple[str, str, str], Seq2SeqTranslator] = {}
_LOAD_LOCK = threading.Lock()


def load_translator(model_dir: str, param: str, device: str, source_prefix: str) -> Seq2SeqTranslator:
    """One translator per (model, device, prefix) per process: each model loaded once."""
    key = (model_dir, device, source_prefix)
    with _LOAD_LOCK:
        if key not in _LOADED:
            _LOADED[key] = Seq2SeqTranslator(model_dir, param, device, source_prefix)
        return _LOADED[key]
