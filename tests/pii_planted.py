"""Held-out style documents for the `pii` stage: personal data made by Faker (en_US and zh_CN) and by
independent template families, planted inside running English and Chinese text in many surroundings,
with hard negatives (versions, section numbers, dates, hashes, UUIDs, ISBNs, order numbers,
coordinates, prices, file names with @, long digit runs that fail Luhn) that must stay untouched.

Hosts are the real paragraphs of ../shared/data/prose-en.txt and prose-zh.txt when present, else
Faker's own text.  Every planted item records its kind (None for a negative), language, template
family and offsets, so recall and precision are scored per kind, span for span.  Used by
tests/test_pii_planted.py and benchmarks/pii.py.

The families marked SANITY were written after the detector was finished, as a check that the rest
did not steer it.
"""
from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass
from pathlib import Path

from faker import Faker

KINDS = ("email", "ip", "phone", "id", "card")
SANITY = {"sanity_en", "sanity_zh"}


@dataclass
class Planted:
    kind: str | None  # None: a hard negative
    lang: str
    family: str
    start: int
    end: int
    value: str


def _wide(value: str) -> str:
    """The value in full-width forms (１３９, ＠, ．, －), as Chinese input methods write it."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" and c not in " " else c for c in value)


def _luhn_complete(body: str) -> str:
    for d in "0123456789":
        digits = body + d
        total = sum((int(c) * 2 - 9 if int(c) * 2 > 9 else int(c) * 2) if i % 2 else int(c)
                    for i, c in enumerate(reversed(digits)))
        if total % 10 == 0:
            return digits
    raise AssertionError


class Generator:
    def __init__(self, seed: int, shared: Path | None = None):
        self.rng = random.Random(seed)
        self.en, self.zh = Faker("en_US"), Faker("zh_CN")
        self.en.seed_instance(seed)
        self.zh.seed_instance(seed + 1)
        self.hosts = {"en": self._hosts(shared, "en"), "zh": self._hosts(shared, "zh")}

    def _hosts(self, shared: Path | None, lang: str) -> list[str]:
        path = shared / f"prose-{lang}.txt" if shared else None
        if path and path.exists():
            paras = [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if 80 <= len(p.strip()) <= 1500]
            if paras:
                return paras
        fake = self.en if lang == "en" else self.zh
        return [fake.paragraph(nb_sentences=6) for _ in range(200)]

    # -- values, each kind from several independent families ------------------------------------
    def value(self, kind: str, lang: str) -> str:
        rng, en, zh = self.rng, self.en, self.zh
        if kind == "email":
            return rng.choice([en.email, en.company_email, en.free_email, zh.email,
                               lambda: f"{en.first_name().lower()}.{en.last_name().lower()}+{en.word()}@{en.domain_word()}.{en.tld()}",
                               lambda: f"{zh.user_name()}{rng.randrange(100)}@{rng.choice(['qq.com', '163.com', 'mail.sina.com.cn', 'corp.example.cn'])}"])()
        if kind == "ip":
            while True:
                addr = rng.choice([lambda: en.ipv4_public(), lambda: en.ipv6(), lambda: en.ipv6(),
                                   lambda: f"2{rng.randrange(16):x}{rng.randrange(16**2):02x}:{rng.randrange(16**4):x}::{rng.randrange(1, 16**3):x}"])()
                ip = ipaddress.ip_address(addr)
                if ip.is_global and not ip.is_multicast:
                    break
            if ip.version == 6 and rng.random() < 0.2:
                return ip.exploded
            return str(ip)
        if kind == "phone":
            mobile = zh.phone_number()
            forms = [mobile, f"{mobile[:3]} {mobile[3:7]} {mobile[7:]}", f"{mobile[:3]}-{mobile[3:7]}-{mobile[7:]}",
                     f"+86 {mobile}", f"+86-{mobile[:3]}-{mobile[3:7]}-{mobile[7:]}", f"0086 {mobile}",
                     f"0{rng.choice(['10', '21', '755', '571', '28'])}-{rng.randrange(2, 9)}{rng.randrange(10**6, 10**7)}",
                     f"(0{rng.choice(['755', '20', '512'])}) {rng.randrange(2000, 9000)} {rng.randrange(1000, 9999)}",
                     en.phone_number(), en.phone_number(),
                     f"({rng.randrange(201, 989)}) {rng.randrange(200, 999)}-{rng.randrange(10**4):04d}",
                     f"+1 {rng.randrange(201, 989)} {rng.randrange(200, 999)} {rng.randrange(10**4):04d}",
                     f"+44 20 {rng.randrange(7000, 8999)} {rng.randrange(10**4):04d}",
                     f"+49 30 {rng.randrange(10**6, 10**8)}", f"+33 1 {rng.randrange(10, 99)} {rng.randrange(10, 99)} {rng.randrange(10, 99)} {rng.randrange(10, 99)}"]
            return rng.choice(forms)
        if kind == "id":
            number = zh.ssn()
            return rng.choice([number, number, number.lower(), f"{number[:6]} {number[6:14]} {number[14:]}"])
        card_type = rng.choice(["visa16", "visa13", "visa19", "mastercard", "amex", "discover", "diners", "jcb16", "jcb15", None])
        digits = en.credit_card_number(card_type) if card_type else _luhn_complete("62" + "".join(
            str(rng.randrange(10)) for _ in range(rng.choice([13, 16]))))
        if len(digits) == 15 and rng.random() < 0.5:
            return f"{digits[:4]} {digits[4:10]} {digits[10:]}"
        if len(digits) in (16, 19) and rng.random() < 0.6:
            sep = rng.choice([" ", "-"])
            return sep.join(digits[i:i + 4] for i in range(0, len(digits), 4))
        return digits

    def negative(self, lang: str) -> str:
        rng, en = self.rng, self.en
        return rng.choice([
            lambda: f"v{rng.randrange(1, 20)}.{rng.randrange(10)}.{rng.randrange(10)}.{rng.randrange(100)}",
            lambda: f"version {rng.randrange(1, 12)}.{rng.randrange(3)}.{rng.randrange(10000, 22000)}.{rng.randrange(999)}",
            lambda: f"Section {rng.randrange(1, 20)}.{rng.randrange(1, 12)}.{rng.randrange(1, 12)}.{rng.randrange(1, 20)}",
            lambda: f"第{rng.randrange(1, 9)}.{rng.randrange(1, 9)}.{rng.randrange(1, 9)}.{rng.randrange(1, 9)}节",
            lambda: ".".join(str(rng.randrange(1, 30)) for _ in range(rng.randrange(5, 8))),
            lambda: en.date(), lambda: en.date("%Y/%m/%d"), lambda: en.date("%Y年%m月%d日"), lambda: en.iso8601(),
            lambda: en.sha1(), lambda: en.md5(), lambda: en.sha256()[:rng.randrange(12, 64)], lambda: en.uuid4(),
            lambda: en.isbn13(), lambda: en.isbn10(), lambda: en.isbn13().replace("-", ""),
            lambda: f"订单号：{en.date('%Y%m%d')}{rng.randrange(10**9, 10**10)}",
            lambda: f"Order #{rng.randrange(10**11, 10**14)}",
            lambda: f"{en.latitude()}, {en.longitude()}", lambda: f"({float(en.latitude()):.6f},{float(en.longitude()):.6f})",
            lambda: f"${rng.randrange(1, 9999):,}.{rng.randrange(100):02d}", lambda: f"¥{rng.randrange(100, 99999)}",
            lambda: f"￥{rng.randrange(10**10, 10**11)}元"[:-1] + "元",
            lambda: f"{rng.choice(['icon', 'logo', 'avatar', 'btn_close'])}@{rng.choice(['2x', '3x', '1.5x'])}.{rng.choice(['png', 'jpg', 'webp'])}",
            lambda: str(rng.randrange(10**25, 10**40)),
            lambda: self._non_luhn(), lambda: f"{rng.randrange(1600000000, 1800000000)}{rng.randrange(1000):03d}",
        ])()

    def _non_luhn(self) -> str:
        card = self.en.credit_card_number(self.rng.choice(["visa16", "mastercard", "discover"]))
        wrong = str((int(card[-1]) + self.rng.randrange(1, 10)) % 10)
        return card[:-1] + wrong

    # -- surroundings --------------------------------------------------------------------------
    EN = {
        "en_plain": [("contact {v} for", 8), ("at {v}, ", 3)],
        "en_punct": [("({v})", 1), ("\"{v}\"", 1), ("[{v}]", 1), ("<{v}>", 1), ("'{v}'", 1)],
        "en_sentence": [("Write to {v}.", 9), ("The value is {v}. Then", 13), ("is {v};", 3), ("is: {v}!", 5)],
        "en_line": [("\n{v}\n", 1), ("\n- {v}\n", 3), ("\t{v}\t", 1)],
        "sanity_en": [("Reach us via {v}, thanks.", 13), ("(see: {v}).", 6)],
    }
    ZH = {
        "zh_glued": [("请拨打{v}咨询", 3), ("邮箱{v}或", 2), ("号码{v}的", 2), ("地址是{v}。", 3)],
        "zh_punct": [("：{v}。", 1), ("，{v}，", 1), ("（{v}）", 1), ("「{v}」", 1), ("“{v}”", 1), ("【{v}】", 1)],
        "zh_wide": [("联系：{w}。", 3), ("（{w}）", 1), ("请拨{w}咨询", 2)],
        "zh_line": [("\n{v}\n", 1), ("\n{v}。", 1), ("：\n{v}", 2)],
        "sanity_zh": [("备注：{v}（仅内部）", 3), ("微信同号{v}欢迎", 4)],
    }

    def document(self, lang: str, n_pos: int = 3, n_neg: int = 2) -> tuple[str, list[Planted]]:
        rng = self.rng
        text = rng.choice(self.hosts[lang])
        families = self.EN if lang == "en" else self.ZH
        pieces = [(rng.choice(KINDS), None) for _ in range(n_pos)] + [(None, None) for _ in range(n_neg)]
        rng.shuffle(pieces)
        # Insert at word boundaries (en) or between characters (zh), the last first, so offsets stay put.
        if lang == "en":
            places = [i + 1 for i, c in enumerate(text) if c == " "] + [len(text)]
            cuts = sorted(rng.sample(places, min(len(pieces), len(places))) + [len(text)] * max(0, len(pieces) - len(places)), reverse=True)
        else:
            # between two characters that are not ASCII letters or digits (Chinese hosts quote English words)
            places = [i for i in range(len(text) + 1) if not (i and text[i - 1].isascii() and text[i - 1].isalnum())
                      and not (i < len(text) and text[i].isascii() and text[i].isalnum())]
            cuts = sorted(rng.sample(places, len(pieces)), reverse=True)
        inserted: list[tuple[int, str, str | None, str, int, int]] = []
        for (kind, _), cut in zip(pieces, cuts):
            if kind is None:
                value, family = self.negative(lang), "negative"
                template = " {v} " if lang == "en" else rng.choice(["，{v}，", "（{v}）", "{v}", " {v} "])
            else:
                value = self.value(kind, lang)
                family = rng.choice(list(families))
                template = rng.choice(families[family])[0]
                if "{w}" in template:
                    value = _wide(value)
                    template = template.replace("{w}", "{v}")
                if lang == "en":
                    template = template + " "
            before, after = template.split("{v}")
            piece = before + value + after
            text = text[:cut] + piece + text[cut:]
            inserted = [(c + len(piece), *rest) for c, *rest in inserted]  # earlier insertions lie after this one
            inserted.append((cut + len(before), value, kind, family, 0, 0))
        planted = [Planted(kind, lang, family, start, start + len(value), value) for start, value, kind, family, *_ in inserted]
        return text, sorted(planted, key=lambda p: p.start)

    def corpus(self, docs: int) -> list[tuple[str, list[Planted]]]:
        return [self.document("en" if i % 2 else "zh") for i in range(docs)]


def score(corpus: list[tuple[str, list[Planted]]], spans_of) -> dict:
    """Recall per kind and language (a planted item counts when a span of its kind has exactly its
    offsets) and precision against the hard negatives (a span that overlaps a negative is false)."""
    found: dict[tuple[str, str], list[int]] = {}
    fp, tp = 0, 0
    per_kind_fp: dict[str, int] = {}
    for text, planted in corpus:
        spans = spans_of(text)
        exact = {(s, e, k) for s, e, k in spans}
        for p in planted:
            if p.kind is None:
                hits = [k for s, e, k in spans if s < p.end and p.start < e]
                fp += len(hits)
                for k in hits:
                    per_kind_fp[k] = per_kind_fp.get(k, 0) + 1
                continue
            ok = (p.start, p.end, p.kind) in exact
            tp += ok
            cell = found.setdefault((p.kind, p.lang), [0, 0])
            cell[0] += ok
            cell[1] += 1
    recall = {f"{k}/{lang}": round(a / n, 3) for (k, lang), (a, n) in sorted(found.items())}
    total = sum(n for _, n in found.values())
    return {"recall": round(tp / total, 4), "recall_per_kind": recall, "precision": round(tp / (tp + fp), 4) if tp + fp else 1.0,
            "false_positives": fp, "false_positives_per_kind": per_kind_fp, "planted": total}
