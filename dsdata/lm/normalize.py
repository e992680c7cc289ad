"""Text normalisation applied before SentencePiece, identically at training and scoring time, as
CCNet does: NFKC, lower case, accents removed, digits mapped to 0, whitespace collapsed.
"""
from __future__ import annotations

import re
import unicodedata

_DIGITS = re.compile(r"\d")
_SPACES = re.compile(r"\s+")


def normalize_line(line: str) -> str:
    """One line of text as the language models see it."""
    text = unicodedata.normalize("NFKC", line).lower()
    decomposed = unicodedata.normalize("NFD", text)
    if len(decomposed) != len(text):
        text = unicodedata.normalize("NFC", "".join(ch for ch in decomposed if unicodedata.category(ch) != "Mn"))
    text = _DIGITS.sub("0", text)
    return _SPACES.sub(" ", text).strip()
