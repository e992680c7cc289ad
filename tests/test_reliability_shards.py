"""Tampered shards are refused before a token is served, manifest field types are checked, and
`dsdata shm list --json` prints JSON only."""
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dsdata.cli import main as cli_main
from dsdata.shards.format import ShardError, check_shard_buffer, verify_shards
from shard_sets import ShardSetWriter
from dsdata.io.outfiles import file_sha256

REPO = Path(__file__).resolve().parents[1]


def _write_set(directory, docs=20, length=100):
    writer = ShardSetWriter(str(directory), shard_size=10**9)
    for i in range(docs):
        writer.add(f"doc{i}", (np.arange(length) + i).astype(np.uint16))
    return writer.close()


def _reseal(directory, manifest, entry, **changes):
    """Make the manifest agree with a tampered shard: its size and sha256, plus `changes`."""
    path = os.path.join(directory, entry["file"])
    entry.update(bytes=os.path.getsize(path), sha256=file_sha256(path), **changes)
    manifest["totals"]["tokens"] = sum(s["tokens"] for s in manifest["shards"])
    with open(os.path.join(directory, "manifest.json"), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh)


def _tamper_token_count(directory, manifest, factor=1000):
    """Claim `factor` times the tokens in the Arrow metadata (the values FieldNode) and the offsets."""
    entry = manifest["shards"][0]
    path = os.path.join(directory, entry["file"])
    tokens = entry["tokens"]
    data = bytearray(Path(path).read_bytes())
    node = struct.pack("<qq", tokens, 0)  # FieldNode(length, null_count) of the uint16 values
    assert data.count(node) == 1
    at = data.find(node)
    data[at:at + 8] = struct.pack("<q", tokens * factor)
    last = struct.pack("<i", tokens)  # the last int32 offset of the token lists
    at = data.rfind(last)
    data[at:at + 4] = struct.pack("<i", tokens * factor)
    Path(path).write_bytes(bytes(data))
    _reseal(directory, manifest, entry, tokens=tokens * factor)
    return path


def test_shard_claiming_more_tokens_than_it_holds_is_refused(tmp_path):
    manifest = _write_set(tmp_path / "s")
    path = _tamper_token_count(str(tmp_path / "s"), manifest)
    with pa.memory_map(path) as mapped:
        with pytest.raises(ShardError, match="not a valid dsdata shard"):
            check_shard_buffer(path, mapped.read_buffer(), "tokens", np.dtype(np.uint16), 2000 * 1000)
    _, problems = verify_shards(str(tmp_path / "s"))
    assert len(problems) == 1 and "not a valid dsdata shard" in problems[0]


def test_shards_verify_command_catches_tampered_metadata(tmp_path):
    manifest = _write_set(tmp_path / "s")
    _tamper_token_count(str(tmp_path / "s"), manifest)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "dsdata.cli", "shards", "verify", str(tmp_path / "s")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "not a valid dsdata shard" in proc.stderr


def test_buffer_pointing_past_the_file_is_refused(tmp_path):
    manifest = _write_set(tmp_path / "s")
    entry = manifest["shards"][0]
    path = str(tmp_path / "s" / entry["file"])
    data = bytearray(Path(path).read_bytes())
    values_bytes = entry["tokens"] * 2
    for k in range(0, len(data) - 16, 8):  # the values Buffer(offset, length) descriptor
        off, length = struct.unpack_from("<qq", data, k)
        if length == values_bytes and 0 <= off < len(data):
            data[k + 8:k + 16] = struct.pack("<q", values_bytes * 1000)
    Path(path).write_bytes(bytes(data))
    _reseal(str(tmp_path / "s"), manifest, entry)
    with pa.memory_map(path) as mapped:
        with pytest.raises(ShardError, match="not a valid dsdata shard"):
            check_shard_buffer(path, mapped.read_buffer(), "tokens", np.dtype(np.uint16), entry["tokens"])


def test_untampered_shard_passes_and_is_zero_copy(tmp_path):
    manifest = _write_set(tmp_path / "s")
    entry = manifest["shards"][0]
    path = str(tmp_path / "s" / entry["file"])
    with pa.memory_map(path) as mapped:
        buf = mapped.read_buffer()
        values = check_shard_buffer(path, buf, "tokens", np.dtype(np.uint16), entry["tokens"])
        assert len(values) == 2000 and buf.address <= values.ctypes.data < buf.address + buf.size
    assert verify_shards(str(tmp_path / "s"))[1] == []


@pytest.mark.parametrize("field, value", [("tokens", "many"), ("bytes", -1), ("docs", True), ("sha256", 7)])
def test_manifest_field_types_are_one_line(tmp_path, capsys, field, value):
    manifest = _write_set(tmp_path / "s")
    manifest["shards"][0][field] = value
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    for command in ("verify", "info"):
        assert cli_main(["shards", command, str(tmp_path / "s")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("dsdata: error: ") and f"shards[0].{field}" in err[0]


def test_shm_list_json_prints_only_json(tmp_path, capsys):
    _write_set(tmp_path / "s")
    root = str(tmp_path / "shmroot")
    assert cli_main(["shm", "--root", root, "publish", str(tmp_path / "s"), "--name", "corpus"]) == 0
    capsys.readouterr()
    assert cli_main(["shm", "--root", root, "list", "--json"]) == 0
    items = json.loads(capsys.readouterr().out)
    assert [i["name"] for i in items] == ["corpus"]


# The loader refuses the tampered shard too (_OpenShard runs check_shard_buffer on every mapping).
def test_loader_refuses_a_shard_claiming_more_tokens_than_it_holds(tmp_path):
    manifest = _write_set(tmp_path / "s")
    _tamper_token_count(str(tmp_path / "s"), manifest)
    script = ("import sys\nfrom dsdata.train.data import ShardDataset\nfrom dsdata.shards.format import ShardError\n"
              "try:\n    n = sum(1 for _ in ShardDataset(sys.argv[1], 16, shuffle=False))\n"
              "except ShardError as exc:\n    print('refused', exc)\nelse:\n    print('served', n)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # A subprocess: served windows read past the mapping, which may crash the interpreter.
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "s")], capture_output=True, text=True,
                          env=env, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0 and proc.stdout.startswith("refused") and "not a valid dsdata shard" in proc.stdout
