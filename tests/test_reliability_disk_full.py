"""A full or read-only file system (issue 35): under OUT and its spill folder, at a checkpoint, during
`shm publish` — one line naming the path, partial files removed, exit 1.  Real small tmpfs mounts,
made by the test as root; skipped with the reason where mounting is not permitted."""
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from shard_sets import ShardSetWriter
from dsdata.io.storage_errors import storage_failure

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def tmpfs(path: Path, options: str):
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _env():
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def _corpus(path, n):
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"d{i}", "text": f"Document {i}: " + " ".join(f"w{i * 7 + j}" for j in range(60))})
                     + "\n")


def _one_error_line(proc, code=1, prefix="dsdata: error: "):
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1 and errors[0].startswith(prefix), proc.stderr[-3000:]
    return errors[0]


def _files(root: Path):
    return [p for p in root.rglob("*") if p.is_file()]


@pytest.mark.parametrize("stages, out_name", [("[]", "out"), ("\n  - dedup: {threshold: 0.8}\n", "out"),
                                              ("[]", os.fsdecode(b"out-\xff"))],
                         ids=["no-stages", "dedup", "non-utf8-out"])
def test_a_full_out_is_one_line_and_leaves_no_partial_output(tmp_path, stages, out_name):
    _corpus(tmp_path / "in.jsonl", 20_000)  # ~8 MB of text: kept/ (or dedup's .spill) cannot fit in 1 MiB
    (tmp_path / "r.yaml").write_text(f"input: {{paths: [in.jsonl]}}\noutput: out\nstages: {stages}\n")
    with tmpfs(tmp_path / out_name, "size=1m") as out:
        proc = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "r.yaml", "--quiet", "--output", out_name],
                              cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
        line = _one_error_line(proc)
        # The line shows a name's bytes that are not UTF-8 as \xNN (shown_path).
        shown = str(tmp_path / ("out" if out_name == "out" else "out-\\xff"))
        assert "no space left on device writing " + shown in line and "bytes free there" in line, line
        assert "partial outputs were removed" in line
        left = [p.relative_to(out).as_posix() for p in _files(out)]
        assert left == ["INCOMPLETE"], left
        assert not (out / ".spill").exists() and not (out / ".dsdata.lock").exists()


def test_storage_failure_is_found_in_beams_rewrapped_text():
    wrapped = RuntimeError("OSError: [Errno 28] No space left on device: '/o/kept/x.parquet' [while running 'W']")
    assert storage_failure(wrapped).path == "/o/kept/x.parquet"
    assert storage_failure(RuntimeError("stage 'dedup': OSError: [Errno 122] Disk quota exceeded")).errno == 122
    assert storage_failure(ValueError("[Errno 2] No such file or directory: 'x'")) is None


def test_a_checkpoint_on_a_full_disk_is_one_line_and_no_partial_checkpoint(tmp_path):
    with tmpfs(tmp_path / "run", "size=160k") as run_dir:
        args = [sys.executable, "-m", "dsdata.train", "--config", str(REPO / "models" / "tiny.toml"),
                "--run-dir", str(run_dir), "--quiet"]
        for item in ["model.dim=64", "model.n_heads=2", "training.seq_len=32", "data.synthetic_vocab=64",
                     "logging.tensorboard=false", "logging.console_interval=0", "export.enabled=false",
                     "training.steps=4", "checkpoint.interval=2"]:
            args += ["--set", item]
        proc = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=600)
        line = _one_error_line(proc, prefix="dsdata-train: error: ")
        assert "no space left on device" in line and str(run_dir) in line, line
        checkpoints = run_dir / "checkpoints"
        assert not checkpoints.exists() or not [p for p in checkpoints.iterdir() if p.name.startswith(".tmp")]


def _shards(directory):
    writer = ShardSetWriter(str(directory), shard_size=4000)
    rng = np.random.default_rng(0)
    for i in range(64):
        writer.add(f"d{i}", rng.integers(1, 16000, 200, dtype=np.uint16), "easy")
    return writer.close()


