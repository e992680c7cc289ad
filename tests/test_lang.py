"""Language ID on real text with the models that ship in PyPI wheels."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsdata.stages.lang as lang_module
from dsdata.document import Document, Rejected
from dsdata.stages import StageConfigError
from dsdata.stages.lang import LanguageStage, chinese_script, normalise_code

EN = "The package manager downloads the archive, verifies its signature and unpacks it into the system."
ZH_HANS = "软件包管理器会下载软件包，验证它的签名，然后把它解压到系统中。这个过程通常很快。"
ZH_HANT = "軟體套件管理器會下載軟體套件，驗證它的簽名，然後把它解壓到系統中。這個過程通常很快。"
DE = "Der Paketmanager lädt das Archiv herunter, prüft die Signatur und entpackt es in das System."


@pytest.mark.parametrize("backend", ["fasttext", "langdetect"])
def test_backends_on_real_sentences(backend):
    stage = LanguageStage(backend=backend)
    stage.setup()
    docs = [Document(str(i), t) for i, t in enumerate([EN, ZH_HANS, ZH_HANT, DE])]
    results = stage.process_batch(docs)
    en, hans, hant, de = results
    assert en.annotations["lang"] == "en" and en.annotations["lang_script"] is None
    assert hans.annotations["lang"] == "zh" and hans.annotations["lang_script"] == "Hans"
    assert hant.annotations["lang"] == "zh" and hant.annotations["lang_script"] == "Hant"
    assert isinstance(de, Rejected) and de.reason == "lang_not_kept" and de.doc.annotations["lang"] == "de"


def test_min_score_rejects_uncertain_documents():
    stage = LanguageStage(min_score=0.99)
    result = stage.process(Document("x", "ok ok 123 zz"))
    assert isinstance(result, Rejected) and result.reason in ("lang_low_score", "lang_not_kept")


def test_keep_all():
    stage = LanguageStage(keep=[], min_score=0)
    assert not isinstance(stage.process(Document("d", DE)), Rejected)


def test_langdetect_is_deterministic():
    texts = ["ok computer", "Hola mundo, ¿qué tal?", "bonjour tout le monde"] * 3
    a = LanguageStage(backend="langdetect", keep=[], min_score=0).predict(texts)
    b = LanguageStage(backend="langdetect", keep=[], min_score=0).predict(texts)
    assert a == b


def test_codes_and_script():
    assert normalise_code("zh-TW") == "zh" and normalise_code("zh_cn") == "zh" and normalise_code("EN") == "en"
    assert chinese_script(ZH_HANT) == "Hant" and chinese_script(ZH_HANS) == "Hans"


def test_bad_configuration_is_one_clear_error(tmp_path):
    with pytest.raises(StageConfigError, match="lang.backend"):
        LanguageStage(backend="cld3")
    with pytest.raises(StageConfigError, match="no parameter 'keep_langs'"):
        LanguageStage(keep_langs=["en"])
    missing = LanguageStage(model=str(tmp_path / "nope.bin"))
    with pytest.raises(StageConfigError, match="nope.bin' not found"):
        missing.setup()
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a model")
    with pytest.raises(StageConfigError, match="not a fastText model"):
        LanguageStage(model=str(junk)).setup()


def test_zh_en_accuracy_on_dev_set(shared_data):
    recs = [json.loads(line) for line in (shared_data / "langid-dev.jsonl").read_text(encoding="utf-8").splitlines()]
    recs = [r for r in recs if r["lang"] in ("zh", "en")]
    stage = LanguageStage(keep=[], min_score=0)
    preds = stage.predict([r["text"] for r in recs])
    accuracy = sum(p[0] == r["lang"] for p, r in zip(preds, recs)) / len(recs)
    assert accuracy >= 0.99


# The stage's predict before its Python was cut (the generator per character, the regex per text, a
# tuple and normalise_code per result): the faster one must give exactly these values.
def _predict_reference(stage, texts):
    import re

    # A lone surrogate has no UTF-8 form for fastText's binding: the stage classifies it as U+FFFD.
    clean = [re.sub(r"\s+", " ", re.sub("[\ud800-\udfff]", "\ufffd", t[: stage.max_chars])).strip() for t in texts]
    # fastText's own binding: the stage's compiled predictor must give its labels and scores exactly.
    labels, scores = lang_module.load_fasttext(stage.model or lang_module.default_fasttext_model()).predict(clean, k=1)
    out = []
    for text, lab, sc in zip(texts, labels, scores):
        code, score = (lab[0][len("__label__"):] if lab else "unknown", float(sc[0]) if len(sc) else 0.0)
        lang = normalise_code(code)
        script = None
        if lang == "zh":
            cut = text[: stage.max_chars]
            simp = sum(1 for ch in cut if ch in lang_module._SIMPLIFIED)
            trad = sum(1 for ch in cut if ch in lang_module._TRADITIONAL)
            script = {"zh-cn": "Hans", "zh-tw": "Hant"}.get(code.lower()) or ("Hant" if trad > simp else "Hans")
        out.append((lang, min(max(score, 0.0), 1.0), script))
    return out


def test_predict_equals_the_reference_on_real_paragraphs(shared_data):
    texts = [json.loads(line)["text"] for line in (shared_data / "langid-dev.jsonl").read_text(encoding="utf-8").splitlines()]
    for name in ("prose-zh.txt", "prose-en.txt"):
        texts += (shared_data / name).read_text(encoding="utf-8").split("\n\n")[::5]
    texts += [ZH_HANT, ZH_HANT * 3000, "", "   ", "\u3000混合\u00a0text\twith\x1c odd\u2029 spaces\n\n"]
    stage = LanguageStage(max_chars=300)
    stage.setup()
    got = stage.predict(texts)
    assert got == _predict_reference(stage, texts)
    assert {lang for lang, _, _ in got} >= {"zh", "en", "de", "fr"} and ("zh", pytest.approx(1, abs=0.1), "Hant") in got


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(list(" \t\n\r\x0b\x0c\x00\x1c\x1d\x85\xa0\u2028\u3000\u200b\ufeffab中國这"))
                        | st.characters(), max_size=30), min_size=1, max_size=8))
def test_predict_equals_the_reference_on_generated_text(texts):
    stage = _GENERATED_STAGE
    assert stage.predict(texts) == _predict_reference(stage, texts)


_GENERATED_STAGE = LanguageStage(max_chars=20)


def test_the_binding_called_directly_equals_fasttexts_predict_and_a_lone_surrogate_is_classified(monkeypatch):
    monkeypatch.setattr(lang_module.fasttext_model, "load", lambda path: None)  # the binding's path, not the compiled one
    stage = LanguageStage(max_chars=300)
    stage.setup()
    assert stage._predict_lines is not None  # fasttext-numpy2's binding: predict() calls it itself
    texts = ["Das ist ein ganz normaler deutscher Satz.", "这是一个中文句子。", "x\ud800y and some English words",
             "\udfff", "Ceci est une phrase française."]
    direct = stage.predict(texts)
    stage._predict_lines = None  # the model's own predict(list, k=1)
    assert stage.predict([t for t in texts if not any("\ud800" <= c <= "\udfff" for c in t)]) == [
        r for t, r in zip(texts, direct) if not any("\ud800" <= c <= "\udfff" for c in t)]
    assert direct[2] == stage.predict(["x\ufffdy and some English words"])[0] and direct[2][0] == "en"
    assert [r[0] for r in direct] == ["de", "zh", "en", direct[3][0], "fr"]


def test_texts_passed_as_they_are_are_exactly_those_fasttext_splits_alike():
    """The stage re-spaces a text only when it holds a character of _REFLOW: the newline and every
    character str.split() breaks on that fastText's tokenizer (space, \\t, \\v, \\f, \\r, \\0) does not."""
    import sys

    python_breaks = {c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()}
    expected = (python_breaks - set(" \t\x0b\x0c\r")) | {"\n"}
    found = {c for c in map(chr, range(sys.maxunicode + 1)) if lang_module._REFLOW.match(c)}
    assert found == expected and "\x00" not in found
    # _fasttext_line's shortcuts (ASCII, printable) agree with the regex on every character, alone
    # and inside ASCII and non-ASCII text.
    for c in map(chr, range(sys.maxunicode + 1)):
        for text in (c, f"ab {c} cd", f"中文{c}字", f"é{c}"):
            want = text if lang_module._REFLOW.search(text) is None else " ".join(text.split())
            assert lang_module._fasttext_line(text) == want, hex(ord(c))
