"""HTML → main text: a lexbor (selectolax) DOM heuristic that drops boilerplate, plus two baselines.

The `dom` extractor (the default behind `auto`) drops elements that never carry text, picks the
content root, drops furniture and link lists, and serialises blocks, cells and `<pre>` on one parse
(docs/clean.md has the rules).  The rules name HTML semantics and common class-name words, never one site.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import filterfalse

from selectolax.lexbor import LexborHTMLParser, LexborNode

from dsdata.compiled import import_compiled

# Elements whose content is never main text (void elements without text, such as <input> or
# <source>, need no removal).
_NON_CONTENT_TAGS = (
    "script", "style", "noscript", "template", "svg", "canvas", "iframe", "object",
    "embed", "button", "select", "textarea", "datalist", "dialog", "map", "audio", "video",
)
_HIDDEN_SELECTOR = '[hidden], [aria-hidden="true"], [style*="display:none"], [style*="display: none"]'
_INVISIBLE_SELECTOR = ", ".join(_NON_CONTENT_TAGS) + ", " + _HIDDEN_SELECTOR

# ARIA landmark roles of page furniture.
_BOILERPLATE_ROLES = frozenset(
    {"navigation", "banner", "contentinfo", "complementary", "search", "menu", "menubar", "toolbar", "tablist"}
)

# Words in a class or id (split on whitespace, '-' and '_') that name page furniture.  Exact words
# only: 'menu' matches "main-menu" but not Sphinx's inline "menuselection".  Words that also name
# content ("search", "copyright", "index") are left out: an API entry may be called `copyright`.
_BOILERPLATE_WORDS = frozenset(
    {
        "nav", "navbar", "navigation", "navheader", "navfooter", "navmenu", "navlinks", "subnav", "topnav",
        "sidenav", "docnav", "menu", "menubar", "sidebar", "sphinxsidebar", "sidebarwrapper", "footer",
        "breadcrumb", "breadcrumbs", "toc", "toctree", "related", "relbar", "rellinks", "skiplink",
        "share", "sharing", "social", "cookie", "cookies", "consent", "banner", "advert", "advertisement",
        "ads", "sponsor", "pagination", "pager", "genindex", "modindex", "searchbox", "masthead",
        "printfooter", "catlinks", "jumpto", "backtotop", "newsletter", "subscribe", "comments", "disqus",
    }
)
# Only containers are furniture; a <dt id="copyright"> or <p class="sidebar-title"> is content or
# part of a container that is judged as a whole.
_CONTAINER_TAGS = frozenset(
    {
        "div", "section", "nav", "aside", "header", "footer", "ul", "ol", "dl", "menu", "table", "tbody",
        "td", "th", "center", "form", "fieldset", "details", "iframe", "frame", "frameset",
    }
)
_WORD_SPLIT = re.compile(r"[\s_\-]+")
_NON_WORD_RUN = re.compile(r"[\W_]+")

# Block-level elements: each starts and ends a line in the output.
_BLOCK_TAGS = frozenset(
    {
        "address", "article", "aside", "blockquote", "body", "caption", "center", "dd", "details", "dialog",
        "dir", "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "h1", "h2", "h3", "h4", "h5",
        "h6", "header", "hgroup", "hr", "html", "legend", "li", "listing", "main", "menu", "nav", "ol", "p",
        "plaintext", "pre", "section", "summary", "table", "tbody", "tfoot", "thead", "tr", "ul", "xmp",
    }
)
_CELL_TAGS = frozenset({"td", "th"})
_SPACE_RUN = re.compile(r"[ \t\n\r\f\v\u00a0]+")

# A main region is trusted when it holds at least this share of the page's visible text.
MAIN_MIN_SHARE = 0.25
# A list is navigation (inside <main> too: blog archives, link farms) when it has at least
# LINK_LIST_MIN_ITEMS items and LINK_LIST_MIN_SHARE of them are links (LINK_ITEM_MIN_SHARE of
# their text).  A list of links *with descriptions* (<dt>link</dt><dd>what it is</dd>) stays.
LINK_LIST_MIN_ITEMS = 4
LINK_LIST_MIN_SHARE = 0.9
LINK_ITEM_MIN_SHARE = 0.9
# ... and at most this share of its links leave the site (absolute http(s)/ftp URLs).
LINK_LIST_MAX_EXTERNAL_SHARE = 0.5
# ... and unless more than this share of its links are code references (API names).
CODE_LIST_MIN_SHARE = 0.5


class HtmlParseError(ValueError):
    """The page cannot be parsed into a DOM with a body."""


@dataclass
class ExtractedPage:
    title: str | None
    text: str


def page_title(tree: LexborHTMLParser) -> str | None:
    node = tree.css_first("title")
    if node is None:
        return None
    title = _SPACE_RUN.sub(" ", node.text(deep=True)).strip()
    return title or None


def _words(value: str | None) -> list[str]:
    return [w for w in _WORD_SPLIT.split(value.lower()) if w] if value else []


@lru_cache(maxsize=4096)
def _names_furniture(value: str | None) -> bool:
    """Whether a class or id value holds a furniture word (cached: a page repeats its class values)."""
    return any(w in _BOILERPLATE_WORDS for w in _words(value))


def _slug(text: str) -> str:
    return _NON_WORD_RUN.sub("-", text.lower()).strip("-")


def _is_heading_anchor(node: LexborNode, value: str) -> bool:
    """Whether `value` (an id) is the slug of the element's own heading: `<section
    id="buffer-related-functions">` is a section about related functions, not a "related" box."""
    heading = node.css_first("h1, h2, h3, h4, h5, h6")
    # "in", not "==": numbered headings ("2.3. Python-related paths") keep the number out of the id.
    return heading is not None and _slug(value) in _slug(heading.text(deep=True))


def _is_boilerplate(node: LexborNode, explicit_main: bool) -> bool:
    tag = node.tag
    if tag in ("nav", "footer"):
        return True
    if tag in ("aside", "header"):
        # Inside an explicit main region these are the article's own header and its asides
        # (footnotes, notes, topics); outside it they are the site's header and sidebars.
        return not explicit_main
    if tag not in _CONTAINER_TAGS:
        return False
    attrs = node.attributes
    role = attrs.get("role")
    if role and role.strip().lower() in _BOILERPLATE_ROLES:
        return True
    if _names_furniture(attrs.get("class")):
        return True
    ident = attrs.get("id")
    return _names_furniture(ident) and not _is_heading_anchor(node, ident)


def _candidate_selector() -> str:
    """A CSS selector for every element `_is_boilerplate` might accept: furniture tags, and elements
    with a class, id or role other than the common inline/leaf tags (lexbor filters in C, which is
    faster than a tag list; Python then checks the tag and the words)."""
    leaves = ("a", "span", "code", "em", "strong", "b", "i", "p", "li", "dt", "dd", "pre", "img", "tr",
              "h1", "h2", "h3", "h4", "h5", "h6", "br", "input", "label", "sup", "sub", "kbd", "var", "abbr")
    skip = "".join(f":not({t})" for t in leaves)
    return f"nav, aside, footer, header, [class]{skip}, [id]{skip}, [role]{skip}"


_CANDIDATES = _candidate_selector()


def _visible_length(node: LexborNode) -> int:
    return sum(map(len, node.text(deep=True).split()))


def _outermost(nodes: list[LexborNode]) -> list[LexborNode]:
    """Drop nodes nested inside another node of the list (document order in, document order out).

    Each ancestor's answer is remembered, so every element is walked past once, not once per node
    below it; right because a chosen node precedes every node inside it in document order."""
    chosen: list[LexborNode] = []
    inside: dict[int, bool] = {}  # mem_id → the element is, or lies inside, a chosen node
    for node in nodes:
        path = []
        parent = node.parent
        nested = False
        while parent is not None:
            known = inside.get(parent.mem_id)
            if known is not None:
                nested = known
                break
            path.append(parent.mem_id)
            parent = parent.parent
        for mem_id in path:
            inside[mem_id] = nested
        inside[node.mem_id] = True
        if not nested:
            chosen.append(node)
    return chosen


def _content_root(tree: LexborHTMLParser, body: LexborNode, names: set[str] | None = None) -> tuple[LexborNode, bool]:
    """The element holding the main content, and whether it is an explicit main region."""
    body_text = None
    body_len = None
    for selector in ("main, [role=main]", "article"):
        if selector == "article" and names is not None and "article" not in names:
            continue
        outer = _outermost(tree.css(selector))
        if len(outer) != 1:
            continue
        if body_text is None:  # only pages with a candidate pay for measuring the body
            body_text = body.text(deep=True)
        main_len = _visible_length(outer[0])
        # The body's raw text length bounds its visible length from above: a region that holds
        # enough of that needs no count of the body's words.
        if main_len >= MAIN_MIN_SHARE * max(len(body_text), 1):
            return outer[0], True
        if body_len is None:
            body_len = sum(map(len, body_text.split())) or 1
        if main_len >= MAIN_MIN_SHARE * body_len:
            return outer[0], True
    return body, False


def _drop_boilerplate(root: LexborNode, explicit_main: bool) -> None:
    root_id = root.mem_id
    doomed = [
        n for n in root.css(_CANDIDATES)
        if n.mem_id != root_id and _is_boilerplate(n, explicit_main)
    ]
    # Decompose outermost first; a node inside a decomposed subtree is already gone.
    for node in _outermost(doomed):
        node.decompose()


def _is_code_reference_list(links: list[LexborNode]) -> bool:
    """Whether most links' whole text is code (`<code>`, `<tt>`, `<kbd>`, `<samp>`): a list of the
    functions the text is about, not navigation, whose labels are words."""
    code_links = 0
    for link in links:
        code = link.css_first("code, tt, kbd, samp")
        if code is not None and code.text(deep=True).strip() == link.text(deep=True).strip():
            code_links += 1
    return code_links > CODE_LIST_MIN_SHARE * len(links)


def _drop_link_lists(root: LexborNode, names: set[str] | None = None) -> None:
    """Drop lists whose items are nothing but links to the site's own pages (tables of contents,
    indexes, archives); a list whose links mostly leave the site is a reference list and stays."""
    if names is not None and names.isdisjoint(("ul", "ol", "dl", "menu")):
        return
    doomed = []
    for block in root.css("ul, ol, dl, menu"):
        items = [c for c in block.iter() if c.tag in ("li", "dt", "dd")]
        if len(items) < LINK_LIST_MIN_ITEMS:
            continue
        links = block.css("a")
        if len(links) < LINK_LIST_MIN_SHARE * len(items):
            continue  # an item without a link is not a link item: too few links to pass
        all_link = 0
        for item in items:
            total = _visible_length(item)
            linked = sum(_visible_length(a) for a in item.css("a"))
            if total and linked >= LINK_ITEM_MIN_SHARE * total:
                all_link += 1
        if all_link < LINK_LIST_MIN_SHARE * len(items):
            continue
        hrefs = [(a.attributes.get("href") or "").lstrip().lower() for a in links]
        external = sum(h.startswith(("http://", "https://", "//", "ftp://")) for h in hrefs)
        if external <= LINK_LIST_MAX_EXTERNAL_SHARE * len(links) and not _is_code_reference_list(links):
            doomed.append(block)
    for node in _outermost(doomed):
        node.decompose()


# Private-use code points mark structure while lexbor gathers the text in C; page text that
# happens to contain them loses them (they carry no meaning outside a private agreement).
_LINE, _PARA, _CELL = "\ue000", "\ue001", "\ue002"
_PRE_NEWLINE, _PRE_SPACE, _PRE_TAB = "\ue003", "\ue004", "\ue005"
_MARKERS = (_LINE, _PARA, _CELL, _PRE_NEWLINE, _PRE_SPACE, _PRE_TAB)
_DROP_MARKERS = str.maketrans({m: None for m in _MARKERS})
_PROTECT_PRE = str.maketrans({"\n": _PRE_NEWLINE, " ": _PRE_SPACE, "\t": _PRE_TAB, "\r": None})
# Blocks that stand apart as paragraphs (a blank line around them); the other block elements
# (list items, table rows, divs, <br>) only start a new line.
_PARAGRAPH_TAGS = frozenset(
    {
        "address", "article", "aside", "blockquote", "body", "details", "dialog", "dir", "dl", "fieldset",
        "figure", "footer", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hgroup", "hr", "main", "menu",
        "nav", "ol", "p", "section", "table", "ul",
    }
)
_PRE_TAGS = ("pre", "listing", "xmp", "plaintext")
_LINE_TAGS = _BLOCK_TAGS - _PARAGRAPH_TAGS - set(_PRE_TAGS)
_BREAK = "br"  # a line mark before the element only
_MARKER_OF = {
    **{tag: _LINE for tag in _LINE_TAGS}, **{tag: _PARA for tag in _PARAGRAPH_TAGS},
    **{tag: _CELL for tag in _CELL_TAGS}, "br": _BREAK,
}
_MARKED_TAGS = frozenset(_MARKER_OF)
# Fixed replacement strings and patterns that start with a marker (so the regex engine skips
# ahead to the next marker): a Python callback per block boundary would cost more than the rest.
# A run of markers (spaces between them) that holds a paragraph mark becomes a blank line, any other
# run a line break: the part from the first paragraph mark on collapses into it, the line marks
# before it into one, and that one is absorbed by the paragraph mark that follows it.
_PARA_TAIL = re.compile(f"{_PARA}[ {_LINE}{_PARA}]*")
_LINE_RUN = re.compile(f"{_LINE}[ {_LINE}]*")
_CELL_MARK = re.compile(f"{_CELL} ?")
# Cells emptied of icons leave tabs at line ends; a row starts with its first cell's tab.
_TABS_AFTER_NEWLINE = re.compile("\n\t+")
_TABS_BEFORE_NEWLINE = re.compile("\t+\n")


def _drop_permalinks(root: LexborNode, names: set[str] | None = None) -> None:
    """Drop heading permalinks: in-page links whose whole text is one symbol (¶ § # 🔗), as Sphinx,
    MkDocs and most static-site generators put after every heading."""
    if names is not None and "a" not in names:
        return
    for link in root.css('a[href^="#"]'):
        label = link.text(deep=True).strip()
        if len(label) == 1 and not label.isalnum():
            link.decompose()


def _present(selector_tags: frozenset[str] | tuple[str, ...], names: set[str] | None) -> str:
    """A selector for those of `selector_tags` the page has (all of them when `names` is None)."""
    if names is not None:
        selector_tags = [t for t in selector_tags if t in names or t in _MADE_UP]
    return ", ".join(sorted(selector_tags))


# Elements the tree builder makes without a tag for them in the page.
_MADE_UP = frozenset({"html", "head", "body", "tbody"})


def _serialise(root: LexborNode, names: set[str] | None = None) -> str:
    """Visible text: paragraphs apart by a blank line, other blocks on their own line, table cells
    separated by tabs, <pre> exactly as written.  The structure is marked with private-use
    characters so that lexbor collects the text in one C call instead of a Python walk."""
    root_id = root.mem_id
    if root.tag in _PRE_TAGS:
        return root.text(deep=True).strip("\n")
    pre_selector = _present(_PRE_TAGS, names)
    pres = _outermost(root.css(pre_selector)) if pre_selector else []
    for pre in pres:
        # One text node in place of the block and its two marks (one DOM call, not three).
        pre.replace_with(_PARA + pre.text(deep=True).strip("\r\n").translate(_PROTECT_PRE) + _PARA)
    # One query for every marked element (each query walks the whole tree, and its cost grows with
    # the number of selectors in it: only the tags the page has).  Where a marker goes does not
    # depend on the order the elements are marked in.
    for node in root.css(_present(_MARKED_TAGS, names)):
        marker = _MARKER_OF[node.tag]
        if marker == _CELL:
            node.insert_before(_CELL)
        elif marker == _BREAK:
            node.insert_before(_LINE)
        elif node.mem_id != root_id:
            node.insert_before(marker)
            node.insert_after(marker)
    # str.split() collapses every whitespace run (incl. NBSP and the ideographic space) in C; the
    # protected <pre> whitespace is not whitespace to it.
    text = " ".join(root.text(deep=True).split())
    text = _LINE_RUN.sub(_LINE, _PARA_TAIL.sub(_PARA, text)).replace(_LINE + _PARA, _PARA)
    text = text.replace(_PARA, "\n\n").replace(_LINE, "\n").replace(" \n", "\n")
    if _CELL in text:
        text = _CELL_MARK.sub("\t", text).replace(" \t", "\t")
        text = _TABS_AFTER_NEWLINE.sub("\n", _TABS_BEFORE_NEWLINE.sub("\n", text))
    if pres:
        text = text.replace(_PRE_NEWLINE, "\n").replace(_PRE_SPACE, " ").replace(_PRE_TAB, "\t")
    return text.strip()


# Deeper elements are not nested further (Chromium's parser stops nesting at 512 too): the HTML
# tree builder scans the stack of open elements at most start tags ("is there a <p> in button
# scope?"), so parsing alone costs O(elements × depth) on a page of 100,000 nested <div>s.
MAX_NESTING = 512
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9:-]*)[^>]*?(/?)>")
_RAW_TEXT = frozenset({"script", "style", "textarea", "title", "xmp", "noscript", "iframe", "noembed", "noframes",
                       "plaintext"})
# Elements that never open a nesting level: void elements, and those the tree builder closes by
# itself when the next one starts (an unclosed <p>, <li> or <td> does not nest its successor).
_NO_LEVEL = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr", "param",
    "keygen", "p", "li", "dt", "dd", "option", "optgroup", "tr", "td", "th", "thead", "tbody", "tfoot", "rb", "rt",
    "rp", "rtc", "colgroup", "caption", "html", "head", "body",
})


@lru_cache(maxsize=None)
def _raw_text_end(name: str) -> re.Pattern:
    return re.compile(f"</{name}", re.I)


def _ascii_any_case(name: str) -> str:
    return "".join(f"[{c}{c.upper()}]" if c.isalpha() else re.escape(c) for c in name)


# `cap_nesting`'s scan needs a Python step per tag; this pattern lets one C-level `findall` feed a
# cheaper check first.  A raw-text element's start tag together with its content up to its end tag
# (what the scan skips) yields an empty string; any other tag yields its `/`-prefixed name.  The
# raw-text names match ASCII letters in any case (the scan lowers `[A-Za-z]` names) and their end
# is found as the scan finds it (a case-insensitive `</name`), so both see the same tags.
def _raw_text_alternatives() -> str:
    """The raw-text alternatives of `_TAG_NAMES`, grouped by first letter (the regex engine tries
    alternatives one by one at every `<`; one letter test rules out most of them)."""
    by_letter: dict[str, list[str]] = {}
    for name in sorted(_RAW_TEXT):
        by_letter.setdefault(name[0], []).append(name)
    groups = []
    for letter, names in sorted(by_letter.items()):
        rest = "|".join(
            f"{_ascii_any_case(name[1:])}(?![A-Za-z0-9:-])[^>]*>(?:.*?(?=(?i:</{name}))|.*)" for name in names
        )
        groups.append(f"[{letter}{letter.upper()}](?:{rest})")
    return "|".join(groups)


_TAG_NAMES = re.compile("<(?:" + _raw_text_alternatives() + r"|(/?[A-Za-z][A-Za-z0-9:-]*)[^>]*>)", re.S)


_NO_COUNT = frozenset({"", *_NO_LEVEL, *(f"/{name}" for name in _NO_LEVEL)})


def _scan(html: str, max_depth: int, data: bytes | None = None) -> tuple[set[str] | None, bool]:
    """(`_tag_names_python`'s answer, whether a tag may be LONG_TAG_BYTES long or longer); from the
    compiled scan of the UTF-8 bytes (`data`, or encoded here) once this process has scanned
    COMPILED_SCAN_AFTER_BYTES of HTML, with numba and no lone surrogates; the reference otherwise."""
    global _scanned_bytes
    if _kernels is None and _scanned_bytes < COMPILED_SCAN_AFTER_BYTES:
        _scanned_bytes += len(html) if data is None else len(data)
        return _tag_names_python(html, max_depth), _LONG_TAG.search(html) is not None
    kernels = _html_kernels()
    if kernels:
        if data is None:
            data = _utf8(html)
        if data is not None:
            names, longest = _scan_compiled(kernels, data, max_depth)
            # A scan that stopped early (too deep) has not seen every tag: the regex looks.
            long_tag = longest >= LONG_TAG_BYTES or (names is None and _LONG_TAG.search(html) is not None)
            return names, long_tag
    return _tag_names_python(html, max_depth), _LONG_TAG.search(html) is not None


# lexbor checks each attribute of an element against those before it: a tag of k attributes costs
# ~k².  A tag longer than LONG_TAG_BYTES has its attributes past MAX_ATTRIBUTES dropped before parsing.
LONG_TAG_BYTES = 1024
MAX_ATTRIBUTES = 256
_LONG_TAG = re.compile(r"</?[A-Za-z][^>]{%d}" % (LONG_TAG_BYTES - 2))
_LONG_TAG_SPAN = re.compile(r"<(/?[A-Za-z][A-Za-z0-9:-]*)([^>]{%d,})" % (LONG_TAG_BYTES - 2 - 1))
# One attribute as the tokenizer reads it: a name (up to whitespace, /, >, =), then maybe = and a
# quoted or unquoted value; a stray / between attributes is skipped.
_ATTRIBUTE = re.compile(r"""[\s/]*([^\s/>="'][^\s/>=]*)(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s>]*))?""")


def _cap_attributes(html: str) -> str:
    """The page with every tag's attributes after its MAX_ATTRIBUTES-th dropped (lexbor keeps the
    first of duplicated names, so the element keeps what it had up to there).  A tag ends at its
    first `>`, as in the scans above.  The page itself when no tag has more."""
    def cap(m: re.Match) -> str:
        attrs = m.group(2)
        count = 0
        for a in _ATTRIBUTE.finditer(attrs):
            count += 1
            if count == MAX_ATTRIBUTES:
                rest = attrs[a.end():]
                if _ATTRIBUTE.search(rest) is None:
                    return m.group(0)
                return "<" + m.group(1) + attrs[:a.end()] + ("/" if attrs.rstrip().endswith("/") else "")
        return m.group(0)

    capped = _LONG_TAG_SPAN.sub(cap, html)
    return html if capped == html else capped


def _utf8(html: str) -> bytes | None:
    """The UTF-8 bytes selectolax would make of the text, or None for a text with lone surrogates
    (selectolax drops them; such a text takes the reference scan and is encoded by the parser)."""
    try:
        return html.encode("utf-8")
    except UnicodeEncodeError:
        return None


_kernels = None  # dsdata.clean.html_kernels once imported; False when numba is missing or disabled
# The compiled scan has a one-off cost per process (numba's import): it is taken once this process
# has scanned this much HTML the Python way, so a run of a few pages never pays for it.
COMPILED_SCAN_AFTER_BYTES = 8 << 20
_scanned_bytes = 0


def _html_kernels():
    """dsdata.clean.html_kernels, or None without numba or with DSDATA_NO_NUMBA=1 (imported on the
    first page: numba costs start-up a run without HTML never pays)."""
    global _kernels
    if _kernels is None:
        _kernels = import_compiled("dsdata.clean.html_kernels")
    return _kernels or None


@lru_cache(maxsize=1)
def _known_names() -> tuple:
    """The names `tag_scan` must know before it starts: those that open no level, the raw-text ones."""
    import numpy as np

    from dsdata.clean.html_kernels import _NO_LEVEL_FLAG, _RAW_FLAG

    names = [(n, _NO_LEVEL_FLAG) for n in sorted(_NO_LEVEL)] + [(n, _RAW_FLAG) for n in sorted(_RAW_TEXT)]
    blob = "".join(n for n, _ in names).encode("ascii")
    offsets = np.cumsum([0] + [len(n) for n, _ in names]).astype(np.int64)
    return np.frombuffer(blob, np.uint8), offsets, np.array([f for _, f in names], np.int64)


def _scan_compiled(kernels, data: bytes, max_depth: int) -> tuple[set[str] | None, int]:
    """(the tag names or None, the longest tag's bytes) from the kernel."""
    import numpy as np

    within, saw_raw, store, starts, lengths, seen, longest = kernels.tag_scan(
        np.frombuffer(data, np.uint8), data.rfind(b">") + 1, max_depth, *_known_names()
    )
    if not within:
        return None, int(longest)
    blob = store.tobytes()
    names = {blob[s:s + n].decode("ascii") for s, n, hit in zip(starts.tolist(), lengths.tolist(), seen.tolist()) if hit}
    if saw_raw:
        names.add("")
    return names, int(longest)


def _tag_names_python(html: str, max_depth: int) -> set[str] | None:
    """The lowercase names of the page's start and end tags outside raw-text elements, when
    `cap_nesting`'s scan provably never reaches `max_depth` on it; None when it may.

    Instead of the scan's stack, one open-element count per tag name; their sum never falls below
    the scan's stack depth, so a sum within the bound proves the scan makes no edit.  The names let
    the extractor skip CSS queries for elements the page does not have."""
    # No tag ends after the last ">"; without the bound every "<" of "<a<a<a…" scans to the end: O(n²).
    tags = list(map(str.lower, _TAG_NAMES.findall(html, 0, html.rfind(">") + 1)))
    counts: dict[str, int] = {}
    get = counts.get
    depth = 0
    # Tags that never change a count (raw-text elements, elements that open no level, and their
    # end tags, whose count is never above zero) are filtered out in C.
    for tag in filterfalse(_NO_COUNT.__contains__, tags):
        if tag[0] == "/":
            name = tag[1:]
            count = get(name)
            if count:
                counts[name] = count - 1
                depth -= 1
        else:
            counts[tag] = get(tag, 0) + 1
            depth += 1
            if depth > max_depth:
                return None
    # End tags count too: `</br>` and `</p>` make elements.
    return {tag.lstrip("/") for tag in set(tags)}


def _within_nesting(html: str, max_depth: int) -> bool:
    """True only if `cap_nesting`'s scan never reaches `max_depth` on the page (False: it may)."""
    return _scan(html, max_depth)[0] is not None


def cap_nesting(html: str, max_depth: int = MAX_NESTING) -> str:
    """The page rewritten so that no element nests deeper than `max_depth`: an element that would
    go deeper becomes the next sibling of the element at the limit (that one is closed just before
    it, and its own end tag, when it comes, is dropped) — as Chromium's parser does.  Every tag and
    all text stay.  A page within the bound (every ordinary page) is returned unchanged."""
    if html.count("<") <= max_depth or _within_nesting(html, max_depth):
        return html
    return _capped(html, max_depth)


def _capped(html: str, max_depth: int) -> str:
    """`cap_nesting`'s rewrite: the scan that finds where the page nests too deep, with positions."""
    stack: list[str] = []
    open_counts: dict[str, int] = {}
    closed_early: dict[str, int] = {}  # end tags still to come for elements closed at the limit
    edits: list[tuple[int, int, str]] = []
    pos = 0
    # No tag ends after the page's last ">": searching past it from every "<" is O(n²) on a page of
    # "<a<a<a…" that never closes.
    tags_end = html.rfind(">") + 1
    while True:
        m = _TAG.search(html, pos, tags_end)
        if m is None:
            break
        pos = m.end()
        closing, name, self_closing = m.group(1), m.group(2).lower(), m.group(3)
        if not closing:
            if name in _RAW_TEXT:
                end = _raw_text_end(name).search(html, pos)
                pos = len(html) if end is None else end.start()
                continue
            if name in _NO_LEVEL or self_closing:
                continue
            if len(stack) >= max_depth:
                top = stack.pop()
                open_counts[top] -= 1
                closed_early[top] = closed_early.get(top, 0) + 1
                edits.append((m.start(), m.start(), f"</{top}>"))
            stack.append(name)
            open_counts[name] = open_counts.get(name, 0) + 1
        elif open_counts.get(name):
            # An end tag closes its element and everything opened inside it.
            while stack:
                top = stack.pop()
                open_counts[top] -= 1
                if top == name:
                    break
        elif closed_early.get(name):
            closed_early[name] -= 1
            edits.append((m.start(), m.end(), ""))
    return _edited(html, edits)


def _edited(text: str, edits: list[tuple[int, int, str]]) -> str:
    """`text` with each (start, end, replacement) applied; the edits are in order and do not overlap."""
    if not edits:
        return text
    parts = []
    last = 0
    for start, end, replacement in edits:
        parts.append(text[last:start])
        parts.append(replacement)
        last = end
    parts.append(text[last:])
    return "".join(parts)


def _parse(html: str | bytes) -> LexborHTMLParser:
    try:
        tree = LexborHTMLParser(html)
    except Exception as exc:  # noqa: BLE001 - lexbor raises plain exceptions on hostile input
        raise HtmlParseError(f"{type(exc).__name__}: {exc}") from exc
    if tree.body is None:
        raise HtmlParseError("the document has no <body>")
    return tree


# lexbor's "in select" insertion mode costs ~k² for a <select> of k options.  A select is never main
# text, so on a page with many options every <select> is renamed to a custom element before parsing
# (its options then parse as in a <div>) and removed with the other non-content elements.
_WIDE_SELECT_OPTIONS = 512
_OPTION_TAG = re.compile(r"<option[\s/>]", re.IGNORECASE)
_SELECT_TAG = re.compile(r"<(/?)select(?=[\s/>])", re.IGNORECASE)
_RENAMED_SELECT = "dsdata-select"


def _unselect(html: str, names: set[str] | None) -> str:
    """`html` with its <select> tags renamed when it holds over _WIDE_SELECT_OPTIONS options."""
    if names is not None and "select" not in names:
        return html
    count = 0
    for _ in _OPTION_TAG.finditer(html):
        count += 1
        if count > _WIDE_SELECT_OPTIONS:
            return _SELECT_TAG.sub(lambda m: f"<{m.group(1)}{_RENAMED_SELECT}", html)
    return html


def extract_dom(html: str) -> ExtractedPage:
    """The DOM heuristic described in the module docstring."""
    if any(m in html for m in _MARKERS):
        html = html.translate(_DROP_MARKERS)
    data = _utf8(html)
    names, long_tag = _scan(html, MAX_NESTING, data)
    unselected = _unselect(html, names)
    renamed = unselected is not html
    if renamed:
        html, data = unselected, _utf8(unselected)
    if long_tag:
        capped = _cap_attributes(html)
        if capped is not html:
            html, data = capped, _utf8(capped)
    if names is None:
        html, data = _capped(html, MAX_NESTING), None
    else:
        # Raw-text elements are not among the names (their start tag yields none).
        names.update(_RAW_TEXT)
    tree = _parse(html if data is None else data)
    title = page_title(tree)
    body = tree.body
    invisible = _INVISIBLE_SELECTOR if names is None else _present(_NON_CONTENT_TAGS, names) + ", " + _HIDDEN_SELECTOR
    if renamed:
        invisible = f"{_RENAMED_SELECT}, {invisible}"
    for node in _outermost(body.css(invisible.lstrip(", "))):
        node.decompose()
    root, explicit_main = _content_root(tree, body, names)
    _drop_boilerplate(root, explicit_main)
    _drop_link_lists(root, names)
    _drop_permalinks(root, names)
    return ExtractedPage(title, _serialise(root, names))


def extract_selectolax_body(html: str) -> ExtractedPage:
    """Baseline: all text of <body> (scripts and styles removed), no boilerplate removal."""
    tree = _parse(html)
    tree.strip_tags(["script", "style", "noscript", "template"])
    return ExtractedPage(page_title(tree), tree.body.text(separator="\n"))


def extract_trafilatura(html: str) -> ExtractedPage:
    """trafilatura.extract with its default settings (tables and comments on, no links)."""
    import trafilatura

    text = trafilatura.extract(html)
    title = None
    try:
        title = page_title(LexborHTMLParser(html))
    except Exception:  # noqa: BLE001 - the title is optional
        pass
    return ExtractedPage(title, text or "")


_DISPATCH = {
    "auto": extract_dom,
    "dom": extract_dom,
    "trafilatura": extract_trafilatura,
    "selectolax-body": extract_selectolax_body,
}
EXTRACTORS = tuple(_DISPATCH)


def extract_main_text(html: str, extractor: str = "auto") -> ExtractedPage:
    """Main text of an HTML page with the named extractor (see EXTRACTORS)."""
    try:
        fn = _DISPATCH[extractor]
    except KeyError:
        raise ValueError(f"unknown extractor '{extractor}' (known: {', '.join(EXTRACTORS)})") from None
    return fn(html)
