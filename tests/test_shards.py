"""Shards: Beam round trip docs → shards → loader, determinism across runners, integrity checks,
and crash safety of shard writing (SIGKILL mid-write)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsdata.cli import main as cli_main
from dsdata.document import Document
from dsdata.shards.format import MANIFEST, ShardError, read_manifest, verify_shards
from shard_sets import ShardSetWriter
from dsdata.stages.shards import shard_record
from dsdata.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "pipelines" / "models" / "tokenizer"


def _paragraphs(path: Path, n: int) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if len(p.strip()) > 40][:n]


@pytest.fixture(scope="module")
def corpus_recipe(tmp_path_factory, shared_data):
    """A recipe dir with 70 real en + zh paragraphs (and one blank text the reader rejects)."""
    tmp_path = tmp_path_factory.mktemp("corpus")
    docs = _paragraphs(shared_data / "prose-en.txt", 40) + _paragraphs(shared_data / "prose-zh.txt", 30)
    (tmp_path / "data").mkdir()
    with open(tmp_path / "data" / "docs.jsonl", "w", encoding="utf-8") as fh:
        for i, text in enumerate(docs):
            fh.write(json.dumps({"id": f"doc-{i:03d}", "text": text}, ensure_ascii=False) + "\n")
        fh.write(json.dumps({"id": "blank", "text": "   "}) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "name: shardtest\ninput:\n  paths: [data/*.jsonl]\noutput: out\nstages:\n"
        "  - tokenize: {}\n  - shards: {shard_size: 3000}\n", encoding="utf-8")
    return recipe, {f"doc-{i:03d}": t for i, t in enumerate(docs)}


@pytest.fixture(scope="module")
def default_run(corpus_recipe):
    """The corpus run once with the default in-process runner."""
    recipe, _ = corpus_recipe
    out = recipe.parent / "out-inprocess"
    return out, _run(recipe, out)


def _run(recipe: Path, out: Path, *beam_args: str) -> dict:
    from dsdata.beam.pipeline import run_recipe
    from dsdata.recipe import load_recipe

    return run_recipe(load_recipe(str(recipe), [f"tokenize.tokenizer={TOKENIZER}"]), str(out), list(beam_args))


@pytest.mark.slow
def test_round_trip_docs_to_shards_to_loader_gives_the_token_stream(corpus_recipe, default_run):
    from dsdata.train.data import ShardDataset

    _, texts = corpus_recipe
    out, stats = default_run
    assert stats["ledger_ok"] and stats["kept"] == len(texts)
    shard_dir = out / "shards"
    manifest, problems = verify_shards(str(shard_dir))
    assert problems == []
    assert manifest["totals"]["docs"] == len(texts)
    assert manifest["dtype"] == "uint16" and manifest["tokenizer"]["sha256"] == load_tokenizer(str(TOKENIZER)).sha256
    assert len(manifest["shards"]) > 1  # shard_size 3000 cuts this corpus into several shards

    tokenizer = load_tokenizer(str(TOKENIZER))
    seen_ids = []
    seq_len = 32
    ds = ShardDataset(str(shard_dir), seq_len, shuffle=False, prefetch=False)
    windows = iter(ds)
    total_tokens = 0
    for entry in manifest["shards"]:
        table = pa.ipc.open_file(pa.memory_map(str(shard_dir / entry["file"]))).read_all()
        ids = table.column("id").to_pylist()
        seen_ids += ids
        assert set(table.column("difficulty").to_pylist()) == {"medium"}
        encoded = tokenizer.encode_batch([texts[i] for i in ids])
        expected = np.concatenate([np.array(e + [tokenizer.eos_id], dtype=np.uint16) for e in encoded])
        assert len(expected) == entry["tokens"]
        total_tokens += len(expected)
        # The loader's windows of this shard, stitched back (they overlap by one token), are the stream.
        n_windows = (len(expected) - 1) // seq_len
        stitched = [next(windows).numpy()]
        for _ in range(n_windows - 1):
            stitched.append(next(windows).numpy()[1:])
        np.testing.assert_array_equal(np.concatenate(stitched), expected[: n_windows * seq_len + 1])
    with pytest.raises(StopIteration):
        next(windows)
    assert sorted(seen_ids) == sorted(texts)
    assert manifest["totals"]["tokens"] == total_tokens
    kept = pq.read_table(str(out / "kept"))
    # kept/*.parquet carries the count, not the ids (those live in the shards).
    assert "num_tokens" in kept.column_names and "tokens" not in kept.column_names
    assert sum(kept.column("num_tokens").to_pylist()) == total_tokens


@pytest.mark.slow
def test_multi_worker_direct_runner_writes_identical_shards(corpus_recipe, default_run, tmp_path):
    recipe, _ = corpus_recipe
    _run(recipe, tmp_path / "b", "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    a = read_manifest(str(default_run[0] / "shards"))
    b = read_manifest(str(tmp_path / "b" / "shards"))
    assert [(s["file"], s["sha256"]) for s in a["shards"]] == [(s["file"], s["sha256"]) for s in b["shards"]]
    assert verify_shards(str(tmp_path / "b" / "shards"))[1] == []


def _small_set(directory: Path, n_docs=30, shard_size=400) -> dict:
    writer = ShardSetWriter(str(directory), shard_size=shard_size)
    rng = np.random.default_rng(0)
    for i in range(n_docs):
        writer.add(f"d{i}", rng.integers(1, 16000, 40 + i, dtype=np.uint16), ("easy", "medium", "hard")[i % 3])
    return writer.close()


def test_corrupted_shard_is_refused_naming_the_file(tmp_path, capsys):
    from dsdata.train.data import ShardDataset

    manifest = _small_set(tmp_path / "s")
    victim = tmp_path / "s" / manifest["shards"][1]["file"]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit in the token values
    victim.write_bytes(bytes(data))

    assert cli_main(["shards", "verify", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert str(victim) in err and "sha256" in err
    other = tmp_path / "s" / manifest["shards"][0]["file"]
    assert str(other) not in err

    ds = ShardDataset(str(tmp_path / "s"), 8, shuffle=False, prefetch=True)
    with pytest.raises(ShardError, match=str(victim)):
        for _ in ds:
            pass
    # With verification off the loader maps it anyway (the user's explicit choice).
    assert sum(1 for _ in ShardDataset(str(tmp_path / "s"), 8, verify=False)) > 0


def test_verify_ok_and_info(tmp_path, capsys):
    _small_set(tmp_path / "s")
    assert cli_main(["shards", "verify", str(tmp_path / "s")]) == 0
    assert "every sha256 matches" in capsys.readouterr().out
    assert cli_main(["shards", "info", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "easy" in out and "hard" in out and "dtype uint16" in out


def test_truncated_or_missing_shard_and_missing_manifest(tmp_path, capsys):
    manifest = _small_set(tmp_path / "s")
    victim = tmp_path / "s" / manifest["shards"][0]["file"]
    victim.write_bytes(victim.read_bytes()[:-10])
    assert cli_main(["shards", "verify", str(tmp_path / "s")]) == 1
    assert str(victim) in capsys.readouterr().err
    (tmp_path / "s" / MANIFEST).unlink()
    assert cli_main(["shards", "verify", str(tmp_path / "s")]) == 2
    assert "manifest.json not found" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["../outside.arrow", "/etc/passwd", "sub/../../x.arrow", ""])
def test_manifest_paths_may_not_escape_its_directory(tmp_path, bad):
    manifest = _small_set(tmp_path / "s")
    (tmp_path / "outside.arrow").write_bytes(b"x")
    manifest["shards"][0]["file"] = bad
    (tmp_path / "s" / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="escapes|plain relative"):
        read_manifest(str(tmp_path / "s"))


def test_symlink_out_of_the_directory_is_refused(tmp_path):
    manifest = _small_set(tmp_path / "s")
    (tmp_path / "elsewhere.arrow").write_bytes(b"x")
    os.symlink(tmp_path / "elsewhere.arrow", tmp_path / "s" / "link.arrow")
    manifest["shards"][0]["file"] = "link.arrow"
    (tmp_path / "s" / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="escapes"):
        read_manifest(str(tmp_path / "s"))


def test_buckets_from_difficulty_annotation_default_medium():
    tokens = np.array([5, 6, 0], dtype=np.uint16)
    assert shard_record(Document("a", "x", annotations={"tokens": tokens, "difficulty": "hard"}), "medium")[0] == "hard"
    assert shard_record(Document("b", "x", annotations={"tokens": tokens}), "medium")[0] == "medium"
    with pytest.raises(ValueError, match="tokenize"):
        shard_record(Document("c", "x"), "medium")


_KILL_WRITER = r"""
import sys
import numpy as np
from shard_sets import ShardSetWriter

