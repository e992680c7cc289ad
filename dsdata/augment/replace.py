"""Synonym and entity replacement from a user's dictionary file (TSV or JSON; docs/augment.md).

Each synonym occurrence is replaced with probability `replace_prob`; each distinct entity is
swapped for another of its type, consistently within a document; matching as docs/augment.md says.
"""
from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass

_WORD_CHAR = re.compile(r"[^\W_]", re.UNICODE)
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


class DictionaryError(ValueError):
    """A dictionary file that cannot be read; the message names the file and the problem."""


def _read_entries(path: str, param: str) -> list[tuple[str, list[str]]]:
    """(key, values) pairs from a TSV or JSON dictionary file."""
    if not os.path.isfile(path):
        raise DictionaryError(f"augment.{param}: dictionary file '{path}' not found; pass a TSV or JSON file")
    try:
        with open(path, encoding="utf-8") as fh:
            content = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise DictionaryError(f"augment.{param}: cannot read '{path}' as UTF-8 text ({exc})") from None
    if path.lower().endswith(".json"):
        try:
            raw = json.loads(content)
        except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested past Python's limit
            raise DictionaryError(f"augment.{param}: '{path}' is not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise DictionaryError(f"augment.{param}: '{path}' must hold a JSON object {{\"key\": [\"value\", …]}}")
        entries = []
        for key, values in raw.items():
            values = [values] if isinstance(values, str) else values
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise DictionaryError(f"augment.{param}: '{path}': the value of {key!r} must be a string or a list of strings")
            entries.append((key, values))
        return entries
    entries = []
    for number, line in enumerate(content.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) < 2 or not all(fields):
            raise DictionaryError(
                f"augment.{param}: '{path}' line {number}: expected KEY<TAB>VALUE[<TAB>VALUE…], got {line[:80]!r}"
            )
        entries.append((fields[0], fields[1:]))
    return entries


class _TermMatcher:
    """Longest-first matching of dictionary terms in text (whole words for Latin-script terms)."""

    def __init__(self, terms: list[str]):
        self.terms = {t.casefold() for t in terms if t}
        self.lengths: dict[str, list[int]] = {}
        for term in self.terms:
            self.lengths.setdefault(term[0], []).append(len(term))
        for first in self.lengths:
            self.lengths[first] = sorted(set(self.lengths[first]), reverse=True)

    def find(self, text: str) -> list[tuple[int, int, str]]:
        """Non-overlapping (start, end, folded term) matches, scanning left to right."""
        folded = text.casefold()
        # casefold can change lengths (ß → ss); fall back to lower() which keeps them for matching.
        if len(folded) != len(text):
            folded = text.lower()
        found, i, n = [], 0, len(text)
        while i < n:
            lengths = self.lengths.get(folded[i])
            hit = None
            if lengths and (i == 0 or not self._joins(text, i - 1, i)):
                for length in lengths:
                    end = i + length
                    if end <= n and folded[i:end] in self.terms and (end == n or not self._joins(text, end - 1, end)):
                        hit = (i, end, folded[i:end])
                        break
            if hit:
                found.append(hit)
                i = hit[1]
            else:
                i += 1
        return found

    @staticmethod
    def _joins(text: str, left: int, right: int) -> bool:
        """True when text[left] and text[right] belong to one Latin word (no term boundary there)."""
        a, b = text[left], text[right]
        if _CJK.match(a) or _CJK.match(b):
            return False
        return bool(_WORD_CHAR.match(a) and _WORD_CHAR.match(b))


def _match_case(source: str, replacement: str) -> str:
    if source.isupper() and len(source) > 1:
        return replacement.upper()
    if source[:1].isupper():
        return replacement[:1].upper() + replacement[1:]
    return replacement


@dataclass
class Replacement:
    text: str
    replaced: int


def _replaced(text: str, spans: list[tuple[int, int, str]]) -> Replacement:
    """`text` with each (start, end, replacement) of `spans` (in order, not overlapping) put in, in
    the case of the text it replaces."""
    parts, last = [], 0
    for start, end, replacement in spans:
        parts += [text[last:start], _match_case(text[start:end], replacement)]
        last = end
    parts.append(text[last:])
    return Replacement("".join(parts), len(spans))


class SynonymReplacer:
    def __init__(self, path: str, param: str = "synonyms"):
        self.synonyms: dict[str, list[str]] = {}
        for key, values in _read_entries(path, param):
            options = [v for v in values if v.casefold() != key.casefold()]
            if options:
                self.synonyms.setdefault(key.casefold(), []).extend(options)
        self.matcher = _TermMatcher(list(self.synonyms))

    def apply(self, text: str, rng: random.Random, prob: float) -> Replacement:
        spans = []
        for start, end, term in self.matcher.find(text):
            # Draw for every match, replaced or not, so one decision does not shift the others.
            roll, choice = rng.random(), rng.choice(self.synonyms[term])
            if roll < prob:
                spans.append((start, end, choice))
        return _replaced(text, spans)


class EntityReplacer:
    def __init__(self, path: str, param: str = "entities"):
        self.type_of: dict[str, str] = {}
        self.members: dict[str, list[str]] = {}
        for entity_type, entities in _read_entries(path, param):
            for entity in entities:
                if entity.casefold() not in self.type_of:
                    self.type_of[entity.casefold()] = entity_type
                    self.members.setdefault(entity_type, []).append(entity)
        self.matcher = _TermMatcher(list(self.type_of))

    def apply(self, text: str, rng: random.Random, prob: float) -> Replacement:
        matches = self.matcher.find(text)
        swap: dict[str, str] = {}
        # Decide once per distinct entity, in sorted order so the draw does not depend on position.
        for term in sorted({m[2] for m in matches}):
            others = [e for e in self.members[self.type_of[term]] if e.casefold() != term]
            roll = rng.random()
            if others:
                choice = rng.choice(others)
                if roll < prob:
                    swap[term] = choice
        return _replaced(text, [(start, end, swap[term]) for start, end, term in matches if term in swap])
