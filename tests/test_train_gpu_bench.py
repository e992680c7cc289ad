"""benchmarks/train_gpu.py --smoke: every section runs on CPU at tiny shapes and the last line is
the JSON summary; the trainer it times imports no Apache Beam (the GPU machine has none)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_smoke_runs_every_section_and_ends_with_one_json_object():
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "train_gpu.py"), "--smoke"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = json.loads(lines[-1])
    assert summary["smoke"] is True
    for section in ("matmul", "trainer_eager", "hf_llama", "attention"):
        assert "error" not in summary[section], summary[section]
    assert summary["matmul"]["tflops"] >= 0
    trainer = summary["trainer_eager"]
    assert trainer["tokens_per_s"] > 0 and trainer["tokens_per_step"] == 4 * 64
    assert all(loss is not None and loss > 0 for loss in trainer["losses"])
    for section in ("trainer_eager", "hf_llama"):  # one more step profiled: where the time goes
        profile = summary[section]["profile"]
        assert profile["launches"] > 0 and profile["top"]
        assert sum(profile["by_kind_ms"].values()) == pytest.approx(profile["total_ms"], rel=0.01, abs=0.01)
        assert profile["by_kind_ms"].get("matmul", 0) > 0  # the linear layers, whatever the device
    # 6·N + 12·L·T·d per token, the formula
    assert trainer["gflops_per_token"] == round((6 * trainer["parameters"] + 12 * 2 * 64 * 64) / 1e9, 3)
    attention = summary["attention"]
    assert set(attention["ms"]) == {f"{k}@256" for k in ("dense", "dynamic_sparse", "dynamic_sparse_flex",
                                                          "dynamic_sparse_reference", "lsh", "lsh_fused",
                                                          "lsh_reference")}
    diffs = attention["kernel_vs_reference_max_abs_diff"]
    assert set(diffs) == {"dynamic_sparse_fused", "dynamic_sparse_flex", "lsh_flex", "lsh_fused"}
    for kernel_diffs in diffs.values():
        assert max(kernel_diffs.values()) < 1e-4
    profile = attention["profile"]["dynamic_sparse@256"]
    assert profile["launches"] > 0 and profile["top"] and profile["top"][0][2] > 0
    assert summary["ratios"]["eager_vs_hf"] > 0
    assert "skipped" in summary["trainer_compiled"]


def test_the_benchmarked_trainer_imports_no_beam():
    code = ("import runpy, sys\n"
            f"runpy.run_path({str(REPO / 'benchmarks' / 'train_gpu.py')!r})  # its imports, not main()\n"
            "import dsdata.train.loop, dsdata.train.attention, dsdata.train.block_sparse, transformers\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'apache_beam'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
