"""`dsdata shards export` and the shards stage's `export` option: each format is read back with its
own project's reader (megatron-core's IndexedDataset, mosaicml-streaming's StreamingDataset,
Hugging Face datasets) and compared token for token with the shards, read here with pyarrow."""
import json
import math
import os
import re
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dsdata.cli import main as cli_main
from dsdata.shards.export.formats import ExportFormat, format_names, register_export_format
from dsdata.shards.format import MANIFEST, read_manifest
from shard_sets import ShardSetWriter
from dsdata.io.outfiles import file_sha256

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "pipelines" / "models" / "tokenizer"


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch):
    """streaming.StreamingDataset leaves its filelocks in tempfile.gettempdir(): keep them in the
    test's own folder rather than /tmp."""
    (tmp_path / "tempdir").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tempdir"))


def shard_documents(shard_dir: Path) -> dict[str, list[tuple[str, np.ndarray]]]:
    """{bucket: [(id, ids)]} straight from the Arrow files, in manifest order."""
    manifest = read_manifest(str(shard_dir))
    out: dict[str, list[tuple[str, np.ndarray]]] = {}
    for shard in manifest["shards"]:
        with pa.memory_map(str(shard_dir / shard["file"]), "r") as source:
            table = pa.ipc.open_file(source).read_all()
        for ids, doc_id in zip(table.column("tokens").to_pylist(), table.column("id").to_pylist()):
            out.setdefault(shard["difficulty"], []).append((doc_id, np.asarray(ids, dtype=manifest["dtype"])))
    return dict(sorted(out.items()))


def random_set(directory: Path, vocab: int = 1000, n_docs: int = 90, shard_size: int = 900) -> Path:
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    writer = ShardSetWriter(str(directory), dtype=np.dtype(dtype), shard_size=shard_size,
                            tokenizer={"vocab_size": vocab, "eos_id": 0, "eos_token": "<|endoftext|>"})
    rng = np.random.default_rng(7)
    for i in range(n_docs):
        # 1-300 ids: documents longer than 255 ids exercise MDS's 2-byte shapes
        ids = np.append(rng.integers(1, vocab, int(rng.integers(0, 300))), 0).astype(dtype)
        writer.add(f"doc-{i:03d}", ids, ("easy", "medium", "hard")[i % 3])
    writer.close()
    return directory


