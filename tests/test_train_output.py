"""What a user reads from the trainer (issue 17): the set-up at the start, one log format, progress
from step 1, valid summary JSON, and a finished run that says so instead of training or exporting again.
Progress looks as `dsdata run`'s does (issue 18): `--progress auto|bar|lines|off`, a tqdm bar on a
terminal, `dsdata-train: H:MM:SS step N/T, ...` lines otherwise, nothing but the summary under --quiet."""
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "models" / "tiny.toml")
SMALL = ["model.dim=32", "model.n_heads=2", "training.seq_len=32", "data.synthetic_vocab=64",
         "training.global_batch_size=2", "logging.tensorboard=false", "logging.histogram_interval=0",
         "training.threads=1", "checkpoint.interval=0"]
# A log line: the same prefix, no clock (warnings and errors say so; other libraries give their name).
LINE = re.compile(r"^dsdata-train: (warning: |error: )?(\[[\w.]+\] )?(?!\d+:\d\d:\d\d step)\S")
# A progress line, in the style of `dsdata run`'s "dsdata: 0:00:10 read 64595, kept 64183, ...".
PROGRESS = re.compile(r"^dsdata-train: (\d+):(\d\d):(\d\d) step (\d+)/(\d+), loss (\d+\.\d{4}|-), (\d+) tok/s, "
                      r"lr (\d\.\d\de[-+]\d\d), grad_norm (\d+\.\d{3}|-), clip \d+\.\d{3}, scale \S+$")


