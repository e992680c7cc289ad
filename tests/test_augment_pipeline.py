"""End to end: pipelines/augment.yaml with --set overrides, tiny random MarianMT models, the real
Beam runner and Parquet output.  Checks split → batch → translate → reassemble → window → new ids,
the ledger law with augmentation, augment.json, the lighter methods, and run-to-run determinism."""
from __future__ import annotations

import glob
import json
import os
import re
import statistics

import pyarrow.parquet as pq
import pytest

from dsdata.augment.language import guess_script_language
from dsdata.augment.sentences import split_sentences
from dsdata.augment.similarity import chrf
from benchmarks.tiny_models import build_tiny_marian
from dsdata.augment.translate import GenerationSettings, Seq2SeqTranslator
from dsdata.beam.pipeline import run_recipe
from dsdata.recipe import RecipeError, load_recipe

RECIPE = os.path.join(os.path.dirname(__file__), "..", "pipelines", "augment.yaml")
MAX_SENTENCE_CHARS = 40
DOCS = [
    {"id": "en-1", "text": "The data model is small. Open the file and read the code!\nRun the test."},
    {"id": "en-2", "text": "This is the first line of a list.\n\n* The second item is here.\n* The third item is there."},
    # One sentence longer than MAX_SENTENCE_CHARS: cut at its comma, put back together after.
    {"id": "en-3", "text": "When the user opens the graph file, the system will read all of the nodes and train."},
    {"id": "zh-1", "text": "今天我们学习数据模型。这个系统很快！用户可以打开文件吗？"},
    {"id": "zh-2", "text": "第一段的内容。\n第二段的内容，里面有很多字。"},
    {"id": "fr-1", "text": "Le chat est sur la table avec le chien et la souris."},  # not zh/en: never augmented
    {"id": "rule", "text": "---- 12345 ----"},  # no language: never augmented
]
BASE_OVERRIDES = ["augment.fraction=1.0", "augment.min_sim=0", "augment.max_sim=1", "augment.num_beams=2",
                  "augment.max_new_tokens=6", "augment.batch_size=3", "augment.threads=1",
                  f"augment.max_sentence_chars={MAX_SENTENCE_CHARS}"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"en_zh": build_tiny_marian(str(root / "en_zh"), seed=1), "zh_en": build_tiny_marian(str(root / "zh_en"), seed=2)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in DOCS), encoding="utf-8")
    return str(path)


