"""Tokenizer training and loading: byte-level BPE on zh + en, AutoTokenizer compatibility, the tokenize stage."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from dsdata.cli import main as cli_main
from dsdata.document import Document, Rejected
from dsdata.stages import StageConfigError
from dsdata.stages.tokenize import TokenizeStage
from dsdata.tokenizer import EOS_TOKEN, TokenizerError, load_tokenizer

REPO = Path(__file__).resolve().parents[1]
TEXTS = [
    "The quick brown fox jumps over the lazy dog. Shards are memory-mapped Arrow files.",
    "数据管道把文档切分成词元，然后写入训练分片。每个分片都有校验和。",
    "Mixed 中英文 text with numbers 12345 and symbols — “quotes” ✓ 🚀.",
] * 20


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tok")
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n\n".join(TEXTS), encoding="utf-8")
    out = tmp / "tokenizer"
    assert cli_main(["tokenizer", "train", "--input", str(corpus), "--vocab-size", "400", "--out", str(out)]) == 0
    return out


def test_trained_tokenizer_round_trips_zh_and_en_and_loads_with_autotokenizer(trained):
    tok = load_tokenizer(str(trained))
    assert tok.eos_id == 0 and tok.eos_token == EOS_TOKEN and tok.vocab_size <= 400
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(trained / "tokenizer.json"))
    for text, ids in zip(TEXTS[:3], tok.encode_batch(TEXTS[:3])):
        assert raw.decode(ids) == text  # byte-level: no unknown tokens, exact round trip
        assert EOS_TOKEN not in raw.decode(ids)
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(trained))
    assert auto.eos_token_id == 0
    assert auto(TEXTS[1], add_special_tokens=False)["input_ids"] == tok.encode_batch([TEXTS[1]])[0]
    info = json.loads((trained / "training.json").read_text())
    assert info["vocab_size_requested"] == 400
    assert info["tokenizer_sha256"] == tok.sha256


def test_autotokenizer_directory_without_tokenizer_json_is_accepted(tmp_path, trained):
    """A SentencePiece-style directory (no tokenizer.json) goes through AutoTokenizer."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_file=str(trained / "tokenizer.json"), eos_token=EOS_TOKEN)
    fast.save_pretrained(str(tmp_path / "hf"), legacy_format=False)
    assert load_tokenizer(str(tmp_path / "hf")).encode_batch(["abc"]) == load_tokenizer(str(trained)).encode_batch(["abc"])


def test_default_tokenizer_is_small_and_fits_uint16():
    path = REPO / "pipelines" / "models" / "tokenizer"
    assert (path / "tokenizer.json").stat().st_size <= 2 * 1024 * 1024
    assert (path / "README.md").is_file()
    tok = load_tokenizer(str(path))
    assert 8000 <= tok.vocab_size <= 16384 and tok.dtype == np.uint16


def test_tokenize_stage_appends_eos_and_rejects_empty(trained):
    stage = TokenizeStage(tokenizer=str(trained))
    stage.setup()
    results = stage.process_batch([Document("a", TEXTS[0]), Document("b", ""), Document("c", TEXTS[1])])
    assert isinstance(results[1], Rejected) and results[1].reason == "no_tokens"
    for doc, text in ((results[0], TEXTS[0]), (results[2], TEXTS[1])):
        ids = doc.annotations["tokens"]
        assert ids.dtype == np.uint16 and ids[-1] == 0 and doc.annotations["num_tokens"] == len(ids)
        assert list(ids[:-1]) == load_tokenizer(str(trained)).encode_batch([text])[0]
    assert "tokens" not in stage.annotations
    assert "tokens" in TokenizeStage(tokenizer=str(trained), keep_column=True).annotations


def test_user_errors_are_one_clear_line(tmp_path, capsys):
    with pytest.raises(StageConfigError, match="not found"):
        TokenizeStage(tokenizer=str(tmp_path / "nope"))
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizer(str(tmp_path / "nope"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TokenizerError, match="bad.json"):
        load_tokenizer(str(tmp_path / "bad.json"))
    assert cli_main(["tokenizer", "train", "--input", str(tmp_path / "none*.txt"), "--out", str(tmp_path / "o")]) == 2
    assert "no files match" in capsys.readouterr().err
