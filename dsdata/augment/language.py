"""Which language a document is in, for choosing the translation direction: the `lang` stage's
annotation when present, else a script guess (mostly Han → zh; Latin with English function words
→ en; anything else → None, not augmented).
"""
from __future__ import annotations

import re

from dsdata.document import Document

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# Kana and Hangul: Japanese and Korean text also uses Han characters; these tell them apart.
_KANA_HANGUL = re.compile(r"[\u3040-\u30ff\uac00-\ud7af]")
_LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]")
_WORD = re.compile(r"[A-Za-z\u00c0-\u024f']+")
# Only words rare outside English ("a", "in", "no", "de" made Dutch or Portuguese pass as English).
_ENGLISH_FUNCTION_WORDS = frozenset(
    "the and of are were with that this these those which from have has been would should "
    "could their there what when where will you they it's don't can't does shall than then".split()
)
# Shares of letters / words: short technical English counts as en, French or German prose does not.
_MIN_HAN_SHARE = 0.3
_MAX_KANA_HANGUL_SHARE = 0.05
_MIN_LATIN_SHARE = 0.8
_MIN_FUNCTION_WORD_SHARE = 0.06


def normalize_lang(code: object) -> str | None:
    """'zh-Hant', 'zh_CN', 'ZH' → 'zh'; None/'' → None."""
    if not isinstance(code, str) or not code.strip():
        return None
    return re.split(r"[-_]", code.strip().lower(), maxsplit=1)[0]


def guess_script_language(text: str) -> str | None:
    """'zh', 'en' or None from the characters and words of `text`."""
    han = len(_HAN.findall(text))
    kana_hangul = len(_KANA_HANGUL.findall(text))
    latin = len(_LATIN.findall(text))
    letters = han + kana_hangul + latin
    if letters == 0:
        return None
    if han / letters >= _MIN_HAN_SHARE and kana_hangul / letters <= _MAX_KANA_HANGUL_SHARE:
        return "zh"
    if latin / letters >= _MIN_LATIN_SHARE:
        words = [w.lower() for w in _WORD.findall(text)]
        function_words = sum(1 for w in words if w in _ENGLISH_FUNCTION_WORDS)
        if words and function_words / len(words) >= _MIN_FUNCTION_WORD_SHARE:
            return "en"
    return None


def document_language(doc: Document) -> str | None:
    """The `lang` annotation when a lang stage ran, else the script guess."""
    annotated = normalize_lang(doc.annotations.get("lang"))
    return annotated if annotated is not None else guess_script_language(doc.text)
