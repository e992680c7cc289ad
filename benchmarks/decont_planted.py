"""Planted decontamination data (test scaffolding shared by tests/test_decontaminate_planted.py and
benchmarks/decontaminate.py): real English and Chinese paragraphs as benchmark passages and as clean
documents, each passage planted in other documents under every perturbation class, and a site footer
(an author line and a manual's title) that ends some benchmark passages AND many clean documents.

Classes: exact (the passage embedded in another document), case, punct (removed, replaced, added),
space (spaces, tabs, newlines; spaces after Chinese characters), width (ASCII ↔ full width), window
(13 to 25 words cut from an English passage, a word being what lies between spaces, "-"
included; 13 to 25 characters of a Chinese one holding at least 13 whole tokens, a Latin word the
cut splits not being one; before the footer), substitute (a few words or characters
replaced), mixed (case + punct + space + width at once).  Every planted document is a clean document
with the perturbed passage written into its middle.

`build(en, zh, seed)` → Planted: the benchmark items per language, the documents (id, text) and for
each planted document its (language, class); clean documents' ids start with "c", planted ones "p".
"""
from __future__ import annotations

import random
import re
import unicodedata
from dataclasses import dataclass, field

CLASSES = ("exact", "case", "punct", "space", "width", "window", "substitute", "mixed")
FOOTER = {
    "en": "Posted by Margaret Holloway, senior technical writer. The Riverbend Server Administration Manual, "
          "second edition, all rights reserved.",
    "zh": "作者：王建国，高级技术文档工程师。《河湾服务器管理手册》第二版，版权所有，未经许可不得转载。",
}
_TOKEN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]|[A-Za-z0-9]+")
_PUNCT_EN = ",.;:!?-()\"'/"
_PUNCT_ZH = "，。、；：！？…（）“”《》"
_HALF_OF = {"，": ",", "。": ".", "；": ";", "：": ":", "！": "!", "？": "?", "（": "(", "）": ")", "、": ","}


def paragraphs(text: str, lo: int, hi: int) -> list[str]:
    out = []
    for p in text.split("\n\n"):
        p = " ".join(p.split())
        if lo <= len(p) <= hi:
            out.append(p)
    return out


def count_tokens(piece: str, whole: str, start: int) -> int:
    """Whole tokens of `piece` = whole[start:start + len(piece)], as a reader counts them: a Chinese
    character, or a run of ASCII letters and digits that the cut does not split."""
    end = start + len(piece)
    n = 0
    for m in _TOKEN.finditer(piece):
        a, b = start + m.start(), start + m.end()
        split = (a > 0 and whole[a - 1].isascii() and whole[a - 1].isalnum() and m.group().isascii()) or \
                (b < len(whole) and b == end and whole[b].isascii() and whole[b].isalnum() and m.group().isascii())
        n += not split
    return n


def _grams(text: str, n: int = 13) -> set[tuple[str, ...]]:
    toks = _TOKEN.findall(unicodedata.normalize("NFKC", text).lower())
    return {tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)}


def _case(t: str, rng: random.Random, lang: str) -> str:
    return " ".join(rng.choice((w.upper(), w.lower(), w.title(), w.swapcase())) for w in t.split(" "))


def _punct(t: str, rng: random.Random, lang: str) -> str:
    marks = _PUNCT_ZH if lang == "zh" else _PUNCT_EN
    out = []
    for ch in t:
        if not ch.isalnum() and not ch.isspace():
            r = rng.random()
            ch = "" if r < 0.4 else (rng.choice(marks) if r < 0.8 else ch)
        out.append(ch)
        if ch.isspace() and rng.random() < 0.15:
            out.append(rng.choice(marks) + " ")
    return "".join(out)


def _space(t: str, rng: random.Random, lang: str) -> str:
    out = []
    for ch in t:
        if ch == " ":
            out.append(rng.choice((" ", "  ", "\n", "\t", " \n  ", "\u3000")))
        else:
            out.append(ch)
            if lang == "zh" and _TOKEN.fullmatch(ch) and not ch.isascii() and rng.random() < 0.3:
                out.append(rng.choice((" ", "\n", "  ")))
    return "".join(out)


def _width(t: str, rng: random.Random, lang: str) -> str:
    out = []
    for ch in t:
        if "!" <= ch <= "~" and rng.random() < 0.8:
            ch = chr(ord(ch) + 0xFEE0)
        elif ch in _HALF_OF and rng.random() < 0.8:
            ch = _HALF_OF[ch]
        elif ch == " " and rng.random() < 0.3:
            ch = "\u3000"
        out.append(ch)
    return "".join(out)


