"""pii: planted PII of every type is redacted in real documents; the dev data's version numbers,
dates, hashes and code survive; validators refuse look-alikes; tag and reject modes."""
from __future__ import annotations

import ipaddress
import json
import random
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.document import Document, Rejected
from dsdata.recipe import load_recipe
from dsdata.stages.pii import PiiStage
from dsdata.stages.pii_kinds import (_ISSUER_OF, _ISSUERS, _NUMBERING_BEFORE, PiiFinder, _card_digits_ok, _numbering_may_end,
                                  _v6_value, id_check_char, valid_resident_id)


def _resident_id(rng: random.Random) -> str:
    first = f"{rng.choice([11, 31, 44, 51, 65])}{rng.randrange(1000, 9999):04d}" \
            f"{rng.randrange(1950, 2005)}{rng.randrange(1, 13):02d}{rng.randrange(1, 29):02d}{rng.randrange(0, 999):03d}"
    return first + id_check_char(first)


def _luhn_ok(digits: str) -> bool:
    """Luhn, as its definition reads: every second digit from the right doubled, its digits summed."""
    return sum(int(d) if i % 2 == 0 else (2 * int(d) - 9 if int(d) > 4 else 2 * int(d))
               for i, d in enumerate(reversed(digits))) % 10 == 0


def _issuer(digits: str) -> str | None:
    """The first issuer range (_ISSUERS) the number's leading digits are in."""
    return next((net for net, low, high in _ISSUERS if low <= int(digits[:len(str(low))]) <= high), None)


def _card(rng: random.Random, prefix: str, length: int) -> str:
    body = prefix + "".join(str(rng.randrange(10)) for _ in range(length - len(prefix) - 1))
    return next(body + d for d in "0123456789" if _luhn_ok(body + d))


def _planted(rng: random.Random) -> list[tuple[str, str]]:
    """(type, text as written) of one of each kind, in the forms people write them."""
    card = _card(rng, rng.choice(["4", "51", "62", "37"]), rng.choice([16, 16, 19]))
    if rng.random() < 0.5 and len(card) == 16:
        card = " ".join(card[i:i + 4] for i in range(0, 16, 4))
    mobile = f"1{rng.choice('3456789')}{rng.randrange(0, 10)}{rng.randrange(10000000, 99999999)}"
    return [
        ("email", f"{rng.choice(['li.wei', 'j_smith', 'zhang+news'])}{rng.randrange(99)}@{rng.choice(['qq.com', 'mail.example.org', '163.com'])}"),
        ("ip", f"{rng.randrange(11, 99)}.{rng.randrange(10, 250)}.{rng.randrange(0, 250)}.{rng.randrange(1, 250)}"),
        ("ip", rng.choice(["2606:4700:4700::1111", "2a00:1450:4001:82b::200e"])),
        ("phone", rng.choice([mobile, f"+86 {mobile[:3]} {mobile[3:7]} {mobile[7:]}", f"{mobile[:3]}-{mobile[3:7]}-{mobile[7:]}"])),
        ("phone", rng.choice(["+44 20 7946 0958", "+1 (415) 555-0132", "+49 30 901820"])),
        ("id", _resident_id(rng)),
        ("card", card),
    ]


def _paragraphs(path: Path, lo: int, hi: int) -> list[str]:
    return [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if lo <= len(p.strip()) <= hi]


