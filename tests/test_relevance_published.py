"""Published quality classifiers load as they are: a DCLM-shaped fastText model (labels
`__label__hq` / `__label__cc`, one .bin file, no dsdata metadata) and a FineWeb-Edu-shaped BERT
(BertForSequenceClassification, num_labels=1, a 0-5 regression score used raw with threshold 3),
both built here and run through the recipe path a downloaded model takes."""
from __future__ import annotations

import json
import os
import platform
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dsdata.beam.pipeline import run_recipe  # noqa: E402
from dsdata.recipe import RecipeError, load_recipe  # noqa: E402
from dsdata.relevance import fasttext_backend  # noqa: E402
from dsdata.relevance.scorer import load_scorer  # noqa: E402
from dsdata.stages import StageConfigError  # noqa: E402
from dsdata.stages.relevance import RelevanceStage  # noqa: E402

from test_relevance import WORDS, build_tiny_bert, read_outputs  # noqa: E402


def _write(path: Path, records: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def _recipe(folder: Path, params: dict) -> Path:
    lines = ["name: published", "input: {paths: [docs.jsonl]}", "stages:", "  - relevance:"]
    lines += [f"      {k}: {json.dumps(v)}" for k, v in params.items()]
    (folder / "recipe.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder / "recipe.yaml"


@pytest.fixture(scope="module")
def dclm_shaped(tmp_path_factory):
    """A fastText model trained like DCLM's (labels hq / cc, case kept, one line per text) on real
    relevant / irrelevant text, saved as one .bin file the way it is published."""
    import conftest

    shared_data = conftest.SHARED_DATA
    if not shared_data.is_dir():
        pytest.skip(f"shared dev data not found at {shared_data}")
    folder = tmp_path_factory.mktemp("dclm")
    records = [json.loads(line) for line in (shared_data / "relevance-dev.jsonl").read_text(encoding="utf-8").splitlines()]
    random.Random(0).shuffle(records)
    train, held = records[:1500], records[1500:]
    with open(folder / "train.txt", "w", encoding="utf-8") as fh:
        for r in train:
            fh.write(f"__label__{'hq' if r['label'] == 1 else 'cc'} {fasttext_backend.published_form(r['text'])}\n")
    job = {"input": str(folder / "train.txt"), "output": str(folder / "fasttext-oh-eli5.bin"), "quantize": False,
           "cutoff": 0, "args": {"epoch": 10, "lr": 0.5, "wordNgrams": 2, "minn": 2, "maxn": 4, "dim": 16,
                                 "bucket": 50_000, "loss": "softmax", "thread": 1, "seed": 0}}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)))
    if platform.libc_ver()[0] == "glibc":  # fastText's uninitialised rows: see fasttext_backend's docstring
        env["GLIBC_TUNABLES"] = "glibc.malloc.perturb=255"
    subprocess.run([sys.executable, "-c", fasttext_backend._TRAIN_CHILD, json.dumps(job)], env=env, check=True)
    os.unlink(folder / "train.txt")
    return folder / "fasttext-oh-eli5.bin", held


def test_dclm_shaped_fasttext_scores_hq_and_filters(dclm_shaped, tmp_path):
    model, held = dclm_shaped
    import fasttext

    direct = fasttext.load_model(str(model))
    assert sorted(direct.get_labels()) == ["__label__cc", "__label__hq"]
    docs = [{"id": r["id"], "text": r["text"], "label": r["label"]} for r in held]
    _write(tmp_path / "docs.jsonl", docs)
    shutil.copy(model, tmp_path / "fasttext-oh-eli5.bin")  # as downloaded
    stats = run_recipe(load_recipe(str(_recipe(tmp_path, {"model": "fasttext-oh-eli5.bin",
                                                          "positive_label": "__label__hq", "threshold": 0.5}))),
                       str(tmp_path / "out"))
    assert stats["ledger_ok"]
    kept, rejected = read_outputs(tmp_path / "out")
    scores = {r["id"]: r["relevance_score"] for r in kept}
    scores.update({r["id"]: json.loads(r["annotations"])["relevance_score"] for r in rejected})
    # The score is the model's own P(__label__hq) on the text as published models see it (case kept).
    labels, probs = direct.predict([fasttext_backend.published_form(d["text"]) for d in docs], k=-1)
    for d, labs, ps in zip(docs, labels, probs):
        assert scores[d["id"]] == pytest.approx(float(dict(zip(labs, ps))["__label__hq"]), abs=1e-6)
    # It separates the held-out real data as a quality classifier should.
    right = sum((scores[d["id"]] >= 0.5) == (d["label"] == 1) for d in docs)
    assert right / len(docs) > 0.85
    # "hq" means the same label; a list sums its labels' probabilities (datatrove's rule): hq + cc = 1.
    texts = [d["text"] for d in docs[:50]]
    assert load_scorer(str(model), positive_label="hq").score(texts) == pytest.approx([scores[d["id"]] for d in docs[:50]], abs=1e-6)
    assert load_scorer(str(model), positive_label=["hq", "cc"]).score(texts) == pytest.approx([1.0] * 50, abs=1e-4)


