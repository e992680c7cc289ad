"""Heuristic quality rules: Gopher quality + repetition, C4 line/page rules, FineWeb line rules.

Every threshold is a parameter (null switches that rule off) and every rejection names its rule
(`gopher_min_words`, `c4_min_sentences`, …).  CJK-aware: words, sentence ends, stop words and
n-grams on CJK text as docs/filters.md describes.
"""
from __future__ import annotations

import re
from collections import Counter
from types import SimpleNamespace

import pyarrow as pa

from dsdata.compiled import import_compiled
from dsdata.document import Document, Rejected
from dsdata.stages.base import DocumentStage, Param
from dsdata.core.params import Boolean, Integer, MappingOf, Number

CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_WORD_RE = re.compile(f"[{CJK_CHARS}]|[^\\s{CJK_CHARS}]+")
_NON_LETTER_RUNS_RE = re.compile(r"[\W\d_]+")
_CJK_LETTER_RE = re.compile(f"(?=[{CJK_CHARS}])[^\\W\\d_]")
# The words of `words` with a character that passes a test, by one scan of the text (the lookbehind
# anchors a run at its start): NON_SYMBOL, a letter or digit; LETTERED, a letter.
_RUN = f"(?<![^\\s{CJK_CHARS}])[^\\s{CJK_CHARS}]*(?={{0}})[^\\s{CJK_CHARS}][^\\s{CJK_CHARS}]*"
_CJK_NON_SYMBOL_RE = re.compile(f"(?=[^\\W_])[{CJK_CHARS}]")
_NON_SYMBOL_WORD_RE = re.compile(_CJK_NON_SYMBOL_RE.pattern + "|" + _RUN.format(r"[^\W_]"))
_LETTERED_WORD_RE = re.compile(f"(?=[^\\W\\d_])[{CJK_CHARS}]|" + _RUN.format(r"[^\W\d_]"))
_LONG_WORDS: dict[int, re.Pattern] = {}


def _long_word(limit: int) -> re.Pattern:
    """Matches where `words` has a word longer than limit ≥ 1 (CJK words are one character long).
    Tried from a run's first character only: from every character, text of runs just under the
    limit cost O(length × limit)."""
    if limit not in _LONG_WORDS:
        _LONG_WORDS[limit] = re.compile(f"(?<![^\\s{CJK_CHARS}])[^\\s{CJK_CHARS}]{{{limit + 1}}}")
    return _LONG_WORDS[limit]
TERMINAL_PUNCT = (".", "!", "?", '"', "'", "”", "’", "。", "！", "？", "」", "』", "…", "．", "：", ":", ";", "；")
# A run of terminators is tried from its first one only (the lookbehind): from each, O(n²).
_ENDS, _CLOSERS = "[.!?。！？]", "[\"'”’」』）)]"
_SENTENCE_END = re.compile(f"(?<!{_ENDS}){_ENDS}+(?=\\s|$|{_CLOSERS})|[。！？]")
_BULLET = ("•", "●", "○", "■", "□", "▪", "▫", "*", "-", "–", "‣", "⁃", "◦")
_ELLIPSIS = ("...", "…", "。。。")

EN_STOP_WORDS = frozenset(["the", "be", "to", "of", "and", "that", "have", "with"])
ZH_STOP_WORDS = frozenset("的了是在和有不这也就都而及与着或个为以中上之对")
_STOP_STRIP = ".,;:!?\"'()"  # stripped from an English word before the stop-word test
C4_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


def words(text: str) -> list[str]:
    """CJK-aware word split: each CJK character is a word; otherwise whitespace-separated runs."""
    return _WORD_RE.findall(text)


def cjk_ratio(text: str) -> float:
    """Share of CJK characters among letters."""
    # Letters are what the runs of non-letters leave: a few runs per line instead of a list item per letter.
    n_letters = len(text) - sum(map(len, _NON_LETTER_RUNS_RE.findall(text)))
    if not n_letters:
        return 0.0
    return len(_CJK_LETTER_RE.findall(text)) / n_letters