def test_planted_pii_is_redacted_in_real_documents(tmp_path, shared_data):
    rng = random.Random(3)
    hosts = _paragraphs(shared_data / "prose-en.txt", 300, 2000)[:60] + _paragraphs(shared_data / "prose-zh.txt", 120, 1000)[:60]
    docs, planted = [], {}
    for i, text in enumerate(hosts):
        items = _planted(rng)
        words = text.split(" ") if i < 60 else None
        # Chinese: each at its own place of the original text, the last place first.
        cuts = sorted((rng.randrange(len(text) + 1) for _ in items), reverse=True)
        for (kind, value), cut in zip(items, cuts):  # each between words (en) or characters (zh) of the real text
            sep = " " if words is not None else "，"
            connector = {"email": "contact", "ip": "address", "phone": "call", "id": "ID", "card": "card"}[kind]
            phrase = f"{connector} {value}" if words is not None else f"{ {'email': '邮箱', 'ip': '地址', 'phone': '电话', 'id': '身份证号', 'card': '卡号'}[kind]}：{value}"
            if words is not None:
                words.insert(rng.randrange(len(words) + 1), phrase)
            else:
                text = text[:cut] + sep + phrase + sep + text[cut:]
        docs.append({"id": f"d{i:03d}", "text": " ".join(words) if words is not None else text})
        planted[f"d{i:03d}"] = items
    with open(tmp_path / "docs.jsonl", "w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    (tmp_path / "recipe.yaml").write_text("name: pii\ninput: {paths: [docs.jsonl]}\nstages:\n  - pii: {mode: redact}\n")
    stats = run_recipe(load_recipe(str(tmp_path / "recipe.yaml")), str(tmp_path / "out"))
    assert stats["ledger_ok"] and stats["kept"] == len(docs)
    kept = {r["id"]: r for f in sorted((tmp_path / "out" / "kept").glob("*.parquet")) for r in pq.read_table(f).to_pylist()}
    tokens = {"email": "<EMAIL>", "ip": "<IP>", "phone": "<PHONE>", "id": "<ID>", "card": "<CARD>"}
    for doc_id, items in planted.items():
        row = kept[doc_id]
        for kind, value in items:
            assert value not in row["text"], (doc_id, kind, value)
            assert tokens[kind] in row["text"]
        expected = {k: sum(1 for kind, _ in items if kind == k) for k in tokens}
        # The real text may hold PII of its own (a maintainer's e-mail): at least the planted ones.
        assert all(row["pii_counts"][k] >= n for k, n in expected.items()), (doc_id, row["pii_counts"])
    tally = stats["tallies"]["pii_counts"]
    assert tally["id"] == tally["card"] == len(docs) and tally["phone"] == 2 * len(docs)
    assert tally == {k: sum(r["pii_counts"][k] for r in kept.values()) for k in tally if tally[k]}


# What the dev data holds that must never be redacted.
_VERSION = re.compile(r"(?<![\w.])v?\d+(?:\.\d+){1,4}(?:[-+~][\w.]+)?(?![\w])")
_DATE = re.compile(r"\b(?:19|20)\d\d[-/.](?:0?[1-9]|1[0-2])[-/.](?:0?[1-9]|[12]\d|3[01])\b|(?:19|20)\d\d年\d{1,2}月(?:\d{1,2}日)?")
_HASH = re.compile(r"\b[0-9a-fA-F]{7,64}\b")
_CODE_LINE = re.compile(r"^\s*(?:\$ |# |>>> |\w+\(|[{}]|import |def |sudo )", re.M)


def _dev_texts(shared_data: Path) -> list[str]:
    texts = _paragraphs(shared_data / "prose-en.txt", 1, 10**9) + _paragraphs(shared_data / "prose-zh.txt", 1, 10**9)
    for name in ("langid-dev.jsonl", "relevance-dev.jsonl"):
        texts += [json.loads(line)["text"] for line in (shared_data / name).read_text(encoding="utf-8").splitlines()]
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in sorted((shared_data / "html-dev").iterdir())]
    return texts


def test_dev_data_versions_dates_hashes_and_code_survive(shared_data):
    finder = PiiFinder()
    found: dict[str, set[str]] = {}
    protected = 0
    for text in _dev_texts(shared_data):
        spans = finder.find(text)
        for start, end, kind in spans:
            found.setdefault(kind, set()).add(text[start:end])
        for pattern in (_VERSION, _DATE, _HASH):
            for m in pattern.finditer(text):
                protected += 1
                assert not any(s < m.end() and m.start() < e for s, e, _ in spans
                               if not (s <= m.start() and m.end() <= e and kind_is_address(text[s:e]))), \
                    (m.group(0), [text[s:e] for s, e, _ in spans if s < m.end() and m.start() < e])
        for m in _CODE_LINE.finditer(text):
            line = text[m.start():text.find("\n", m.start()) if "\n" in text[m.start():] else len(text)]
            redacted = [text[s:e] for s, e, k in spans if m.start() <= s < m.start() + len(line) and k != "email"]
            assert not redacted or all(kind_is_address(r) for r in redacted), (line, redacted)
    assert protected > 10_000  # the dev data really holds versions, dates and hashes to protect
    # The dev data (Debian, PostgreSQL, Python docs) holds no phones, identity or card numbers; its IP
    # addresses are the real ones its network examples show, nothing else.
    assert set(found) <= {"email", "ip"}
    assert found["ip"] == {"193.8.232.2", "193.8.232.7", "100.50.200.5", "123.45.67.89", "213.244.11.247",
                           "128.6.4.194", "8.8.8.8", "2001:0bc8:31a0::", "130.89.148.77", "149.20.4.15",
                           "2603:400a:ffff:bb8::801f:3e",
                           "5aef:2b::8"}  # the socket docs' example of an address: public, three groups written
    assert all("@" in e and not e.endswith((".service", ".png")) for e in found["email"])


