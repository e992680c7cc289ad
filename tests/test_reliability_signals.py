"""SIGINT and SIGTERM stop `dsdata run` and the trainer cleanly (issue 35): real signals to real
processes at several points of a run — while reading, inside a model stage, while the outputs are
written, with worker processes — end in one line and exit 130/143, with the lock released, no
worker left, and OUT marked incomplete (no stats.json, OUT/INCOMPLETE)."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]


def _corpus(path, n):
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"d{i}", "text": f"Document number {i} says a few plain words again. " * 6}) + "\n")


class _Run:
    """A `dsdata run` subprocess whose stderr is collected as it comes."""

    def __init__(self, args, cwd):
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen([sys.executable, "-m", "dsdata.cli", "run", *args], cwd=cwd, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, condition, timeout=240):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if condition():
                return
            assert self.proc.poll() is None, "\n".join(self.lines[-20:])
            time.sleep(0.05)
        raise AssertionError("timed out: " + "\n".join(self.lines[-20:]))

    def stop(self, sig):
        children = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.send_signal(sig)
        self.proc.wait(timeout=120)
        self.reader.join(timeout=10)
        return children


def _assert_stopped_cleanly(run, sig, out, children):
    assert run.proc.returncode == 128 + sig, "\n".join(run.lines)
    text = "\n".join(run.lines)
    assert "Traceback" not in text and "Fatal" not in text, text
    # The stop is one line, the last, and nothing but start-up lines and progress come before it.
    assert run.lines[-1].startswith(f"dsdata: stopped by {signal.Signals(sig).name}"), text
    assert sum("stopped by" in ln for ln in run.lines) == 1
    assert not (out / ".dsdata.lock").exists()
    assert not (out / ".spill").exists()
    assert not (out / "stats.json").exists() and not (out / "report.html").exists()
    assert "partial" in (out / "INCOMPLETE").read_text()
    # Both say how to go on: --resume continues the run, a run without it replaces the outputs.
    for said in (run.lines[-1], (out / "INCOMPLETE").read_text()):
        assert "same command and --resume" in said and "without --resume to replace them" in said, said
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def _progress_shows(run, word):
    return lambda: any(ln.startswith("dsdata: 0:") and word in ln for ln in run.lines)


@pytest.mark.parametrize("sig, out_name", [(signal.SIGINT, "out"), (signal.SIGTERM, "out"),
                                           (signal.SIGTERM, os.fsdecode(b"out-\xff"))],
                         ids=["SIGINT", "SIGTERM", "SIGTERM-non-utf8-out"])
def test_a_signal_while_reading_stops_the_run(tmp_path, sig, out_name):
    _corpus(tmp_path / "big.jsonl", 600_000)
    (tmp_path / "r.yaml").write_text("input: {paths: [big.jsonl]}\noutput: out\nstages:\n  - clean: {}\n")
    run = _Run(["r.yaml", "--progress=lines", "--output", out_name], tmp_path)
    run.wait_for(lambda: any(ln.startswith("dsdata: running") for ln in run.lines))
    time.sleep(3)  # Beam has started and the reader is reading (600,000 records take well over that)
    children = run.stop(sig)
    _assert_stopped_cleanly(run, sig, tmp_path / out_name, children)
    if out_name != "out":  # the stop line names OUT as every line shows a name: its bytes as \xNN
        assert "out-\\xff is incomplete" in run.lines[-1], run.lines[-1]


def test_the_run_stopped_by_ctrl_c_continues_with_resume_as_its_message_says(tmp_path):
    # 12 files of 50k: the clean stage reads 120k documents in under 2 s on a quiet machine, so the
    # signal goes as soon as the first file is committed, with most of the run still to come.
    for i in range(12):
        _corpus(tmp_path / f"part-{i:02d}.jsonl", 50_000)
    (tmp_path / "r.yaml").write_text("input: {paths: ['part-*.jsonl']}\noutput: out\nstages:\n  - clean: {}\n")
    run = _Run(["r.yaml", "--progress=lines"], tmp_path)
    run.wait_for(lambda: any(ln.startswith("dsdata: read ") for ln in run.lines))
    children = run.stop(signal.SIGINT)
    _assert_stopped_cleanly(run, signal.SIGINT, tmp_path / "out", children)
    resumed = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "r.yaml", "--resume", "--quiet"], cwd=tmp_path,
                             env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["input"] == 600_000 and stats["kept"] + stats["rejected_total"] == 600_000
    assert not (tmp_path / "out" / "INCOMPLETE").exists()


def test_a_signal_inside_a_model_stage_keeps_nothing_that_looks_complete(tmp_path, monkeypatch):
    # A progress line every second: on a quiet machine the whole run takes ~10 s, so the default
    # 10 s interval could let it finish before a line named the model stage.
    monkeypatch.setenv("DSDATA_PROGRESS_INTERVAL", "1")
    _corpus(tmp_path / "big.jsonl", 600_000)
    (tmp_path / "r.yaml").write_text("input: {paths: [big.jsonl]}\noutput: out\nstages:\n"
                                     "  - lang: {backend: fasttext, keep: [], min_score: 0}\n")
    # A previous complete run's outputs: the stopped run must not leave them looking like its own.
    _corpus(tmp_path / "small.jsonl", 5)
    done = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "r.yaml", "--quiet", "--input", "small.jsonl"],
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "stats.json").exists()
    run = _Run(["r.yaml", "--progress=lines"], tmp_path)
    run.wait_for(_progress_shows(run, "lang"))
    children = run.stop(signal.SIGINT)
    _assert_stopped_cleanly(run, signal.SIGINT, tmp_path / "out", children)


def test_a_signal_while_outputs_are_written_with_worker_processes(tmp_path):
    _corpus(tmp_path / "big.jsonl", 200_000)
    (tmp_path / "r.yaml").write_text("input: {paths: [big.jsonl]}\noutput: out\nstages: []\n")
    run = _Run(["r.yaml", "--progress=lines", "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
               tmp_path)
    out = tmp_path / "out"
    # Parquet part files appear under kept/ as bundles are written.
    run.wait_for(lambda: out.is_dir() and any(p.is_file() for p in out.rglob("*") if "kept" in p.parts or
                                                 p.name.startswith("beam-temp")), timeout=400)
    children = run.stop(signal.SIGTERM)
    assert children, "multi_processing started no worker process"
    _assert_stopped_cleanly(run, signal.SIGTERM, out, children)


# ---------------------------------------------------------------------------------- the trainer

TRAIN_SETS = ["model.dim=32", "model.n_heads=2", "training.seq_len=32", "data.synthetic_vocab=64",
              "logging.tensorboard=false", "logging.console_interval=0", "export.enabled=false",
              "training.steps=100000", "checkpoint.interval=0"]


def _trainer(run_dir):
    args = [sys.executable, "-m", "dsdata.train", "--config", str(REPO / "models" / "tiny.toml"),
            "--run-dir", str(run_dir)]
    for item in TRAIN_SETS:
        args += ["--set", item]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_trainer_saves_a_checkpoint_on_either_signal(tmp_path, sig):
    proc = _trainer(tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    lines = [ln for ln in err.splitlines() if "stopped by" in ln]
    assert len(lines) == 1 and err.strip().splitlines()[-1] == lines[0]
    assert f"stopped by {signal.Signals(sig).name}: checkpoint saved at step" in lines[0]
    summary = json.loads(out.splitlines()[-1])
    step = summary["steps"]
    assert (tmp_path / "checkpoints" / f"step_{step:08d}" / "trainer_state.json").is_file()


def test_the_trainer_stopped_while_setting_up_is_one_line(tmp_path):
    proc = _trainer(tmp_path)
    first = proc.stderr.readline()  # the first set-up line: the model is being built, no step made yet
    assert first.startswith("dsdata-train:"), first
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    last = err.strip().splitlines()[-1]
    # Before the loop: nothing to save; inside it: a checkpoint.  Either way one line.
    assert last.startswith("dsdata-train: stopped by SIGINT"), err[-2000:]
    assert sum("stopped by" in ln for ln in err.splitlines()) == 1


# ------------------------------------------------------------------------------ the sub-commands

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_sub_command_in_one_line(tmp_path, sig):
    """`dsdata tokenizer train` (any sub-command): Ctrl-C was a KeyboardInterrupt traceback, and
    SIGTERM ended it without its cleanup; now one line, exit 130/143, no tokenizer left behind."""
    _corpus(tmp_path / "big.jsonl", 1_000_000)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "dsdata.cli", "tokenizer", "train", "--input", "big.jsonl",
                             "--out", "tok", "--vocab-size", "4000"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4)  # reading and counting a million documents takes well over that
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert err.strip().splitlines() == [f"dsdata: tokenizer stopped by {signal.Signals(sig).name}"], err
    assert not (tmp_path / "tok" / "tokenizer.json").exists()
