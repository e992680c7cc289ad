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


def _pure_python_finder(monkeypatch, types=PII_TYPES) -> PiiFinder:
    monkeypatch.setattr(pii_kinds, "_kernels", False)  # what import_compiled answers without numba
    finder = PiiFinder(types)
    monkeypatch.undo()
    return finder


def test_runs_and_first_candidates_are_sound():
    """Every _HINT run that passes the gate and where the number pattern matches is reported, at or
    before the regex's first match; every reported run is a _HINT run."""
    rng = random.Random(11)
    for types in (PII_TYPES, ("ip",), ("phone",), ("card", "id")):
        finder = PiiFinder(types)
        assert finder._kernels, "numba is installed: the compiled path must be the one in use"
        for text in map(normalise, _fuzz(rng, 1500)):
            out = pii_kernels.np.empty(len(text) // 7 * 3 + 3, pii_kernels.np.int64)
            rows = pii_kernels.first_candidates(pii_kernels.code_points(text), finder._shape_bits, finder._gate[0], out)
            got = {(q, j): p for q, j, p in out[:3 * rows].reshape(-1, 3).tolist()}
            runs = {run.span() for run in pii_kinds._HINT.finditer(text)}
            assert set(got) <= runs, text
            for q, j in runs:
                m = finder._number.search(text, q, j + 16) if pii_kinds._open(text, q, j, finder._gate) else None
                if m and m.start() < j:
                    assert (q, j) in got and got[q, j] <= m.start(), (text, q, j, m, got.get((q, j)))


def test_compiled_and_pure_python_paths_find_the_same_spans(monkeypatch, shared_data):
    texts = _fuzz(random.Random(12), 3000)
    for seed in (101, 303):
        texts += [text for text, _ in Generator(seed, shared_data if seed != 303 else None).corpus(300)]
    texts += [p for p in (shared_data / "prose-zh.txt").read_text(encoding="utf-8")[:400_000].split("\n\n") if p.strip()]
    for types in (PII_TYPES, ("phone",), ("ip", "card")):
        compiled, pure = PiiFinder(types), _pure_python_finder(monkeypatch, types)
        assert compiled._kernels and not pure._kernels
        for text in texts:
            assert compiled.find(text) == pure.find(text), text
