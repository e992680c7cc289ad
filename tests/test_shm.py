"""dsdata shm publish/list/remove: atomic verified copies, permissions, refusal to clobber, crash recovery."""
import json
import os
import stat
import subprocess
import sys

from pathlib import Path

import numpy as np
import pytest

from dsdata.cli import main as cli_main
from dsdata.shards.format import verify_shards
from shard_sets import ShardSetWriter
from dsdata.shards.shm import ShmError, clean_stale, list_published, publish, remove

REPO = Path(__file__).resolve().parents[1]


def _set(directory, seed=0):
    writer = ShardSetWriter(str(directory), shard_size=300)
    rng = np.random.default_rng(seed)
    for i in range(12):
        writer.add(f"d{i}", rng.integers(1, 16000, 60, dtype=np.uint16), ("easy", "hard")[i % 2])
    return writer.close()


@pytest.fixture
def root(tmp_path, monkeypatch):
    # A tmpfs root of this test's own; /dev/shm itself when the machine has one.
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    path = os.path.join(base, f"dsdata-test-{os.getpid()}-{tmp_path.name}")
    monkeypatch.setenv("DSDATA_SHM_ROOT", path)
    yield path
    subprocess.run(["rm", "-rf", path], check=False)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_publish_list_remove_with_permissions(tmp_path, root, capsys):
    manifest = _set(tmp_path / "src")
    assert cli_main(["shm", "publish", str(tmp_path / "src"), "--name", "corpus"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["status"] == "published" and result["shards"] == len(manifest["shards"])
    target = os.path.join(root, "corpus")
    assert _mode(root) == 0o700 and _mode(target) == 0o700
    files = os.listdir(target)
    assert "manifest.json" in files and len(files) == len(manifest["shards"]) + 1
    assert all(_mode(os.path.join(target, f)) == 0o600 for f in files)
    assert verify_shards(target)[1] == []

    # The loader reads the published copy.
    from dsdata.train.data import ShardDataset

    assert sum(1 for _ in ShardDataset(target, 8)) > 0

    assert cli_main(["shm", "list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("corpus\t") and f"{manifest['totals']['tokens']} tokens" in out
    assert [d["name"] for d in list_published(verify=True)] == ["corpus"]

    assert cli_main(["shm", "remove", "corpus"]) == 0
    assert not os.path.exists(target)
    assert cli_main(["shm", "remove", "corpus"]) == 1
    assert list_published() == []


def test_same_dataset_again_is_a_noop_a_different_one_is_refused(tmp_path, root, capsys):
    _set(tmp_path / "a", seed=0)
    _set(tmp_path / "b", seed=1)
    assert publish(str(tmp_path / "a"), "corpus")["status"] == "published"
    assert publish(str(tmp_path / "a"), "corpus")["status"] == "unchanged"
    with pytest.raises(ShmError, match="different dataset"):
        publish(str(tmp_path / "b"), "corpus")
    assert cli_main(["shm", "publish", str(tmp_path / "b"), "--name", "corpus"]) == 2
    assert "dsdata shm remove corpus" in capsys.readouterr().err
    # The published copy is still dataset a.
    published = json.load(open(os.path.join(root, "corpus", "manifest.json")))
    source = json.load(open(tmp_path / "a" / "manifest.json"))
    assert published == source


def test_corrupt_source_is_not_published(tmp_path, root):
    manifest = _set(tmp_path / "src")
    victim = tmp_path / "src" / manifest["shards"][0]["file"]
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(ShmError, match=str(victim)):
        publish(str(tmp_path / "src"), "corpus")
    assert not os.path.exists(os.path.join(root, "corpus"))
    assert [n for n in os.listdir(root) if n.startswith(".")] == []


def test_bad_names_are_refused(tmp_path, root):
    _set(tmp_path / "src")
    for name in ("../escape", ".hidden", "a/b", ""):
        with pytest.raises(ShmError, match="name"):
            publish(str(tmp_path / "src"), name)


_CRASHING_PUBLISHER = r"""
import os, sys
import dsdata.shards.shm as shm

real_copy = shm._copy_verified
count = {"n": 0}

def copy_then_die(src, dst, sha):
    real_copy(src, dst, sha)
    count["n"] += 1
    if count["n"] == 2:
        os._exit(137)  # as abrupt as SIGKILL: no cleanup handlers run

shm._copy_verified = copy_then_die
shm.publish(sys.argv[1], "corpus")
"""


def test_crashed_publisher_leaves_no_dataset_and_its_debris_is_cleaned(tmp_path, root):
    _set(tmp_path / "src")
    proc = subprocess.run([sys.executable, "-c", _CRASHING_PUBLISHER, str(tmp_path / "src")],
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 137
    leftovers = [n for n in os.listdir(root) if n.startswith(".corpus.tmp-")]
    assert len(leftovers) == 1, os.listdir(root)
    assert not os.path.exists(os.path.join(root, "corpus"))  # readers never see a half dataset
    assert list_published() == []  # ... and list cleans the dead publisher's directory
    assert [n for n in os.listdir(root) if n.startswith(".")] == []
    # Publishing the same name works again (no FileExistsError forever).
    assert publish(str(tmp_path / "src"), "corpus")["status"] == "published"


def test_live_publishers_temp_dir_is_left_alone(tmp_path, root):
    os.makedirs(root, mode=0o700)
    mine = os.path.join(root, f".corpus.tmp-{os.getpid()}-abc123")
    os.mkdir(mine)
    dead = os.path.join(root, ".corpus.tmp-999999999-abc123")
    os.mkdir(dead)
    removed = clean_stale(root)
    assert os.path.isdir(mine) and not os.path.exists(dead) and removed == [os.path.basename(dead)]


def test_root_must_be_a_real_directory(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    monkeypatch.setenv("DSDATA_SHM_ROOT", str(tmp_path / "link"))
    _set(tmp_path / "src")
    with pytest.raises(ShmError, match="symlink"):
        publish(str(tmp_path / "src"), "corpus")
    assert remove("corpus") is False