def _command(run_dir: Path, sets: list[str], flags: list[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "dsdata.train", "--config", TINY, "--run-dir", str(run_dir), *flags]
    for item in SMALL + sets:
        cmd += ["--set", item]
    return cmd


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")


def _run(run_dir: Path, sets: list[str], flags: list[str] = ()) -> subprocess.CompletedProcess:
    proc = subprocess.run(_command(run_dir, sets, flags), env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_setup_first_progress_line_and_one_log_format(tmp_path):
    proc = _run(tmp_path / "run", ["training.steps=12", "logging.console_interval=10", "export.enabled=true"])
    lines = proc.stderr.strip().splitlines()
    # Log lines in one format; progress lines (stderr is not a terminal: auto means lines) in the pipeline's.
    assert lines and all(LINE.match(line) or PROGRESS.match(line) for line in lines), \
        [x for x in lines if not (LINE.match(x) or PROGRESS.match(x))]
    text = proc.stderr
    assert "1 process on cpu, layout one process, dp 1 × tp 1 × pp 1, 1 micro-batch of 2 per rank" in text
    assert re.search(r"model [\d,]+ parameters \(2 layers, dim 32, dense\), fp32, optimizer adamw, eager", text)
    assert "synthetic stream (64-token vocabulary" in text and "2 × 32 = 64 tokens per step, 12 steps" in text
    steps = [int(m) for m in re.findall(r"^dsdata-train: \d+:\d\d:\d\d step (\d+)/12, ", text, re.M)]
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
    assert summary == {"steps": 3, "loss": last_loss, "run_dir": str(run), "vocab_size": 64, "compiled": False,
                       "already_complete": True}
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


def test_progress_lines_match_metrics_jsonl(tmp_path):
    run = tmp_path / "run"
    proc = _run(run, ["training.steps=12", "logging.console_interval=5"], ["--progress", "lines"])
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    progress = [PROGRESS.match(line) for line in proc.stderr.splitlines() if re.match(r"dsdata-train: \d+:\d\d:\d\d step", line)]
    assert progress and all(progress), proc.stderr
    assert [int(m[4]) for m in progress] == [1, 5, 10, 12] and {int(m[5]) for m in progress} == {12}
    elapsed = [int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) for m in progress]
    assert elapsed == sorted(elapsed)
    for m in progress:  # the line shows the step's own metrics.jsonl record
        row = rows[int(m[4])]
        assert m[6] == f"{row['loss']:.4f}" and m[8] == f"{row['lr']:.2e}" and m[9] == f"{row['grad_norm']:.3f}"
        assert int(m[7]) == round(row["tokens_per_s"])
    assert "\r" not in proc.stderr and "%|" not in proc.stderr  # no bar in a log


def test_quiet_and_progress_off(tmp_path, capsys):
    import logging

    from dsdata.train.__main__ import main

    base = ["--config", TINY]
    for item in SMALL + ["training.steps=3", "logging.console_interval=1", "export.enabled=false"]:
        base += ["--set", item]
    root_level = logging.getLogger().level
    try:
        # --quiet wins over --progress, as in `dsdata run`: only the summary JSON (and warnings) remain.
        assert main(base + ["--run-dir", str(tmp_path / "quiet"), "--quiet", "--progress", "lines"]) == 0
        quiet = capsys.readouterr()
        assert quiet.err == "" and json.loads(quiet.out)["steps"] == 3
        assert main(base + ["--run-dir", str(tmp_path / "off"), "--progress", "off"]) == 0
        off = capsys.readouterr()
        assert not re.search(r"^dsdata-train: \d+:\d\d:\d\d step", off.err, re.M)  # no progress lines
        assert "64 tokens per step, 3 steps" in off.err  # set-up lines stay
        assert main(base + ["--run-dir", str(tmp_path / "lines"), "--set", "logging.progress=off",
                            "--progress", "lines"]) == 0  # the flag wins over the config
        shown = [int(m[4]) for m in map(PROGRESS.match, capsys.readouterr().err.splitlines()) if m]
        assert shown == [1, 2, 3]
    finally:
        logging.getLogger().setLevel(root_level)
    assert len((tmp_path / "quiet" / "metrics.jsonl").read_text().splitlines()) == 3  # metrics.jsonl unchanged


def _read_pty(master: int, proc: subprocess.Popen, timeout: float = 600) -> str:
    out, deadline = b"", time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the pty has exited
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out.decode("utf-8", "replace")


def test_a_terminal_gets_a_tqdm_bar_with_log_lines_above_it(tmp_path):
    run = tmp_path / "run"
    # fp16 with a loss scale far too high: steps 1-3 overflow, so warnings are logged while the bar is up.
    sets = ["training.steps=8", "training.precision=fp16", "precision.init_scale=4194304.0", "export.enabled=true"]
    master, slave = pty.openpty()  # a real terminal: stderr.isatty() is true in the trainer
    proc = subprocess.Popen(_command(run, sets), env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave)
    os.close(slave)
    try:
        drawn = _read_pty(master, proc)
    finally:
        os.close(master)
    assert proc.wait(timeout=60) == 0, drawn[-3000:]
    assert json.loads(proc.stdout.read())["steps"] == 8
    # The bar: total = steps, loss and tok/s after it, redrawn in place with \r; no progress lines.
    assert re.search(r"\rdsdata-train: +100%\|[^\r\n]*\| 8/8 \[[^\r\n]*loss \d+\.\d{4}, \d+ tok/s", drawn), drawn
    assert not PROGRESS.search(drawn.replace("\r\n", "\n").replace("\r", "\n"), re.M)
    assert not re.search(r"^dsdata-train: \d+:\d\d:\d\d step", drawn.replace("\r", "\n"), re.M)
    # Every log line starts a line of its own (tqdm.write clears the bar first), also those logged
    # while the bar was drawn; the export comes after the finished bar.
    lines = [segment.split("\r")[-1] for segment in drawn.split("\r\n")]
    logged = [line for line in lines if line.startswith("dsdata-train:") and "%|" not in line]
    assert logged and all(LINE.match(line) for line in logged), logged
    warned = [int(n) for line in logged for n in re.findall(r"dsdata-train: warning: step (\d+) skipped", line)]
    assert warned == [1, 2, 3]
    assert "exported llama model" in logged[-1]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 8


def test_the_trainer_imports_no_beam():
    code = ("import sys, dsdata.train.__main__, dsdata.train.loop, dsdata.train.metrics; "
            "assert not [m for m in sys.modules if m.startswith('apache_beam')], 'Beam imported'")
    subprocess.run([sys.executable, "-c", code], env=_env(), check=True, timeout=300)