def kind_is_address(value: str) -> bool:
    """A dotted quad or IPv6 the finder took as an address (an IP overlapping the version pattern)."""
    return value.count(".") == 3 or ":" in value


@pytest.mark.parametrize("text", [
    "version 1.2.3.4 released", "Section 9.2.1.4 explains", "见第 6.3.1.1 节", "private 192.168.1.10 and 10.0.0.7",
    "loopback 127.0.0.1", "documentation 2001:db8::1 and fe80::1 and ::1", "std::vector<int> a; dead::beef",
    "ID 110101199003077776 (bad check digit)", "ID 110101199002307778 (no Feb 30)", "card 4111 1111 1111 1112",
    "total 13000000000 items", "price ¥13812345678", "13812345678元", "order 138123456789 done",
    "timestamp 1701234567890 ms", "ISBN 9787111213826", "range (-33554432, +33554432)", "INT_MAX is +2147483647",
    "sha 3f786850e387550fdab836ed7e6dc881de23001b", "commit 4067a74", "icon@2x.png getty@tty1.service",
    "2024-03-15 and 2024年3月15日", "uuid 123e4567-e89b-12d3-a456-426614174000",
])
def test_look_alikes_are_not_pii(text):
    assert PiiFinder().find(text) == []


def test_validators():
    assert valid_resident_id("11010519491231002X")  # the standard's published example
    assert not valid_resident_id("110105194912310021")
    assert not valid_resident_id("99010519491231002X")  # no province 99
    assert _card_digits_ok("4539148803436467") and not _card_digits_ok("4539148803436468")
    assert not _card_digits_ok("0000000000000000") and not _card_digits_ok("4444444444444448")


def test_fast_validators_agree_with_their_definitions():
    """The arithmetic shortcuts (IPv6 read without ipaddress objects, identity numbers parsed once,
    Luhn as byte sums, the issuer table, the first look before the version/section words) give the
    answers of the definitions they stand for, on random and hostile strings."""
    rng = random.Random(11)
    alphabet = "0123456789abcdefABCDEF::::...%/g "
    for _ in range(20000):
        if rng.random() < 0.5:
            s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 42)))
        else:
            addr = ipaddress.IPv6Address(rng.getrandbits(128) >> rng.choice([0, 16, 64, 96, 112]))
            s = rng.choice([str(addr), addr.exploded, str(addr).upper()])
            cut = rng.randrange(len(s))
            s = s if rng.random() < 0.5 else s[:cut] + rng.choice(alphabet) + s[cut + rng.randrange(3):]
        try:
            expected = int(ipaddress.IPv6Address(s))
        except ValueError:
            expected = None
        assert _v6_value(s) == expected, s
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 22)))
        card = (12 <= len(digits) <= 19 and _issuer(digits) is not None and (len(digits) >= 13 or _issuer(digits) == "maestro")
                and len(set(digits[:-1])) > 1 and _luhn_ok(digits))
        assert _card_digits_ok(digits) == card, digits
        first17 = digits.ljust(17, "7")[:17]
        assert id_check_char(first17) == "10X98765432"[sum(int(d) * (2 ** (17 - i) % 11) for i, d in enumerate(first17)) % 11]
    for prefix in range(10000):
        four = f"{prefix:04d}"
        assert _ISSUER_OF[prefix] == _issuer(four), four
    words = ["version", "Build", "v", "版本", "Sect.", "sec.", "Ch.", "art.", "fig.", "§", "第", "参阅", "條", "IP", "地址", "ſection", "ıtem"]
    for _ in range(20000):
        before = "".join(rng.choice(words) + rng.choice(["", " ", ".", ":", "=", " : ", "\u3000", "x"]) for _ in range(3))
        text = before + "8.8.8.8"
        if _NUMBERING_BEFORE.search(text, max(0, len(before) - 12), len(before)):
            assert _numbering_may_end(text, len(before)), before


