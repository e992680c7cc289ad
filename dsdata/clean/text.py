"""Regex/Unicode cleaning of plain text: invisible characters, leftover markup, symbol runs,
whitespace, Unicode normal form.  Each step is a flag so a recipe can switch it off.

The default form is NFC, not NFKC, which would fold full-width punctuation and the ideographic space
of Chinese text into ASCII; `NFKC_CJK` spares them (docs/clean.md).
"""
from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass

UNICODE_FORMS = ("NFC", "NFKC", "NFKC_CJK", "NFD", "NFKD", "none")

# C0 and C1 controls except \t and \n (\r is turned into \n first), and DEL.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Invisible characters with no meaning in running text (ZWSP, word joiner, invisible operators, BOM,
# soft hyphen, Mongolian vowel separator, CGJ).  ZWJ/ZWNJ are kept: Persian, Indic and emoji need them.
_ZERO_WIDTH = re.compile("[\u200b\u2060-\u2064\ufeff\u00ad\u180e\u034f]")
_LINE_SEPARATORS = re.compile("\r\n?|[\u2028\u2029\x85]")

# Only real HTML element names count as leftover tags, so that `vector<int>` or `Map<K, V>` in
# code survive.
_HTML_TAG_NAMES = (
    "a|abbr|address|article|aside|b|big|blockquote|body|br|button|caption|center|cite|code|col|colgroup|dd|"
    "del|details|div|dl|dt|em|embed|figcaption|figure|font|footer|form|h[1-6]|head|header|hr|html|i|iframe|"
    "img|input|ins|kbd|label|li|link|main|mark|meta|nav|noscript|ol|option|p|pre|q|s|samp|script|section|"
    "select|small|source|span|strike|strong|style|sub|summary|sup|table|tbody|td|textarea|tfoot|th|thead|"
    "title|tr|tt|u|ul|var|wbr"
)
# Spaces before a match, taken only from where a run of them starts: a leading "[ \t]*" is tried at
# every space of a run and rescans the rest of it each time, O(n²) on a long run of spaces or tabs.
_LEADING_BLANKS = r"(?:(?<![ \t])[ \t]+)?"
_SCRIPT_STYLE = re.compile(r"<(script|style)\b[^<>]*>.*?</\1\s*>", re.I | re.S)
_SCRIPT_STYLE_END = re.compile(r"</(?:script|style)\s*>", re.I)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_TAG = re.compile(rf"({_LEADING_BLANKS})<(/?)({_HTML_TAG_NAMES})(\s[^<>]*)?/?>([ \t]*)", re.I)
# A bare opening tag (no attributes) of these names is markup; of other names it is as likely a
# placeholder in prose ("man<section> directories", "<title> of the page") and stays.
_BARE_MARKUP_TAGS = frozenset(
    "a b big blockquote br center code dd div dl dt em font h1 h2 h3 h4 h5 h6 hr i img li ol p pre s "
    "small span strike strong sub sup table tbody td th thead tr tt u ul".split()
)
# Tags that end a line of text; every other tag is inline and vanishes without a space
# ("foo<b>bar</b>" is one word).
_LINE_BREAKING_TAGS = frozenset(
    "address article aside blockquote body br caption center dd details div dl dt figcaption figure footer "
    "form h1 h2 h3 h4 h5 h6 head header hr html li main nav ol p pre section summary table tbody td tfoot th "
    "thead title tr ul".split()
)
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")


# Non-ASCII symbols that form decorative runs: arrows, math and technical symbols, box drawing, shapes
# (▲ ■), dingbats (★ ✔) and emoji.  Not punctuation: '……' and '——' are normal Chinese punctuation.
_DECORATIVE = "[\u2190-\u23ff\u2500-\u27bf\u2900-\u2bff\U0001f000-\U0001faff]"
_DECORATIVE_CHAR = re.compile(_DECORATIVE)