def _publish(shards, root):
    env = dict(_env(), DSDATA_SHM_ROOT=str(root))
    return subprocess.run([sys.executable, "-m", "dsdata.cli", "shm", "publish", str(shards), "--name", "set"],
                          env=env, capture_output=True, text=True, timeout=300)


def test_shm_publish_onto_a_read_only_file_system_is_one_line(tmp_path):
    _shards(tmp_path / "shards")
    with tmpfs(tmp_path / "shm", "size=4m") as shm:
        (shm / "dsdata").mkdir(mode=0o700)  # the root exists (published to before), then the mount turns read-only
        subprocess.run(["mount", "-o", "remount,ro", str(shm)], check=True)
        line = _one_error_line(_publish(tmp_path / "shards", shm / "dsdata"))
        assert "read-only file system" in line and str(shm) in line


def test_shm_publish_onto_a_file_system_that_fills_is_one_line_and_removes_its_copy(tmp_path):
    _shards(tmp_path / "shards")
    # Bytes are free but inodes are not: the free-space check passes and the copy fills the disk.
    with tmpfs(tmp_path / "shm", "size=4m,nr_inodes=6") as shm:
        line = _one_error_line(_publish(tmp_path / "shards", shm / "dsdata"))
        assert "no space left on device" in line, line
        assert not _files(shm) and not [p for p in (shm / "dsdata").iterdir() if p.name != "set"]


# A stage that writes a file of its own per document into FOLDER (a plug-in's cache, a side log).
SIDE_WRITER = '''
from dsdata.stages import DocumentStage, Param
from dsdata.core.params import Text


class SideWriter(DocumentStage):
    name = "side_writer"
    description = "writes a file per document into folder"
    params = {"folder": Param("", "where", Text())}

    def process(self, doc):
        with open(f"{self.folder}/{doc.id}.txt", "w", encoding="utf-8") as fh:
            fh.write(doc.text * 20)
        return doc
'''


@pytest.mark.parametrize("options, named", [("size=64k", False), ("size=1m,nr_inodes=4", True)],
                         ids=["bytes-no-path", "inodes-path-named"])
def test_a_full_disk_outside_out_is_the_stages_line_and_out_is_not_blamed_nor_cleared(tmp_path, options, named):
    """A stage's own full disk (not OUT's) was reported as "no space left on device writing OUT" and the
    run removed OUT's files: the line names the stage (and the file, where the error says it)."""
    _corpus(tmp_path / "in.jsonl", 2_000)
    (tmp_path / "side_writer_stage.py").write_text(SIDE_WRITER, encoding="utf-8")
    (tmp_path / "r.yaml").write_text("input: {paths: [in.jsonl]}\noutput: out\nstages: [side_writer]\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("the user's own file in OUT")
    code = ("import sys; from dsdata.stages import register_stage; from side_writer_stage import SideWriter; "
            "register_stage(SideWriter); from dsdata.cli import main; sys.exit(main())")
    with tmpfs(tmp_path / "side", options) as side:
        proc = subprocess.run([sys.executable, "-c", code, "run", "r.yaml", "--quiet", "--output", "out",
                               "--set", f"side_writer.folder={side}"],
                              cwd=tmp_path, env=dict(_env(), PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}"),
                              capture_output=True, text=True, timeout=600)
        line = _one_error_line(proc)
    assert line.startswith("dsdata: error: stage 'side_writer': OSError: [Errno 28] No space left on device"), line
    assert (f"'{side}/d" in line) == named, line
    assert str(tmp_path / "out") not in line and "partial outputs were removed" not in line, line
    assert (tmp_path / "out" / "notes.txt").read_text() == "the user's own file in OUT"
    assert not (tmp_path / "out" / "INCOMPLETE").exists()
