"""The difficulty stage end to end: perplexity, per-language quantile buckets, rejections, ledger."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.lm.scorers import NgramScorer, perplexity
from dsdata.recipe import load_recipe
from dsdata.stages.base import StageConfigError
from dsdata.stages.difficulty import DifficultyStage

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "pipelines" / "models" / "lm"


def _docs(shared_data: Path, per_lang: dict[str, int]) -> list[dict]:
    taken = {lang: 0 for lang in per_lang}
    docs = []
    with open(shared_data / "langid-dev.jsonl", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            lang = rec["lang"]
            if lang in taken and taken[lang] < per_lang[lang]:
                taken[lang] += 1
                docs.append({"id": rec["id"], "text": rec["text"], "lang": lang})
    return docs


def _run(tmp_path: Path, docs: list[dict], params: str = "{}", overrides: list[str] | None = None):
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: t\ninput: {{paths: [docs.jsonl]}}\nstages:\n  - difficulty: {params}\n", encoding="utf-8")
    out = tmp_path / "out"
    stats = run_recipe(load_recipe(str(recipe), [f"difficulty.model_dir={MODELS}"] + (overrides or [])), str(out))
    kept = [r for f in sorted((out / "kept").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    rejected = [r for f in sorted((out / "rejected").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    summary = json.loads((out / "difficulty.json").read_text(encoding="utf-8"))
    return stats, kept, rejected, summary, out


def _shuffled_words(text: str, lang: str, scorer: NgramScorer, rng: random.Random) -> str:
    if lang == "zh":
        # Chinese has no spaces: shuffle the model's SentencePiece pieces (≈ words and characters).
        pieces = scorer.sp.encode(text, out_type=str)
        rng.shuffle(pieces)
        return "".join(pieces).replace("\u2581", " ")
    words = text.split()
    rng.shuffle(words)
    return " ".join(words)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_shuffled_words_score_much_higher_perplexity(shared_data, lang):
    scorer = NgramScorer(str(MODELS / lang))
    min_chars = 300 if lang == "en" else 120  # ~60 words either way
    docs = [d["text"] for d in _docs(shared_data, {lang: 200}) if len(d["text"]) >= min_chars][:30]
    assert len(docs) == 30
    rng = random.Random(0)
    shuffled = [_shuffled_words(t, lang, scorer, rng) for t in docs]
    original = [perplexity(*r) for r in scorer.score_documents(docs)]
    mixed = [perplexity(*r) for r in scorer.score_documents(shuffled)]
    ratios = sorted(m / o for m, o in zip(mixed, original))
    # Every shuffled copy is worse; typically several times worse (a few fortune cookies among the
    # en paragraphs are far from the documentation prose the model knows, so their ratio is smaller).
    assert all(r > 1.2 for r in ratios), ratios
    assert ratios[len(ratios) // 2] > 3.0, ratios


def test_perplexity_formula_is_token_weighted_over_lines():
    scorer = NgramScorer(str(MODELS / "en"))
    a, b = "the file is opened for reading.", "options are passed on the command line"
    (sa, na), (sb, nb), (sab, nab) = scorer.score_documents([a, b, f"{a}\n\n{b}\n"])
    assert nab == na + nb and na == len(scorer.sp.encode(a.lower())) + 1
    assert sab == pytest.approx(sa + sb)
    assert perplexity(sab, nab) == pytest.approx(10 ** (-(sa + sb) / (na + nb)))
    assert scorer.score_documents([" \n\t"]) == [(0.0, 0)]
    assert perplexity(0.0, 0) is None


@pytest.mark.slow
def test_buckets_split_each_language_at_the_requested_percentiles(tmp_path, shared_data):
    docs = _docs(shared_data, {"zh": 400, "en": 400, "fr": 12})
    stats, kept, rejected, summary, out = _run(tmp_path, docs, "{percentiles: [25, 70]}")
    # The ledger law, and nothing rejected unless configured.
    assert stats["ledger_ok"] and stats["input"] == len(docs) == len(kept) and not rejected
    schema = pq.read_schema(next((out / "kept").glob("*.parquet")))
    assert schema.field("perplexity").type == pa.float64() and schema.field("difficulty").type == pa.string()
    for lang, n in (("zh", 400), ("en", 400)):
        rows = [r for r in kept if json.loads(r["metadata"])["lang"] == lang]
        assert len(rows) == n and all(r["perplexity"] > 1 for r in rows)
        share = {g: sum(r["difficulty"] == g for r in rows) / n for g in ("easy", "medium", "hard")}
        assert share["easy"] == pytest.approx(0.25, abs=0.02)
        assert share["medium"] == pytest.approx(0.45, abs=0.02)
        assert share["hard"] == pytest.approx(0.30, abs=0.02)
        # Buckets are ordered by perplexity and the written cut-offs are the ones applied.
        cut = summary["languages"][lang]["cutoffs"]
        assert max(r["perplexity"] for r in rows if r["difficulty"] == "easy") <= cut["easy_below"]
        assert min(r["perplexity"] for r in rows if r["difficulty"] == "hard") >= cut["hard_above"]
        assert summary["languages"][lang]["counts"] == {g: round(share[g] * n) for g in share}
    # No French model: kept, perplexity null, graded medium, counted as unscored.
    fr = [r for r in kept if json.loads(r["metadata"])["lang"] == "fr"]
    assert len(fr) == 12 and all(r["perplexity"] is None and r["difficulty"] == "medium" for r in fr)
    assert summary["languages"]["fr"]["unscored"] == 12 and summary["languages"]["fr"]["cutoffs"] is None
    # Per-language perplexity differs between models: the cut-offs are per language.
    assert summary["languages"]["zh"]["cutoffs"] != summary["languages"]["en"]["cutoffs"]
    assert sum(summary["counts"].values()) == len(docs)
    assert summary["sampling_weights"] == {"easy": 0.5, "medium": 0.3, "hard": 0.2}


@pytest.mark.slow
def test_outliers_and_unscored_documents_are_rejected_when_configured(tmp_path, shared_data):
    docs = _docs(shared_data, {"zh": 200, "en": 200, "de": 5})
    stats, kept, rejected, summary, _ = _run(
        tmp_path, docs, "{outlier_percentile: 95, unscored_grade: reject}")
    assert stats["ledger_ok"] and len(kept) + len(rejected) == len(docs)
    reasons = stats["rejected"]["difficulty"]
    assert reasons["no_language_model"] == 5
    assert reasons["perplexity_outlier"] == pytest.approx(20, abs=4)   # 5 % of 400
    outliers = [r for r in rejected if r["reason"] == "perplexity_outlier"]
    for lang in ("en", "zh"):
        threshold = summary["languages"][lang]["outlier_threshold"]
        kept_lang = [r["perplexity"] for r in kept if json.loads(r["metadata"])["lang"] == lang]
        out_lang = [json.loads(r["annotations"])["perplexity"] for r in outliers
                    if json.loads(r["metadata"])["lang"] == lang]
        assert max(kept_lang) <= threshold + 1e-3 and threshold < min(out_lang)  # written rounded to 4 places


@pytest.mark.slow
def test_fixed_cutoffs_and_language_parameter(tmp_path, shared_data):
    docs = [{k: v for k, v in d.items() if k != "lang"} for d in _docs(shared_data, {"en": 150})]
    stats, kept, rejected, summary, _ = _run(tmp_path, docs, "{cutoffs: [60, 150], lang: en}")
    assert stats["ledger_ok"] and len(kept) == 150
    for r in kept:
        expected = "easy" if r["perplexity"] < 60 else "hard" if r["perplexity"] > 150 else "medium"
        assert r["difficulty"] == expected
    assert summary["languages"]["en"]["cutoff_source"] == "fixed"
    assert summary["languages"]["en"]["cutoffs"] == {"easy_below": 60.0, "hard_above": 150.0}


@pytest.mark.parametrize("params,match", [
    ({"backend": "bigram"}, "backend"),
    ({"percentiles": [60, 30]}, "percentiles"),
    ({"cutoffs": [30, 10]}, "cutoffs"),
    ({"outlier_percentile": 40}, "outlier_percentile"),
    ({"unscored_grade": "drop"}, "unscored_grade"),
    ({"sampling_weights": {"easy": -1}}, "sampling_weights"),
    ({"model_dir": "/nonexistent/lm"}, "model_dir"),
])
def test_bad_parameters_name_the_parameter(params, match):
    with pytest.raises(StageConfigError, match=match):
        DifficultyStage(**{"model_dir": str(MODELS), **params})


def test_unscorable_documents_get_the_configured_grade_or_reason():
    from dsdata.document import Document, Rejected

    keep = DifficultyStage(model_dir=str(MODELS), unscored_grade="easy")
    keep.setup()
    doc = keep.score_batch([Document("x", "\u3000 \t", {"lang": "en"})])[0]
    assert doc.annotations["perplexity"] is None and keep.grade(doc, (10, 20), None).annotations["difficulty"] == "easy"
    strict = DifficultyStage(model_dir=str(MODELS), unscored_grade="reject")
    strict.setup()
    no_tokens = strict.grade(strict.score_batch([Document("x", "\u3000 \t", {"lang": "en"})])[0], (10, 20), None)
    no_model = strict.grade(strict.score_batch([Document("y", "Bonjour à tous", {"lang": "fr"})])[0], (10, 20), None)
    assert isinstance(no_tokens, Rejected) and no_tokens.reason == "no_tokens"
    assert isinstance(no_model, Rejected) and no_model.reason == "no_language_model"
    # Language falls back from annotation to metadata to the `lang` parameter; zh-Hant uses zh.
    assert strict.model_key(strict.language_of(Document("z", "t", {}, {"lang": "zh-Hant"}))) == "zh"
    assert DifficultyStage(model_dir=str(MODELS), lang="en").language_of(Document("z", "t")) == "en"


def test_model_dir_without_models_is_a_clear_error(tmp_path):
    stage = DifficultyStage(model_dir=str(tmp_path))
    with pytest.raises(StageConfigError, match="no language subdirectory"):
        stage.setup()


def test_shipped_models_are_small_and_documented():
    for lang in ("en", "zh"):
        meta = json.loads((MODELS / lang / "lm.json").read_text(encoding="utf-8"))
        assert meta["lang"] == lang and meta["corpus"] == f"prose-{lang}.txt"
        for f in (MODELS / lang).iterdir():
            assert f.stat().st_size <= 3 * 1024 * 1024, f
    assert "dsdata lm train" in (MODELS / "README.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_difficulty_recipe_annotates_every_document_and_rejects_nothing(tmp_path, shared_data):
    """pipelines/difficulty.yaml: lang → difficulty, with --set difficulty.model_dir=DIR."""
    pytest.importorskip("fasttext")
    docs = _docs(shared_data, {"zh": 60, "en": 60, "ja": 5})
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": d["id"], "text": d["text"]}, ensure_ascii=False) + "\n" for d in docs),
                   encoding="utf-8")
    recipe = load_recipe(str(REPO / "pipelines" / "difficulty.yaml"), [f"difficulty.model_dir={MODELS}"])
    recipe.inputs = [str(src)]
    out = tmp_path / "out"
    stats = run_recipe(recipe, str(out))
    assert stats["ledger_ok"] and stats["kept"] == len(docs) and stats["rejected_total"] == 0
    kept = [r for f in sorted((out / "kept").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert all(r["difficulty"] in ("easy", "medium", "hard") for r in kept)
    # Languages come from the lang stage's annotation (the input carries none).
    scored = [r for r in kept if r["perplexity"] is not None]
    assert len(scored) >= 110 and {r["lang"] for r in scored} <= {"zh", "en"}
    summary = json.loads((out / "difficulty.json").read_text(encoding="utf-8"))
    assert {"en", "zh"} <= set(summary["languages"])


def _parked_inputs(tmp_path: Path, shared_data: Path) -> None:
    docs = _docs(shared_data, {"en": 120, "zh": 80})
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), "utf-8")
    # Metadata holding a time in a named zone: not in the spill format, so these documents wait in
    # the runner while the others wait in spill files; both are graded against the same quantiles.
    import datetime as dt

    seen = pa.array([dt.datetime(2024, 3, 31, 1, 30)] * 3, pa.timestamp("us")).cast(
        pa.timestamp("us", tz="Europe/Berlin"))
    pq.write_table(pa.table({"id": ["z0", "z1", "z2"], "text": [d["text"] for d in docs[:3]],
                             "lang": ["en"] * 3, "seen": seen}), tmp_path / "zoned.parquet")


def _parked_run(tmp_path: Path, name: str, spill_on: bool, flags: list[str]) -> Path:
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text("name: t\ninput: {paths: [docs.jsonl, zoned.parquet]}\nstages:\n"
                      f"  - difficulty: {{outlier_percentile: 95, batch_size: 8, spill: {str(spill_on).lower()}}}\n",
                      "utf-8")
    out = tmp_path / name
    stats = run_recipe(load_recipe(str(recipe), [f"difficulty.model_dir={MODELS}"]), str(out), flags)
    assert stats["ledger_ok"]
    return out


def _sorted_rows(out: Path, kind: str) -> list[dict]:
    rows = [r for f in sorted((out / kind).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


@pytest.mark.parametrize("flags", [[], ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]],
                         ids=["in_process", "multi_processing"])
def test_parked_scored_documents_are_graded_exactly_as_waiting_ones(tmp_path, shared_data, monkeypatch, flags):
    """With `spill: true` (the default) scored documents wait for the quantiles in spill files, not in
    the runner's memory (at 1M documents they were 6.2 GB of the in-process peak); grades,
    rejections, difficulty.json and stats.json are those of `spill: false`."""
    import dsdata.beam.park as park
    from dsdata.beam import spill

    _parked_inputs(tmp_path, shared_data)
    read: list[int] = []
    if not flags:  # in-process: the DoFns run here, so the files they read can be seen
        def counting(path, _real=park.read_spill):
            for record in _real(path):
                if "/difficulty/" in str(path):
                    read.append(1)
                yield record

        monkeypatch.setattr(park, "read_spill", counting)
        monkeypatch.setattr(park, "PARK_FILE_BYTES", 4000)  # several files per bundle
    waiting = _parked_run(tmp_path, "waiting", False, flags)
    assert not read
    parked = _parked_run(tmp_path, "parked", True, flags)
    kept, rejected = _sorted_rows(parked, "kept"), _sorted_rows(parked, "rejected")
    if not flags:
        # Every scored document but the three zoned ones came back from a spill file.
        scored = sum(r["perplexity"] is not None for r in kept) + sum(r["reason"] == "perplexity_outlier"
                                                                       for r in rejected)
        assert len(read) == scored - 3 > 150, (len(read), scored)
    assert kept == _sorted_rows(waiting, "kept") and rejected == _sorted_rows(waiting, "rejected")
    assert {r["id"] for r in kept} >= {"z0", "z1", "z2"} - {r["id"] for r in rejected}
    assert {r["reason"] for r in rejected} == {"perplexity_outlier"}
    for name in ("difficulty.json", "stats.json"):
        a, b = (json.loads((out / name).read_text("utf-8")) for out in (parked, waiting))
        for key in ("seconds", "stage_time", "stage_time_unavailable"):
            a.pop(key, None), b.pop(key, None)
        assert a == b, name
    assert not (parked / spill.SPILL_DIR).exists(), "spill files are removed when the run ends"


def _percentiles_through_beam(values: list[tuple[str, float]], flags: list[str], percentiles, folder: Path) -> dict:
    """The stage's histogram combine run by a real Beam pipeline; percentiles read per key."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from dsdata.beam.difficulty import LogHistogram, percentiles_from_histogram

    with beam.Pipeline(options=PipelineOptions(flags)) as p:
        (p | beam.Create(values, reshuffle=True)
         | beam.CombinePerKey(LogHistogram())
         | beam.MapTuple(lambda k, h: json.dumps([k, percentiles_from_histogram(h, percentiles)]))
         | beam.io.WriteToText(str(folder / "p")))
    return dict(json.loads(line) for path in sorted(folder.glob("p*")) for line in path.read_text().splitlines())