def check_megatron(export: Path, expected: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core warns that apex / transformer-engine are absent
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    assert sorted(p.name for p in export.iterdir() if p.name != "tokenizer") == sorted(
        [f"{b}.{ext}" for b in expected for ext in ("bin", "idx")] + ["export.json", ".dsdata-export"])
    for bucket, docs in expected.items():
        ds = IndexedDataset(str(export / bucket))
        assert len(ds) == len(docs)
        # one sequence per document: document i is sequence i
        assert ds.document_indices.tolist() == list(range(len(docs) + 1))
        assert ds.sequence_lengths.tolist() == [len(ids) for _, ids in docs]
        for i, (_, ids) in enumerate(docs):
            got = ds[i]
            assert np.array_equal(got, ids) and got[-1] == 0
            if len(ids) > 3:
                assert np.array_equal(ds.get(i, offset=1, length=2), ids[1:3])


def import_streaming():
    """mosaicml-streaming, which .ci/run installs with --no-deps (its declared requirements would
    downgrade numpy and transformers; pyproject.toml's dev extra says why).  Not installed: the check
    skips naming the command.  Installed but not importable (a module it needs is missing): a failure."""
    try:
        import streaming
    except ModuleNotFoundError as exc:
        if exc.name != "streaming":
            raise
        pytest.skip("mosaicml-streaming is not installed: python3 -m pip install --no-deps "
                    "mosaicml-streaming==0.13.0 (as .ci/run does; its declared numpy<2.2 cannot be met here)")
    return streaming


def check_mds(export: Path, expected: dict, source: str) -> None:
    streaming = import_streaming()
    for bucket, docs in expected.items():
        ds = streaming.StreamingDataset(local=str(export / bucket), shuffle=False, batch_size=1)
        assert len(ds) == len(docs)
        for i, (doc_id, ids) in enumerate(docs):
            sample = ds[i]
            assert sample["id"] == doc_id and sample["difficulty"] == bucket and sample["source"] == source
            assert sample["input_ids"].dtype == ids.dtype and np.array_equal(sample["input_ids"], ids)
        assert [s["id"] for s in ds] == [d for d, _ in docs]  # iteration (not only random access) too


def check_hf(export: Path, expected: dict, source: str) -> None:
    datasets = pytest.importorskip("datasets")
    flat = [(bucket, doc_id, ids) for bucket, docs in expected.items() for doc_id, ids in docs]
    from_disk = datasets.load_from_disk(str(export / "save_to_disk"))
    from_parquet = datasets.load_dataset(str(export), split="train", cache_dir=str(export.parent / "hf-cache"))
    for ds in (from_disk, from_parquet):
        assert ds.num_rows == len(flat)
        assert set(ds.column_names) == {"input_ids", "id", "difficulty", "source"}
        assert ds.features["input_ids"].feature.dtype == str(flat[0][2].dtype)
        assert ds["difficulty"] == [b for b, _, _ in flat] and ds["id"] == [d for _, d, _ in flat]
        assert set(ds["source"]) == {source}
        for row, (_, _, ids) in zip(ds.with_format("numpy"), flat):
            assert np.array_equal(row["input_ids"], ids)
    card = (export / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\nconfigs:") and "data/train-*.parquet" in card


def test_the_stage_and_the_registry_name_the_same_formats():
    assert format_names() == ("megatron", "mds", "hf")


@pytest.mark.parametrize("vocab", [1000, 70_000], ids=["uint16", "uint32"])
def test_cli_export_round_trips_through_each_projects_reader(tmp_path, vocab, capsys):
    src = random_set(tmp_path / "shards", vocab=vocab)
    expected = shard_documents(src)
    assert sum(len(d) for d in expected.values()) == 90 and len(read_manifest(str(src))["shards"]) > 3
    code = cli_main(["shards", "export", "--format", "megatron,mds", "--format", "hf", "--source", "web",
                     str(src), str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    assert "megatron: 90 documents" in capsys.readouterr().out
    if vocab > 1 << 16:  # Megatron has no uint32: int32 ids, the same values
        expected_megatron = {b: [(d, ids.astype(np.int32)) for d, ids in docs] for b, docs in expected.items()}
    else:
        expected_megatron = expected
    check_megatron(tmp_path / "out" / "megatron", expected_megatron)
    check_hf(tmp_path / "out" / "hf", expected, "web")
    summary = json.loads((tmp_path / "out" / "mds" / "export.json").read_text())
    assert summary["manifest_sha256"] and summary["buckets"]["easy"]["documents"] == 30
    check_mds(tmp_path / "out" / "mds", expected, "web")


def test_mds_shards_split_at_the_size_limit(tmp_path):
    from dsdata.shards.export import mds
    from dsdata.shards.export.source import ShardSource

    src = random_set(tmp_path / "shards")
    out = tmp_path / "mds"
    out.mkdir()
    summary = mds.write(ShardSource(str(src), "web"), str(out), size_limit=2000)
    assert summary["buckets"]["easy"]["shards"] > 3
    for bucket in summary["buckets"]:
        index = json.loads((out / bucket / "index.json").read_text())
        for shard in index["shards"]:
            size = (out / bucket / shard["raw_data"]["basename"]).stat().st_size
            assert size == shard["raw_data"]["bytes"] <= 2000
    check_mds(out, shard_documents(src), "web")


@pytest.mark.parametrize("vocab", [1000, 70_000], ids=["uint16", "uint32"])
def test_mds_export_is_byte_identical_to_streamings_own_writer(tmp_path, vocab):
    """The same documents through streaming's MDSWriter give the same files: every shard and the
    index.json, byte for byte, split at the same samples."""
    from dsdata.shards.export import mds
    from dsdata.shards.export.source import ShardSource

    MDSWriter = import_streaming().MDSWriter
    src = random_set(tmp_path / "shards", vocab=vocab)
    source = ShardSource(str(src), "web")
    (tmp_path / "ours").mkdir()
    summary = mds.write(source, str(tmp_path / "ours"), size_limit=1500)
    columns = {"difficulty": "str", "id": "str", "input_ids": f"ndarray:{source.dtype.name}", "source": "str"}
    for bucket in source.buckets:
        with MDSWriter(out=str(tmp_path / "theirs" / bucket), columns=columns, size_limit=1500,
                       hashes=[]) as writer:
            for doc in source.documents(bucket):
                writer.write({"difficulty": doc.difficulty, "id": doc.id, "input_ids": doc.tokens,
                              "source": "web"})
        ours, theirs = tmp_path / "ours" / bucket, tmp_path / "theirs" / bucket
        names = sorted(os.listdir(theirs))
        assert sorted(os.listdir(ours)) == names and len(names) == summary["buckets"][bucket]["shards"] + 1 > 3
        for name in names:
            assert (ours / name).read_bytes() == (theirs / name).read_bytes(), f"{bucket}/{name}"


def test_export_refuses_corrupt_shards_unknown_formats_and_a_destination_inside_the_set(tmp_path, capsys):
    src = random_set(tmp_path / "shards")
    assert cli_main(["shards", "export", "--format", "parquet", str(src), str(tmp_path / "out")]) == 2
    assert "unknown export format(s) 'parquet'; choose from megatron, mds, hf" in capsys.readouterr().err
    assert cli_main(["shards", "export", "--format", "hf", str(src), str(src / "x")]) == 2
    assert "lies inside the shard set" in capsys.readouterr().err
    first = read_manifest(str(src))["shards"][0]["file"]
    data = bytearray((src / first).read_bytes())
    data[-100] ^= 0xFF
    (src / first).write_bytes(bytes(data))
    assert cli_main(["shards", "export", "--format", "megatron", str(src), str(tmp_path / "out")]) == 2
    assert f"{first}: sha256" in capsys.readouterr().err
    # nothing that looks like an export is left behind: no megatron folder, no temp folder
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_an_unwritable_destination_is_one_line(tmp_path, capsys):
    src = random_set(tmp_path / "shards")
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path, tmp_path / "out" / "megatron")  # not ours to replace
    assert cli_main(["shards", "export", "--format", "megatron", str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsdata: error: cannot write the export under") and err.count("\n") == 1
    assert os.path.islink(tmp_path / "out" / "megatron") and os.listdir(tmp_path / "out") == ["megatron"]


def test_a_second_export_replaces_the_first_whole(tmp_path):
    src = random_set(tmp_path / "shards")
    assert cli_main(["shards", "export", "--format", "megatron", str(src), str(tmp_path / "out")]) == 0
    (tmp_path / "out" / "megatron" / "stale.bin").write_bytes(b"x")
    assert cli_main(["shards", "export", "--format", "megatron", str(src), str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "megatron" / "stale.bin").exists()
    assert sorted(os.listdir(tmp_path / "out")) == ["megatron"]


def test_an_export_replaces_only_a_folder_it_wrote(tmp_path, capsys):
    """DST/<format> that the export did not write (a user's own folder, one whose marker is a link)
    is refused in one line, exit 2, nothing in it touched; an empty folder or an earlier export is
    replaced."""
    src = random_set(tmp_path / "shards")
    out = tmp_path / "out"
    (out / "megatron").mkdir(parents=True)
    (out / "megatron" / "notes.txt").write_text("mine")
    assert cli_main(["shards", "export", "--format", "hf,megatron", str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "export did not write" in err and "megatron" in err, err
    assert sorted(os.listdir(out)) == ["megatron"] and os.listdir(out / "megatron") == ["notes.txt"]
    # a marker that is a link to a regular file is not dsdata's marker
    os.symlink(tmp_path / "shards" / MANIFEST, out / "megatron" / ".dsdata-export")
    assert cli_main(["shards", "export", "--format", "megatron", str(src), str(out)]) == 2
    assert "export did not write" in capsys.readouterr().err
    assert sorted(os.listdir(out / "megatron")) == [".dsdata-export", "notes.txt"]
    (out / "hf").mkdir()  # empty: taken
    assert cli_main(["shards", "export", "--format", "hf", str(src), str(out)]) == 0
    assert (out / "hf" / "export.json").is_file() and (out / "hf" / ".dsdata-export").is_file()
    assert cli_main(["shards", "export", "--format", "hf", str(src), str(out)]) == 0  # its own: replaced
    assert sorted(os.listdir(out)) == ["hf", "megatron"]


def test_an_export_refuses_a_tampered_tokenizer(tmp_path, capsys):
    """The bundled tokenizer's files are pinned by the manifest: a changed, missing or added file
    stops the export (exit 2, one line, no export folder) instead of exporting without it."""
    src = text_set(tmp_path / "shards", 12, bundled=True)
    bundle = src / "tokenizer"
    assert cli_main(["shards", "export", "--format", "megatron", str(src), str(tmp_path / "ok")]) == 0
    assert sorted(os.listdir(tmp_path / "ok" / "megatron" / "tokenizer")) == sorted(os.listdir(bundle))
    capsys.readouterr()
    original = (bundle / "tokenizer.json").read_bytes()

    def refused(what: str) -> None:
        assert cli_main(["shards", "export", "--format", "megatron", str(src), str(tmp_path / "out")]) == 2, what
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not exporting a changed tokenizer" in err, (what, err)
        assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == [], what

    (bundle / "tokenizer.json").write_bytes(original.replace(b'"<|endoftext|>"', b'"<|endoftexT|>"', 1))
    refused("changed tokenizer.json")
    (bundle / "tokenizer.json").unlink()
    refused("missing tokenizer.json")
    (bundle / "tokenizer.json").write_bytes(original)
    (bundle / "special_tokens_map.json").write_text('{"eos_token": "<s>"}')
    refused("a tokenizer file the manifest does not list")
    (bundle / "special_tokens_map.json").unlink()
    assert cli_main(["shards", "export", "--format", "megatron", str(src), str(tmp_path / "out")]) == 0


def test_an_export_refuses_ids_outside_the_manifests_vocabulary(tmp_path, capsys):
    """A shard set whose checksums match but whose ids lie past the vocabulary the manifest records
    (written with another tokenizer, or manifest and shards rewritten together) is not exported."""
    src = random_set(tmp_path / "shards", vocab=1000)
    manifest = json.loads((src / MANIFEST).read_text())
    manifest["tokenizer"]["vocab_size"] = 100
    (src / MANIFEST).write_text(json.dumps(manifest))
    assert cli_main(["shards", "export", "--format", "megatron", str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "outside the tokenizer's vocabulary of 100" in err and err.count("\n") == 1


@pytest.mark.slow
def test_recipe_export_option_writes_every_format_next_to_the_shards(tmp_path, shared_data):
    """A real run (tokenize → shards with export: [megatron, mds, hf]) on the dev corpus."""
    shared = shared_data
    from dsdata.beam.pipeline import run_recipe
    from dsdata.recipe import load_recipe

    paragraphs = [p.strip() for p in (shared / "prose-en.txt").read_text(encoding="utf-8").split("\n\n")
                  if len(p.strip()) > 40][:60]
    (tmp_path / "data").mkdir()
    with open(tmp_path / "data" / "docs.jsonl", "w", encoding="utf-8") as fh:
        for i, text in enumerate(paragraphs):
            fh.write(json.dumps({"id": f"doc-{i:03d}", "text": text}) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: exporttest\ninput:\n  paths: [data/*.jsonl]\noutput: out\nstages:\n"
                      "  - tokenize: {}\n  - shards: {shard_size: 3000, export: [megatron, mds, hf]}\n",
                      encoding="utf-8")
    out = tmp_path / "out"
    run_recipe(load_recipe(str(recipe), [f"tokenize.tokenizer={TOKENIZER}"]), str(out), [])
    assert (out / "shards" / MANIFEST).is_file()
    expected = shard_documents(out / "shards")
    assert sum(len(d) for d in expected.values()) == len(paragraphs)
    check_megatron(out / "export" / "megatron", expected)
    check_hf(out / "export" / "hf", expected, "out")
    # the run's tokenizer goes with every export (bundled with the shards, dsdata/shards/tokenizer.py)
    sha = read_manifest(str(out / "shards"))["tokenizer"]["sha256"]
    for fmt in ("megatron", "mds", "hf"):
        assert file_sha256(str(out / "export" / fmt / "tokenizer" / "tokenizer.json")) == sha
    check_mds(out / "export" / "mds", expected, "out")


def text_set(directory: Path, n_docs: int, bundled: bool = False) -> Path:
    """Shards of the repo's sample corpus (pipelines/samples/docs.jsonl) tokenized with the shipped
    tokenizer, which the manifest names (with its sha256) so every export carries it; `bundled`:
    its files copied into the set and pinned, as a run's shards stage writes them."""
    from tokenizers import Tokenizer

    from dsdata.shards.tokenizer import bundle_tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    with open(REPO / "pipelines" / "samples" / "docs.jsonl", encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line, _ in zip(fh, range(n_docs))]
    entry = {"path": str(TOKENIZER), "vocab_size": tokenizer.get_vocab_size(), "eos_id": 0,
             "eos_token": "<|endoftext|>", "sha256": file_sha256(str(TOKENIZER / "tokenizer.json"))}
    if bundled:
        directory.mkdir(parents=True)
        entry = bundle_tokenizer(str(directory), entry)
    writer = ShardSetWriter(str(directory), dtype=np.dtype(np.uint16), shard_size=4000, tokenizer=entry)
    for i, text in enumerate(texts):
        writer.add(f"doc-{i:03d}", np.array(tokenizer.encode(text).ids + [0], dtype=np.uint16),
                   ("easy", "medium", "hard")[i % 3])
    writer.close()
    return directory


def docs_snippet(first_line: str, export: Path, seq: int, batch: int) -> str:
    """The docs/shards.md Python block that starts with `first_line`, as printed except for its
    settings line (this export, short rows, small batches) and a one-layer model."""
    text = (REPO / "docs" / "shards.md").read_text(encoding="utf-8")
    (code,) = [b for b in re.findall(r"```python\n(.+?)\n```", text, re.S) if b.startswith(first_line)]
    for old, new in (('DST, SEQ, BATCH = "DST", 1024, 8', f"DST, SEQ, BATCH = {str(export)!r}, {seq}, {batch}"),
                     ("GPT2Config(", "GPT2Config(n_layer=1, n_embd=32, n_head=2, ")):
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    return code


@pytest.mark.slow
def test_the_docs_training_code_trains_on_the_mds_and_hf_exports(tmp_path, monkeypatch):
    """docs/shards.md's "Train on each": the streaming loop and the transformers.Trainer run run
    on real exports and see every token of the shards."""
    import datasets
    import torch

    import_streaming()
    src = text_set(tmp_path / "shards", n_docs=12)
    assert cli_main(["shards", "export", "--format", "mds,hf", str(src), str(tmp_path / "out")]) == 0
    expected = shard_documents(src)
    docs = [ids for bucket_docs in expected.values() for _, ids in bucket_docs]
    monkeypatch.chdir(tmp_path)  # the Trainer's output folder, "run"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    seq, batch = 64, 4

    mds_run: dict = {}
    exec(docs_snippet("# MosaicML streaming", tmp_path / "out", seq, batch), mds_run)
    assert torch.isfinite(mds_run["loss"])
    prefixes = {tuple(ids[:seq].tolist()) for ids in docs}
    rows = 0
    for step in mds_run["loader"]:  # each row: one document's first SEQ ids, the rest padding
        for ids, labels in zip(step["input_ids"], step["labels"]):
            kept = labels[labels != -100]
            assert tuple(kept.tolist()) in prefixes and torch.equal(ids[:len(kept)], kept)
            assert (ids[len(kept):] == 0).all()
            rows += 1
    assert rows == len(mds_run["ds"]) > 0

    hf_run: dict = {}
    exec(docs_snippet("# Hugging Face", tmp_path / "out", seq, batch), hf_run)
    stream = np.concatenate(docs)  # the export's order: buckets by name, documents in manifest order
    blocks = hf_run["train"]["input_ids"]
    assert len(blocks) == len(stream) // seq > 10
    assert np.array_equal(np.concatenate(blocks), stream[:len(blocks) * seq])
    state = hf_run["trainer"].state
    assert state.global_step == math.ceil(len(blocks) / batch)
    assert math.isfinite(state.log_history[-1]["train_loss"])
    assert (tmp_path / "run" / f"checkpoint-{state.global_step}" / "model.safetensors").is_file()


def test_recipe_refuses_an_unknown_export_format(tmp_path):
    from dsdata.recipe import load_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: bad\ninput:\n  paths: [x.jsonl]\noutput: out\nstages:\n"
                      "  - tokenize: {}\n  - shards: {export: [tfrecord]}\n", encoding="utf-8")
    with pytest.raises(Exception, match=r"shards.export: .tfrecord. is not one of the export formats \(megatron, mds, hf\)"):
        load_recipe(str(recipe), [f"tokenize.tokenizer={TOKENIZER}"])


def write_lines(source, out_dir: str) -> dict:
    """A test-only export format: one line of space-separated token ids per document."""
    buckets = {}
    with open(os.path.join(out_dir, "docs.txt"), "w", encoding="utf-8") as fh:
        for bucket in source.buckets:
            docs = list(source.documents(bucket))
            for doc in docs:
                fh.write(" ".join(map(str, doc.tokens.tolist())) + "\n")
            buckets[bucket] = {"documents": len(docs), "tokens": sum(len(d.tokens) for d in docs)}
    return {"buckets": buckets}


def test_an_export_format_is_one_module_and_one_row(tmp_path):
    """A format added by a writer function and one registered row (no other table) is accepted by
    `dsdata shards export`, the shards stage's parameter and its help, and written like the others."""
    from dsdata.stages import StageConfigError
    from dsdata.stages.shards import ShardsStage

    register_export_format(ExportFormat("lines", "test_shards_export:write_lines", "plain text lines of ids"))
    try:
        src = text_set(tmp_path / "shards", n_docs=6)
        assert cli_main(["shards", "export", "--format", "lines", str(src), str(tmp_path / "out")]) == 0
        lines = (tmp_path / "out" / "lines" / "docs.txt").read_text().splitlines()
        docs = [ids for bucket_docs in shard_documents(src).values() for _, ids in bucket_docs]
        assert lines == [" ".join(map(str, ids.tolist())) for ids in docs]
        summary = json.loads((tmp_path / "out" / "lines" / "export.json").read_text())
        assert sum(b["documents"] for b in summary["buckets"].values()) == 6
        assert ShardsStage(export=["lines"]).export == ["lines"]
        with pytest.raises(StageConfigError, match="did you mean 'lines'"):
            ShardsStage(export=["line"])
    finally:
        from dsdata.shards.export import formats

        formats.EXPORT_FORMATS[:] = [f for f in formats.EXPORT_FORMATS if f.name != "lines"]
