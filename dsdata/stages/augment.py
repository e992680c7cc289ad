"""augment: add paraphrased copies of chosen documents (back-translation, synonyms, entities).

Originals always stay.  Each copy is a new document with id `<source id>#bt|#syn|#ent`,
annotations augmentation / source_id / derived_by="augment" / augment_similarity (chrF to the
original), and `derived_from` = the source id, so the ledger counts it as `augmented`.
Back-translated copies whose chrF to the original lies outside [min_sim, max_sim] are not emitted;
they are counted in RUN_DIR/augment.json and Beam Metrics (namespace dsdata.augment).
See docs/augment.md.
"""
from __future__ import annotations

import pyarrow as pa

from dsdata.stages.base import Param, Stage, StageConfigError

METHODS = ("back_translation", "synonym", "entity")
TRANSLATABLE = ("zh", "en")


class AugmentStage(Stage):
    name = "augment"
    description = "add back-translated (zh↔en) and dictionary-replaced copies of a seeded fraction of documents"
    params = {
        "method": Param("back_translation", "method or list of methods: back_translation, synonym, entity"),
        "fraction": Param(0.1, "share of documents each method augments (chosen by a hash of seed and id)"),
        "seed": Param(0, "seed for choosing documents, sampling and replacements"),
        "languages": Param(["zh", "en"], "languages to back-translate (zh, en); from the lang annotation, else by script"),
        "model_en_zh": Param("Helsinki-NLP/opus-mt-en-zh", "en→zh seq2seq model: directory or repo id in the local HF cache", kind="path"),
        "model_zh_en": Param("Helsinki-NLP/opus-mt-zh-en", "zh→en seq2seq model: directory or repo id in the local HF cache", kind="path"),
        "target_token_zh": Param(">>cmn_Hans<<", "token put before sources translated into zh, if the model's vocabulary has it"),
        "target_token_en": Param(">>eng<<", "token put before sources translated into en, if the model's vocabulary has it"),
        "min_sim": Param(0.4, "keep a back-translated copy only if chrF(copy, original) >= this (0..1)"),
        "max_sim": Param(0.9, "… and <= this; identical copies (chrF 1.0) teach nothing"),
        "num_beams": Param(4, "beam width for translation (ignored when do_sample)"),
        "do_sample": Param(False, "sample instead of beam search (seeded per sentence)"),
        "temperature": Param(1.0, "sampling temperature"),
        "top_k": Param(0, "sample among the k most likely tokens (0 = all)"),
        "top_p": Param(1.0, "nucleus sampling mass (1.0 = off)"),
        "max_new_tokens": Param(256, "longest translation of one sentence, in tokens"),
        "generate_kwargs": Param({}, "further model.generate arguments, e.g. {no_repeat_ngram_size: 3}"),
        "batch_size": Param(16, "sentences per model call (RunInference batch)"),
        "max_sentence_chars": Param(400, "sentences longer than this are cut at clause marks / spaces"),
        "device": Param("cpu", "torch device for translation: cpu, cuda, cuda:1 …"),
        "threads": Param(0, "torch CPU threads per worker (0 = torch's default)"),
        "synonyms": Param(None, "synonym dictionary (TSV term<TAB>syn… or JSON {term: [syn…]})", kind="path"),
        "entities": Param(None, "entity dictionary (TSV TYPE<TAB>entity or JSON {TYPE: [entity…]})", kind="path"),
        "replace_prob": Param(0.3, "chance to replace each synonym occurrence / each distinct entity"),
    }
    annotations = {
        "augmentation": pa.string(),
        "source_id": pa.string(),
        "derived_by": pa.string(),
        "augment_similarity": pa.float64(),
    }

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
        self._check_number("fraction", 0.0, 1.0)
        self._check_number("min_sim", 0.0, 1.0)
        self._check_number("max_sim", 0.0, 1.0)
        self._check_number("replace_prob", 0.0, 1.0)
        if self.min_sim > self.max_sim:
            raise StageConfigError(f"augment: min_sim {self.min_sim} is above max_sim {self.max_sim}; nothing could be kept")
        for key, low in (("num_beams", 1), ("batch_size", 1), ("max_new_tokens", 1), ("max_sentence_chars", 20), ("top_k", 0), ("threads", 0)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise StageConfigError(f"augment.{key}: expected an integer >= {low}, got {value!r}")
        self._check_number("temperature", 1e-6, 100.0)
        self._check_number("top_p", 1e-6, 1.0)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise StageConfigError(f"augment.seed: expected an integer, got {self.seed!r}")
        if not isinstance(self.generate_kwargs, dict):
            raise StageConfigError(f"augment.generate_kwargs: expected a mapping, got {self.generate_kwargs!r}")
        languages = [self.languages] if isinstance(self.languages, str) else list(self.languages or [])
        bad = [lang for lang in languages if lang not in TRANSLATABLE]
        if bad or not languages:
            raise StageConfigError(f"augment.languages: {bad or 'empty'} cannot be back-translated (choose from zh, en)")
        self.languages = languages
        self._model_dirs: dict[str, str] = {}
        if "back_translation" in methods:
            from dsdata.augment.translate import ModelNotFoundError, resolve_model_dir

            needed = {"en_zh", "zh_en"}  # a round trip uses both directions whichever the source
            for direction in sorted(needed):
                param = f"model_{direction}"
                try:
                    self._model_dirs[direction] = resolve_model_dir(getattr(self, param), param)
                except ModelNotFoundError as exc:
                    raise StageConfigError(str(exc)) from None
        for method, param in (("synonym", "synonyms"), ("entity", "entities")):
            if method in methods:
                self._check_dictionary(method, param)

    def _check_number(self, key: str, low: float, high: float) -> None:
        value = getattr(self, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise StageConfigError(f"augment.{key}: expected a number in [{low}, {high}], got {value!r}")

    def _check_dictionary(self, method: str, param: str) -> None:
        from dsdata.augment.replace import DictionaryError, EntityReplacer, SynonymReplacer

        path = getattr(self, param)
        if not path:
            raise StageConfigError(f"augment.{param}: method '{method}' needs a dictionary file; set augment.{param}=FILE (TSV or JSON)")
        try:
            (SynonymReplacer if method == "synonym" else EntityReplacer)(path, param)
        except DictionaryError as exc:
            raise StageConfigError(str(exc)) from None

    def beam_transform(self):
        from dsdata.augment.transforms import Augment, BackTranslationConfig, ReplacementConfig
        from dsdata.augment.translate import GenerationSettings

        back_translation = None
        if "back_translation" in self.methods:
            settings = GenerationSettings(
                num_beams=self.num_beams, do_sample=bool(self.do_sample), temperature=float(self.temperature),
                top_k=self.top_k, top_p=float(self.top_p), max_new_tokens=self.max_new_tokens,
                extra=tuple(sorted(self.generate_kwargs.items())),
            )
            back_translation = BackTranslationConfig(
                model_dirs=dict(self._model_dirs),
                target_tokens={"zh": self.target_token_zh or "", "en": self.target_token_en or ""},
                settings=settings, languages=tuple(self.languages), fraction=float(self.fraction), seed=self.seed,
                min_sim=float(self.min_sim), max_sim=float(self.max_sim), batch_size=self.batch_size,
                max_sentence_chars=self.max_sentence_chars, device=self.device, threads=self.threads,
            )
        replacements = [
            ReplacementConfig(method, getattr(self, param), float(self.replace_prob), float(self.fraction), self.seed)
            for method, param in (("synonym", "synonyms"), ("entity", "entities"))
            if method in self.methods
        ]
        return Augment(back_translation, replacements, self.run_dir, self.methods)
