"""pii on held-out style documents (tests/pii_planted.py): personal data made by Faker and by
independent template families, planted in running English and Chinese text in many surroundings
(no space, CJK punctuation, full-width forms, brackets, quotes, line starts and ends, before '.',
after '：'), among hard negatives.  Span-level recall per kind and language, precision against the
negatives."""
from __future__ import annotations

import json

import pytest

from dsdata.stages.pii_kinds import PiiFinder
from pii_planted import KINDS, SANITY, Generator, score


def _check(result: dict) -> None:
    print(json.dumps(result, ensure_ascii=False))
    assert result["recall"] >= 0.95, result
    for kind in KINDS:
        for lang in ("en", "zh"):
            assert result["recall_per_kind"][f"{kind}/{lang}"] >= 0.90, (kind, lang, result)
    assert result["precision"] >= 0.98, result


@pytest.mark.parametrize("seed", [101, 202])
def test_planted_in_real_paragraphs(seed, shared_data):
    corpus = Generator(seed, shared_data).corpus(500)
    _check(score(corpus, PiiFinder().find))


def test_planted_in_faker_text_without_shared_data():
    """The same without ../shared/data: Faker's own paragraphs host the items."""
    corpus = Generator(303, None).corpus(400)
    _check(score(corpus, PiiFinder().find))


def test_sanity_families_written_after_the_detector(shared_data):
    """The template families written after the detector was finished, scored on their own."""
    corpus = Generator(404, shared_data).corpus(800)
    kept = [(text, [p for p in planted if p.family in SANITY or p.kind is None]) for text, planted in corpus]
    result = score(kept, PiiFinder().find)
    print(json.dumps(result, ensure_ascii=False))
    assert result["planted"] > 100 and result["recall"] >= 0.95 and result["precision"] >= 0.98, result
