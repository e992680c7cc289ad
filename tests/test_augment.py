"""Unit tests of the augment stage's parts: chrF, sentence layout, language guess, selection,
dictionaries, model resolution and seeded decoding with a tiny random MarianMT model."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsdata.augment.language import document_language, guess_script_language, normalize_lang
from dsdata.augment.records import augmented_copy, derived_id, is_selected
from dsdata.augment.replace import EntityReplacer, SynonymReplacer
from dsdata.augment.sentences import split_sentences
from dsdata.augment.similarity import chrf
from benchmarks.tiny_models import build_tiny_marian
from dsdata.augment.translate import GenerationSettings, ModelNotFoundError, Seq2SeqTranslator, resolve_model_dir
from dsdata.document import Document
from dsdata.stages.augment import AugmentStage
from dsdata.stages.base import StageConfigError


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return build_tiny_marian(str(tmp_path_factory.mktemp("marian") / "m"), seed=3)


# --- chrF -------------------------------------------------------------------------------------

def test_chrf_matches_sacrebleu_published_value():
    # The sentence-level chrF example from the sacreBLEU / HF `chrf` metric card: 61.576379378113785.
    hyp = "The relationship between Obama and Netanyahu is not exactly friendly."
    ref = "The ties between Obama and Netanyahu are not particularly friendly."
    assert chrf(hyp, ref) * 100 == pytest.approx(61.576379378113785, abs=1e-9)


def test_chrf_bounds_and_whitespace():
    assert chrf("数据模型很小。", "数据模型很小。") == 1.0
    assert chrf("abc def", "abcdef") == 1.0  # whitespace is ignored, as in sacreBLEU
    assert chrf("xyz", "abc") == 0.0
    assert chrf("", "abc") == 0.0
    assert 0.0 < chrf("数据模型很大。", "数据模型很小。") < 1.0


# --- sentence layout --------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab .!?\n。！？，,;你好 ")), max_size=120), st.integers(20, 60))
def test_layout_reassembles_exactly(text, max_chars):
    layout = split_sentences(text, max_chars)
    assert len(layout.separators) == len(layout.sentences) + 1
    assert layout.join(layout.sentences) == text
    assert all(0 < len(s) <= max_chars for s in layout.sentences)
    assert all(s == s.strip() for s in layout.sentences)


def test_sentence_boundaries_zh_and_en():
    zh = split_sentences("今天天气很好。我们去公园吧！你呢？好的")
    assert zh.sentences == ["今天天气很好。", "我们去公园吧！", "你呢？", "好的"]
    en = split_sentences("Dr. Smith ran 3.14 km. Then he stopped!\n\n----\nNext line")
    assert en.sentences == ["Dr. Smith ran 3.14 km.", "Then he stopped!", "Next line"]
    assert en.separators == ["", " ", "\n\n----\n", ""]
    assert en.join(["A.", "B!", "C"]) == "A. B!\n\n----\nC"
    listed = split_sentences("* First item.\n1. Second item\n> Quoted line")
    assert listed.sentences == ["First item.", "Second item", "Quoted line"]  # markers stay untranslated


def test_long_sentences_are_cut_at_clause_marks():
    text = "第一部分的内容很长，第二部分的内容也很长；第三部分的内容同样很长。"
    layout = split_sentences(text, max_chars=25)
    assert layout.sentences == ["第一部分的内容很长，第二部分的内容也很长；", "第三部分的内容同样很长。"]
    words = split_sentences("word " * 40, max_chars=30)
    assert all(len(s) <= 30 for s in words.sentences) and words.join(words.sentences) == "word " * 40


# --- language ---------------------------------------------------------------------------------

def test_language_guess_and_annotation_precedence():
    assert guess_script_language("这是一个用于测试的中文句子。") == "zh"
    assert guess_script_language("The file is opened and the data are read from it.") == "en"
    assert guess_script_language("Le chat est sur la table avec le chien.") is None
    assert guess_script_language("これは日本語の文です。漢字もあります。") is None
    assert guess_script_language("12345 ---") is None
    assert normalize_lang("zh-Hant") == "zh" and normalize_lang("EN_us") == "en" and normalize_lang("") is None
    doc = Document("x", "The file is opened and the data are read.", annotations={"lang": "zh_CN"})
    assert document_language(doc) == "zh"  # the lang stage's annotation wins over the script


def test_language_guess_on_real_paragraphs(shared_data):
    data = shared_data / "langid-dev.jsonl"
    hits = {"zh": [0, 0], "en": [0, 0], "other": [0, 0]}
    with open(data, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            label = row["lang"] if row["lang"] in ("zh", "en") else "other"
            guess = guess_script_language(row["text"]) or "other"
            hits[label][0] += guess == label
            hits[label][1] += 1
    assert hits["zh"][0] / hits["zh"][1] > 0.97
    assert hits["en"][0] / hits["en"][1] > 0.95
    assert hits["other"][0] / hits["other"][1] > 0.98  # few other-language paragraphs pass as en


# --- selection and records --------------------------------------------------------------------

def test_selection_is_seeded_and_proportional():
    ids = [f"doc-{i}" for i in range(20000)]
    chosen = [i for i in ids if is_selected(7, "back_translation", i, 0.3)]
    assert 0.28 < len(chosen) / len(ids) < 0.32
    assert chosen == [i for i in ids if is_selected(7, "back_translation", i, 0.3)]
    assert chosen != [i for i in ids if is_selected(8, "back_translation", i, 0.3)]
    assert all(is_selected(0, "synonym", i, 1.0) for i in ids[:100])
    assert not any(is_selected(0, "synonym", i, 0.0) for i in ids[:100])


def test_augmented_copy_records_its_source():
    doc = Document("a1", "text", metadata={"src": "x"}, annotations={"lang": "en"})
    copy = augmented_copy(doc, "synonym", "new text", 0.5)
    assert copy.id == derived_id("a1", "synonym") == "a1#syn"
    assert copy.derived_from == "a1"
    assert copy.annotations == {"lang": "en", "augmentation": "synonym", "source_id": "a1",
                                "derived_by": "augment", "augment_similarity": 0.5}
    assert doc.annotations == {"lang": "en"}  # the original is untouched


# --- dictionaries -----------------------------------------------------------------------------

def test_synonyms_whole_words_case_and_chinese(tmp_path):
    path = tmp_path / "syn.tsv"
    path.write_text("# comment\nquick\tfast\nbig\tlarge\n快\t迅速\n", encoding="utf-8")
    import random

    out = SynonymReplacer(str(path)).apply("The Quick fox is quicker, BIG big 很快的车", random.Random(0), 1.0)
    assert out.text == "The Fast fox is quicker, LARGE large 很迅速的车"
    assert out.replaced == 4
    none = SynonymReplacer(str(path)).apply("The Quick fox", random.Random(0), 0.0)
    assert none.text == "The Quick fox" and none.replaced == 0


def test_entities_swap_consistently_within_type(tmp_path):
    import random

    path = tmp_path / "ent.json"
    path.write_text(json.dumps({"PERSON": ["Alice", "Bob"], "CITY": ["Paris", "北京"]}), encoding="utf-8")
    out = EntityReplacer(str(path)).apply("Alice met Bob in Paris. Alice left Paris. Alicette stayed.", random.Random(0), 1.0)
    assert out.text == "Bob met Alice in 北京. Bob left 北京. Alicette stayed."
    assert out.replaced == 5


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.tsv", "quick fast\n", "line 1: expected KEY<TAB>VALUE"),
        ("bad.json", "{not json", "is not valid JSON"),
        ("list.json", "[1, 2]", "must hold a JSON object"),
    ],
)
def test_bad_dictionaries_name_the_file(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(StageConfigError, match=message) as info:
        AugmentStage(method="synonym", synonyms=str(path))
    assert name in str(info.value) and "augment.synonyms" in str(info.value)
    with pytest.raises(StageConfigError, match="needs a dictionary file"):
        AugmentStage(method="entity")


# --- parameters and model resolution ----------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "paraphrase"}, "augment.method: unknown"),
        ({"fraction": 1.5}, "augment.fraction"),
        ({"min_sim": 0.8, "max_sim": 0.2}, "min_sim 0.8 is above max_sim"),
        ({"languages": ["fr"]}, "augment.languages"),
        ({"num_beams": 0}, "augment.num_beams"),
    ],
)
def test_bad_parameters(kwargs, message, tiny_model):
    kwargs = {"model_en_zh": tiny_model, "model_zh_en": tiny_model, **kwargs}
    with pytest.raises(StageConfigError, match=message):
        AugmentStage(**kwargs)


def test_generate_kwargs_take_only_plain_search_settings(tiny_model, tmp_path):
    # transformers' generate() imports custom_generate/generate.py from a folder the kwargs name
    # (with trust_remote_code): a recipe must not reach that, nor any other non-setting argument.
    code_dir = tmp_path / "evil" / "custom_generate"
    code_dir.mkdir(parents=True)
    marker = tmp_path / "RAN"
    (code_dir / "generate.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    models = {"model_en_zh": tiny_model, "model_zh_en": tiny_model}
    for bad, message in [
        ({"custom_generate": str(tmp_path / "evil"), "trust_remote_code": True}, "'custom_generate' is not allowed"),
        ({"trust_remote_code": True}, "'trust_remote_code' is not allowed"),
        ({"assistant_model": tiny_model}, "'assistant_model' is not allowed"),
        ({"generation_config": str(tmp_path)}, "'generation_config' is not allowed"),
        ({"no_repeat_ngram_size": "3"}, "no_repeat_ngram_size: '3' is not a number"),
        ({"repetition_penalty": [1.2]}, "not a number"),
    ]:
        with pytest.raises(StageConfigError, match=message):
            AugmentStage(generate_kwargs=bad, **models)
    assert not marker.exists()
    stage = AugmentStage(generate_kwargs={"no_repeat_ngram_size": 3, "early_stopping": "never",
                                          "repetition_penalty": 1.1, "use_cache": True}, **models)
    assert dict(stage.transform_config().back_translation.settings.extra)["no_repeat_ngram_size"] == 3


def test_missing_model_names_the_param_and_the_fix(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(StageConfigError) as info:
        AugmentStage(model_zh_en=str(tmp_path / "nowhere"), model_en_zh=str(tmp_path / "nowhere"))
    message = str(info.value)
    assert "augment.model_en_zh" in message and "never downloaded" in message
    assert "hf download Helsinki-NLP/opus-mt-en-zh" in message and "--set augment.model_en_zh=DIR" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        resolve_model_dir(str(tmp_path / "empty"), "model_zh_en")


def test_repo_id_resolves_from_the_local_hf_cache(tmp_path, monkeypatch, tiny_model):
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    snapshot = cache / "models--Helsinki-NLP--opus-mt-zh-en" / "snapshots" / "abc123"
    shutil.copytree(tiny_model, snapshot)
    (cache / "models--Helsinki-NLP--opus-mt-zh-en" / "refs").mkdir()
    (cache / "models--Helsinki-NLP--opus-mt-zh-en" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    assert resolve_model_dir("Helsinki-NLP/opus-mt-zh-en", "model_zh_en") == str(snapshot)
    # What --set makes of a repo id (an absolute path under the working directory) still resolves.
    assert resolve_model_dir(os.path.abspath("Helsinki-NLP/opus-mt-zh-en"), "model_zh_en") == str(snapshot)
    with pytest.raises(ModelNotFoundError, match="model_en_zh"):
        resolve_model_dir("Helsinki-NLP/opus-mt-en-zh", "model_en_zh")


# --- decoding ---------------------------------------------------------------------------------

def test_seeded_sampling_does_not_depend_on_the_batch(tiny_model):
    translator = Seq2SeqTranslator(tiny_model, "model_en_zh")
    texts = ["The data model is small.", "Open the file and read the code.", "数据模型很小。", "Run the test."]
    sampling = GenerationSettings(do_sample=True, temperature=1.5, top_k=50, max_new_tokens=8)
    together = translator.translate(texts, [11, 12, 13, 14], sampling, batch_size=4)
    alone = [translator.translate([t], [s], sampling, batch_size=1)[0] for t, s in zip(texts, [11, 12, 13, 14])]
    assert together == alone
    reseeded = translator.translate(texts, [21, 22, 23, 24], sampling, batch_size=4)
    assert reseeded != together
    greedy = GenerationSettings(num_beams=1, max_new_tokens=8)
    assert translator.translate(texts, [0] * 4, greedy, 4) == translator.translate(texts, [9] * 4, greedy, 2)


def test_target_token_is_used_only_when_the_model_knows_it(tiny_model):
    assert Seq2SeqTranslator(tiny_model, "model_en_zh", source_prefix=">>cmn_Hans<<").source_prefix == ""
    assert Seq2SeqTranslator(tiny_model, "model_en_zh", source_prefix="</s>").source_prefix == "</s> "


def test_unloadable_model_dir_is_one_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match="augment.model_zh_en: cannot load a seq2seq model"):
        Seq2SeqTranslator(str(tmp_path), "model_zh_en")