writer = ShardSetWriter(sys.argv[1], shard_size=20_000_000)
rng = np.random.default_rng(1)
block = rng.integers(1, 16000, 2_000_000, dtype=np.uint16)
for i in range(1000):
    writer.add(f"d{i}", block, "medium")
writer.close()
"""


@pytest.mark.slow
def test_sigkill_during_shard_writing_leaves_no_partial_shard_named(tmp_path):
    from dsdata.train.data import ShardDataset

    directory = tmp_path / "s"
    _small_set(directory)  # a complete earlier set, about to be overwritten
    proc = subprocess.Popen([sys.executable, "-c", _KILL_WRITER, str(directory)], cwd=str(REPO),
                            env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"})
    # Kill as soon as a 40 MB shard is being written under its temp name.
    deadline = time.time() + 120
    caught_mid_write = False
    try:
        while time.time() < deadline and proc.poll() is None:
            if any(".tmp-" in name for name in os.listdir(directory)):
                caught_mid_write = True
                break
            time.sleep(0.001)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert caught_mid_write, "the writer never started a shard"
    assert proc.returncode == -signal.SIGKILL

    # The manifest was removed before rewriting began: nothing claims the set is complete ...
    assert not (directory / MANIFEST).exists()
    with pytest.raises(ShardError, match="manifest.json not found"):
        ShardDataset(str(directory), 16)
    # ... and every file under a final shard name is a whole, readable Arrow file.
    for name in os.listdir(directory):
        if name.endswith(".arrow") and not name.startswith("."):
            table = pa.ipc.open_file(pa.memory_map(str(directory / name))).read_all()
            table.validate(full=True)
    # A new run over the debris completes, cleans the temp files, and verifies.
    _small_set(directory)
    assert not any(".tmp-" in name for name in os.listdir(directory))
    assert verify_shards(str(directory))[1] == []


def test_info_verify_and_publish_accept_the_run_directory(tmp_path, capsys, monkeypatch):
    """`dsdata shards info out` / `dsdata shm publish out` take the run directory, as the trainer's
    data.path does (issue 17: they said 'a run that wrote it did not finish')."""
    _small_set(tmp_path / "run" / "shards")
    (tmp_path / "run" / "stats.json").write_text("{}")
    assert cli_main(["shards", "info", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["docs"] == 30
    assert cli_main(["shards", "verify", str(tmp_path / "run")]) == 0
    assert "every sha256 matches" in capsys.readouterr().out
    monkeypatch.setenv("DSDATA_SHM_ROOT", str(tmp_path / "shm"))
    assert cli_main(["shm", "publish", str(tmp_path / "run"), "--name", "corpus"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["shards"] > 1

    # A run directory whose shards/ has no manifest yet, and one without shards/ at all: said plainly.
    (tmp_path / "run" / "shards" / "manifest.json").unlink()
    assert cli_main(["shards", "info", str(tmp_path / "run")]) == 2
    assert "did not finish writing its shards" in capsys.readouterr().err
    (tmp_path / "langid").mkdir()
    (tmp_path / "langid" / "stats.json").write_text("{}")
    assert cli_main(["shm", "publish", str(tmp_path / "langid"), "--name", "x"]) == 2
    assert "without shards/ (its recipe has no shards stage)" in capsys.readouterr().err


def test_piping_into_head_prints_no_traceback(tmp_path):
    _small_set(tmp_path / "s", n_docs=1500, shard_size=40)  # --files: ~1500 lines, more than a pipe holds
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    for args in (["shards", "info", str(tmp_path / "s"), "--files"], ["shards", "info", str(tmp_path / "s"), "--json"]):
        proc = subprocess.run(f"{sys.executable} -m dsdata.cli {' '.join(args)} | head -n 1", shell=True,
                              env=env, capture_output=True, text=True, timeout=120)
        assert len(proc.stdout.splitlines()) == 1
        assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def _shards_of(docs: list[Document], out: Path) -> dict[str, bytes]:
    import apache_beam as beam

    from dsdata.beam.kinds import StageContext
    from dsdata.beam.shards import composite
    from dsdata.stages.shards import ShardsStage
    from dsdata.stages.tokenize import TokenizeStage

    with beam.Pipeline() as p:
        (p | beam.Create(docs) | composite(ShardsStage(shard_size=2000), StageContext(str(out), (TokenizeStage(
            tokenizer=str(TOKENIZER)),))))
    root = out / "shards"
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def test_token_ids_parked_in_many_spill_files_give_the_same_shards(tmp_path, monkeypatch):
    """The shards stage parks token ids in spill files until the per-bucket totals are known; how
    many files a bundle's records roll over into changes nothing in the shards, and every document's
    ids come back exactly once."""
    import dsdata.beam.shards as beam_shards

    rng = np.random.default_rng(7)
    docs = [Document(f"d{i:04d}", "", annotations={"tokens": rng.integers(0, 500, int(rng.integers(1, 90)),
                                                                             dtype=np.uint16),
                                                    **({"difficulty": "hard"} if i % 4 == 0 else {})})
            for i in range(600)]
    one_file = _shards_of(docs, tmp_path / "one")
    monkeypatch.setattr(beam_shards, "SPILL_FILE_BYTES", 300)  # a new spill file every few documents
    many_files = _shards_of(docs, tmp_path / "many")
    assert one_file == many_files
    assert len([n for n in one_file if n.endswith(".arrow")]) > 4
    spilled = {run: len(list((tmp_path / run / ".spill").rglob("*.spill"))) for run in ("one", "many")}
    assert spilled["many"] > 5 * spilled["one"]  # (the run, not the composite, removes .spill/)
    manifest = json.loads(one_file[MANIFEST])
    got = {}
    for name in one_file:
        if name.endswith(".arrow"):
            table = pa.ipc.open_file(tmp_path / "one" / "shards" / name).read_all()
            for doc_id, tokens in zip(table["id"].to_pylist(), table["tokens"].to_pylist()):
                assert doc_id not in got
                got[doc_id] = tokens
    assert got == {d.id: d.annotations["tokens"].tolist() for d in docs}
    assert manifest["buckets"]["hard"]["docs"] == 150 and manifest["totals"]["docs"] == 600
