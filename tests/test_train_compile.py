"""training.compile on CPU: compiled blocks train the same losses as eager, and resume exactly.

Runs the real command (python -m dsdata.train) with inductor's CPU backend (needs a C++ compiler,
as torch.compile on CPU always does)."""
import shutil

import pytest

from tests.test_train import metrics, run_train

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("c++") is None,
                                reason="torch.compile on CPU needs a C++ compiler (gcc / c++ not on PATH)")

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
