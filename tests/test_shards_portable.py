"""Portable shard sets: the tokenizer travels inside the shard folder (named relatively, with sha256),
through `dsdata shm publish`, into training and into exports — also where the tokenizer the shards
were written with no longer exists.  Old manifests (an absolute tokenizer path) still read."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dsdata.shards.tokenizer import verify_shard_set
from dsdata.shards.format import MANIFEST, read_manifest
from dsdata.io.outfiles import file_sha256

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "pipelines" / "models" / "tokenizer"
WORDS = ("the river city data model train light stone paper window garden music number market story "
         "winter summer bridge engine signal field green quiet early north table letter").split()


def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", **extra)
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def _cli(*args, **env):
    proc = subprocess.run([sys.executable, "-m", "dsdata.cli", *args], env=_env(**env), capture_output=True,
                          text=True, timeout=600)
    return proc


@pytest.fixture(scope="module")
def moved_tokenizer_run(tmp_path_factory):
    """Shards written by a real run with a tokenizer at tmp/tok, which is then removed."""
    tmp = tmp_path_factory.mktemp("portable")
    tok = tmp / "tok"
    shutil.copytree(TOKENIZER, tok)
    rng = np.random.default_rng(3)
    (tmp / "data").mkdir()
    with open(tmp / "data" / "docs.jsonl", "w", encoding="utf-8") as fh:
        for i in range(200):
            text = " ".join(rng.choice(WORDS, int(rng.integers(20, 80))))
            fh.write(json.dumps({"id": f"d{i:04d}", "text": text.capitalize() + "."}) + "\n")
    (tmp / "recipe.yaml").write_text("name: portable\ninput:\n  paths: [data/*.jsonl]\noutput: out\nstages:\n"
                                     "  - tokenize: {}\n  - shards: {shard_size: 4000}\n", encoding="utf-8")
    proc = _cli("run", str(tmp / "recipe.yaml"), "--output", str(tmp / "out"), "--quiet", "--set",
                f"tokenize.tokenizer={tok}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sha = file_sha256(str(tok / "tokenizer.json"))
    shutil.rmtree(tok)  # the machine the shards land on has no such path
    return tmp / "out" / "shards", str(tok), sha


def test_the_manifest_names_the_bundled_tokenizer_relatively(moved_tokenizer_run):
    shards, origin, sha = moved_tokenizer_run
    tokenizer = read_manifest(str(shards))["tokenizer"]
    assert tokenizer["path"] == "tokenizer" and tokenizer["bundled"] is True and tokenizer["origin"] == origin
    assert tokenizer["sha256"] == sha
    names = {e["file"]: e["sha256"] for e in tokenizer["files"]}
    assert names["tokenizer/tokenizer.json"] == sha and "tokenizer/tokenizer_config.json" in names
    for name, digest in names.items():
        assert file_sha256(str(shards / name)) == digest
    assert not any(name.endswith((".md", "training.json")) for name in names)  # only tokenizer files


def test_published_shards_train_and_export_without_the_original_tokenizer(moved_tokenizer_run, tmp_path):
    shards, origin, sha = moved_tokenizer_run
    assert not os.path.exists(origin)
    root = tmp_path / "shm"
    proc = _cli("shm", "publish", str(shards.parent), "--name", "portable", DSDATA_SHM_ROOT=str(root))
    assert proc.returncode == 0, proc.stderr
    published = root / "portable"
    assert file_sha256(str(published / "tokenizer" / "tokenizer.json")) == sha
    assert verify_shard_set(str(published))[1] == []

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "dsdata.train", "--config", str(REPO / "models" / "tiny.toml"), "--run-dir",
           str(run_dir), "--set", f"data.path={published}", "--set", "training.steps=3", "--set",
           "checkpoint.interval=0", "--set", "logging.console_interval=0", "--set", "training.global_batch_size=4",
           "--set", "schedule.warmup_steps=1", "--set", "logging.histogram_interval=0", "--set",
           "logging.tensorboard=false"]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the exported model carries the shards' tokenizer, loadable by transformers
    assert file_sha256(str(run_dir / "hf" / "tokenizer.json")) == sha
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(run_dir / "hf")).eos_token == "<|endoftext|>"

    proc = _cli("shards", "export", "--format", "hf", "--format", "megatron", str(published), str(tmp_path / "exp"))
    assert proc.returncode == 0, proc.stderr
    for fmt in ("hf", "megatron"):
        assert file_sha256(str(tmp_path / "exp" / fmt / "tokenizer" / "tokenizer.json")) == sha
        assert "tokenizer.json" in json.loads((tmp_path / "exp" / fmt / "export.json").read_text())["tokenizer_files"]


def test_a_changed_bundled_tokenizer_fails_verify_and_publish(moved_tokenizer_run, tmp_path):
    shards, _, _ = moved_tokenizer_run
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    (copy / "tokenizer" / "tokenizer_config.json").write_text("{}")
    problems = verify_shard_set(str(copy))[1]
    assert len(problems) == 1 and "tokenizer_config.json: sha256 does not match" in problems[0]
    proc = _cli("shm", "publish", str(copy), "--name", "changed", DSDATA_SHM_ROOT=str(tmp_path / "shm"))
    assert proc.returncode == 2 and "tokenizer_config.json" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_bundle_entry_escaping_the_folder_is_refused(moved_tokenizer_run, tmp_path):
    shards, _, _ = moved_tokenizer_run
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["tokenizer"]["files"].append({"file": "tokenizer/../../secret", "sha256": "0" * 64})
    (copy / MANIFEST).write_text(json.dumps(manifest))
    problems = verify_shard_set(str(copy))[1]
    assert problems and "must be {file: tokenizer/NAME, sha256}" in problems[0]


def test_an_old_manifest_with_an_absolute_tokenizer_path_still_reads(moved_tokenizer_run, tmp_path):
    from dsdata.shards.export import copy_tokenizer
    from dsdata.shards.export.source import ShardSource
    from dsdata.train.loop import _shard_tokenizer

    shards, _, sha = moved_tokenizer_run
    old = tmp_path / "old"
    shutil.copytree(shards, old)
    shutil.rmtree(old / "tokenizer")
    manifest = json.loads((old / MANIFEST).read_text())
    tok = manifest["tokenizer"]
    manifest["tokenizer"] = {k: tok[k] for k in ("kind", "vocab_size", "eos_id", "eos_token", "sha256")}
    manifest["tokenizer"]["path"] = str(TOKENIZER)  # what manifests recorded before bundling
    (old / MANIFEST).write_text(json.dumps(manifest))
    assert verify_shard_set(str(old))[1] == []
    batches = SimpleNamespace(tokenizer=lambda: (manifest["tokenizer"], str(old)))  # a BatchSource's tokenizer()
    assert _shard_tokenizer(batches) == (str(TOKENIZER), tok["eos_id"])
    out = tmp_path / "export"
    out.mkdir()
    assert "tokenizer.json" in copy_tokenizer(ShardSource(str(old)), str(out))
    assert file_sha256(str(out / "tokenizer" / "tokenizer.json")) == sha
