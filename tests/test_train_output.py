"""What a user reads from the trainer (issue 17): the set-up at the start, one log format, progress
from step 1, valid summary JSON, and a finished run that says so instead of training or exporting again."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "models" / "tiny.toml")
SMALL = ["model.dim=32", "model.n_heads=2", "training.seq_len=32", "data.synthetic_vocab=64",
         "training.global_batch_size=2", "logging.tensorboard=false", "logging.histogram_interval=0",
         "training.threads=1", "checkpoint.interval=0"]
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) [\w.]+: ")


def _run(run_dir: Path, sets: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dsdata.train", "--config", TINY, "--run-dir", str(run_dir)]
    for item in SMALL + sets:
        cmd += ["--set", item]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_setup_first_progress_line_and_one_log_format(tmp_path):
    proc = _run(tmp_path / "run", ["training.steps=12", "logging.console_interval=10", "export.enabled=true"])
    lines = proc.stderr.strip().splitlines()
    assert lines and all(LINE.match(line) for line in lines), [x for x in lines if not LINE.match(x)]
    text = proc.stderr
    assert "1 process on cpu, layout one process, dp 1 × tp 1 × pp 1, 1 micro-batch of 2 per rank" in text
    assert re.search(r"model [\d,]+ parameters \(2 layers, dim 32, dense\), fp32, optimizer adamw", text)
    assert "synthetic stream (64-token vocabulary" in text and "2 × 32 = 64 tokens per step, 12 steps" in text
    steps = [int(m) for m in re.findall(r"dsdata.train: step (\d+)/12 ", text)]
    assert steps == [1, 10, 12]  # the first progress line comes at step 1, not step 10
    assert "exported llama model" in text
    summary = json.loads(proc.stdout)
    assert summary["steps"] == 12 and "already_complete" not in summary


def test_a_finished_run_says_so_and_neither_trains_nor_exports_again(tmp_path):
    run = tmp_path / "run"
    _run(run, ["training.steps=3", "export.enabled=true"])
    last_loss = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]["loss"]
    for name in os.listdir(run / "hf"):
        os.remove(run / "hf" / name)
    os.rmdir(run / "hf")
    proc = _run(run, ["training.steps=3", "export.enabled=true"])
    assert "already complete at step 3" in proc.stderr
    summary = json.loads(proc.stdout)  # strict JSON: no NaN
    assert summary == {"steps": 3, "loss": last_loss, "run_dir": str(run), "vocab_size": 64, "already_complete": True}
    assert not (run / "hf").exists()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


def test_a_non_finite_final_loss_is_null_in_the_summary(tmp_path):
    from dsdata.train.config import load_config
    from dsdata.train.loop import train

    torch.set_num_threads(1)
    # fp16 activations overflow with huge weights and the fp32 retry is off: the loss is NaN.
    sets = SMALL + ["training.steps=1", "training.precision=fp16", "training.fp32_retry=false", "model.init_std=40.0",
                    "export.enabled=false", "logging.console_interval=0"]
    summary = train(load_config(TINY, sets), str(tmp_path))
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["loss"] is None and row["skipped"]
    assert summary["loss"] is None
    json.dumps(summary, allow_nan=False)