def test_dclm_shaped_without_positive_label_is_one_line(dclm_shaped):
    model, _ = dclm_shaped
    stage = RelevanceStage(model=str(model))
    with pytest.raises(StageConfigError, match=r"labels \['__label__(hq|cc)', '__label__(hq|cc)'\], not __label__1; "
                                               r"set relevance.positive_label"):
        stage.setup()
    with pytest.raises(StageConfigError, match="not __label__good"):
        RelevanceStage(model=str(model), positive_label="good").setup()
    with pytest.raises(StageConfigError, match="score=raw is for a one-output BERT"):
        RelevanceStage(model=str(model), score="raw", threshold=3)


@pytest.fixture(scope="module")
def fineweb_edu_shaped(tmp_path_factory) -> Path:
    """A BertForSequenceClassification with one output (FineWeb-Edu's regression head), its bias set so
    that raw scores fall around 3 on the 0-5 scale, saved with save_pretrained."""
    from transformers import BertForSequenceClassification

    folder = build_tiny_bert(tmp_path_factory.mktemp("fineweb-edu") / "model", init_range=0.3)
    model = BertForSequenceClassification.from_pretrained(folder, num_labels=1, problem_type="regression",
                                                          ignore_mismatched_sizes=True)
    with torch.no_grad():
        model.classifier.bias.fill_(3.0)
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 1
    return folder


def test_fineweb_edu_shaped_head_scores_raw_with_threshold_3(fineweb_edu_shaped, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rng = random.Random(1)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 40))) for _ in range(60)]
    _write(tmp_path / "docs.jsonl", [{"id": f"d{i:02d}", "text": t} for i, t in enumerate(texts)])
    shutil.copytree(fineweb_edu_shaped, tmp_path / "fineweb-edu-classifier")
    stats = run_recipe(load_recipe(str(_recipe(tmp_path, {"model": "fineweb-edu-classifier", "score": "raw",
                                                          "threshold": 3, "device": "cpu"}))),
                       str(tmp_path / "out"))
    assert stats["ledger_ok"]
    kept, rejected = read_outputs(tmp_path / "out")
    # What the FineWeb-Edu model card does: logits.squeeze(-1).float() is the score, no sigmoid.
    tok = AutoTokenizer.from_pretrained(fineweb_edu_shaped)
    model = AutoModelForSequenceClassification.from_pretrained(fineweb_edu_shaped).eval()
    with torch.no_grad():
        expected = [float(model(**tok(t, return_tensors="pt", truncation=True)).logits.squeeze(-1)) for t in texts]
    got = {r["id"]: r["relevance_score"] for r in kept}
    got.update({r["id"]: json.loads(r["annotations"])["relevance_score"] for r in rejected})
    assert [got[f"d{i:02d}"] for i in range(len(texts))] == pytest.approx(expected, abs=1e-4)
    assert any(e > 1 for e in expected)  # a raw score, not a probability
    assert {r["id"] for r in kept} == {f"d{i:02d}" for i, e in enumerate(expected) if e >= 3}
    assert 0 < len(kept) < len(texts)
    assert all(r["reason"] == "low_relevance" for r in rejected)


def test_raw_and_threshold_checks_are_one_line(fineweb_edu_shaped, tiny_bert_two):
    with pytest.raises(StageConfigError, match="not a probability .* set relevance.score=raw"):
        RelevanceStage(model=str(fineweb_edu_shaped), threshold=3)
    with pytest.raises(StageConfigError, match="has 2 outputs; score: raw needs a one-output head"):
        RelevanceStage(model=str(tiny_bert_two), score="raw", threshold=3, device="cpu").setup()
    with pytest.raises(StageConfigError, match="has no label 'good'"):
        RelevanceStage(model=str(tiny_bert_two), positive_label="good", device="cpu").setup()
    # A label2id name selects the logit; both labels' probabilities sum to 1.
    both = load_scorer(str(tiny_bert_two), device="cpu", positive_label=["LABEL_0", "LABEL_1"])
    assert both.score(["alpha beta", "w1 w2 w3"]) == pytest.approx([1.0, 1.0], abs=1e-5)
    # Without score: raw the one-output head stays a probability (sigmoid), as before.
    prob = load_scorer(str(fineweb_edu_shaped), device="cpu").score(["alpha beta gamma"])[0]
    assert 0.9 < prob < 1.0


@pytest.fixture(scope="module")
def tiny_bert_two(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("two-labels"))


def test_recipe_threshold_over_1_without_raw_names_the_recipe(fineweb_edu_shaped, tmp_path):
    shutil.copytree(fineweb_edu_shaped, tmp_path / "m")
    _write(tmp_path / "docs.jsonl", [{"id": "a", "text": "alpha"}])
    recipe = load_recipe(str(_recipe(tmp_path, {"model": "m", "threshold": 3})))
    with pytest.raises((RecipeError, StageConfigError), match="relevance.threshold 3 is not a probability"):
        run_recipe(recipe, str(tmp_path / "out"))