def test_tag_mode_spans_and_reject_mode():
    text = "写信到 li.wei@qq.com 或致电 13812345678，服务器 8.8.4.4 (DNS)。"
    tagged = PiiStage(mode="tag").process(Document("t", text))
    assert tagged.text == text
    spans = tagged.annotations["pii_spans"]
    assert [(s["type"], text[s["start"]:s["end"]]) for s in spans] == [
        ("email", "li.wei@qq.com"), ("phone", "13812345678"), ("ip", "8.8.4.4")]
    assert PiiStage().process(Document("r", text)).text == "写信到 <EMAIL> 或致电 <PHONE>，服务器 <IP> (DNS)。"
    rejected = PiiStage(mode="reject").process(Document("x", text))
    assert isinstance(rejected, Rejected) and rejected.reason == "pii" and rejected.detail == "email 1, ip 1, phone 1"
    only = PiiStage(types=["phone"]).process(Document("o", text))
    assert "li.wei@qq.com" in only.text and "<PHONE>" in only.text
    clean = PiiStage(mode="reject").process(Document("c", "nothing personal here, version 2.6.38.6"))
    assert isinstance(clean, Document) and clean.annotations["pii_counts"] == dict.fromkeys(
        ["email", "ip", "phone", "id", "card"], 0)


def test_planted_at_random_places_of_the_dev_data_are_found_as_written(shared_data):
    """Each planted item, between a boundary of either script (a Chinese or full-width character,
    punctuation, a line end) and the real text around it, is found with exactly its own span."""
    rng = random.Random(11)
    finder = PiiFinder()
    before, after = [" ", "(", "：", "\n", "，", "号", "「", "是"], [" ", ")", "。", ". ", "，", "」", "或", "\n"]
    planted = 0
    for text in [t[:20_000] for t in _dev_texts(shared_data)[::7]]:
        kind, value = rng.choice(_planted(rng))
        cut = rng.randrange(len(text) + 1)
        text = text[:cut] + rng.choice(before) + value + rng.choice(after) + text[cut:]
        start = cut + 1
        assert (start, start + len(value), kind) in finder.find(text), (kind, value, text[start - 20:start + len(value) + 20])
        planted += 1
    assert planted > 50


# 1 MB each: shapes that once cost time quadratic in their length.  The first hold no item: they may
# cost at most 10x prose.  In the others an item to validate (and redact) comes every 4-19
# characters, or (spaced digits) every digit starts an attempt of the digit shapes, so their cost is
# per item, not per character: at most 30x prose (measured: 6-21x compiled, 15-27x pure Python).
_HOSTILE = {
    "digits": (10, lambda rng: "".join(rng.choice("0123456789") for _ in range(1 << 20))),
    "dotted": (10, lambda rng: ".".join("1" for _ in range(1 << 19))),
    "arabic_indic_digits": (10, lambda rng: "".join(rng.choice("٠١٢٣٤٥٦٧٨٩") for _ in range(1 << 20))),
    "colons_and_hex": (10, lambda rng: ":".join(rng.choice(["1", "a", "ff", ""]) for _ in range(1 << 19))),
    "spaced_digits": (30, lambda rng: " ".join(rng.choice("0123456789") for _ in range(1 << 19))),
    "at_signs": (30, lambda rng: "@".join("a.b" for _ in range(1 << 18))),
    "phone_dense": (30, lambda rng: "".join(f"电话1{rng.choice('3456789')}{rng.randrange(10**9):09d}，" for _ in range(1 << 16))),
    "id_dense": (30, lambda rng: "".join(_resident_id(rng) + " " for _ in range(1 << 16))),
}


def _cpu(text: str) -> float:
    import time

    stage = PiiStage(mode="redact")
    t = time.process_time()
    stage.process(Document("x", text))
    return time.process_time() - t