def _window(t: str, rng: random.Random, lang: str) -> str:
    """13 to 25 tokens of the passage: whole words (English) or a slice of characters (Chinese)."""
    want = rng.randint(13, 25)
    for _ in range(50):
        if lang == "en":  # 13+ words as a reader counts them: "-" and "│" between spaces are words
            words = t.split(" ")
            first = rng.randrange(max(1, len(words) - want))
            return " ".join(words[first:first + want])
        else:
            start = rng.randrange(max(1, len(t) - want))
            piece = t[start:start + want]
        if count_tokens(piece, t, start) >= 13:
            return piece
    return t


def _substitute(t: str, rng: random.Random, lang: str, vocab: list[str]) -> str:
    """Three words (English) or three characters (Chinese) replaced by others from the corpus."""
    if lang == "en":
        words = t.split(" ")
        for i in rng.sample(range(len(words)), min(3, len(words))):
            words[i] = rng.choice(vocab)
        return " ".join(words)
    chars = list(t)
    cjk = [i for i, ch in enumerate(chars) if _TOKEN.fullmatch(ch)]
    for i in rng.sample(cjk, min(3, len(cjk))):
        chars[i] = rng.choice(vocab)
    return "".join(chars)


def perturb(cls: str, passage: str, rng: random.Random, lang: str, vocab: list[str]) -> str:
    if cls == "exact":
        return passage
    if cls == "substitute":
        return _substitute(passage, rng, lang, vocab)
    if cls == "mixed":
        for f in (_case, _punct, _space, _width):
            passage = f(passage, rng, lang)
        return passage
    return {"case": _case, "punct": _punct, "space": _space, "width": _width, "window": _window}[cls](passage, rng, lang)


@dataclass
class Planted:
    items: dict[str, list[str]] = field(default_factory=dict)       # language → benchmark passages
    docs: list[dict] = field(default_factory=list)                    # {"id", "text"}
    planted: dict[str, tuple[str, str]] = field(default_factory=dict)  # planted doc id → (language, class)
    footer_docs: int = 0                                               # clean documents ending with a footer


def build(en_text: str, zh_text: str, seed: int = 0, passages: int = 40, clean: int = 300,
          footer_share: float = 0.3) -> Planted:
    """`passages` benchmark passages per language (a quarter of them ending with the footer), each
    planted once per class; `clean` clean documents per language, `footer_share` of them ending with
    the footer."""
    rng = random.Random(seed)
    out = Planted()
    for lang, text, lo, hi in (("en", en_text, 300, 1500), ("zh", zh_text, 100, 600)):
        paras = paragraphs(text, lo, hi)
        rng.shuffle(paras)
        bench = paras[:passages]
        # Clean means clean: a paragraph that already shares 13 tokens with a passage (the manuals
        # repeat their menu paths and sentences) is left out.
        grams = {g for p in bench for g in _grams(p)}
        pool = [p for p in paras[passages:] if not (_grams(p) & grams)][:clean]
        if lang == "en":
            vocab = [w for p in pool[:50] for w in p.split(" ") if w.isalpha()]
        else:
            vocab = [ch for p in pool[:50] for ch in p if _TOKEN.fullmatch(ch)]
        items = []
        for i, passage in enumerate(bench):
            item = passage + (" " + FOOTER[lang] if i % 4 == 0 else "")
            items.append(item)
            for cls in CLASSES:
                host = rng.choice(pool)
                planted_text = perturb(cls, passage if cls == "window" else item, rng, lang, vocab)
                cut = rng.randrange(len(host) // 4, 3 * len(host) // 4 + 1)
                doc_id = f"p-{lang}-{i:03d}-{cls}"
                out.docs.append({"id": doc_id, "text": f"{host[:cut]}\n{planted_text}\n{host[cut:]}"})
                out.planted[doc_id] = (lang, cls)
        out.items[lang] = items
        for j, host in enumerate(pool):
            footer = rng.random() < footer_share
            out.footer_docs += footer
            out.docs.append({"id": f"c-{lang}-{j:04d}", "text": host + (f"\n\n{FOOTER[lang]}" if footer else "")})
    rng.shuffle(out.docs)
    return out


def scores(planted: Planted, rejected: dict[str, str], footer_tokens) -> dict:
    """Recall per class and language, clean documents rejected, and rejections whose n-gram lies in a
    footer.  `rejected`: document id → the rejection detail; `footer_tokens(lang)` → the footer's
    n-gram text test (a callable: detail → True when the n-gram shown is inside the footer)."""
    per: dict[str, list[int]] = {}
    for doc_id, (lang, cls) in planted.planted.items():
        hit = int(doc_id in rejected)
        for key in ("all", lang, cls, f"{lang}/{cls}"):
            per.setdefault(key, [0, 0])
            per[key][0] += hit
            per[key][1] += 1
    recall = {k: round(h / n, 4) for k, (h, n) in sorted(per.items())}
    clean = [d["id"] for d in planted.docs if d["id"].startswith("c-")]
    return {"recall": recall,
            "clean_docs": len(clean),
            "clean_rejected": sum(i in rejected for i in clean),
            "footer_rejections": sum(bool(footer_tokens(detail)) for detail in rejected.values())}
