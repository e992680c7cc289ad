"""The compiled fastText predictor (dsdata.stages.fasttext_model + fasttext_kernels) against
fastText's own binding: the same top label and the same float32 probability, bit for bit, on the
shipped lid.176.ftz and on small models trained here with each setting the reader handles
(hierarchical softmax and softmax, word n-grams, no character n-grams, dense and product-quantized
input with and without norms), on real paragraphs and generated text; models it does not cover and
damaged files fall back to the binding."""
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

fasttext = pytest.importorskip("fasttext")
pytest.importorskip("numba")

from dsdata.stages import fasttext_model  # noqa: E402
from dsdata.stages.lang import LanguageStage, _fasttext_line, default_fasttext_model, load_fasttext  # noqa: E402

ODD = ["", " ", "a", "</s>", "hello </s> world 中文", "__label__en foo", "__label__en", "日本語のテキスト",
       "x\x00y\tz\rw\x0bq\x0c", "😀 emoji ✓ ünïcödé", "<b>", "<", ">", "<>", "a" * 5000, "中" * 3000,
       "Ceci est une phrase française.", "Das ist ein ganz normaler deutscher Satz.", "这是一个中文句子。"]


def _texts(shared_data, step=7):
    recs = [json.loads(line) for line in (shared_data / "langid-dev.jsonl").read_text(encoding="utf-8").splitlines()]
    texts = [r["text"] for r in recs[::step]]
    for name in ("prose-en.txt", "prose-zh.txt"):
        texts += [p for p in (shared_data / name).read_text(encoding="utf-8").split("\n") if p.strip()][::50]
    return [_fasttext_line(t[:4000]) for t in texts] + ODD


def _assert_same(engine, binding, texts, threshold=0.0):
    labels, probs = binding.predict(texts, k=1, threshold=threshold)
    got_labels, got_probs = engine.predict(texts, threshold)
    want = [(lab[0] if len(lab) else None, float(p[0]) if len(p) else 0.0) for lab, p in zip(labels, probs)]
    got = list(zip(got_labels, got_probs))
    diffs = [(t[:40], w, g) for t, w, g in zip(texts, want, got) if w != g]
    assert not diffs, diffs[:5]


def test_lid176_equals_the_binding_on_real_and_odd_text(shared_data):
    path = default_fasttext_model()
    engine = fasttext_model.load(path)
    assert engine is not None and len(engine.labels) == 176
    texts = _texts(shared_data, step=3)
    assert len(texts) > 3000
    _assert_same(engine, load_fasttext(path), texts)
    _assert_same(engine, load_fasttext(path), texts[:500], threshold=0.5)  # pruned walks, no label for some


@pytest.fixture(scope="module")
def training_set():
    from tests.conftest import SHARED_DATA as shared_data

    if not shared_data.is_dir():
        pytest.skip(f"shared dev data not found at {shared_data}")
    recs = [json.loads(line) for line in (shared_data / "langid-dev.jsonl").read_text(encoding="utf-8").splitlines()]
    langs = sorted({r["lang"] for r in recs})
    return [r["text"] for r in recs[:4000]], [langs.index(r["lang"]) for r in recs[:4000]]


def _train(training_set, out_dir, quantize, **opts):
    """A small multi-label model, trained by the project's own fastText trainer (a child process
    with zeroed allocations: fastText leaves most of its input matrix uninitialised)."""
    from dsdata.relevance.fasttext_backend import train_fasttext

    texts, labels = training_set
    return train_fasttext(texts, labels, str(out_dir), quantize=quantize, **{
        "dim": 8, "epoch": 2, "lr": 0.1, "bucket": 20000, "thread": 1, **opts})


SETTINGS = [
    dict(loss="hs", minn=2, maxn=4, wordNgrams=1),
    dict(loss="softmax", minn=2, maxn=4, wordNgrams=1),
    dict(loss="softmax", minn=3, maxn=6, wordNgrams=2),
    dict(loss="hs", minn=0, maxn=0, wordNgrams=3),
]


@pytest.mark.parametrize("quantize", [False, True], ids=["dense", "quantized"])
@pytest.mark.parametrize("opts", SETTINGS, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()))
def test_trained_models_equal_the_binding(tmp_path, training_set, shared_data, opts, quantize):
    path = _train(training_set, tmp_path, quantize, **opts)
    engine = fasttext_model.load(path)
    assert engine is not None and len(engine.labels) > 20
    _assert_same(engine, load_fasttext(path), _texts(shared_data, step=11))