def test_cost_is_linear_in_the_text_whatever_it_holds(shared_data):
    """Each hostile shape of 1 MB costs at most a small multiple of 1 MB of real prose (a ratio of
    work measured in this test; the bounds at _HOSTILE), and 2 MB of it at most ~2x its 1 MB (no
    quadratic term)."""
    rng = random.Random(5)
    prose = (shared_data / "prose-en.txt").read_text(encoding="utf-8") + (shared_data / "prose-zh.txt").read_text(encoding="utf-8")
    prose = (prose * (1 + (1 << 20) // len(prose)))[: 1 << 20]
    base = min(_cpu(prose) for _ in range(3))
    ratios = {}
    for name, (bound, make) in _HOSTILE.items():
        text = make(rng)[: 1 << 20]
        one = min(_cpu(text) for _ in range(2))
        two = min(_cpu(text + text) for _ in range(2))
        ratios[name] = round(one / base, 1)
        assert two <= 3 * one + 0.05, (name, one, two)
    print(base, ratios)
    assert all(ratios[name] <= bound for name, (bound, _) in _HOSTILE.items()), (base, ratios)


# The examples docs/pii.md gives, each as it is written there.
@pytest.mark.parametrize("text, value, kind", [
    ("请拨打13912345678咨询", "13912345678", "phone"), ("邮箱zhang.wei@example.cn或", "zhang.wei@example.cn", "email"),
    ("身份证号11010519491231002X，", "11010519491231002X", "id"), ("地址：2606:4700:4700::1111。", "2606:4700:4700::1111", "ip"),
    ("请拨打１３９１２３４５６７８咨询", "１３９１２３４５６７８", "phone"), ("ＺＨＡＮＧ＠ＥＸＡＭＰＬＥ．ＣＮ", "ＺＨＡＮＧ＠ＥＸＡＭＰＬＥ．ＣＮ", "email"),
    ("13812345678@qq.com", "13812345678@qq.com", "email"), ("li.wei+news@mail.example.org", "li.wei+news@mail.example.org", "email"),
    ("IP 8.8.8.8.", "8.8.8.8", "ip"), ("服务器 123.45.67.89", "123.45.67.89", "ip"), ("202.96.128.86，", "202.96.128.86", "ip"),
    ("2606:4700:4700::1111.", "2606:4700:4700::1111", "ip"), ("[2001:4860:4860::8888]:53", "2001:4860:4860::8888", "ip"),
    ("DNS 8.8.4.4", "8.8.4.4", "ip"), ("5aef:2b::8", "5aef:2b::8", "ip"), ("::ffff:8.8.8.8", "::ffff:8.8.8.8", "ip"),
    *((t, t, "phone") for t in ["13812345678", "138 1234 5678", "138-1234-5678", "+86 138 1234 5678", "0086 13812345678",
                                "010-12345678", "(0755) 1234 5678", "0755-12345678", "020 7946 0958", "010-12345678-8001",
                                "(415) 555-0132", "415.555.0132", "415-555-0132", "1-800-555-0199", "415-555-0132x123",
                                "+1 415 555 0132", "+44 20 7946 0958", "+49 30 901820", "+33 1 23 45 67 89", "001-415-555-0132",
                                "（0755）1234 5678", "１３８　1234　5678"]),
    ("call 4155550132", "4155550132", "phone"),
    *((t, t, "card") for t in ["4111 1111 1111 1111", "4111-1111-1111-1111", "5555 5555 5555 4444", "3782 822463 10005",
                               "378282246310005", "6212345678901232"]),
])
def test_documented_examples_are_found(text, value, kind):
    start = text.index(value)
    assert PiiFinder().find(text) == [(start, start + len(value), kind)]


@pytest.mark.parametrize("text", [
    "abc13912345678", "13912345678abc", "icon@2x.png", "logo@3x.jpg", "avatar@1.5x.webp", "user@localhost", "pkg@1.2.3",
    "Section 11.6.7.10", "§ 4.2.1.3", "第3.2.1.4节", "见节 9.2.1.1 服务器", "v1.2.3.4", "version 10.0.19041.1",
    "Release 2.6.38.6", "1.2.3.4.5", "1.3.6.1.4.1", "9.2.1.4", "6.2.4. 邮件传输代理 6.2.4.1. exim4 的配置 6.2.4.2. 地址",
    "192.168.1.10", "2001:db8::1", "fe80::1%eth0", "::1", "std::vector", "dead::beef", "138123456789", "¥13812345678",
    "13812345678元", "13000000000", "+2147483647", "订单号：4111111111111111", "ISBN 9787111213826", "4111 1111 1111 1112",
    "0000 0000 0000 0000", "4444 4444 4444 4448", "1701234567890", "110101199003077776", "110101199002307778",
    '"john doe"@example.com', "张伟@例子.中国", "4155550132",
])
def test_documented_examples_are_kept(text):
    assert PiiFinder().find(text) == []
