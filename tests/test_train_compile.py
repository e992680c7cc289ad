"""training.compile on CPU: compiled blocks train the same losses as eager, and resume exactly.

Runs the real command (python -m dsdata.train) with inductor's CPU backend (needs a C++ compiler,
as torch.compile on CPU always does)."""
import re
import shutil

import pytest

from tests.conftest import needs_compiler
from tests.test_train import metrics, run_train

pytestmark = needs_compiler

STEPS = 20
COMMON = [f"training.steps={STEPS}", "checkpoint.interval=10", "model.n_layers=2", "optimizer.lr=0.003",
          "schedule.warmup_steps=2", "optimizer.name=deepopt"]


def _losses(run_dir):
    return [r["loss"] for r in metrics(run_dir)]


def test_compiled_blocks_train_the_eager_losses_and_resume_exactly(tmp_path):
    eager = tmp_path / "eager"
    run_train(eager, COMMON + ["training.compile=false"])
    compiled = tmp_path / "compiled"
    run_train(compiled, COMMON + ["training.compile=true"])
    want, got = _losses(eager), _losses(compiled)
    assert len(got) == STEPS and got[-1] < got[0] - 0.5  # it learns
    assert got == pytest.approx(want, rel=2e-3, abs=2e-3)

    # The run as if killed after its step-10 checkpoint: continued by a fresh compiled process.
    resumed = tmp_path / "resumed"
    shutil.copytree(compiled, resumed)
    shutil.rmtree(resumed / "checkpoints" / f"step_{STEPS:08d}")
    run_train(resumed, COMMON + ["training.compile=true"])
    assert _losses(resumed) == got  # exact: the same compiled kernels from the same state


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_compiled_blocks_under_every_layout_train_the_one_process_losses(tmp_path):
    """DDP, FSDP2, tensor and pipeline parallel over 2 gloo processes, each block compiled, against
    one eager process: the compiled forward keeps the layouts' hooks (DDP's and FSDP2's, tensor
    parallel's DTensor plumbing, pipeline stages) working.  Tensor parallel with compiled blocks once
    failed in backward (the embedding's all-reduced output reached the compiled block as an
    AsyncCollectiveTensor); every rank of every run reports compiled blocks."""
    from dsdata.train.config import load_config
    from dsdata.train.loop import train
    from tests.test_parallel import BASE, TINY, _losses, _torchrun

    sets = [s for s in BASE if not s.startswith(("training.steps", "checkpoint.interval"))] + [
        "training.steps=4", "checkpoint.interval=0"]
    layouts = {"ddp": ["parallel.data_parallel_size=2"],
               "fsdp": ["parallel.data_parallel_size=2", "parallel.data_parallel=fsdp"],
               "tp2": ["parallel.tensor_parallel_size=2"],
               "pp2": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=1f1b"]}
    proc = _torchrun(2, [{"run_dir": str(tmp_path / name), "overrides": sets + extra + ["training.compile=true"]}
                         for name, extra in layouts.items()], tmp_path)
    for name in layouts:  # both ranks of every run trained compiled blocks (no layout declines it)
        reported = re.findall(rf"{re.escape(str(tmp_path / name))}: [\d.]+ s, compiled blocks: (\w+)", proc.stderr)
        assert reported == ["True", "True"], (name, proc.stderr[-3000:])
    train(load_config(TINY, sets + ["training.compile=false"]), str(tmp_path / "single"))
    want = _losses(tmp_path / "single")
    for name in layouts:
        assert _losses(tmp_path / name) == pytest.approx(want, rel=2e-3), name


def test_compiled_blocks_with_dynamic_sparse_attention_train_the_eager_losses(tmp_path):
    """The sparse kernel traced into each compiled block (selection, gathers, summary, the gate's
    straight-through term), two threads: the compiled run trains the eager losses and gradient norms."""
    sets = ["training.steps=6", "checkpoint.interval=0", "model.n_layers=2", "optimizer.lr=0.003",
            "schedule.warmup_steps=2", "training.threads=2", "model.attention=dynamic_sparse",
            "model.attention_config.top_k=8", "model.attention_config.window=64", "model.attention_config.block=32", "model.max_seq_len=256",
            "training.seq_len=256", "training.global_batch_size=2", "export.enabled=false"]
    run_train(tmp_path / "eager", sets + ["training.compile=false"])
    run_train(tmp_path / "compiled", sets + ["training.compile=true"])
    want, got = metrics(tmp_path / "eager"), metrics(tmp_path / "compiled")
    assert len(got) == 6 and got[-1]["loss"] < got[0]["loss"]
    for key in ("loss", "grad_norm"):
        assert [r[key] for r in got] == pytest.approx([r[key] for r in want], rel=2e-3, abs=2e-3), key
