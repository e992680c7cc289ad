"""`dsdata lm train` writes a model directory the difficulty stage loads."""
from __future__ import annotations

import json

import pytest

from dsdata.cli import main as cli_main
from dsdata.lm.scorers import NgramScorer, language_model_dirs, perplexity


@pytest.mark.slow
def test_lm_train_command_writes_a_loadable_model(tmp_path, shared_data, capsys):
    corpus = tmp_path / "ref.jsonl"
    # A JSONL corpus with mixed languages: only the --lang records are used.
    with open(shared_data / "langid-dev.jsonl", encoding="utf-8") as src, open(corpus, "w", encoding="utf-8") as dst:
        for line in src:
            rec = json.loads(line)
            if rec["lang"] in ("en", "de"):
                dst.write(json.dumps({"text": rec["text"], "lang": rec["lang"]}, ensure_ascii=False) + "\n")
    out = tmp_path / "models" / "en"
    rc = cli_main(["lm", "train", "--corpus", str(corpus), "--lang", "en", "--order", "3",
                   "--vocab-size", "600", "--prune", "0", "0", "1", "--out", str(out)])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    meta = json.loads((out / "lm.json").read_text(encoding="utf-8"))
    assert meta["training_lines"] >= 582 and meta["order"] == 3 and printed["ngrams"] == meta["ngrams"]
    assert meta["smoothing"] == "interpolated modified Kneser-Ney"
    assert language_model_dirs(str(tmp_path / "models"), "ngram") == {"en": str(out)}
    scorer = NgramScorer(str(out))
    good, bad = scorer.score_documents(["The installer asks for the root password.", "password the root for asks The installer."])
    assert perplexity(*good) < perplexity(*bad)


def test_lm_train_errors_are_one_line(tmp_path, capsys):
    assert cli_main(["lm", "train", "--corpus", str(tmp_path / "missing.txt"), "--lang", "en",
                     "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.txt" in err[0] and "not found" in err[0]
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("one line\n", encoding="utf-8")
    assert cli_main(["lm", "train", "--corpus", str(tiny), "--lang", "en", "--out", str(tmp_path / "o")]) == 2
    assert "usable line" in capsys.readouterr().err


def _mixed_records(shared_data, langs=("en", "de")) -> list[dict]:
    records = []
    with open(shared_data / "langid-dev.jsonl", encoding="utf-8") as src:
        for line in src:
            rec = json.loads(line)
            if rec["lang"] in langs:
                records.append({"text": rec["text"], "lang": rec["lang"]})
    return records


@pytest.mark.slow
def test_lm_train_reads_parquet_as_parquet(tmp_path, shared_data, capsys):
    """Issue 17: a .parquet corpus was read as text (its bytes, errors='replace')."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = _mixed_records(shared_data)
    corpus = tmp_path / "ref.parquet"
    pq.write_table(pa.Table.from_pylist(records), corpus)
    out = tmp_path / "en"
    assert cli_main(["lm", "train", "--corpus", str(corpus), "--lang", "en", "--order", "2",
                     "--vocab-size", "400", "--out", str(out)]) == 0
    meta = json.loads((out / "lm.json").read_text(encoding="utf-8"))
    en = [r for r in records if r["lang"] == "en"]
    assert meta["corpus_format"] == "parquet" and meta["corpus_records_used"] == len(en)
    assert meta["training_lines"] == sum(1 for r in en for ln in r["text"].splitlines() if ln.strip())
    err = capsys.readouterr().err
    assert f"{len(en)} of {len(records)} records have lang = 'en' (field 'lang')" in err


def test_lm_train_lang_filter_names_its_field_and_refuses_when_nothing_matches(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Sentence number {i} is here.", "language": "en"}) + "\n"
                              for i in range(50)), encoding="utf-8")
    args = ["lm", "train", "--corpus", str(corpus), "--lang", "en", "--out", str(tmp_path / "o")]
    # The language is in 'language', not 'lang': refused, naming the field and the way out.
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no record has the language field 'lang'" in err[0] and "--lang-field" in err[0]
    # Wrong language: refused with the languages seen.
    assert cli_main(args[:5] + ["de"] + args[6:] + ["--lang-field", "language"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no record has language = 'de'" in err[0] and "en 50" in err[0]
    # An unknown file kind is refused rather than read as text.
    blob = tmp_path / "c.bin"
    blob.write_bytes(b"\x00\x01PAR1")
    assert cli_main(["lm", "train", "--corpus", str(blob), "--lang", "en", "--out", str(tmp_path / "o")]) == 2
    assert "cannot tell its format" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