def _run(models, corpus, output, extra=()):
    overrides = [f"augment.model_en_zh={models['en_zh']}", f"augment.model_zh_en={models['zh_en']}",
                 *BASE_OVERRIDES, *extra]
    recipe = load_recipe(RECIPE, overrides)
    recipe.inputs = [corpus]
    stats = run_recipe(recipe, str(output))
    rows = [r for f in sorted(glob.glob(os.path.join(output, "kept", "*.parquet"))) for r in pq.read_table(f).to_pylist()]
    with open(os.path.join(output, "augment.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    return stats, {r["id"]: r for r in rows}, report


@pytest.fixture(scope="module")
def full_window(models, corpus, tmp_path_factory):
    return _run(models, corpus, tmp_path_factory.mktemp("run") / "out")


def _round_trip_by_hand(models, text: str) -> str:
    """What the pipeline should produce: each sentence alone through both models, same layout."""
    lang = guess_script_language(text)
    pivot = "zh" if lang == "en" else "en"
    settings = GenerationSettings(num_beams=2, max_new_tokens=6)
    there = Seq2SeqTranslator(models[f"{lang}_{pivot}"], "m")
    back = Seq2SeqTranslator(models[f"{pivot}_{lang}"], "m")
    layout = split_sentences(text, MAX_SENTENCE_CHARS)
    out = [back.translate(there.translate([s], [0], settings, 1), [0], settings, 1)[0] for s in layout.sentences]
    return layout.join(out)


def test_every_zh_en_document_gets_one_round_trip_copy(full_window, models):
    stats, rows, report = full_window
    originals = {d["id"]: d["text"] for d in DOCS}
    translatable = [d["id"] for d in DOCS if d["id"][:2] in ("en", "zh")]
    assert stats["ledger_ok"] and stats["input"] == len(DOCS)
    assert stats["augmented"] == len(translatable)
    assert stats["input"] + stats["augmented"] == stats["kept"] + stats["rejected_total"]
    assert set(rows) == set(originals) | {f"{i}#bt" for i in translatable}
    for source_id in translatable:
        copy = rows[f"{source_id}#bt"]
        assert copy["augmentation"] == "back_translation" and copy["source_id"] == source_id
        assert copy["derived_by"] == "augment"
        assert copy["augment_similarity"] == pytest.approx(chrf(copy["text"], originals[source_id]), abs=1e-6)
        # Split, batch (3 sentences a call, mixed directions), translate, reassemble in order:
        assert copy["text"] == _round_trip_by_hand(models, originals[source_id]), source_id
    assert "\n\n* " in rows["en-2#bt"]["text"]  # the layout between sentences survives
    for source_id, text in originals.items():
        assert rows[source_id]["text"] == text and rows[source_id]["augmentation"] is None
    assert report["back_translation"] == {"selected": 5, "made": 5, "kept": 5, "dropped": {}, "skipped": {}}


def test_window_drops_copies_and_runs_are_deterministic(full_window, models, corpus, tmp_path):
    _stats, first_rows, _report = full_window
    sims = sorted(r["augment_similarity"] for r in first_rows.values() if r["augmentation"] == "back_translation")
    assert len(set(sims)) > 1, "tiny models gave identical similarities; the window check needs a spread"
    cut = statistics.median(sims)
    synonyms = tmp_path / "syn.tsv"
    synonyms.write_text("data\tinformation\nfile\tdocument\n数据\t资料\n", encoding="utf-8")
    entities = tmp_path / "ent.json"
    entities.write_text(json.dumps({"ROLE": ["user", "system", "administrator"]}), encoding="utf-8")
    stats, rows, report = _run(models, corpus, tmp_path / "out", [
        f"augment.min_sim={cut}", "augment.method=[back_translation, synonym, entity]",
        f"augment.synonyms={synonyms}", f"augment.entities={entities}", "augment.replace_prob=1.0",
    ])
    kept_bt = {i for i, r in rows.items() if r["augmentation"] == "back_translation"}
    expected_bt = {i for i, r in first_rows.items() if r["augmentation"] == "back_translation" and r["augment_similarity"] >= cut}
    assert kept_bt == expected_bt and 0 < len(kept_bt) < 5
    for i in kept_bt:  # a second run translates the same way
        assert rows[i]["text"] == first_rows[i]["text"]
    dropped = 5 - len(kept_bt)
    assert report["back_translation"]["dropped"] == {"out_of_window": dropped}
    assert report["back_translation"]["made"] == 5 and report["back_translation"]["kept"] == len(kept_bt)
    # Lighter methods: every document with a dictionary term gets one copy, whatever its language.
    assert rows["en-1#syn"]["text"] == "The information model is small. Open the document and read the code!\nRun the test."
    assert rows["zh-1#syn"]["text"] == "今天我们学习资料模型。这个系统很快！用户可以打开文件吗？"
    assert rows["zh-1#syn"]["source_id"] == "zh-1" and "fr-1#syn" not in rows
    swapped, original = rows["en-3#ent"]["text"], rows["en-3"]["text"]
    roles = re.compile(r"user|system|administrator")
    assert swapped != original and roles.sub("ROLE", swapped) == roles.sub("ROLE", original)
    assert "the user opens" not in swapped and rows["en-3#ent"]["augmentation"] == "entity"
    n_syn, n_ent = report["synonym"]["kept"], report["entity"]["kept"]
    assert n_syn == sum(1 for r in rows.values() if r["augmentation"] == "synonym") == 3
    assert n_ent == sum(1 for r in rows.values() if r["augmentation"] == "entity")
    assert stats["augmented"] == len(kept_bt) + n_syn + n_ent == report["total"]["kept"]
    assert report["total"]["dropped"] == dropped
    assert stats["ledger_ok"] and stats["input"] + stats["augmented"] == stats["kept"] + stats["rejected_total"]


def test_missing_model_stops_before_the_pipeline(corpus, tmp_path):
    with pytest.raises(RecipeError, match=r"augment\.model_en_zh: .* not in the local Hugging Face cache"):
        recipe = load_recipe(RECIPE, [f"augment.model_en_zh={tmp_path / 'none'}"])
        run_recipe(recipe, str(tmp_path / "out"))


def test_copies_rejected_by_a_later_stage_still_balance_the_ledger(tmp_path):
    # "data" alone is too short for the quality rules: its synonym copy is made, then rejected.
    (tmp_path / "syn.tsv").write_text("data\tinformation\n", encoding="utf-8")
    (tmp_path / "docs.jsonl").write_text(json.dumps({"id": "short", "text": "data"}) + "\n", encoding="utf-8")
    (tmp_path / "recipe.yaml").write_text(
        "name: chain\ninput: {paths: [docs.jsonl]}\nstages:\n"
        "  - augment: {method: synonym, synonyms: syn.tsv, fraction: 1.0, replace_prob: 1.0}\n"
        "  - rules: {}\n",
        encoding="utf-8",
    )
    stats = run_recipe(load_recipe(str(tmp_path / "recipe.yaml")), str(tmp_path / "out"))
    rejected = [r for f in glob.glob(str(tmp_path / "out" / "rejected" / "*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert sorted(r["id"] for r in rejected) == ["short", "short#syn"]
    assert stats["augmented"] == 1 and stats["kept"] == 0 and stats["rejected_total"] == 2
    assert stats["ledger_ok"] and stats["stages"]["augment"]["kept_after"] == 2
