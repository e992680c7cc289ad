"""Trainer inputs are untrusted (issue 35): token ids past the tokenizer's vocabulary, a shard listed
twice, JSON nested without bound, a FIFO or folder where a file belongs, checkpoint files linked out
of their folder, a shared-memory dataset name with a control character — each one line."""
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from dsdata.shards.format import ShardError, read_manifest, verify_shards
from shard_sets import ShardSetWriter
from dsdata.shards.shm import ShmError, publish
from dsdata.io.untrusted_files import UntrustedFileError, load_json_file

REPO = Path(__file__).resolve().parents[1]


def _set(directory, high=16000, vocab=None):
    writer = ShardSetWriter(str(directory), shard_size=400)
    rng = np.random.default_rng(0)
    for i in range(12):
        writer.add(f"d{i}", rng.integers(1, high, 60, dtype=np.uint16), ("easy", "hard")[i % 2])
    writer.close()
    if vocab is not None:
        manifest = json.loads((directory / "manifest.json").read_text())
        manifest["tokenizer"] = {"path": "tok", "kind": "bpe", "vocab_size": vocab, "eos_id": 0, "eos_token": "</s>"}
        (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def _cli(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "dsdata.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_token_ids_past_the_vocabulary_fail_verification(tmp_path):
    shards = _set(tmp_path / "shards", high=16000, vocab=1000)
    _, problems = verify_shards(str(shards))
    assert problems and all("outside the tokenizer's vocabulary of 1000" in p for p in problems)
    proc = _cli("shards", "verify", str(shards))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    ok = _set(tmp_path / "ok", high=1000, vocab=1000)
    assert verify_shards(str(ok))[1] == []


def test_the_loader_refuses_token_ids_past_the_vocabulary(tmp_path):
    from dsdata.train.data import ShardDataset

    shards = _set(tmp_path / "shards", high=16000, vocab=1000)
    dataset = ShardDataset(str(shards), 16, prefetch=False)
    with pytest.raises(ShardError, match="outside the tokenizer's vocabulary"):
        next(iter(dataset))


def test_a_shard_listed_twice_is_refused(tmp_path):
    shards = _set(tmp_path / "shards")
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["shards"].append(dict(manifest["shards"][0]))
    (shards / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="listed twice"):
        read_manifest(str(shards))
    # The same file spelled another way is the same file.
    manifest["shards"][-1]["file"] = "./" + manifest["shards"][0]["file"]
    (shards / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="listed twice"):
        read_manifest(str(shards))


@pytest.mark.parametrize("depth", [65, 5000, 200_000])
def test_deeply_nested_json_is_one_line_everywhere(tmp_path, depth):
    shards = _set(tmp_path / "shards")
    manifest = json.loads((shards / "manifest.json").read_text())
    text = json.dumps(manifest)[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
    (shards / "manifest.json").write_text(text)
    proc = _cli("shards", "verify", str(shards))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "nested deeper than 64 levels" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def _with_timeout(fn, seconds=20):
    result = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the read blocked (a FIFO was opened)"
    return result


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_fifo_or_directory_where_a_file_belongs_is_refused_without_opening_it(tmp_path, kind):
    shards = _set(tmp_path / "shards")
    (shards / "manifest.json").unlink()
    if kind == "fifo":
        os.mkfifo(shards / "manifest.json")
    else:
        (shards / "manifest.json").mkdir()
    proc = _cli("shards", "verify", str(shards), timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert ("a FIFO" if kind == "fifo" else "a directory") in proc.stderr
    result = _with_timeout(lambda: load_json_file(str(shards / "manifest.json"), "manifest"))
    assert isinstance(result.get("error"), UntrustedFileError)


def _checkpointed_run(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "dsdata.train", "--config", str(REPO / "models" / "tiny.toml"), "--run-dir",
            str(run_dir), "--quiet"]
    for item in ["model.dim=32", "model.n_heads=2", "training.seq_len=32", "data.synthetic_vocab=64",
                 "logging.tensorboard=false", "logging.console_interval=0", "export.enabled=false",
                 "training.steps=2", "checkpoint.interval=1"]:
        args += ["--set", item]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return args, env, run_dir


def test_checkpoint_files_are_confined_and_their_state_bounded(tmp_path):
    args, env, run_dir = _checkpointed_run(tmp_path)
    args = [a if a != "training.steps=2" else "training.steps=4" for a in args]
    step = run_dir / "checkpoints" / "step_00000002"
    state = step / "trainer_state.json"
    original = state.read_text()

    def resume():
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        return proc.stderr.strip().splitlines()[-1]

    state.write_text(original[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "nested deeper than" in resume()
    state.unlink()
    os.mkfifo(state)
    assert "a FIFO" in resume()
    state.unlink()
    state.write_text(original)
    # A file of the checkpoint replaced by a link to a copy outside the folder: refused, not followed.
    data_file = next(p for p in step.iterdir() if p.suffix == ".distcp")
    outside = tmp_path / "outside.distcp"
    shutil.move(data_file, outside)
    os.symlink(outside, data_file)
    assert "leads out of" in resume()


@pytest.mark.parametrize("name", ["set\n", "set\r", "se\tt", "set\x00", "\nset"])
def test_a_shm_dataset_name_with_a_control_character_is_refused(tmp_path, name, monkeypatch):
    shards = _set(tmp_path / "shards")
    with pytest.raises(ShmError, match="dataset name"):
        publish(str(shards), name, root=str(tmp_path / "root"))


def test_a_config_or_recipe_that_is_no_regular_file_is_one_line_not_a_hang(tmp_path):
    """`dsdata.train --config FIFO` waited for a writer for ever and `--config /dev/zero` read without
    end; both, a directory and an oversized file are one line and exit 2, as a recipe given so is."""
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    big = tmp_path / "big.toml"
    big.write_text("# padding\n" * 200_000)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for path, words in [(fifo, "is a FIFO, not a regular file"), ("/dev/zero", "is a character device"),
                        (tmp_path, "is a directory"), (big, "is over 1048576 bytes")]:
        proc = subprocess.run([sys.executable, "-m", "dsdata.train", "--config", str(path), "--run-dir",
                               str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr
        assert lines[0].startswith("dsdata-train: error: config file")
        proc = _cli("run", str(path), "--output", str(tmp_path / "out"))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


def test_the_training_commands_refuse_a_fifo_input_in_one_line(tmp_path):
    """The same class for the other commands that read a user's file: `dsdata tokenizer train
    --input FIFO` and `dsdata classifier train --data FIFO` waited for a writer for ever."""
    fifo = tmp_path / "texts.jsonl"
    os.mkfifo(fifo)
    for args in (["tokenizer", "train", "--input", str(fifo), "--out", str(tmp_path / "tok")],
                 ["classifier", "train", "--backend", "fasttext", "--data", str(fifo), "--out", str(tmp_path / "clf")]):
        proc = _cli(*args)
        assert proc.returncode == 2 and "is a FIFO, not a regular file" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