def test_percentiles_are_within_a_hundredth_of_a_percent_of_numpy_and_independent_of_partitioning(tmp_path):
    """The cut-offs must not depend on how a runner splits the values into partial accumulators
    (Beam's ApproximateQuantiles did: at 1M documents Flink graded 20 documents differently from the
    in-process runner).  Integer counts per fixed log bin merge to the same histogram in any
    grouping; the percentiles read from it stay within 0.01 % of numpy's."""
    import numpy as np

    from dsdata.beam.difficulty import LogHistogram, percentiles_from_histogram

    rng = np.random.default_rng(7)
    values = [("en", float(v)) for v in np.exp(rng.normal(4.2, 0.7, 30000))]
    values += [("zh", float(v)) for v in np.exp(rng.normal(5.0, 1.1, 12000))]
    values += [("one", 42.5)]
    percentiles = (0, 0.1, 10, 30, 50, 60, 90, 99.9, 100)
    first = _percentiles_through_beam(values, [], percentiles, tmp_path / "a")
    for lang in ("en", "zh", "one"):
        exact = np.percentile([v for k, v in values if k == lang], percentiles)
        assert np.allclose(first[lang], exact, rtol=1e-4, atol=0), lang
        assert first[lang][0] == exact[0] and first[lang][-1] == exact[-1], "min and max are exact"
    # Another order, another runner (two worker processes, so other partial accumulators): the same
    # floats, not just close ones.
    shuffled = list(values)
    random.Random(3).shuffle(shuffled)
    again = _percentiles_through_beam(shuffled, ["--direct_running_mode=multi_processing",
                                                 "--direct_num_workers=2"], percentiles, tmp_path / "b")
    assert again == first
    # And merges in any grouping, down to one value per accumulator.
    fn = LogHistogram()
    singles = []
    for _, v in (kv for kv in shuffled if kv[0] == "zh"):
        singles.append(fn.add_input(fn.create_accumulator(), v))
    left = fn.merge_accumulators(singles[: len(singles) // 3])
    right = fn.merge_accumulators([fn.merge_accumulators(singles[len(singles) // 3:][::-1])])
    assert percentiles_from_histogram(fn.merge_accumulators([right, left]), percentiles) == first["zh"]
