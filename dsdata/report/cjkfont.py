"""Chinese on the report page without a system CJK font: the shipped OFL font's glyphs the page
uses (fonts/NotoSansCJKsc-subset.woff), embedded as a WOFF data URI behind the system fonts;
characters outside it are named in one line on the page.
"""
from __future__ import annotations

import base64
import io
import logging
import os
import unicodedata

log = logging.getLogger("dsdata")

FONT_FILE = os.path.join(os.path.dirname(__file__), "fonts", "NotoSansCJKsc-subset.woff")
FAMILY = "dsdata Noto Sans CJK SC"
# Characters from here up are the ones a system may lack a font for: CJK radicals onwards (U+2E80).
_FIRST_CJK = 0x2E80
_SHOWN_MISSING = 12


def _wide(ch: str) -> bool:
    return ord(ch) >= _FIRST_CJK and unicodedata.east_asian_width(ch) in ("W", "F")


def cjk_characters(page: str) -> set[str]:
    """The wide (CJK) characters of `page`: the ones that need a CJK font to show."""
    return {ch for ch in set(page) if _wide(ch)}


def embedded_font(page: str) -> tuple[str, str]:
    """(CSS @font-face rule, note) for the CJK characters of `page`: the rule embeds the shipped
    font's glyphs for them ("" when the page has none), the note names those it lacks ("" when none)."""
    wanted = cjk_characters(page)
    if not wanted:
        return "", ""
    try:
        from fontTools import subset
        from fontTools.ttLib import TTFont
    except ImportError as exc:
        return "", (f"This page shows {len(wanted)} CJK characters with the fonts of the machine that opens it; "
                    f"to embed them, install fontTools ({exc}).")
    # Tables parsed as the subsetter reaches them (less memory); the metrics tables keep the full font's
    # bounds, which hold its subset's: recomputing them drew every glyph three times (~0.4 CPU-s).
    font = TTFont(FONT_FILE, lazy=True, recalcBBoxes=False)
    cmap = font.getBestCmap()
    present = sorted(ch for ch in wanted if ord(ch) in cmap)
    missing = sorted(wanted - set(present))
    note = ""
    if missing:
        shown = "".join(missing[:_SHOWN_MISSING]) + ("…" if len(missing) > _SHOWN_MISSING else "")
        note = (f"{len(missing)} CJK characters of this page ({shown}) are not in the embedded font "
                "(Noto Sans CJK SC's common CJK blocks): they show only where the opening machine has "
                "a font with them.")
    if not present:
        return "", note
    options = subset.Options()
    options.layout_features = []  # plain glyphs: the page sets no OpenType features
    options.notdef_outline = True
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6, 13, 14]  # keep the copyright and licence records (OFL)
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=[ord(ch) for ch in present])
    subsetter.subset(font)
    font.flavor = "woff"
    data = io.BytesIO()
    font.save(data)
    b64 = base64.b64encode(data.getvalue()).decode("ascii")
    rule = (f"@font-face{{font-family:'{FAMILY}';src:url(data:font/woff;base64,{b64}) format('woff');"
            "font-display:block}")
    return rule, note
