"""A JSON line nested past Python's recursion limit (json.loads raises RecursionError, which is no
ValueError) is one clear line in every reader of a JSON file a user hands dsdata, never a traceback:
labelled data, tokenizer corpora, n-gram corpora, augment dictionaries and a run's own stats.json
that `dsdata report` reads back."""
import json

import pytest

DEEP = "[" * 100_000 + "]" * 100_000


def test_labelled_data_with_a_deep_line_is_one_line(tmp_path):
    from dsdata.relevance.data import LabelledDataError, load_labelled

    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps({"text": "fine", "label": 1}) + "\n" + DEEP + "\n")
    with pytest.raises(LabelledDataError, match=r"labels.jsonl:2: not valid JSON") as info:
        load_labelled(str(path))
    assert "\n" not in str(info.value)


def test_a_tokenizer_corpus_with_a_deep_line_is_one_line(tmp_path):
    from dsdata.tokenizer import TokenizerError, iter_training_texts

    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"text": "fine"}) + "\n" + DEEP + "\n")
    with pytest.raises(TokenizerError, match=r"corpus.jsonl:2: not a JSON record"):
        list(iter_training_texts([str(path)]))


def test_an_lm_corpus_with_a_deep_line_is_one_line(tmp_path):
    from dsdata.lm.training import CorpusReader, TrainingError

    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"text": "fine", "lang": "en"}) + "\n" + DEEP + "\n")
    with pytest.raises(TrainingError, match=r"corpus.jsonl:2: not a JSON object"):
        list(CorpusReader(str(path), "en"))


def test_a_report_over_a_deep_stats_json_is_one_line(tmp_path):
    from dsdata.report.page import build_html

    (tmp_path / "stats.json").write_text(DEEP)
    with pytest.raises(ValueError, match=r"stats.json is not a JSON file dsdata wrote") as info:
        build_html(str(tmp_path))
    assert "\n" not in str(info.value)