# ASCII rules and dividers: only a line made of nothing but =*#~_-+^|\/ runs (4+), so code such
# as "-----BEGIN PGP SIGNATURE-----", print('====') or "x === y" is untouched.
# Written so that a run splits into groups one way only (runs are separated by spaces): a pattern
# such as "(?:[=-]{4,}[ \t]*)+$" tries 2^(N/4) splits of a run of N symbols not at a line's end.
_RULE_LINE = r"[ \t]*[=*#~_\-+^|\\/]{4,}(?:[ \t]+[=*#~_\-+^|\\/]{4,})*[ \t]*"
_ASCII_RULE_LINE = re.compile(f"^{_RULE_LINE}$", re.M)
# The same lines found from their "\n" (a literal the regex engine skips to; "^" under re.M is tried
# at every character), and the first line by itself.
_RULE_LINE_BODY = _RULE_LINE + r"(?=\n|\Z)"
_RULE_LINE_AFTER_NEWLINE = re.compile("\n" + _RULE_LINE_BODY)
_RULE_LINE_FIRST = re.compile(_RULE_LINE_BODY)
# Non-ASCII decorative symbols: a run of 3+ of the same one anywhere (▲▲▲, ★★★★★).
_SYMBOL_RUN = re.compile(rf"{_LEADING_BLANKS}({_DECORATIVE})\1{{2,}}[ \t]*")


_HSPACE = "[ \t\f\v\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]"
# A run inside a line (indentation is left alone by the callback); only runs that change (two or more
# characters, or one that is not a plain space): a callback per space between words costs too much.
_INNER_SPACE_RUN = re.compile(
    f"(?: (?={_HSPACE})|[\t\f\v\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]){_HSPACE}*"
)
# The characters of _HSPACE.
_HSPACE_CHARS = " \t\f\v\u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u202f\u205f\u3000"
_SPACE_OR_LINE_START = frozenset("\n" + _HSPACE_CHARS)
_LEADING_SPACE = re.compile(f"^{_HSPACE}+", re.M)
# Runs of 2+ plain spaces: the only runs the whitespace step changes in a text whose horizontal
# space is all plain spaces (a literal prefix the regex engine skips to).
_PLAIN_SPACE_RUN = re.compile("  +")
_BLANK_LINES = re.compile("\n\n\n+")  # \n{3,}, written with a literal prefix the engine skips to

# Of the characters the control, zero-width and whitespace steps act on, the ones str.isprintable()
# calls printable besides the space (the others are Cc, Cf, Zs, Zl or Zp: not printable).
# tests/test_clean_text.py derives this from the patterns over every code point.
_PRINTABLE_BUT_CLEANED = "\u034f"

# Full-width punctuation (U+FF01–FF0F, FF1A–FF20, FF3B–FF40, FF5B–FF60) and the ideographic space:
# what NFKC would turn into ASCII in Chinese and Japanese text.
_CJK_PROTECTED = "\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff60\u3000"
_NOT_CJK_PROTECTED = re.compile(f"[^{_CJK_PROTECTED}]+")


def _tag_replacement(match: re.Match[str]) -> str:
    before, closing, name, attributes, after = match.groups()
    name = name.lower()
    if not closing and not attributes and name not in _BARE_MARKUP_TAGS:
        return match.group(0)
    if name in _LINE_BREAKING_TAGS:
        return "\n"  # with the spaces around it: they would indent the next line
    return before + after


def _sub_before(pattern: re.Pattern[str], last_end: int, text: str) -> str:
    """pattern.sub("", ·) where every match ends with a closing mark and the text's last one ends at
    `last_end` (≤ 0: none).  Same result, but an opening whose closing never comes is not scanned to
    the text's end once per opening (O(n²) on a text of many "<!--" and no "-->")."""
    if last_end <= 0:
        return text
    return pattern.sub("", text[:last_end]) + text[last_end:]


def _symbol_run_replacement(match: re.Match[str]) -> str:
    # Inside a line the run (with the spaces around it) was a separator: one space is left; at
    # the start or end of a line nothing is (a "==== Title ====" line becomes "Title").
    text, start, end = match.string, match.start(), match.end()
    at_line_start = start == 0 or text[start - 1] == "\n"
    at_line_end = end == len(text) or text[end] == "\n"
    return "" if at_line_start or at_line_end else " "


def _space_run_replacement(match: re.Match[str]) -> str:
    run = match.group(0)
    start = match.start()
    if start == 0 or match.string[start - 1] in _SPACE_OR_LINE_START:
        return run  # indentation (or the end of a run already looked at): not an inner run
    if "\t" in run:
        return "\t"  # a tab separates table cells; keep one
    if run.strip("\u3000") == "":
        return "\u3000"  # CJK typography: keep one ideographic space
    return " "


