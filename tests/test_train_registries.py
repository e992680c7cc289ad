"""Attention kernels and optimizers are one module + one registry row each: a test-only kernel and a
test-only optimizer (tests/train_plugins.py), declared as entry points of a distribution on the path,
train end to end through `python -m dsdata.train`; no dsdata module outside attention.py / optim.py
spells a kernel or optimizer name."""
import json
import re
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

from test_train import _env, command, metrics

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """A directory holding only a distribution's metadata: its entry points name tests/train_plugins.py."""
    root = tmp_path_factory.mktemp("plugins")
    info = root / "dsdata_test_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dsdata-test-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[dsdata.attention_kernels]\ntest_band = tests.train_plugins:BandAttention\n\n"
                                           "[dsdata.optimizers]\ntest_sgd = tests.train_plugins:SGD_ROW\n")
    return root


def _run(run_dir, sets, plugin_path, check=True):
    env = _env()
    env["PYTHONPATH"] = f"{REPO}:{plugin_path}"
    proc = subprocess.run(command(run_dir, sets), env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


STEPS = ["training.steps=4", "checkpoint.interval=0", "schedule.warmup_steps=1"]


def test_a_test_only_kernel_trains_end_to_end_and_equals_dense_when_its_band_covers_the_sequence(tmp_path,
                                                                                                 plugin_path):
    _run(tmp_path / "dense", STEPS, plugin_path)
    # band = seq_len: every causal key is in the band, so the model computes dense attention's function
    _run(tmp_path / "band", STEPS + ["model.attention=test_band", "model.attention_config.band=32",
                                     "export.enabled=true"], plugin_path)
    dense, band = metrics(tmp_path / "dense"), metrics(tmp_path / "band")
    assert len(band) == 4
    for want, got in zip(dense, band):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-5)
    # The kernel's per-step member was called once per step on every layer (its buffer is exported:
    # the kernel is not llama_compatible, so the export is dsdata-native).
    weights = load_file(str(tmp_path / "band" / "hf" / "model.safetensors"))
    seen = {k: int(v) for k, v in weights.items() if k.endswith("steps_seen")}
    assert seen == {"layers.0.attention.kernel.steps_seen": 4, "layers.1.attention.kernel.steps_seen": 4}
    meta = json.loads((tmp_path / "band" / "hf" / "dsdata_model.json").read_text())
    assert meta["model"]["attention"] == "test_band" and meta["model"]["attention_config"] == {"band": 32}
    # A narrow band is another function: the losses part from dense attention's.
    _run(tmp_path / "narrow", STEPS + ["model.attention=test_band", "model.attention_config.band=2"], plugin_path)
    assert metrics(tmp_path / "narrow")[-1]["loss"] != pytest.approx(dense[-1]["loss"], rel=1e-4)


def test_a_test_only_optimizer_trains_end_to_end_with_its_own_options(tmp_path, plugin_path):
    _run(tmp_path / "adamw", STEPS, plugin_path)
    proc = _run(tmp_path / "sgd", STEPS + ["optimizer.name=test_sgd", "optimizer.lr=0.5",
                                           "optimizer.config.momentum=0.9"], plugin_path)
    assert "optimizer test_sgd" in proc.stderr
    sgd, adamw = metrics(tmp_path / "sgd"), metrics(tmp_path / "adamw")
    assert sgd[0]["loss"] == pytest.approx(adamw[0]["loss"], rel=1e-6)  # same model, same first batch
    assert sgd[-1]["loss"] < sgd[0]["loss"] and sgd[-1]["loss"] != pytest.approx(adamw[-1]["loss"], rel=1e-4)
    bad = _run(tmp_path / "bad", STEPS + ["optimizer.name=test_sgd", "optimizer.config.momentum=1.5"], plugin_path,
               check=False)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].endswith("optimizer.config.momentum must be a number between 0 and 1, 1 excluded, got 1.5")


def test_without_the_plugin_its_names_are_unknown_in_one_line(tmp_path):
    proc = subprocess.run(command(tmp_path, ["model.attention=test_band"]), env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"dsdata-train: error: {REPO / 'models' / 'tiny.toml'}: model.attention must be one of "
        "dense, dynamic_sparse, lsh, got 'test_band'"]


def test_register_refuses_a_taken_name_or_a_non_row():
    from dsdata.train.attention import ATTENTION_KERNELS, register_attention
    from dsdata.train.optim import register_optimizer

    with pytest.raises(ValueError, match="'dense' is already registered"):
        register_attention("dense", ATTENTION_KERNELS["lsh"])
    with pytest.raises(ValueError, match="not a subclass of dsdata.train.attention.AttentionKernel"):
        register_attention("mine", dict)
    with pytest.raises(ValueError, match="Config must be a dataclass"):
        register_optimizer("mine", lambda *a: None, config=dict)
    assert "mine" not in ATTENTION_KERNELS


def test_kernel_and_optimizer_names_are_spelled_only_in_their_registries():
    from dsdata.train.attention import ATTENTION_KERNELS
    from dsdata.train.optim import OPTIMIZERS

    owners = {"attention.py": set(ATTENTION_KERNELS), "optim.py": set(OPTIMIZERS)}
    names = set().union(*owners.values())
    spelled = re.compile(r"""["'](%s)["']""" % "|".join(map(re.escape, sorted(names))))
    found = []
    for path in sorted((REPO / "dsdata").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in spelled.finditer(line):
                if not (path.parent.name == "train" and match.group(1) in owners.get(path.name, ())):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, found


def test_every_batch_source_and_kernel_provides_every_protocol_member(tmp_path):
    """The loop calls the protocols' members unconditionally: each implementation has all of them."""
    import numpy as np

    from shard_sets import ShardSetWriter
    from dsdata.train.attention import ATTENTION_KERNELS
    from dsdata.train.batches import build_batches
    from dsdata.train.config import DataConfig
    from dsdata.train.protocols import AttentionKernel, BatchSource

    for name in ("a", "b"):
        writer = ShardSetWriter(str(tmp_path / name), shard_size=1500, tokenizer={"vocab_size": 64, "eos_id": 0})
        for i in range(20):
            writer.add(f"{name}{i}", np.append(np.arange(1, 40) % 63 + 1, 0).astype(np.uint16), "easy")
        writer.close()
    sources = [{"path": str(tmp_path / "a"), "weight": 1}, {"path": str(tmp_path / "b"), "weight": 2}]
    for data in (DataConfig(), DataConfig(path=str(tmp_path / "a")), DataConfig(sources=sources)):
        batches = build_batches(data, seq_len=16, total_steps=4, batch_size=3)
        assert isinstance(batches, BatchSource), type(batches).__name__
        assert batches.next_batch(0).shape == (3, 17)
        assert batches.vocab_size == (256 if not (data.path or data.sources) else 64)
        assert (batches.tokenizer() is None) == (not (data.path or data.sources))
    for name, kernel in ATTENTION_KERNELS.items():
        assert isinstance(kernel.from_config(kernel.Config(), 16, 0), AttentionKernel), name
