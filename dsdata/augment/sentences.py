"""Split a document into translatable sentences and put translations back in the same layout:
`Layout(separators, sentences)`, text == separators[0] + sentences[0] + … + separators[-1], the
separators holding what is not translated (whitespace, pieces without letters or digits).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Sentence ends: a Chinese terminator, a Latin one before whitespace ("3.14" stays whole), a line break.
_BOUNDARY = re.compile(
    r"""[。！？]+[」』”’）)\]"']*
      | (?<![.!?])[.!?]+["'”’)\]]*(?=\s)   # from a run's first mark only: O(n) on "....…"
      | \n""",
    re.X,
)
# A "." after one of these is an abbreviation, not a sentence end.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf fig no vol ch sec approx inc ltd co".split()
)
_LONGEST_ABBREVIATION = max(map(len, _ABBREVIATIONS))
# Inside an over-long sentence, cut after a clause mark (Chinese marks need no following space).
_CLAUSE = re.compile(r"[，；：、]|[,;:](?=\s)")
# List and quote markers at a line's start ("* ", "1. ", "> ") stay outside the translation.
_LINE_MARKER = re.compile(r"^(?:[-*•·–—>#]+|\d{1,3}[.)])\s+")
# A piece is worth translating only if it holds a letter or digit (any script).
_WORDY = re.compile(r"[^\W_]")


@dataclass
class Layout:
    separators: list[str]
    sentences: list[str]

    def join(self, sentences: list[str]) -> str:
        """The document with `sentences` (e.g. translations) in place of the originals."""
        if len(sentences) != len(self.sentences):
            raise ValueError(f"layout has {len(self.sentences)} sentences, got {len(sentences)}")
        return self.separators[0] + "".join(s + sep for s, sep in zip(sentences, self.separators[1:]))


def _is_abbreviation(text: str, dot: int) -> bool:
    # both look-backs are bounded: walking to the word's or line's start made "a.a.a.a…" O(n²)
    floor = max(0, dot - _LONGEST_ABBREVIATION - 1)
    start = dot
    while start > floor and (text[start - 1].isalpha() or text[start - 1] == "."):
        start -= 1
    newline = text.rfind("\n", max(0, dot - 5), dot)
    line_start = newline + 1 if newline >= 0 else (0 if dot <= 4 else -1)
    if line_start >= 0 and text[line_start:dot].strip().isdigit():
        return True  # "1. " numbering a list item
    if start == floor and start > 0 and (text[start - 1].isalpha() or text[start - 1] == "."):
        return False  # a longer word than any abbreviation
    word = text[start:dot].lower()
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    spans, start = [], 0
    for match in _BOUNDARY.finditer(text):
        if match.group().startswith(".") and len(match.group()) == 1 and _is_abbreviation(text, match.start()):
            continue
        spans.append((start, match.end()))
        start = match.end()
    if start < len(text):
        spans.append((start, len(text)))
    return spans


def _cut_long(sentence: str, max_chars: int) -> list[tuple[str, str]]:
    """Cut a sentence longer than max_chars into (piece, following separator) pairs."""
    if len(sentence) <= max_chars:
        return [(sentence, "")]
    cuts = [m.end() for m in _CLAUSE.finditer(sentence)]
    pieces: list[tuple[str, str]] = []
    start = 0
    while len(sentence) - start > max_chars:
        limit = start + max_chars
        good = [c for c in cuts if start < c <= limit]
        if good:
            end = good[-1]
        else:
            space = sentence.rfind(" ", start + 1, limit + 1)
            end = space if space > start else limit  # hard cut: a run with no break at all
        piece = sentence[start:end]
        rest = sentence[end:]
        gap = rest[: len(rest) - len(rest.lstrip())]
        pieces.append((piece.rstrip(), piece[len(piece.rstrip()):] + gap))
        start = end + len(gap)
    pieces.append((sentence[start:], ""))
    return pieces


def split_sentences(text: str, max_chars: int = 400) -> Layout:
    """`text` in sentences of at most `max_chars` (cut at clause marks, spaces, then anywhere)."""
    separators = [""]
    sentences: list[str] = []
    for start, end in _sentence_spans(text):
        chunk = text[start:end]
        core = chunk.strip()
        if not core or not _WORDY.search(core):
            separators[-1] += chunk
            continue
        lead = chunk[: len(chunk) - len(chunk.lstrip())]
        trail = chunk[len(chunk.rstrip()) :]
        separators[-1] += lead
        marker = _LINE_MARKER.match(core)
        if marker and _WORDY.search(core[marker.end():]):
            separators[-1] += marker.group()
            core = core[marker.end():]
        for piece, gap in _cut_long(core, max_chars):
            sentences.append(piece)
            separators.append(gap)
        separators[-1] += trail
    return Layout(separators, sentences)