def _plain(text: str) -> bool:
    """True when `text` holds none of the characters the control, zero-width and whitespace steps
    act on other than the space, "\\n" and "\\t": those steps then skip their patterns (one C pass
    instead of a regex scan per step; most extracted text has no such character)."""
    return text.replace("\n", "").replace("\t", "").isprintable() and _PRINTABLE_BUT_CLEANED not in text


def _remove_rule_lines(text: str) -> str:
    """_ASCII_RULE_LINE.sub("", text), from each line's "\\n" rather than tried at every character."""
    first = _RULE_LINE_FIRST.match(text)
    if first:
        text = text[first.end():]
    return _RULE_LINE_AFTER_NEWLINE.sub("\n", text)


# False: every step runs its plain pattern (the reference the fast paths are tested against).
FAST_PATHS = True


def normalize_unicode(text: str, form: str) -> str:
    """Apply a Unicode normal form; NFKC_CJK is NFKC that leaves full-width punctuation alone."""
    if form == "none":
        return text
    if form == "NFKC_CJK":
        if unicodedata.is_normalized("NFKC", text):
            return text
        return _NOT_CJK_PROTECTED.sub(lambda m: unicodedata.normalize("NFKC", m.group(0)), text)
    if unicodedata.is_normalized(form, text):
        return text
    return unicodedata.normalize(form, text)


@dataclass(frozen=True)
class TextCleaner:
    """Configured text cleaning; `clean(text, markup_possible)` runs the enabled steps in order.

    What each flag removes or keeps: the table in docs/clean.md.
    """

    remove_control: bool = True
    remove_zero_width: bool = True
    strip_tags: bool = True
    decode_entities: bool = True
    symbol_runs: bool = True
    normalize_whitespace: bool = True
    keep_indent: bool = True
    unicode_form: str = "NFC"

    def clean(self, text: str, markup_possible: bool = True) -> str:
        """Clean `text`.  `markup_possible=False` for text an HTML parser produced: any '<p>' left
        in it was written as '&lt;p&gt;' on the page (an HTML tutorial), so it is kept."""
        fast = FAST_PATHS
        # plain: no control, zero-width or non-space horizontal-space character (None: not known)
        plain = _plain(text) if fast else False
        if self.remove_control and not plain:
            if "\r" in text or "\u2028" in text or "\u2029" in text or "\x85" in text:
                text = _LINE_SEPARATORS.sub("\n", text)
            text = _CONTROL.sub("", text)
        if self.remove_zero_width and not plain:
            text = _ZERO_WIDTH.sub("", text)
        if self.strip_tags and markup_possible and "<" in text:  # removes text or adds "\n": plain holds
            last_end = max((m.end() for m in _SCRIPT_STYLE_END.finditer(text)), default=0)
            text = _sub_before(_SCRIPT_STYLE, last_end, text)
            text = _sub_before(_COMMENT, text.rfind("-->") + 3, text)
            text = _TAG.sub(_tag_replacement, text)
        if self.decode_entities and "&" in text:
            decoded = _ENTITY.sub(lambda m: html.unescape(m.group(0)), text)
            if self.remove_control:  # &#0; &#x7f; decode to controls
                decoded = _CONTROL.sub("", decoded)
            if decoded != text:  # &nbsp; &#8203; …
                text, plain = decoded, None
        normalized = normalize_unicode(text, self.unicode_form)
        if normalized is not text:
            text, plain = normalized, None
        if self.symbol_runs:
            text = _remove_rule_lines(text) if fast else _ASCII_RULE_LINE.sub("", text)
            if _DECORATIVE_CHAR.search(text):  # most texts have none: skip the slower pattern
                text = _SYMBOL_RUN.sub(_symbol_run_replacement, text)  # removes text or adds " "
        if self.normalize_whitespace:
            # Per line in C (str.rstrip): a pattern would be tried at every space between words.
            text = "\n".join([line.rstrip(_HSPACE_CHARS) for line in text.split("\n")])
            if not self.keep_indent:
                text = _LEADING_SPACE.sub("", text)
            if plain is None and fast:
                plain = _plain(text)
            if plain and "\t" not in text:
                if "  " in text:
                    text = _PLAIN_SPACE_RUN.sub(_space_run_replacement, text)
            else:
                text = _INNER_SPACE_RUN.sub(_space_run_replacement, text)
            if "\n\n\n" in text:
                text = _BLANK_LINES.sub("\n\n", text)
            text = text.strip("\n")
            if not self.keep_indent:
                text = text.strip()
        return text
