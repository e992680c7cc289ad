"""augment: add paraphrased copies of chosen documents (back-translation, synonyms, entities).

Originals always stay; each copy is a new document derived from its source (ids, annotations and
the chrF bounds on back-translations: docs/augment.md).  The Beam graph: dsdata/beam/augment.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from dsdata.augment.replace import DictionaryError, EntityReplacer, SynonymReplacer
from dsdata.augment.translate import GenerationSettings, ModelNotFoundError, resolve_model_dir
from dsdata.stages.base import CorpusStage, Param, SideOutput, StageConfigError
from dsdata.core.params import AnyOf, Boolean, Choice, Integer, ListOf, MappingOf, Number, Path, Text

METHODS = ("back_translation", "synonym", "entity")
TRANSLATABLE = ("zh", "en")
REPORT_NAME = "augment.json"
_SHARE = Number(0.0, 1.0)


@dataclass(frozen=True)
class BackTranslationConfig:
    model_dirs: dict[str, str]  # direction ("en_zh", "zh_en") → resolved model directory
    target_tokens: dict[str, str]  # target language → token prepended for multi-target models
    settings: GenerationSettings
    languages: tuple[str, ...]
    fraction: float
    seed: int
    min_sim: float
    max_sim: float
    batch_size: int
    max_sentence_chars: int
    device: str
    threads: int
    # The stage's environment_errors: a translator raising one stops the run instead of blaming a sentence.
    environment_errors: tuple[type[BaseException], ...] = ()


@dataclass(frozen=True)
class ReplacementConfig:
    method: str  # "synonym" or "entity"
    path: str
    replace_prob: float
    fraction: float
    seed: int


@dataclass(frozen=True)
class AugmentConfig:
    """What the Beam composite (dsdata/beam/augment.py) runs: one config per method."""

    back_translation: BackTranslationConfig | None
    replacements: tuple[ReplacementConfig, ...]
    methods: tuple[str, ...]


# The generate() settings a recipe may add: numbers and switches of the search itself.  Anything
# else is refused: transformers' generate() imports code named by `custom_generate` (with
# `trust_remote_code`), loads `assistant_model`s and `generation_config`s, and calls `streamer`s.
GENERATE_SETTINGS = frozenset({
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "repetition_penalty", "encoder_repetition_penalty",
    "length_penalty", "min_new_tokens", "min_length", "early_stopping", "num_beam_groups", "diversity_penalty",
    "typical_p", "epsilon_cutoff", "eta_cutoff", "min_p", "penalty_alpha", "renormalize_logits",
    "remove_invalid_values", "use_cache", "forced_bos_token_id", "forced_eos_token_id",
})


class AugmentStage(CorpusStage):
    name = "augment"
    description = "add back-translated (zh↔en) and dictionary-replaced copies of a seeded fraction of documents"
    params = {
        "method": Param("back_translation", "method or list of methods: back_translation, synonym, entity",
                        AnyOf(Text(), ListOf(Text()), expect="a method name or a list of them")),
        "fraction": Param(0.1, "share of documents each method augments (chosen by a hash of seed and id)", _SHARE),
        "seed": Param(0, "seed for choosing documents, sampling and replacements", Integer()),
        "languages": Param(["zh", "en"], "languages to back-translate (zh, en); from the lang annotation, else by script",
                           ListOf(Choice(TRANSLATABLE), nonempty=True, single=True)),
        "model_en_zh": Param("Helsinki-NLP/opus-mt-en-zh", "en→zh seq2seq model: directory or repo id in the local HF cache",
                             Path()),
        "model_zh_en": Param("Helsinki-NLP/opus-mt-zh-en", "zh→en seq2seq model: directory or repo id in the local HF cache",
                             Path()),
        "target_token_zh": Param(">>cmn_Hans<<", "token put before sources translated into zh, if the model's vocabulary has it",
                                 Text(), nullable=True),
        "target_token_en": Param(">>eng<<", "token put before sources translated into en, if the model's vocabulary has it",
                                 Text(), nullable=True),
        "min_sim": Param(0.4, "keep a back-translated copy only if chrF(copy, original) >= this (0..1)", _SHARE),
        "max_sim": Param(0.9, "… and <= this; identical copies (chrF 1.0) teach nothing", _SHARE),
        "num_beams": Param(4, "beam width for translation (ignored when do_sample)", Integer(min=1)),
        "do_sample": Param(False, "sample instead of beam search (seeded per sentence)", Boolean()),
        "temperature": Param(1.0, "sampling temperature", Number(1e-6, 100.0)),
        "top_k": Param(0, "sample among the k most likely tokens (0 = all)", Integer(min=0)),
        "top_p": Param(1.0, "nucleus sampling mass (1.0 = off)", Number(1e-6, 1.0)),
        "max_new_tokens": Param(256, "longest translation of one sentence, in tokens", Integer(min=1)),
        "generate_kwargs": Param({}, "further generate() settings (numbers, true/false), e.g. {no_repeat_ngram_size: 3}",
                                 MappingOf(Text(nonempty=True), expect="a mapping of generate() argument names to values")),
        "batch_size": Param(16, "sentences per model call (RunInference batch)", Integer(min=1)),
        "max_sentence_chars": Param(400, "sentences longer than this are cut at clause marks / spaces", Integer(min=20)),
        "device": Param("cpu", "torch device for translation: cpu, cuda, cuda:1 …", Text(nonempty=True)),
        "threads": Param(0, "torch CPU threads per worker (0 = torch's default)", Integer(min=0)),
        "synonyms": Param(None, "synonym dictionary (TSV term<TAB>syn… or JSON {term: [syn…]})", Path(), nullable=True),
        "entities": Param(None, "entity dictionary (TSV TYPE<TAB>entity or JSON {TYPE: [entity…]})", Path(), nullable=True),
        "replace_prob": Param(0.3, "chance to replace each synonym occurrence / each distinct entity", _SHARE),
    }
    annotations = {
        "augmentation": pa.string(),
        "source_id": pa.string(),
        "derived_by": pa.string(),
        "augment_similarity": pa.float64(),
    }
    side_outputs = (SideOutput(REPORT_NAME, sort_keys=True),)

    @property
    def methods(self) -> list[str]:
        return [self.method] if isinstance(self.method, str) else list(self.method)

    def validate(self) -> None:
        methods = self.methods
        unknown = [m for m in methods if m not in METHODS]
        if unknown or not methods:
            raise StageConfigError(f"augment.method: unknown {unknown or 'empty list'} (choose from {', '.join(METHODS)})")
        if len(set(methods)) != len(methods):
            raise StageConfigError(f"augment.method: {methods} names a method twice")
        for key, value in self.generate_kwargs.items():
            if key not in GENERATE_SETTINGS:
                raise StageConfigError(
                    f"augment.generate_kwargs: '{key}' is not allowed (a recipe may add only these generate() "
                    f"settings: {', '.join(sorted(GENERATE_SETTINGS))}); the stage's own parameters cover the rest")
            if isinstance(value, (int, float)) or (key == "early_stopping" and value == "never"):  # bool is an int
                continue
            raise StageConfigError(f"augment.generate_kwargs.{key}: {value!r} is not a number or true/false")
        if self.min_sim > self.max_sim:
            raise StageConfigError(f"augment: min_sim {self.min_sim} is above max_sim {self.max_sim}; nothing could be kept")
        # Models and dictionaries are looked up now, so a missing one stops the run before the pipeline starts.
        if "back_translation" in methods:
            self.model_dirs()
        for method, param in (("synonym", "synonyms"), ("entity", "entities")):
            if method in methods:
                self._check_dictionary(method, param)

    def model_dirs(self) -> dict[str, str]:
        """direction → local model directory; both directions, since a round trip uses both."""
        dirs = {}
        for direction in ("en_zh", "zh_en"):
            param = f"model_{direction}"
            try:
                dirs[direction] = resolve_model_dir(getattr(self, param), param)
            except ModelNotFoundError as exc:
                raise StageConfigError(str(exc)) from None
        return dirs

    def _check_dictionary(self, method: str, param: str) -> None:
        path = getattr(self, param)
        if not path:
            raise StageConfigError(f"augment.{param}: method '{method}' needs a dictionary file; set augment.{param}=FILE (TSV or JSON)")
        try:
            (SynonymReplacer if method == "synonym" else EntityReplacer)(path, param)
        except DictionaryError as exc:
            raise StageConfigError(str(exc)) from None

    def transform_config(self) -> AugmentConfig:
        back_translation = None
        if "back_translation" in self.methods:
            settings = GenerationSettings(
                num_beams=self.num_beams, do_sample=self.do_sample, temperature=self.temperature,
                top_k=self.top_k, top_p=self.top_p, max_new_tokens=self.max_new_tokens,
                extra=tuple(sorted(self.generate_kwargs.items())),
            )
            back_translation = BackTranslationConfig(
                model_dirs=self.model_dirs(),
                target_tokens={"zh": self.target_token_zh or "", "en": self.target_token_en or ""},
                settings=settings, languages=tuple(self.languages), fraction=self.fraction, seed=self.seed,
                min_sim=self.min_sim, max_sim=self.max_sim, batch_size=self.batch_size,
                max_sentence_chars=self.max_sentence_chars, device=self.device, threads=self.threads,
                environment_errors=self.environment_errors,
            )
        replacements = tuple(
            ReplacementConfig(method, getattr(self, param), self.replace_prob, self.fraction, self.seed)
            for method, param in (("synonym", "synonyms"), ("entity", "entities"))
            if method in self.methods
        )
        return AugmentConfig(back_translation, replacements, tuple(self.methods))
