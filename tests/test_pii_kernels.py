"""pii's compiled first look (dsdata/stages/pii_kernels.py, real numba) against the pure-Python path
it stands in for: the same runs, never a run or a position skipped where the regex matches, and the
same spans on planted documents, dev data and fuzzed text."""
from __future__ import annotations

import random

import pytest

pytest.importorskip("numba")

from dsdata.stages import pii_kernels, pii_kinds  # noqa: E402
from dsdata.stages.pii_kinds import PII_TYPES, PiiFinder, normalise  # noqa: E402
from pii_planted import Generator  # noqa: E402

_PIECES = [*"0123456789", *"０１２３４５６７８９", *" -.:()+@#x", *"－．：（）＋＠　\u2013\u00a0", "中文", "电话", "请拨打", "abc", "X",
           "ext.", "转", "+86 ", "0086", "IP ", "version ", "Section ", "ISBN ", "$", "元", "a@b.com", "::", "2001:db8::1"]


def _fuzz(rng: random.Random, count: int) -> list[str]:
    """Random strings of digits (ASCII and full-width), separators, CJK and Latin, with long digit
    groups among them."""
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.35:
                parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20))))
            else:
                parts.append(rng.choice(_PIECES))
        texts.append("".join(parts))
    return texts


def _finder(types=PII_TYPES) -> PiiFinder:
    finder = PiiFinder(types)
    assert finder._load_kernels(), "numba is installed: the compiled path must be the one in use"
    return finder


def _pure_python_finder(monkeypatch, types=PII_TYPES) -> PiiFinder:
    monkeypatch.setenv("DSDATA_NO_NUMBA", "1")  # the switch to the pure-Python path
    finder = PiiFinder(types)
    assert finder._load_kernels() is False
    monkeypatch.undo()
    return finder


def test_no_position_where_the_regex_matches_is_called_hopeless():
    """_may_start is sound: wherever the number pattern matches (as the stage's search reads it, 16
    characters past the run), it says a shape may start."""
    rng = random.Random(11)
    matches = 0
    for types in (PII_TYPES, ("ip",), ("phone",), ("card", "id")):
        finder = _finder(types)
        for text in map(normalise, _fuzz(rng, 1500)):
            points = pii_kernels.code_points(text)
            for run in pii_kinds._HINT.finditer(text):
                end = min(len(text), run.end() + 16)
                for p in range(run.start(), run.end()):
                    if finder._number.match(text, p, end):
                        matches += 1
                        assert pii_kernels._may_start(points, p, end, finder._shape_bits), (text, p, types)
    assert matches > 1000


def test_the_kernels_tables_are_the_stages():
    assert pii_kinds._LABEL_WORDS.pattern == "|".join(pii_kernels.LABEL_WORDS)
    assert "|".join(pii_kernels.MONEY_CODES).upper() in pii_kinds._MONEY_BEFORE.pattern
    assert tuple(pii_kernels._ID_WEIGHTS) == pii_kinds._ID_WEIGHTS and bytes(pii_kernels._ID_CHECK.astype("u1")) == pii_kinds._ID_CHECK.encode()
    assert tuple(pii_kernels._MONTH_DAYS) == pii_kinds._MONTH_DAYS
    assert frozenset(pii_kernels.NUMBERING_LAST) == pii_kinds._NUMBERING_LAST
    assert f"[{pii_kernels.SECTION_SIGNS}]" in pii_kinds._SECTION_AFTER.pattern


def test_compiled_and_pure_python_paths_find_the_same_spans(monkeypatch, shared_data):
    texts = _fuzz(random.Random(12), 3000)
    for seed in (101, 303):
        texts += [text for text, _ in Generator(seed, shared_data if seed != 303 else None).corpus(300)]
    texts += [p for p in (shared_data / "prose-zh.txt").read_text(encoding="utf-8")[:400_000].split("\n\n") if p.strip()]
    vouched = 0
    for types in (PII_TYPES, ("phone",), ("ip", "card"), ("id",)):
        compiled, pure = _finder(types), _pure_python_finder(monkeypatch, types)
        for text in texts:
            assert compiled.find(text) == pure.find(text), text
            norm = normalise(text)
            out = pii_kernels.np.empty(len(norm) // 7 * 3 + 3, pii_kernels.np.int64)
            rows = pii_kernels.first_candidates(pii_kernels.code_points(norm), compiled._shape_bits, compiled._gate[0],
                                                compiled._tables, out)
            vouched += sum(1 for code in out[:3 * rows:3] if code)
    assert vouched > 500  # the items the kernel reads in full are among those compared
