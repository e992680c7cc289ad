"""Trainer end to end: exact resume after SIGKILL / SIGTERM, DDP = one process, precision paths,
progressive unfreezing, config errors.  Runs the real command (python -m dsdata.train / torchrun)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "models" / "tiny.toml")
# Small and fast: synthetic data, 2 layers of width 32.
SMALL = ["model.dim=32", "model.n_heads=2", "training.seq_len=32", "data.synthetic_vocab=64",
         "logging.tensorboard=false", "logging.console_interval=0", "export.enabled=false"]


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def command(run_dir, sets, nproc=1):
    args = ["--config", TINY, "--run-dir", str(run_dir)]
    for item in SMALL + list(sets):
        args += ["--set", item]
    if nproc == 1:
        return [sys.executable, "-m", "dsdata.train", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "dsdata.train", *args]


def run_train(run_dir, sets, nproc=1, check=True):
    proc = subprocess.run(command(run_dir, sets, nproc), env=_env(), capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def wait_for_lines(path, n, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    raise AssertionError("timed out waiting for metrics")


# Exercises every piece of carried state: DeepOpt moments and β products, the dynamic-sparse gate
# snapshot (refreshed every 4 steps), MoE, the clipper's history (dynamic after 5 norms), the loader
# position, progressive unfreezing.
RICH = ["training.steps=32", "training.global_batch_size=4", "checkpoint.interval=5", "checkpoint.keep=2",
        "optimizer.name=deepopt", "model.attention=dynamic_sparse", "model.attention_config.top_k=4",
        "model.attention_config.window=8", "model.attention_config.block=8", "model.moe_experts=2", "clipping.min_history=5",
        "clipping.window=10", "training.unfreeze_fraction=0.3", "schedule.warmup_steps=5"]


@pytest.mark.slow
def test_resume_after_sigkill_and_sigterm_logs_the_same_losses(tmp_path):
    straight = tmp_path / "straight"
    run_train(straight, RICH)
    expected = metrics(straight)
    assert [m["step"] for m in expected] == list(range(1, 33))
    assert any(m["clip_threshold"] != 1.0 for m in expected)  # the dynamic clipper took over

    broken = tmp_path / "broken"
    proc = subprocess.Popen(command(broken, RICH), env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    wait_for_lines(broken / "metrics.jsonl", 12, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    logged = len(metrics(broken))
    assert 12 <= logged < 32

    proc = subprocess.Popen(command(broken, RICH), env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    wait_for_lines(broken / "metrics.jsonl", 22, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM: checkpoint saved" in err
    stopped_at = metrics(broken)[-1]["step"]
    assert (broken / "checkpoints" / f"step_{stopped_at:08d}" / "trainer_state.json").is_file()

    run_train(broken, RICH)
    resumed = metrics(broken)
    assert [m["step"] for m in resumed] == list(range(1, 33))
    assert [m["loss"] for m in resumed] == [m["loss"] for m in expected]
    assert [m["grad_norm"] for m in resumed] == [m["grad_norm"] for m in expected]
    assert [m["lr"] for m in resumed] == [m["lr"] for m in expected]
    kept = sorted(p.name for p in (broken / "checkpoints").iterdir())
    assert len(kept) == 2 and kept[-1] == "step_00000032"  # keep = 2


def _losses(run_dir):
    return [m["loss"] for m in metrics(run_dir)], [m["grad_norm"] for m in metrics(run_dir)]


@pytest.mark.slow
def test_two_processes_give_the_losses_of_one(tmp_path):
    """DDP and FSDP2 over 2 gloo processes vs 1 process accumulating 2 micro-batches: same global batch."""
    common = ["training.steps=6", "training.global_batch_size=8", "checkpoint.interval=0", "clipping.max_norm=0.5"]
    run_train(tmp_path / "one", common + ["parallel.gradient_accumulation_steps=2"])
    loss1, norm1 = _losses(tmp_path / "one")
    assert loss1[-1] < loss1[0]
    for data_parallel in ("ddp", "fsdp"):
        run_train(tmp_path / data_parallel, common + [f"parallel.data_parallel={data_parallel}"], nproc=2)
        loss2, norm2 = _losses(tmp_path / data_parallel)
        assert len(loss2) == 6  # one metrics.jsonl, written by rank 0 only
        torch.testing.assert_close(torch.tensor(loss2), torch.tensor(loss1), rtol=1e-5, atol=0)
        # The global grad norm (what the clipper sees) is the same: gradients are averaged before it.
        torch.testing.assert_close(torch.tensor(norm2), torch.tensor(norm1), rtol=1e-4, atol=0)


def test_fp16_overflow_skips_steps_and_backs_off_the_scale(tmp_path):
    from dsdata.train.config import load_config
    from dsdata.train.loop import train

    torch.set_num_threads(1)
    sets = SMALL + ["training.steps=3", "training.global_batch_size=2", "training.precision=fp16",
                    "checkpoint.interval=0", "precision.init_scale=1099511627776.0"]
    train(load_config(TINY, sets), str(tmp_path))
    rows = metrics(tmp_path)
    assert [r["skipped"] for r in rows] == [True, True, True]
    assert [r["loss_scale"] for r in rows] == [2.0 ** 40, 2.0 ** 39, 2.0 ** 38]
    assert all(r["grad_norm"] is None for r in rows)


def test_nonfinite_fp16_loss_is_retried_in_fp32(tmp_path):
    from dsdata.train.config import load_config
    from dsdata.train.loop import train

    torch.set_num_threads(1)
    # Huge weights overflow fp16 activations (inf logits → NaN loss) but not fp32.
    sets = SMALL + ["training.steps=2", "training.global_batch_size=2", "training.precision=fp16",
                    "checkpoint.interval=0", "model.init_std=40.0"]
    train(load_config(TINY, sets), str(tmp_path))
    rows = metrics(tmp_path)
    assert all(r["fp32_retry"] and not r["skipped"] for r in rows)
    assert all(r["loss"] is not None and r["grad_norm"] is not None for r in rows)


def test_progressive_unfreezing_keeps_lower_layers_fixed(tmp_path):
    import torch.distributed.checkpoint as dcp

    from dsdata.train.config import load_config
    from dsdata.train.loop import train
    from dsdata.train.model import Transformer

    torch.set_num_threads(1)
    sets = SMALL + ["training.steps=4", "training.global_batch_size=2", "checkpoint.interval=2",
                    "training.unfreeze_fraction=0.5", "checkpoint.keep=5"]
    config = load_config(TINY, sets)
    train(config, str(tmp_path))

    def saved(step):
        args = config.model.__class__(**{**config.model.__dict__, "vocab_size": 64})
        torch.manual_seed(0)
        model = Transformer(args)
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=str(tmp_path / "checkpoints" / f"step_{step:08d}"))
        return state["model"]

    torch.manual_seed(0)
    initial = Transformer(config.model.__class__(**{**config.model.__dict__, "vocab_size": 64})).state_dict()
    at2, at4 = saved(2), saved(4)
    lower = [k for k in initial if k.startswith("layers.0.")]
    upper = [k for k in initial if k.startswith("layers.1.")]
    assert all(torch.equal(at2[k], initial[k]) for k in lower)
    assert not all(torch.equal(at2[k], initial[k]) for k in upper)
    assert not all(torch.equal(at4[k], initial[k]) for k in lower)


@pytest.mark.parametrize("sets,message", [
    (["training.stepz=3"], "[training] has no parameter 'stepz'"),
    (["optimizer.name=sgd"], "optimizer.name"),
    (["training.global_batch_size=3", "parallel.gradient_accumulation_steps=2"], "gradient_accumulation_steps"),
    (["data.path=/nonexistent/shards"], "data.path"),
    (["logging.progress=fancy"], "logging.progress"),
])
def test_user_errors_are_one_line(tmp_path, capsys, sets, message):
    from dsdata.train.__main__ import main

    argv = ["--config", TINY, "--run-dir", str(tmp_path)]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("dsdata-train: error:")


def test_loss_anomaly_detector_flags_spikes_only():
    from dsdata.train.metrics import LossAnomalyDetector

    detector = LossAnomalyDetector(window=100, sigma=3.0)
    losses = [3.0 + 0.01 * ((i * 7) % 5) for i in range(40)]
    assert all(detector.check(x) is None for x in losses)
    assert detector.check(3.5) is not None  # far above mean + 3σ
    assert detector.check(3.02) is None
    assert "nan" in detector.check(float("nan"))
    restored = LossAnomalyDetector()
    restored.load_state_dict(detector.state_dict())
    assert restored.history == detector.history


def test_overrides_parse_toml_values_and_nested_keys():
    from dsdata.train.config import load_config

    config = load_config(TINY, ["training.steps=7", "optimizer.lr=1e-2", "model.attention=lsh",
                                "training.fp32_retry=false", "data.curriculum.kind=fixed"])
    assert config.training.steps == 7 and config.optimizer.lr == 0.01 and config.model.attention == "lsh"
    assert config.training.fp32_retry is False and config.data.curriculum == {"kind": "fixed"}
