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
