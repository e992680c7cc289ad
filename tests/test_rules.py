"""Heuristic quality rules on real zh and en documentation, and on junk they must catch."""
import json
from pathlib import Path

import pytest

from dsdata.document import Document, Rejected
from dsdata.stages import StageConfigError
from dsdata.stages.rules import QualityRulesStage, cjk_ratio, words

SAMPLES = Path(__file__).resolve().parents[1] / "pipelines" / "samples" / "docs.jsonl"


def _samples(lang):
    recs = [json.loads(line) for line in SAMPLES.read_text(encoding="utf-8").splitlines()]
    return sorted((r for r in recs if r["lang_label"] == lang), key=lambda r: -len(r["text"]))


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_real_articles_pass(lang):
    stage = QualityRulesStage()
    docs = _samples(lang)
    results = [stage.process(Document(r["id"], r["text"])) for r in docs]
    # Every one of the 20 longest real articles passes, and nearly all of the rest.
    assert not [r for r in results[:20] if isinstance(r, Rejected)]
    kept = sum(not isinstance(r, Rejected) for r in results)
    assert kept / len(results) >= 0.9


def test_chinese_article_on_shared_prose(shared_data):
    stage = QualityRulesStage()
    docs = [d for d in (shared_data / "prose-zh.txt").read_text(encoding="utf-8").split("\n\n") if len(d) > 1500][:60]
    results = [stage.process(Document(str(i), d)) for i, d in enumerate(docs)]
    kept = sum(not isinstance(r, Rejected) for r in results)
    assert len(docs) >= 20 and kept / len(docs) >= 0.8, [getattr(r, "reason", "") for r in results]


def test_cjk_word_model():
    assert words("安装 Debian 系统。") == ["安", "装", "Debian", "系", "统", "。"]
    assert cjk_ratio("安装 Debian 系统") == pytest.approx(4 / 10)


def _reason(text, **params):
    result = QualityRulesStage(**params).process(Document("d", text))
    return result.reason if isinstance(result, Rejected) else None


ARTICLE = _samples("en")[0]["text"] if SAMPLES.exists() else ""


def test_junk_is_rejected_with_named_rules():
    assert _reason("Too short. Really. Yes.") == "gopher_min_words"
    assert _reason("Buy the cheap pills and go to the shop now. " * 200).startswith(("gopher_top_", "gopher_dup_"))
    assert _reason(ARTICLE + "\nLorem ipsum dolor sit amet.") == "c4_lorem_ipsum"
    zh_spam = "点击这里免费下载最新电影。" * 80
    assert _reason(zh_spam).startswith(("gopher_", "fineweb_"))
    lines = "\n".join(f"item {i}" for i in range(300))
    assert _reason(lines + "\nThe end of the list is here. It has a sentence. And another one.") is not None


def test_policy_lines_are_removed_not_the_page():
    stage = QualityRulesStage()
    text = ARTICLE + "\nThis site uses cookies to improve your experience."
    result = stage.process(Document("d", text))
    assert not isinstance(result, Rejected)
    assert "uses cookies" not in result.text


def test_rules_switch_off_and_validate():
    assert _reason("Too short. Really. Yes.", min_words=None, c4_min_sentences=None, min_stop_words=None,
                   fineweb_max_short_line_ratio=None, min_mean_word_length=None,
                   top_ngram_max_ratio=None, dup_ngram_max_ratio=None) is None
    with pytest.raises(StageConfigError, match="top_ngram_max_ratio"):
        QualityRulesStage(top_ngram_max_ratio=[0.2])
