"""OUT is untrusted (issue 35): a link planted in OUT — as the lock, the spill folder, kept/,
rejected/, shards/, a side file, the report, stats.json — is replaced, never followed: the file or
folder it points to is left as it was."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsdata.io.outfiles import create_exclusive, ensure_dir, write_file_in_out
from dsdata.io.outlock import LOCK_NAME, output_lock

REPO = Path(__file__).resolve().parents[1]

FILE_ENTRIES = [LOCK_NAME, "stats.json", "difficulty.json", "run.json", "INCOMPLETE"]
DIR_ENTRIES = ["kept", "rejected", "shards", ".spill"]


def _plant(out: Path, victims: Path) -> dict:
    out.mkdir()
    victims.mkdir()
    planted = {}
    for name in FILE_ENTRIES:
        target = victims / f"file-{name.strip('.')}"
        target.write_text("precious\n")
        os.symlink(target, out / name)
        planted[name] = target
    for name in DIR_ENTRIES:
        target = victims / f"dir-{name.strip('.')}"
        target.mkdir(mode=0o755)
        (target / "keep.txt").write_text("precious\n")
        os.symlink(target, out / name)
        planted[name] = target
    # A dangling link: following it would create the file it names.
    os.symlink(victims / "created-by-report", out / "report.html")
    return planted


def _assert_untouched(planted: dict, victims: Path):
    for name, target in planted.items():
        if target.is_dir():
            assert sorted(p.name for p in target.iterdir()) == ["keep.txt"], name
            assert (target.stat().st_mode & 0o777) == 0o755, name  # not chmod-ed to 0700
        else:
            assert target.read_text() == "precious\n", name
    assert not (victims / "created-by-report").exists()


@pytest.mark.skipif(not (REPO / "pipelines" / "models" / "tokenizer").is_dir(), reason="no tokenizer model")
def test_links_planted_in_out_are_replaced_not_followed(tmp_path):
    out, victims = tmp_path / "out", tmp_path / "victims"
    planted = _plant(out, victims)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "pipelines/pretrain.yaml", "--quiet",
                           "--output", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_untouched(planted, victims)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["ledger_ok"] and stats["kept"] > 0
    for name in ("kept", "rejected", "shards"):
        assert (out / name).is_dir() and not (out / name).is_symlink()
    assert any((out / "kept").glob("part-*.parquet"))
    assert not (out / LOCK_NAME).exists()


def test_the_lock_never_writes_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / LOCK_NAME)
    with output_lock(str(out)) as path:
        assert not os.path.islink(path) and json.loads(Path(path).read_text())["pid"] == os.getpid()
    assert victim.read_text() == "precious\n"


def test_a_fifo_or_folder_planted_as_the_lock_is_one_line(tmp_path):
    from dsdata.io.outlock import OutputDirError

    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).mkdir()
    with pytest.raises(OutputDirError, match="is a directory"):
        with output_lock(str(out)):
            pass
    (out / LOCK_NAME).rmdir()
    os.mkfifo(out / LOCK_NAME)
    with pytest.raises(OutputDirError, match="not a regular file"):
        with output_lock(str(out)):
            pass


def test_out_entries_are_made_without_following_links(tmp_path):
    victim_dir = tmp_path / "elsewhere"
    victim_dir.mkdir()
    os.symlink(victim_dir, tmp_path / "spill")
    ensure_dir(str(tmp_path / "spill"))
    assert (tmp_path / "spill").is_dir() and not (tmp_path / "spill").is_symlink()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / "side.json")
    write_file_in_out(str(tmp_path), "side.json", "{}")
    assert victim.read_text() == "precious\n" and (tmp_path / "side.json").read_text() == "{}"
    os.symlink(victim, tmp_path / "new")
    os.close(create_exclusive(str(tmp_path / "new")))
    assert victim.read_text() == "precious\n" and not (tmp_path / "new").is_symlink()