def _dup_counts(items: list[str]) -> tuple[int, int, int]:
    """(items that repeat an earlier one, their characters, all characters)."""
    seen: set[str] = set()
    dup_items = dup_chars = 0
    for item in items:
        if item in seen:
            dup_items += 1
            dup_chars += len(item)
        seen.add(item)
    return dup_items, dup_chars, sum(map(len, items))


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _first_failed(checks) -> tuple[str | None, str]:
    """(rule, detail) of the first check whose value is out of its bounds, else (None, "").  A check:
    (rule, value or None where the rule does not apply, lower bound, upper bound, the value's format)."""
    for reason, value, low, high, shown in checks:
        if value is None:
            continue
        if low is not None and value < low:
            return reason, f"{shown.format(value)} < {low}"
        if high is not None and value > high:
            return reason, f"{shown.format(value)} > {high}"
    return None, ""


def _top_ngram_char_frac(tokens: list[str], n: int) -> float:
    """Characters covered by the most frequent n-gram, as a share of all word characters."""
    if len(tokens) < n:
        return 0.0
    grams = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    gram, count = grams.most_common(1)[0]
    total = sum(len(t) for t in tokens)
    return count * sum(len(t) for t in gram) / total if total else 0.0


def _dup_ngram_char_frac(tokens: list[str], n: int) -> float:
    """Characters in repeated occurrences of n-grams (the first occurrence is not counted; a
    repeat is skipped over as a whole, as in datatrove's Gopher implementation)."""
    if len(tokens) < n:
        return 0.0
    seen: set[tuple[str, ...]] = set()
    dup_chars = 0
    i = 0
    while i <= len(tokens) - n:
        gram = tuple(tokens[i : i + n])
        if gram in seen:
            dup_chars += sum(len(t) for t in gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    total = sum(len(t) for t in tokens)
    return dup_chars / total if total else 0.0


def _measure_python(text: str, cjk: bool, short_limit: int, top_ns: list[int], dup_ns: list[int]):
    """The reference of rules_kernels.measure, by regexes (numba missing or DSDATA_NO_NUMBA=1); the
    n-gram fractions lazily, so a rejection at a small n skips the larger ones."""
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    non_symbol = _NON_SYMBOL_WORD_RE.findall(text)
    tokens = non_symbol if cjk else [w.lower() for w in non_symbol]
    distinct = Counter(tokens).items()  # each distinct word tested once
    counts = dict(zip(("line_dup", "line_dup_chars", "line_chars", "para_dup", "para_dup_chars", "para_chars"),
                      _dup_counts(lines) + _dup_counts(paragraphs)))
    counts.update(
        sentences=len(_SENTENCE_END.findall(text)), words=len(_WORD_RE.findall(text)),
        lettered=len(_LETTERED_WORD_RE.findall(text)), nonsym=len(non_symbol), nonsym_chars=sum(map(len, non_symbol)),
        cjk_nonsym=len(_CJK_NON_SYMBOL_RE.findall(text)),
        symbols=text.count("#") + sum(text.count(e) for e in _ELLIPSIS), newlines=text.count("\n"),
        lines=len(lines), bullet_lines=sum(ln.startswith(_BULLET) for ln in lines),
        ellipsis_lines=sum(ln.endswith(_ELLIPSIS) for ln in lines),
        punct_lines=sum(ln.endswith(TERMINAL_PUNCT) for ln in lines),
        short_lines=sum(len(ln) < short_limit for ln in lines), paragraphs=len(paragraphs),
        stop_words=sum(n for w, n in distinct if w in ZH_STOP_WORDS) if cjk else
        sum(n for w, n in distinct if w.strip(_STOP_STRIP) in EN_STOP_WORDS),
    )
    return (counts, (_top_ngram_char_frac(tokens, n) for n in top_ns),
            (_dup_ngram_char_frac(tokens, n) for n in dup_ns))


_kernels = None  # (rules_kernels, its character table) once imported; False without numba or with DSDATA_NO_NUMBA=1


def _compiled():
    """(dsdata.stages.rules_kernels, the class of every code point), or None without numba or with
    DSDATA_NO_NUMBA=1.  Imported on first use: numba costs start-up a run without rules never pays."""
    global _kernels
    if _kernels is None:
        module = import_compiled("dsdata.stages.rules_kernels")
        _kernels = module and (module, module.class_table(
            space=r"\s", cjk=f"[{CJK_CHARS}]", alnum=r"[^\W_]", letter=r"[^\W\d_]", sentence_end=_ENDS,
            closer=_CLOSERS, bullet=f"[{re.escape(''.join(_BULLET))}]",
            terminal=f"[{re.escape(''.join(TERMINAL_PUNCT))}]", strip=f"[{re.escape(_STOP_STRIP)}]"))
    return _kernels or None


# A threshold set to null switches its rule off.
_COUNT = Integer(min=0)
_NONNEG = Number(0)
_SHARE = Number(0, 1)
_FLAG = Boolean()


class _NgramLimits(MappingOf):
    """n → most characters; null (like {}) checks no n-grams."""

    def __init__(self):
        super().__init__(Integer(min=1), Number(0, 1), expect="a mapping n: ratio, e.g. {2: 0.2}, or null")

    def check(self, value):
        return {} if value is None else super().check(value)


_NGRAMS = _NgramLimits()


class QualityRulesStage(DocumentStage):
    name = "rules"
    description = "Gopher quality/repetition, C4 and FineWeb heuristic rules, CJK-aware; each rejection names its rule."
    params = {
        # Gopher quality (Rae et al. 2021, as in datatrove's GopherQualityFilter)
        "min_words": Param(50, "gopher: fewest words (a CJK character counts as one word)", _COUNT, nullable=True),
        "max_words": Param(100_000, "gopher: most words", _COUNT, nullable=True),
        "min_mean_word_length": Param(3.0, "gopher: shortest mean length of Latin words (CJK words are not measured)", _NONNEG, nullable=True),
        "max_mean_word_length": Param(10.0, "gopher: longest mean length of Latin words", _NONNEG, nullable=True),
        "max_symbol_word_ratio": Param(0.1, "gopher: most '#' and ellipsis symbols per word", _NONNEG, nullable=True),
        "max_bullet_lines_ratio": Param(0.9, "gopher: most lines starting with a bullet", _SHARE, nullable=True),
        "max_ellipsis_lines_ratio": Param(0.3, "gopher: most lines ending with an ellipsis", _SHARE, nullable=True),
        "min_alpha_words_ratio": Param(0.8, "gopher: fewest words containing a letter", _SHARE, nullable=True),
        "min_stop_words": Param(2, "gopher: fewest stop words (English list, or a Chinese list for CJK text)", _COUNT, nullable=True),
        # Gopher repetition
        "max_dup_line_ratio": Param(0.3, "gopher: most lines that repeat an earlier line", _SHARE, nullable=True),
        "max_dup_paragraph_ratio": Param(0.3, "gopher: most paragraphs that repeat an earlier one", _SHARE, nullable=True),
        "max_dup_line_char_ratio": Param(0.2, "gopher: most characters in repeated lines", _SHARE, nullable=True),
        "max_dup_paragraph_char_ratio": Param(0.2, "gopher: most characters in repeated paragraphs", _SHARE, nullable=True),
        "top_ngram_max_ratio": Param({2: 0.2, 3: 0.18, 4: 0.16}, "gopher: n → most characters covered by the top n-gram", _NGRAMS),
        "dup_ngram_max_ratio": Param(
            {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10},
            "gopher: n → most characters inside repeated n-grams (CJK text: character 2n-grams)",
            _NGRAMS,
        ),
        # C4 (Raffel et al. 2020): line filters + page filters
        "c4_min_sentences": Param(3, "c4: fewest sentences per page (sentence ends include 。！？)", _COUNT, nullable=True),
        "c4_remove_policy_lines": Param(True, "c4: drop lines about cookies / terms of use / privacy policy", _FLAG, nullable=True),
        "c4_remove_javascript_lines": Param(True, "c4: drop lines mentioning javascript", _FLAG, nullable=True),
        "c4_lorem_ipsum": Param(True, "c4: reject pages containing 'lorem ipsum'", _FLAG, nullable=True),
        "c4_curly_bracket": Param(False, "c4: reject pages containing '{' (off: code in technical docs is wanted)", _FLAG, nullable=True),
        "c4_drop_unterminated_lines": Param(False, "c4: drop lines not ending in terminal punctuation (off, as in FineWeb)", _FLAG, nullable=True),
        "c4_max_word_length": Param(1000, "c4: drop lines with a word longer than this", _COUNT, nullable=True),
        # FineWeb (Penedo et al. 2024)
        "fineweb_min_line_punct_ratio": Param(0.12, "fineweb: fewest lines ending in terminal punctuation", _SHARE, nullable=True),
        "fineweb_max_short_line_ratio": Param(0.67, "fineweb: most short lines", _SHARE, nullable=True),
        "fineweb_short_line_chars": Param(30, "fineweb: a Latin line shorter than this is short", Integer(min=1)),
        "fineweb_short_line_chars_cjk": Param(12, "fineweb: a CJK line shorter than this is short", Integer(min=1)),
        "fineweb_max_char_dup_ratio": Param(0.1, "fineweb: most characters in duplicated lines", _SHARE, nullable=True),
        "fineweb_max_newline_ratio": Param(0.3, "fineweb: most newlines per word", _NONNEG, nullable=True),
        "cjk_threshold": Param(0.3, "documents whose letters are at least this share CJK take the CJK path", _SHARE),
    }
    annotations = {"rules_cjk": pa.bool_()}

    # Each check returns a reason code or None. They run in a fixed order; the first failing rule names the rejection.
    def process(self, doc: Document) -> Document | Rejected:
        text = doc.text
        compiled = _compiled()
        if compiled:  # letters, CJK letters and the longest word in one compiled pass
            letters, cjk_letters, longest = compiled[0].prescan(compiled[0].code_points(text), compiled[1])
            ratio = cjk_letters / letters if letters else 0.0
        else:
            ratio, longest = cjk_ratio(text), None
        cjk = ratio >= self.cjk_threshold
        doc.annotations["rules_cjk"] = cjk
        lower = text.lower()
        text, reason = self._c4(text, lower, longest)
        if reason:
            return self.reject(doc, reason, "")
        m = self._measure(text, lower if text is doc.text else text.lower(), cjk, compiled)
        for check in (self._sentences_and_words, self._gopher_repetition, self._fineweb):
            reason, detail = check(m)
            if reason:
                return self.reject(doc, reason, detail)
        doc.text = text
        return doc

    def _measure(self, text: str, lower: str, cjk: bool, compiled) -> SimpleNamespace:
        """Everything the checks after C4's line filters read: rules_kernels.measure's counts (COUNTS)
        and n-gram fractions, of the lower-cased words: the lower-cased text's words, except around a Σ
        (final sigma looks at its neighbours), so such a text passes its words lower-cased one by one."""
        scale = 2 if cjk else 1
        top_ns = tuple(n * scale for n in sorted(self.top_ngram_max_ratio))
        dup_ns = tuple(n * scale for n in sorted(self.dup_ngram_max_ratio))
        short = self.fineweb_short_line_chars_cjk if cjk else self.fineweb_short_line_chars
        if compiled:
            low = None if cjk else lower if "Σ" not in text else \
                " ".join(w.lower() for w in _NON_SYMBOL_WORD_RE.findall(text))
            counts, top, dup = compiled[0].measure(text, low, compiled[1], short,
                                                   ZH_STOP_WORDS if cjk else EN_STOP_WORDS, not cjk, top_ns, dup_ns)
        else:
            counts, top, dup = _measure_python(text, cjk, short, top_ns, dup_ns)
        return SimpleNamespace(cjk=cjk, top=top, dup=dup, **counts)

    def _c4(self, text: str, lower: str, longest: int | None) -> tuple[str, str | None]:
        """The text less C4's dropped lines, or a rejection.  longest: the longest word when known."""
        if self.c4_lorem_ipsum and "lorem ipsum" in lower:
            return text, "c4_lorem_ipsum"
        if self.c4_curly_bracket and "{" in text:
            return text, "c4_curly_bracket"
        # Each line rule first asks the whole text: a line filter that matches nowhere is skipped, and
        # when none matches the text is kept as it is without a pass per line.  (The phrases are
        # ASCII without a newline, so one is in a line's lower() exactly when it is in the text's.)
        javascript = self.c4_remove_javascript_lines and "javascript" in lower
        policy = self.c4_remove_policy_lines and any(p in lower for p in C4_POLICY)
        limit = self.c4_max_word_length
        long_word = _long_word(limit) if limit else None
        if long_word is not None and not (long_word.search(text) if longest is None else longest > limit):
            long_word = None
        if javascript or policy or long_word is not None or self.c4_drop_unterminated_lines:
            kept_lines = []
            for line in text.split("\n"):
                low = line.lower() if javascript or policy else ""
                if javascript and "javascript" in low:
                    continue
                if policy and any(p in low for p in C4_POLICY):
                    continue
                if long_word is not None and long_word.search(line):
                    continue
                if self.c4_drop_unterminated_lines and line.strip() and not line.rstrip().endswith(TERMINAL_PUNCT):
                    continue
                kept_lines.append(line)
            text = "\n".join(kept_lines)
        if not text.strip():
            return text, "c4_empty_after_line_filters"
        return text, None

    def _sentences_and_words(self, m: SimpleNamespace) -> tuple[str | None, str]:
        """C4's sentence count, then Gopher's quality rules."""
        n = m.nonsym
        # The mean-length rule is about Latin words; a CJK document's few Latin words (commands,
        # names) say nothing about its quality.
        # Latin words are the non-symbol words less the CJK ones (one character each).
        n_cjk = 0 if m.cjk else m.cjk_nonsym
        n_latin = 0 if m.cjk else n - n_cjk
        return _first_failed((
            ("c4_min_sentences", m.sentences, self.c4_min_sentences or None, None, "{} sentences"),
            ("gopher_min_words", n, self.min_words, None, "{} words"),
            ("gopher_max_words", n, None, self.max_words, "{} words"),
            ("gopher_mean_word_length", (m.nonsym_chars - n_cjk) / n_latin if n_latin else None,
             self.min_mean_word_length, self.max_mean_word_length, "mean {:.2f}"),
            ("gopher_symbol_ratio", m.symbols / max(n, 1) if m.words else None, None, self.max_symbol_word_ratio, "{:.3f}"),
            ("gopher_bullet_lines", m.bullet_lines / m.lines if m.lines else None, None, self.max_bullet_lines_ratio, "{:.3f}"),
            ("gopher_ellipsis_lines", m.ellipsis_lines / m.lines if m.lines else None, None, self.max_ellipsis_lines_ratio, "{:.3f}"),
            ("gopher_alpha_words", m.lettered / m.words if m.words else None, self.min_alpha_words_ratio, None, "{:.3f}"),
            ("gopher_stop_words", m.stop_words, self.min_stop_words or None, None, "{} stop words"),
        ))

    def _gopher_repetition(self, m: SimpleNamespace) -> tuple[str | None, str]:
        return _first_failed((
            ("gopher_dup_paragraphs", _share(m.para_dup, m.paragraphs), None, self.max_dup_paragraph_ratio, "{:.3f}"),
            ("gopher_dup_paragraph_chars", _share(m.para_dup_chars, m.para_chars), None,
             self.max_dup_paragraph_char_ratio, "{:.3f}"),
            ("gopher_dup_lines", _share(m.line_dup, m.lines), None, self.max_dup_line_ratio, "{:.3f}"),
            ("gopher_dup_line_chars", _share(m.line_dup_chars, m.line_chars), None, self.max_dup_line_char_ratio, "{:.3f}"),
            *((f"gopher_top_{n}gram", value, None, limit, "{:.3f}")
              for (n, limit), value in zip(sorted(self.top_ngram_max_ratio.items()), m.top)),
            *((f"gopher_dup_{n}gram", value, None, limit, "{:.3f}")
              for (n, limit), value in zip(sorted(self.dup_ngram_max_ratio.items()), m.dup)),
        ))

    def _fineweb(self, m: SimpleNamespace) -> tuple[str | None, str]:
        if not m.lines:
            return None, ""
        return _first_failed((
            ("fineweb_line_punct", m.punct_lines / m.lines, self.fineweb_min_line_punct_ratio, None, "{:.3f}"),
            ("fineweb_short_lines", m.short_lines / m.lines, None, self.fineweb_max_short_line_ratio, "{:.3f}"),
            ("fineweb_char_dup", _share(m.line_dup_chars, m.line_chars), None, self.fineweb_max_char_dup_ratio, "{:.3f}"),
            ("fineweb_newline_ratio", m.newlines / max(m.nonsym, 1), None, self.fineweb_max_newline_ratio, "{:.3f}"),
        ))