_LID = {}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(list(" \t\r\x0b\x0c\x00<>/s_labeé中國这😀")) | st.characters(
    blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=40), min_size=1, max_size=6))
def test_generated_text_equals_the_binding(texts):
    if not _LID:
        _LID["engine"] = fasttext_model.load(default_fasttext_model())
        _LID["binding"] = load_fasttext(default_fasttext_model())
    _assert_same(_LID["engine"], _LID["binding"], texts)


def test_uncovered_losses_and_damaged_files_fall_back_to_the_binding(tmp_path, training_set):
    ova = _train(training_set, tmp_path, False, loss="ova", dim=4, epoch=1, bucket=1000)
    assert fasttext_model.load(ova) is None
    stage = LanguageStage(model=ova, keep=[], min_score=0)
    stage.setup()
    assert stage._engine is None and stage._predict_lines is not None
    assert stage.predict(["Das ist ein ganz normaler deutscher Satz."])[0][0]

    data = open(default_fasttext_model(), "rb").read()
    rng = np.random.default_rng(0)
    for cut in [0, 4, 8, 60, 100, 5000, len(data) // 2, len(data) - 1]:
        bad = tmp_path / f"cut{cut}.ftz"
        bad.write_bytes(data[:cut])
        assert fasttext_model.load(str(bad)) is None, cut
    for i in range(30):  # flipped bytes in the header and dictionary: refused or still consistent, never a crash
        damaged = bytearray(data)
        for pos in rng.integers(0, 200_000, size=4):
            damaged[pos] ^= 0xFF
        bad = tmp_path / f"flip{i}.ftz"
        bad.write_bytes(bytes(damaged))
        try:
            engine = fasttext_model.load(str(bad))
        except fasttext_model.UnusableModel:
            continue
        if engine is not None:
            labels, probs = engine.predict(["some words to classify", "中文句子"])
            assert len(labels) == 2 and all(0.0 <= p <= 1.0 for p in probs)


def test_a_model_that_would_make_fasttext_divide_by_zero_is_one_config_error(tmp_path):
    import struct

    from dsdata.stages import StageConfigError

    data = bytearray(open(default_fasttext_model(), "rb").read())
    struct.pack_into("<i", data, 8 + 8 * 4, 0)  # Args.bucket = 0, with minn 2 / maxn 4 n-grams
    bad = tmp_path / "bucket0.ftz"
    bad.write_bytes(bytes(data))
    with pytest.raises(StageConfigError, match="bucket is 0"):
        LanguageStage(model=str(bad)).setup()


def test_the_stage_uses_the_compiled_predictor_unless_numba_is_disabled(monkeypatch):
    stage = LanguageStage(keep=[], min_score=0)
    stage.setup()
    assert stage._engine is not None
    texts = ["Das ist ein ganz normaler deutscher Satz.", "这是一个中文句子。", "x\ud800y and some English words"]
    compiled = stage.predict(texts)
    monkeypatch.setenv("DSDATA_NO_NUMBA", "1")
    monkeypatch.setattr(fasttext_model, "_kernels", None)
    plain = LanguageStage(keep=[], min_score=0)
    plain.setup()
    assert plain._engine is None and plain._predict_lines is not None
    assert plain.predict(texts) == compiled
    assert [r[0] for r in compiled] == ["de", "zh", "en"]
    assert os.environ["DSDATA_NO_NUMBA"] == "1"


def test_numba_start_up_leaves_scipy_linalg_alone_and_importable():
    """dsdata.compiled loads numba's registries with scipy blocked (numba imports scipy.linalg only
    to probe BLAS, which no dsdata kernel uses); afterwards scipy.linalg imports as usual."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from dsdata.stages import fasttext_model, lang\n"
        "e = fasttext_model.load(lang.default_fasttext_model())\n"
        "assert e is not None and e.predict(['ein deutscher Satz ist das hier'])[0][0] == '__label__de'\n"
        "assert 'scipy.linalg' not in sys.modules, 'numba pulled in scipy.linalg'\n"
        "import scipy.linalg\n"
        "print('ok', scipy.linalg.norm([3.0, 4.0]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["ok", "5.0"]
