"""Checkpoints resume exactly, and run no code a checkpoint file could carry (issue 14).

In-process runs of the real trainer on the synthetic stream (a few seconds each); tampered
checkpoints are written with torch's own pickle / DCP, as an attacker shipping a run directory would.
"""
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from dsdata.train.__main__ import main
from dsdata.train.config import load_config

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "models" / "tiny.toml")
SMALL = ["model.dim=32", "model.n_heads=2", "training.seq_len=32", "data.synthetic_vocab=64",
         "training.global_batch_size=2", "logging.tensorboard=false", "logging.console_interval=0",
         "logging.histogram_interval=0", "export.enabled=false", "training.threads=1", "checkpoint.interval=2",
         "checkpoint.keep=5", "optimizer.name=deepopt", "training.precision=fp16"]


def _train(run_dir: Path, steps: int) -> int:
    argv = ["--config", TINY, "--run-dir", str(run_dir), "--set", f"training.steps={steps}"]
    for item in SMALL:
        argv += ["--set", item]
    return main(argv)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class _CreatesMarker:
    """Unpickling this calls open(marker, "w"): the file appears if anything unpickles it."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_resume_continues_the_run_exactly(tmp_path):
    import shutil

    torch.set_num_threads(1)
    run = tmp_path / "run"
    assert _train(run, 4) == 0
    straight = _metrics(run)
    shutil.rmtree(run / "checkpoints" / "step_00000004")  # as if killed after step 3: resume at step 2
    assert _train(run, 4) == 0
    resumed = _metrics(run)
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for key in ("loss", "grad_norm", "lr", "loss_scale", "clip_threshold"):
        assert [m[key] for m in resumed] == [m[key] for m in straight], key


@pytest.fixture
def finished_run(tmp_path):
    torch.set_num_threads(1)
    run = tmp_path / "run"
    assert _train(run, 2) == 0
    return run


def _refused(run: Path, capsys, marker: Path, words: str) -> None:
    capsys.readouterr()
    assert _train(run, 4) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # The run's set-up may come first (logged before the checkpoint is read); the error is one line, last.
    errors = [line for line in err if "error" in line.lower() or "Traceback" in line]
    assert errors == err[-1:] and err[-1].startswith("dsdata-train: error: checkpoint "), err
    assert words in err[-1], err[-1]
    assert not marker.exists(), "the checkpoint ran code"


def test_a_metadata_file_that_would_run_code_is_refused(finished_run, capsys, tmp_path):
    marker = tmp_path / "pwned"
    (finished_run / "checkpoints" / "step_00000002" / ".metadata").write_bytes(pickle.dumps(_CreatesMarker(marker)))
    pickle.loads(pickle.dumps(_CreatesMarker(tmp_path / "probe")))  # the payload works when unpickled
    assert (tmp_path / "probe").exists()
    _refused(finished_run, capsys, marker, ".metadata refers to io.open, which DCP metadata never holds")


def test_a_param_group_value_that_would_run_code_is_refused(finished_run, capsys, tmp_path):
    """DCP stores non-tensor values (param-group numbers) with torch.save and loads them with full unpickling."""
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "pwned"
    step = finished_run / "checkpoints" / "step_00000002"
    state_file = (step / "trainer_state.json").read_bytes()
    for name in os.listdir(step):
        os.remove(step / name)
    dcp.save({"optim": {"param_groups": [{"lr": _CreatesMarker(marker)}]}}, checkpoint_id=str(step))
    (step / "trainer_state.json").write_bytes(state_file)
    _refused(finished_run, capsys, marker, "optim.param_groups.0.lr is not plain data (Unsupported global: GLOBAL io.open)")


def test_metadata_naming_a_file_outside_the_checkpoint_is_refused(finished_run, capsys, tmp_path):
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    step = finished_run / "checkpoints" / "step_00000002"
    metadata = FileSystemReader(str(step)).read_metadata()  # our own file: trusted in this test
    for info in metadata.storage_data.values():
        info.relative_path = "../../elsewhere.distcp"
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    _refused(finished_run, capsys, tmp_path / "none", "outside its checkpoint directory")


@pytest.mark.parametrize("content", [b"not a pickle", b"", json.dumps({"a": 1}).encode()])
def test_damaged_metadata_is_one_line(finished_run, capsys, tmp_path, content):
    (finished_run / "checkpoints" / "step_00000002" / ".metadata").write_bytes(content)
    _refused(finished_run, capsys, tmp_path / "none", ".metadata")


def test_metadata_over_its_size_bound_is_refused_before_it_is_read_whole(finished_run, capsys, tmp_path):
    from dsdata.train.checkpoint import METADATA_MAX_BYTES

    with open(finished_run / "checkpoints" / "step_00000002" / ".metadata", "r+b") as fh:
        fh.truncate(METADATA_MAX_BYTES + 1)  # sparse: the pickle's own bytes, then zeros
    _refused(finished_run, capsys, tmp_path / "none", f".metadata is over {METADATA_MAX_BYTES} bytes")


@pytest.mark.parametrize("content", ["[1, 2]", "{\"step\": 2}", "{"])
def test_damaged_trainer_state_is_one_line(finished_run, capsys, tmp_path, content):
    (finished_run / "checkpoints" / "step_00000002" / "trainer_state.json").write_text(content)
    _refused(finished_run, capsys, tmp_path / "none", "trainer_state.json")


@pytest.mark.parametrize("item,message", [
    ("model.dim=-4", "model.dim must be a positive integer, got -4"),
    ("model.n_layers=0", "model.n_layers must be a positive integer, got 0"),
    ("model.n_kv_heads=abc", "model.n_kv_heads must be a positive integer, got 'abc'"),
    ("training.seq_len=-1", "training.seq_len must be a positive integer"),
    ("training.global_batch_size=0", "training.global_batch_size must be a positive integer"),
    ("optimizer.lr=-0.1", "optimizer.lr must be a positive number"),
    ("optimizer.beta2=1.5", "optimizer.beta2 must be a number between 0 and 1, 1 excluded"),
    ("checkpoint.keep=0", "checkpoint.keep must be a positive integer"),
    ("parallel.pipeline_parallel_size=-2", "parallel.pipeline_parallel_size must be a positive integer"),
    ("clipping.window=0", "clipping.window must be a positive integer"),
    ("model.norm_eps=nan", "model.norm_eps must be a positive number, got nan"),
])
def test_out_of_range_config_values_are_one_line(tmp_path, capsys, item, message):
    assert main(["--config", TINY, "--run-dir", str(tmp_path), "--set", item]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dsdata-train: error:") and message in err[0], err


def test_every_numeric_key_has_a_declared_range():
    """Every numeric field of every table, the options of every attention kernel and optimizer
    included, is a Param (the type recipe stages declare) whose default passes its own check, and a
    numeric one is an Integer or a Number (seeds: Integer() without bounds)."""
    from dataclasses import fields
    from typing import get_args, get_type_hints

    from dsdata.core.params import Integer, Number, Options, Param
    from dsdata.train.config import SECTIONS

    tables = list(SECTIONS.items())
    for name, cls in SECTIONS.items():  # an Options field: every row's options class
        for spec in fields(cls):
            kind = spec.metadata["param"].type
            if isinstance(kind, Options):
                tables += [(f"{name}.{spec.name}[{row}]", value.Config) for row, value in kind.registry.items()]
    assert {"model.attention_config[dynamic_sparse]", "optimizer.config[deepopt]"} <= {name for name, _ in tables}
    for name, cls in tables:
        hints = get_type_hints(cls)
        for f in fields(cls):
            param = f.metadata["param"]
            assert isinstance(param, Param)
            if param.default is not None:  # None: unset, derived from other keys
                param.coerce(f"{name}.{f.name}", param.default)
            kinds = get_args(hints[f.name]) or (hints[f.name],)  # int | None: int
            if any(kind in (int, float) for kind in kinds):
                assert isinstance(param.type, (Integer, Number)), f"{name}.{f.name} has no range"
    load_config(str(REPO / "models" / "llama-1b.toml"))  # the shipped configs are inside every range


def test_a_truncated_data_file_is_one_line(finished_run, capsys, tmp_path):
    data = finished_run / "checkpoints" / "step_00000002" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:1000])
    _refused(finished_run, capsys, tmp_path / "none", "is damaged")


def test_a_checkpoint_of_another_model_shape_is_one_line(finished_run, capsys):
    capsys.readouterr()
    argv = ["--config", TINY, "--run-dir", str(finished_run), "--set", "training.steps=4", "--set", "model.dim=64"]
    for item in SMALL:
        if not item.startswith("model.dim"):
            argv += ["--set", item]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dsdata-train: error: checkpoint ") and "Size mismatch" in err[-1], err
    assert not any("Traceback" in line for line in err)
