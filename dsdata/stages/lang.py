"""Language identification: fastText (default; the shipped lid.176.ftz or any model through `model`)
or langdetect (docs/filters.md).  Chinese is reported as `zh`, with the script (Hans = Simplified,
Hant = Traditional) in `lang_script`.
"""
from __future__ import annotations

import contextlib
import functools
import mmap
import os
import re
import stat
import struct

import numpy as np
import pyarrow as pa

from dsdata.document import Document, Rejected
from dsdata.stages import fasttext_model
from dsdata.stages.base import BatchStage, Chart, Param, StageConfigError
from dsdata.core.params import Allowed, Choice, Integer, ListOf, Number, Path, Text

_LABEL = "__label__"
# The newline and the characters str.split() breaks on that fastText's tokenizer does not (its word
# breaks are space, \t, \v, \f, \r and \0): a text containing none is passed to fastText as it is.
_REFLOW = re.compile("[\n\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
# Lone surrogates: a str holding one has no UTF-8 form, which fastText's binding needs.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _fasttext_line(text: str) -> str:
    """`text` as fastText's input: itself when it holds none of _REFLOW's characters, else every
    run of whitespace made one space.  An ASCII text can only hold the newline and \x1c-\x1f, a
    printable one none of them: both checks cost less than the regex's scan."""
    if text.isascii():
        if not ("\n" in text or "\x1c" in text or "\x1d" in text or "\x1e" in text or "\x1f" in text):
            return text
    elif text.isprintable() or _REFLOW.search(text) is None:
        return text
    return " ".join(text.split())

# Characters whose form differs between Simplified and Traditional Chinese and that are frequent
# in running text; counting them decides the script of a zh document.
_SIMPLIFIED = set("这个们来时为说国会对经过还没与后发么样见从动将头实现区进关门问间长开车书东认")
_TRADITIONAL = set("這個們來時為說國會對經過還沒與後發麼樣見從動將頭實現區進關門問間長開車書東認")
_SIMPLIFIED, _TRADITIONAL = _SIMPLIFIED - _TRADITIONAL, _TRADITIONAL - _SIMPLIFIED
# The two sets as character classes: counted by findall at C speed, not a generator per character.
_SIMPLIFIED_RE = re.compile("[" + "".join(sorted(_SIMPLIFIED)) + "]")
_TRADITIONAL_RE = re.compile("[" + "".join(sorted(_TRADITIONAL)) + "]")


def chinese_script(text: str) -> str:
    """'Hant' if Traditional-only characters outnumber Simplified-only ones, else 'Hans'."""
    simp = len(_SIMPLIFIED_RE.findall(text))
    trad = len(_TRADITIONAL_RE.findall(text))
    return "Hant" if trad > simp else "Hans"


def normalise_code(code: str) -> str:
    """Backend label → ISO 639-1 style code: zh-cn/zh-tw/zh-Hant → zh; others lower-cased."""
    code = code.lower().replace("_", "-")
    if code == "zh" or code.startswith("zh-"):  # not "zh,en": one code, never the start of a list
        return "zh"
    return code


def _language_of(code: str) -> tuple[str, str | None]:
    """A backend's code (fastText's `zh` from `__label__zh`, langdetect's `zh-tw`) → (language, the
    script the code itself names, or None)."""
    lang = normalise_code(code)
    return lang, ({"zh-cn": "Hans", "zh-tw": "Hant"}.get(code.lower()) if lang == "zh" else None)


def default_fasttext_model() -> str:
    """Path of the lid.176.ftz shipped in dsdata/models/lid176/ (package data)."""
    from dsdata.models import ShippedModelMissing, lid176_path

    try:
        return lid176_path()
    except ShippedModelMissing as exc:
        raise StageConfigError(f"lang: {exc}") from None


def load_fasttext(path: str):
    """Load a fastText model quietly (its loader prints a warning for supervised models)."""
    if not os.path.isfile(path):
        raise StageConfigError(f"lang: fastText model '{path}' not found; set lang.model to a .bin/.ftz file")
    try:
        import fasttext
    except ImportError as exc:
        raise StageConfigError("lang: the fasttext backend needs fasttext-numpy2 (pip install fasttext-numpy2)") from exc
    try:
        fasttext.FastText.eprint = lambda *args, **kwargs: None
    except AttributeError:
        pass
    try:
        fasttext_model.check_model_file(path)  # the binding trusts the file's sizes: damage was a segfault
    except fasttext_model.UnusableModel as exc:
        raise StageConfigError(f"lang: {exc}") from None
    try:
        return fasttext.load_model(path)
    except ValueError as exc:
        raise StageConfigError(f"lang: '{path}' is not a fastText model ({exc})") from None


def _fasttext_labels(path: str) -> frozenset[str] | None:
    """The languages (normalised labels) of the fastText model at `path`, read from its dictionary
    (plain byte parsing); None when the file cannot be read as one (the stage's setup says why)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return _labels_cached(path, st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


@functools.lru_cache(maxsize=8)
def _labels_cached(path: str, _size: int, _mtime_ns: int) -> frozenset[str] | None:
    from dsdata.io.fasttext_file import MAGIC, MAX_VERSION, ModelReader

    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            r = ModelReader(data)
            magic, version = r.take("<ii")
            r.take("<12id")  # Args
            entries, nwords, _nlabels = r.take("<iii")
            r.take("<qq")
            if magic != MAGIC or not 0 < version <= MAX_VERSION or not 0 <= nwords <= entries <= len(data):
                return None
            labels = set()
            for _ in range(entries):
                end = data.find(b"\0", r.pos)
                if end < 0:
                    return None
                word = data[r.pos:end]
                r.pos = end + 1
                if r.take("<qb")[1] == 1:
                    labels.add(_language_of(word.decode("utf-8", "replace").removeprefix(_LABEL))[0])
    except (OSError, ValueError, struct.error):
        return None
    return frozenset(labels) or None


def _langdetect_labels() -> frozenset[str] | None:
    try:
        import langdetect
    except ImportError:
        return None
    folder = os.path.join(os.path.dirname(langdetect.__file__), "profiles")
    with contextlib.suppress(OSError):
        return frozenset(normalise_code(name) for name in os.listdir(folder))
    return None


def model_languages(values: dict) -> Allowed | None:
    """`lang.keep`'s choices: the languages the configured backend and model can report."""
    if values.get("backend") == "langdetect":
        found, source = _langdetect_labels(), "the languages langdetect reports"
    else:
        try:
            path = values.get("model") or default_fasttext_model()
        except StageConfigError:
            return None  # the shipped model is missing: setup() says so
        found, source = _fasttext_labels(path), f"the {{n}} languages {os.path.basename(path)} reports"
    return Allowed(found, source.format(n=len(found))) if found else None


class LanguageCodes(ListOf):
    """Languages to keep: a list or one code; '', 'all' and null keep every language.  Codes are
    normalised as the backends report them (zh-cn → zh)."""

    def __init__(self):
        super().__init__(Text(nonempty=True), single=True)
        self.expect = "a list of language codes such as [zh, en], or [] or all for every language"

    def check(self, value):
        if value is None or value in ("", "all"):
            return []
        return [normalise_code(code) for code in super().check(value)]


class LanguageStage(BatchStage):
    name = "lang"
    charts = (
        Chart("categories", "lang", "hist-lang", "Language mix (kept)", "language mix", label="lang"),
        Chart("histogram", "lang_score", "hist-lang-score", "Language-ID confidence (lang_score)",
              "Language-ID confidence (lang_score)", label="lang_score", threshold="min_score"),
    )
    description = "Language ID (fastText lid.176 or langdetect): annotate lang/lang_score, keep listed languages."
    params = {
        "backend": Param("fasttext", "fasttext (default; the shipped lid.176.ftz) or langdetect",
                         Choice(("fasttext", "langdetect"))),
        "model": Param(None, "fastText model file (.bin/.ftz); default: lid.176.ftz shipped in dsdata/models/lid176", Path(),
                       nullable=True),
        "keep": Param(["zh", "en"], "languages to keep (ISO 639-1, zh covers Simplified and Traditional); [] keeps all; "
                      "each must be a language the model reports", LanguageCodes(), choices=model_languages),
        "min_score": Param(0.5, "reject documents whose top language scores below this (0 disables)", Number(0, 1)),
        "max_chars": Param(4000, "classify on the first N characters (fastText and langdetect slow down on huge docs)",
                           Integer(min=1)),
        "seed": Param(0, "langdetect's random seed (it is non-deterministic without one)", Integer()),
    }
    annotations = {"lang": pa.string(), "lang_score": pa.float64(), "lang_script": pa.string()}
    batch_min = 64
    batch_max = 1024

    _model = None  # loaded per worker by setup()
    _predict_lines = None  # the model's own multilinePredict (setup), when its binding has one
    _engine = None  # the compiled predictor (dsdata.stages.fasttext_model), when it covers the model

    def preflight(self) -> str | None:
        if self.backend != "fasttext":
            return None
        from dsdata.stages.fasttext_install import fasttext_problem

        return fasttext_problem(need_training=False)

    def setup(self) -> None:
        # Backend label → (language, script the label names or None), filled as labels are met (a
        # model has a few hundred): each label is normalised once, not once per document.
        self._codes_seen: dict[str, tuple[str, str | None]] = {}
        if self.backend == "fasttext":
            path = self.model or default_fasttext_model()
            # The compiled predictor gives the binding's labels and float32 scores bit for bit, ~3x
            # faster (fasttext_model's docstring); models it does not cover, numba missing, or
            # DSDATA_NO_NUMBA=1 use the binding.
            try:
                self._engine = fasttext_model.load(path) if os.path.isfile(path) else None
            except fasttext_model.UnusableModel as exc:
                raise StageConfigError(f"lang: {exc}") from None
            if self._engine is not None:
                self._model = self._engine
                return
            self._model = load_fasttext(path)
            # fastText's predict(list) checks each text for a newline, then calls multilinePredict:
            # predict() below calls it directly, its texts hold no newline (_fasttext_line).
            self._predict_lines = getattr(getattr(self._model, "f", None), "multilinePredict", None)
        else:
            from langdetect import detector_factory

            detector_factory.init_factory()
            factory = detector_factory._factory
            factory.set_seed(int(self.seed))
            self._model = factory

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_model"] = state["_predict_lines"] = state["_engine"] = None  # models are loaded per worker in setup(), never pickled
        return state

    def predict(self, texts: list[str]) -> list[tuple[str, float, str | None]]:
        """(lang, score, script) for each text."""
        if self._model is None:
            self.setup()
        limit = self.max_chars
        if self.backend == "fasttext":
            # fastText treats a newline as the end of its input, so whitespace runs become one space
            # (_fasttext_line).  predict on a list: single-string predict breaks under numpy 2.
            lines = [_fasttext_line(t[:limit]) for t in texts]
            if self._engine is not None:
                found, values = self._engine.predict(lines)
                codes = [code or _LABEL + "unknown" for code in found]
                return self._results(texts, codes, values, limit)
            try:
                labels, scores = self._fasttext_predict(lines)
            except (TypeError, UnicodeError):
                # A lone surrogate (a str with no UTF-8 form) fails the binding's conversion of the
                # whole list; such a character is classified as U+FFFD, the others as they are.
                labels, scores = self._fasttext_predict([_SURROGATE.sub("\ufffd", t) for t in lines])
            if all(len(sc) == 1 for sc in scores):
                values = np.concatenate(scores).tolist() if scores else []  # the float32s as floats, at once
                codes = [lab[0] for lab in labels]
            else:
                values = [float(sc[0]) if len(sc) else 0.0 for sc in scores]
                codes = [lab[0] if lab else _LABEL + "unknown" for lab in labels]
        else:
            raw = [self._langdetect_one(t[:limit]) for t in texts]
            codes = [code for code, _ in raw]
            values = [score for _, score in raw]
        return self._results(texts, codes, values, limit)

    def _results(self, texts, codes, values, limit):
        out = []
        codes_seen = self._codes_seen
        prefix = len(_LABEL) if self.backend == "fasttext" else 0
        for text, code, score in zip(texts, codes, values):
            known = codes_seen.get(code)
            if known is None:
                known = codes_seen[code] = _language_of(code[prefix:])
            lang, script = known
            if lang == "zh" and script is None:
                script = chinese_script(text[:limit])
            out.append((lang, score if 0.0 <= score <= 1.0 else min(max(score, 0.0), 1.0), script))
        return out

    def _fasttext_predict(self, lines: list[str]):
        if self._predict_lines is not None:  # = model.predict(lines, k=1): threshold 0, strict UTF-8
            return self._predict_lines([line + "\n" for line in lines], 1, 0.0, "strict")
        return self._model.predict(lines, k=1)

    def _langdetect_one(self, text: str) -> tuple[str, float]:
        from langdetect.lang_detect_exception import LangDetectException

        detector = self._model.create()
        detector.append(text)
        try:
            best = detector.get_probabilities()[0]
        except (LangDetectException, IndexError):
            return "unknown", 0.0
        return best.lang, best.prob

    def _decide(self, doc: Document, result: tuple[str, float, str | None]) -> Document | Rejected:
        lang, score, script = result
        doc.annotations.update(lang=lang, lang_score=round(score, 6), lang_script=script)
        if self.keep and lang not in self.keep:
            return self.reject(doc, "lang_not_kept", f"{lang} ({score:.3f}) not in {self.keep}")
        if score < self.min_score:
            return self.reject(doc, "lang_low_score", f"{lang} scored {score:.3f} < {self.min_score}")
        return doc

    def process_batch(self, docs: list[Document]) -> list[Document | Rejected]:
        return [self._decide(d, r) for d, r in zip(docs, self.predict([d.text for d in docs]))]
