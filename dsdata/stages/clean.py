"""`clean`: HTML → main text (boilerplate removed), then regex/Unicode cleaning of every document.

When a document counts as HTML, and the rejections `html_parse_error` and `empty_after_clean`:
docs/clean.md.
"""
from __future__ import annotations

import re
from functools import cached_property

import pyarrow as pa

from dsdata.clean.html import EXTRACTORS, HtmlParseError, extract_main_text
from dsdata.clean.text import UNICODE_FORMS, TextCleaner
from dsdata.document import Document, Rejected
from dsdata.stages.base import DocumentStage, Param
from dsdata.core.params import Boolean, Choice

HTML_CONTENT_TYPES = frozenset({"text/html", "application/xhtml+xml"})

_HTML_START = re.compile(r"\s*(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html[\s>])", re.I | re.S)
_SNIFF_TAG = re.compile(
    r"</?(?:html|head|body|div|span|p|a|br|li|ul|ol|table|tr|td|th|h[1-6]|script|style|meta|link|img|"
    r"section|article|nav|header|footer|main|pre|code|em|strong|b|i|form|input)(?:\s[^<>]*)?/?>",
    re.I,
)
# Sniffing reads the first SNIFF_CHARS characters; the text is HTML when it holds at least
# SNIFF_MIN_TAGS tags and the tags make up at least SNIFF_MIN_TAG_SHARE of those characters
# (a plain-text post with a stray <br> is not a web page).
SNIFF_CHARS = 8192
SNIFF_MIN_TAGS = 3
SNIFF_MIN_TAG_SHARE = 0.2


def looks_like_html(text: str) -> bool:
    """Whether `text` is an HTML page or fragment rather than plain text with a few tags."""
    head = text[:SNIFF_CHARS]
    if _HTML_START.match(head):
        return True
    tags = _SNIFF_TAG.findall(head) if "<" in head else []
    if len(tags) < SNIFF_MIN_TAGS:
        return False
    tag_chars = sum(len(t) for t in tags)
    visible = len(head) - head.count(" ") - head.count("\n")
    return tag_chars >= SNIFF_MIN_TAG_SHARE * max(visible, 1)


_FLAGS = ("remove_control", "remove_zero_width", "strip_tags", "decode_entities", "symbol_runs",
          "normalize_whitespace", "keep_indent")


class CleanStage(DocumentStage):
    name = "clean"
    description = (
        "HTML → main text with boilerplate (nav, menus, sidebars, TOCs, footers) removed; then control/"
        "zero-width characters, leftover tags and entities, symbol runs and whitespace cleaned, and a "
        "CJK-safe Unicode normal form applied"
    )
    params = {
        "extractor": Param(
            "auto",
            "HTML extractor: auto (= dom, the lexbor boilerplate heuristic), dom, trafilatura, "
            "selectolax-body (all body text, no boilerplate removal)",
            Choice(EXTRACTORS),
        ),
        "html": Param(
            "auto",
            "which documents are HTML: auto (metadata content_type text/html, or the text looks like HTML), "
            "true (all), false (none: only text cleaning)",
            Choice(("auto", True, False), expect="auto, true or false"),
        ),
        "unicode_form": Param(
            "NFC",
            "Unicode normal form: NFC (default; keeps full-width CJK punctuation), NFKC_CJK (NFKC except "
            "full-width punctuation and the ideographic space), NFKC (folds ，！？ into ASCII), NFD, NFKD, none",
            Choice(UNICODE_FORMS),
        ),
        "remove_control": Param(True, "drop C0/C1 control characters (\\t, \\n kept; \\r\\n and \\r become \\n)", Boolean()),
        "remove_zero_width": Param(True, "drop zero-width space, word joiner, BOM, soft hyphen (ZWJ/ZWNJ kept)", Boolean()),
        "strip_tags": Param(True, "drop leftover HTML tags/comments in non-HTML text (real element names only)", Boolean()),
        "decode_entities": Param(True, "decode HTML entities such as &amp; &#8212; &eacute;", Boolean()),
        "symbol_runs": Param(
            True, "empty lines of ASCII rules (==== *****, 4+); remove runs of 3+ of one non-ASCII symbol (▲▲▲ ★★★)",
            Boolean(),
        ),
        "normalize_whitespace": Param(
            True, "collapse space runs inside lines, strip line ends, at most one blank line in a row", Boolean()
        ),
        "keep_indent": Param(True, "keep leading indentation of lines (code blocks); false strips it", Boolean()),
    }
    annotations = {"html_title": pa.string()}

    @cached_property
    def _cleaner(self) -> TextCleaner:
        return TextCleaner(**{name: getattr(self, name) for name in _FLAGS}, unicode_form=self.unicode_form)

    def is_html(self, doc: Document) -> bool:
        if self.html is not True and self.html is not False:
            content_type = str(doc.metadata.get("content_type") or "").split(";")[0].strip().lower()
            return content_type in HTML_CONTENT_TYPES or looks_like_html(doc.text)
        return self.html

    def process(self, doc: Document) -> Document | Rejected:
        text = doc.text
        markup_possible = True
        if self.is_html(doc):
            try:
                page = extract_main_text(text, self.extractor)
            except HtmlParseError as exc:
                return self.reject(doc, "html_parse_error", str(exc))
            except (ValueError, TypeError, UnicodeError) as exc:
                # lexbor refuses strings it cannot encode (lone surrogates); trafilatura raises on
                # pathological trees.
                return self.reject(doc, "html_parse_error", f"{type(exc).__name__}: {exc}")
            text = page.text
            # Parser output: a '<p>' still in the text was '&lt;p&gt;' on the page, i.e. text.
            markup_possible = False
            if page.title:
                doc.annotations["html_title"] = self._cleaner.clean(page.title, markup_possible=False) or None
        text = self._cleaner.clean(text, markup_possible=markup_possible)
        if not text.strip():
            return self.reject(doc, "empty_after_clean", "no text left after HTML extraction and cleaning")
        doc.text = text
        return doc
