"""Hybrid parallelism: layouts proven equal to one process (CPU, gloo), schedules checked in pure Python.

The parity tests run the real trainer (`dsdata.train.loop.train`) on the tiny config: one process in
this test, then one torchrun of 2 processes that trains tp=2, pp=2 (gpipe, 1f1b), dp=2 and two
cross-layout resumes in a row, and one torchrun of 4 processes for dp=2 × tp=2 and pp=2 × tp=2.  Losses must match
to 1e-5 relative at every step, parameters after the steps (read back from each run's sharded DCP
checkpoint) to 1e-5 (abs + rel).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from dsdata.train.config import ConfigError, load_config
from dsdata.train.parallel import MixedParallel, resolve_dims
from dsdata.train.parallel.pipeline import balanced_split

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "models" / "tiny.toml")
STEPS = 10
BASE = [f"training.steps={STEPS}", "checkpoint.interval=5", "checkpoint.keep=3", "logging.tensorboard=false",
        "logging.console_interval=0", "logging.histogram_interval=0", "export.enabled=false", "training.threads=1"]
RTOL = 1e-5


# ------------------------------------------------------------------ pure Python: a model of the schedules
# The per-stage orders of torch's GPipe and 1F1B, checked for completeness and deadlock, and their
# bubble on an idealised clock (docs/parallel.md quotes it next to the measured one).


@dataclass(frozen=True)
class Action:
    stage: int
    kind: str  # "F" or "B"
    micro: int


def schedule_actions(kind: str, stages: int, micro: int) -> list[list[Action]]:
    """Per stage, the order in which it runs forward/backward of each micro-batch (as torch's schedules do)."""
    order: list[list[Action]] = []
    for s in range(stages):
        if kind == "gpipe":
            seq = [Action(s, "F", m) for m in range(micro)] + [Action(s, "B", m) for m in range(micro)]
        elif kind == "1f1b":
            warmup = min(micro, stages - s)
            seq = [Action(s, "F", m) for m in range(warmup)]
            next_f, next_b = warmup, 0
            while next_b < micro:
                seq.append(Action(s, "B", next_b))
                next_b += 1
                if next_f < micro:
                    seq.append(Action(s, "F", next_f))
                    next_f += 1
        else:
            raise ValueError(f"unknown schedule {kind!r}")
        order.append(seq)
    return order


def check_schedule(order: list[list[Action]], micro: int) -> None:
    """Raise AssertionError unless every stage runs F and B of every micro-batch exactly once, F before B,
    and the cross-stage dependencies can be met (F(s,m) after F(s-1,m); B(s,m) after B(s+1,m))."""
    stages = len(order)
    for s, seq in enumerate(order):
        for kind in "FB":
            got = sorted(a.micro for a in seq if a.kind == kind)
            assert got == list(range(micro)), f"stage {s}: {kind} of micro-batches {got}, expected each of 0..{micro - 1} once"
        position = {(a.kind, a.micro): i for i, a in enumerate(seq)}
        for m in range(micro):
            assert position[("F", m)] < position[("B", m)], f"stage {s}: backward of micro-batch {m} before its forward"
    simulate(order)  # raises on a dependency deadlock
    assert stages >= 1


def simulate(order: list[list[Action]], forward_cost: float = 1.0, backward_cost: float = 2.0) -> dict:
    """Run the per-stage orders on an idealised clock; returns makespan, busy time and bubble fraction."""
    stages = len(order)
    done: dict[tuple[str, int, int], float] = {}
    clock = [0.0] * stages
    cursor = [0] * stages
    remaining = sum(len(seq) for seq in order)
    while remaining:
        progressed = False
        for s in range(stages):
            if cursor[s] == len(order[s]):
                continue
            a = order[s][cursor[s]]
            if a.kind == "F":
                dep = ("F", s - 1, a.micro) if s > 0 else None
            else:
                dep = ("B", s + 1, a.micro) if s < stages - 1 else ("F", s, a.micro)
            if dep is not None and dep not in done:
                continue
            start = max(clock[s], done.get(dep, 0.0) if dep else 0.0)
            clock[s] = start + (forward_cost if a.kind == "F" else backward_cost)
            done[(a.kind, s, a.micro)] = clock[s]
            cursor[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise AssertionError(f"schedule deadlocks: stages wait on each other at {cursor}")
    makespan = max(clock)
    per_stage_busy = len(order[0]) // 2 * (forward_cost + backward_cost)
    return {"makespan": makespan, "busy_per_stage": per_stage_busy, "bubble_fraction": 1.0 - per_stage_busy / makespan}


def theoretical_bubble(stages: int, micro: int) -> float:
    """(p − 1) / (m + p − 1): the idle share of each stage in GPipe and 1F1B."""
    return (stages - 1) / (micro + stages - 1)


# ------------------------------------------------------------------ pure Python: schedules, split, sizes

@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro", [(2, 2), (2, 4), (3, 5), (4, 4), (4, 8)])
def test_schedule_runs_every_microbatch_once_forward_before_backward(kind, stages, micro):
    order = schedule_actions(kind, stages, micro)
    check_schedule(order, micro)
    assert simulate(order)["bubble_fraction"] == pytest.approx(theoretical_bubble(stages, micro))


def test_1f1b_keeps_at_most_stages_minus_rank_microbatches_in_flight():
    for s, seq in enumerate(schedule_actions("1f1b", 4, 8)):
        in_flight = peak = 0
        for a in seq:
            in_flight += 1 if a.kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak == 4 - s  # GPipe would hold all 8


def test_schedule_checker_rejects_broken_orders():
    good = schedule_actions("gpipe", 2, 2)
    backward_first = [list(reversed(seq)) for seq in good]
    with pytest.raises(AssertionError, match="before its forward"):
        check_schedule(backward_first, 2)
    missing = [seq[:-1] for seq in good]
    with pytest.raises(AssertionError, match="once"):
        check_schedule(missing, 2)
    # Stage 1 starts with micro-batch 1, whose forward stage 0 only runs after a backward stage 1 owes it.
    deadlock = [[Action(0, "F", 0), Action(0, "B", 0), Action(0, "F", 1), Action(0, "B", 1)],
                [Action(1, "F", 1), Action(1, "F", 0), Action(1, "B", 0), Action(1, "B", 1)]]
    with pytest.raises(AssertionError, match="deadlock"):
        check_schedule(deadlock, 2)


def test_stage_split_balances_parameters_and_keeps_layers_contiguous():
    # Heavy embedding on stage 0 and output on the last stage push layers to the middle stages.
    split = balanced_split(embed=300, layers=[100] * 8, tail=300, stages=4)
    assert [x for part in split for x in part] == list(range(8)) and all(split)
    loads = [sum(100 for _ in part) + (300 if i == 0 else 0) + (300 if i == 3 else 0) for i, part in enumerate(split)]
    assert max(loads) == 400  # the best possible (e.g. 1 + 3 + 3 + 1 layers)
    assert len(split[0]) == len(split[-1]) == 1
    assert balanced_split(0, [5, 5, 5, 5], 0, 2) == [[0, 1], [2, 3]]
    with pytest.raises(ConfigError, match="exceeds model.n_layers"):
        balanced_split(0, [1, 1], 0, 3)


def test_sizes_must_multiply_to_world_size_and_batch_splits_without_changing_math():
    config = load_config(TINY, ["parallel.tensor_parallel_size=2", "parallel.pipeline_parallel_size=2"])
    with pytest.raises(ConfigError, match=r"must equal the world size \(6 processes\)"):
        resolve_dims(config.parallel, 6, 16)
    dims = resolve_dims(config.parallel, 8, 16)
    assert (dims.dp, dims.pp, dims.tp) == (2, 2, 2)
    assert dims.micro_batch_size * dims.accumulation * dims.dp == 16  # the global batch, whatever the layout
    assert dims.coordinates(5) == (1, 0, 1) and dims.rank_of(1, 0, 1) == 5
    bad = load_config(TINY, ["parallel.pipeline_parallel_size=2", "parallel.micro_batch_size=16"])
    with pytest.raises(ConfigError, match="1f1b pipeline schedule needs at least"):
        resolve_dims(bad.parallel, 2, 16)
    odd = load_config(TINY, ["parallel.micro_batch_size=5"])
    with pytest.raises(ConfigError, match="not divisible by parallel.micro_batch_size"):
        resolve_dims(odd.parallel, 2, 16)


def test_mixed_parallel_facade_from_a_dict():
    spec = {"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "micro_batch_size": 8,
            "gradient_accumulation_steps": 16}
    dims = MixedParallel.plan(spec, world_size=16)
    assert (dims.dp, dims.pp, dims.tp, dims.micro_batch_size, dims.accumulation) == (2, 2, 4, 8, 16)
    with pytest.raises(ConfigError, match="world size"):
        MixedParallel(spec)  # this test is one process, the spec needs 8 × dp
    with pytest.raises(ConfigError, match=r"MixedParallel has no parameter 'tensor_parallel' .*; "
                                          r"did you mean 'tensor_parallel_size'\?"):
        MixedParallel.plan({"tensor_parallel": 2}, 2)
    # global_batch_size is checked where a TOML config's is, with the same line
    with pytest.raises(ConfigError, match=r"^MixedParallel: training.global_batch_size must be a positive integer, got 0$"):
        MixedParallel.plan({"global_batch_size": 0}, 2)
    assert MixedParallel.plan({"global_batch_size": 4}, 2).micro_batch_size == 2
    from dsdata.train import MixedParallel as lazily_imported

    assert lazily_imported is MixedParallel


def test_tensor_parallel_refuses_shapes_it_cannot_split():
    from dsdata.train.parallel.tensor import check_tensor_parallel

    config = load_config(TINY, ["model.vocab_size=255"])
    check_tensor_parallel(config.model, 2)  # an odd vocabulary is kept replicated, not refused
    with pytest.raises(ConfigError, match=r"model.n_heads \(4\)"):
        check_tensor_parallel(config.model, 8)


def test_every_layout_implements_the_layout_protocol():
    """A layout that leaves out a protocol method cannot be built: the trainer never probes with hasattr."""
    from dsdata.train.distributed import DistEnv
    from dsdata.train.parallel import DataParallelLayout, HybridLayout, Layout, build_layout

    assert Layout in DataParallelLayout.__mro__ and Layout in HybridLayout.__mro__  # declared, not duck-typed
    assert not DataParallelLayout.__abstractmethods__ and not HybridLayout.__abstractmethods__
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    layout = build_layout(load_config(TINY, ["parallel.gradient_accumulation_steps=2"]), env)
    assert isinstance(layout, DataParallelLayout)
    assert (layout.dims.dp, layout.dims.micro_batch_size, layout.dims.accumulation) == (1, 8, 2)
    assert layout.describe() == "one process, dp 1 × tp 1 × pp 1, 2 micro-batches of 8 per rank"

    class Incomplete(Layout):
        def __init__(self):
            pass

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()


def test_process_start_up_does_not_import_the_layouts():
    """No import circle: train/distributed.py is below parallel/, which imports it."""
    code = ("import sys, dsdata.train.distributed; "
            "assert not [m for m in sys.modules if m.startswith('dsdata.train.parallel')], 'imported'; "
            "import dsdata.train.parallel.dims, dsdata.train.parallel.layout")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_unimplemented_schedule_is_refused_when_the_config_is_read():
    with pytest.raises(ConfigError, match="pipeline_schedule must be one of gpipe, 1f1b, got 'interleaved_1f1b'"):
        load_config(TINY, ["parallel.pipeline_schedule=interleaved_1f1b"])


# ------------------------------------------------------------------ parity with one process (slow)

def _losses(run_dir: Path, first_step: int = 1) -> list[float]:
    """Losses of metrics.jsonl (one file per run, whatever the layout), checking the steps are consecutive."""
    files = sorted(p.name for p in run_dir.glob("metrics*.jsonl"))
    assert files == ["metrics.jsonl"], files
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(first_step, first_step + len(rows)))
    return [r["loss"] for r in rows]


def _checkpoint_params(path: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a DCP checkpoint, read into one process's plain model."""
    import torch.distributed.checkpoint as dcp

    from dsdata.train.model import Transformer

    args = replace(load_config(TINY).model, vocab_size=256)
    state = {k: v.clone() for k, v in Transformer(args).state_dict().items()}
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    saved = {k.removeprefix("model.") for k in metadata.state_dict_metadata if k.startswith("model.")}
    state = {k: v for k, v in state.items() if k in saved}
    dcp.load({"model": state}, checkpoint_id=str(path))
    return state


def _assert_close_losses(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} steps logged, expected {len(want)}"
    for step, (a, b) in enumerate(zip(got, want), 1):
        assert a is not None and abs(a - b) <= RTOL * abs(b), f"{what}: step {step} loss {a} vs one process {b}"


def _assert_close_params(got: dict, want: dict, what: str) -> None:
    assert set(want) <= set(got) | {"output.weight"}, f"{what}: missing {sorted(set(want) - set(got))}"
    for name, value in want.items():
        if name in got:
            torch.testing.assert_close(got[name], value, rtol=RTOL, atol=RTOL, msg=lambda m: f"{what} {name}: {m}")


def _torchrun(nproc: int, plan: list[dict], tmp: Path) -> subprocess.CompletedProcess:
    spec = tmp / f"plan_{nproc}.json"
    spec.write_text(json.dumps(plan))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    for attempt in range(2):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                               __file__, str(spec)], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=600)
        # Once in a full CI run (3 ranks on 2 loaded cores) a rank aborted in C++ ("terminate called
        # without an active exception") 1.7 s after launch, before any step; alone it passed every time.
        # Only that abort is retried, once; any other failure (a loss or parameter mismatch, a Python
        # error) fails at once.
        if proc.returncode == 0 or attempt or "terminate called without an active exception" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


@pytest.fixture(scope="module")
def single_process_run(tmp_path_factory):
    from dsdata.train.loop import train

    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("parallel") / "single"
    train(load_config(TINY, BASE), str(run))
    return run


# Attention variants and MoE under tp=2 (6 steps each; dynamic_sparse needs a far past within seq_len 64).
VARIANTS = {
    "dynamic_sparse": ["model.attention=dynamic_sparse", "model.attention_config.window=16", "model.attention_config.block=16",
                       "model.attention_config.top_k=4", "model.attention_config.refresh_steps=2"],
    "lsh": ["model.attention=lsh", "model.attention_config.chunk=16"],
    "moe": ["model.moe_experts=4"],
}
VARIANT_BASE = [b for b in BASE if not b.startswith("training.steps")] + ["training.steps=6", "checkpoint.interval=0"]

LAYOUTS_2 = {
    "tp2": ["parallel.tensor_parallel_size=2"],
    "pp2_gpipe": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=gpipe"],
    "pp2_1f1b": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=1f1b"],
    "dp2": ["parallel.data_parallel_size=2"],
}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_layouts_match_one_process_and_checkpoints_load_across_layouts(single_process_run, tmp_path):
    single = single_process_run
    reference_losses = _losses(single)
    reference_params = _checkpoint_params(single / "checkpoints" / f"step_{STEPS:08d}")

    plan2 = [{"run_dir": str(tmp_path / name), "overrides": BASE + extra} for name, extra in LAYOUTS_2.items()]
    # Cross-layout resumes: 1 process → tp=2, then tp=2 → pp=2 (1f1b); the first 5 steps come from the checkpoint.
    plan2.append({"run_dir": str(tmp_path / "tp2_from_single"), "overrides": BASE + LAYOUTS_2["tp2"],
                  "copy_checkpoint": str(single / "checkpoints" / "step_00000005")})
    plan2.append({"run_dir": str(tmp_path / "pp2_from_tp2"), "overrides": BASE + LAYOUTS_2["pp2_1f1b"],
                  "copy_checkpoint": str(tmp_path / "tp2" / "checkpoints" / "step_00000005")})
    plan2 += [{"run_dir": str(tmp_path / f"{name}_tp2"), "overrides": VARIANT_BASE + extra + LAYOUTS_2["tp2"]}
              for name, extra in VARIANTS.items()]
    _torchrun(2, plan2, tmp_path)
    plan4 = [{"run_dir": str(tmp_path / "dp2_tp2"), "overrides": BASE + ["parallel.data_parallel_size=2",
                                                                       "parallel.tensor_parallel_size=2"]},
             {"run_dir": str(tmp_path / "pp2_tp2"), "overrides": BASE + ["parallel.pipeline_parallel_size=2",
                                                                       "parallel.tensor_parallel_size=2"]}]
    _torchrun(4, plan4, tmp_path)

    for name in [*LAYOUTS_2, "dp2_tp2", "pp2_tp2"]:
        run = tmp_path / name
        _assert_close_losses(_losses(run), reference_losses, name)
        _assert_close_params(_checkpoint_params(run / "checkpoints" / f"step_{STEPS:08d}"), reference_params, name)
    for name in ("tp2_from_single", "pp2_from_tp2"):
        run = tmp_path / name
        _assert_close_losses(_losses(run, first_step=6), reference_losses[5:], name)
        _assert_close_params(_checkpoint_params(run / "checkpoints" / f"step_{STEPS:08d}"), reference_params, name)

    from dsdata.train.loop import train

    for name, extra in VARIANTS.items():
        train(load_config(TINY, VARIANT_BASE + extra), str(tmp_path / f"{name}_single"))
        _assert_close_losses(_losses(tmp_path / f"{name}_tp2"), _losses(tmp_path / f"{name}_single"), f"{name} tp2")

    # pp=2 (gpipe) checkpoint at step 5 → one process resumes and ends where the one-process run ended.
    resumed = tmp_path / "single_from_pp2"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "pp2_gpipe" / "checkpoints" / "step_00000005", resumed / "checkpoints" / "step_00000005")
    train(load_config(TINY, BASE), str(resumed))
    _assert_close_losses(_losses(resumed, first_step=6), reference_losses[5:], "single_from_pp2")
    _assert_close_params(_checkpoint_params(resumed / "checkpoints" / f"step_{STEPS:08d}"), reference_params,
                         "single_from_pp2")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_three_pipeline_stages_with_a_tied_embedding_match_one_process(tmp_path):
    """The middle stage holds neither copy of the tied embedding (it used to look for one and crash)."""
    from dsdata.train.loop import train

    sets = VARIANT_BASE + ["model.n_layers=3", "model.tie_embeddings=true", "training.global_batch_size=6"]
    _torchrun(3, [{"run_dir": str(tmp_path / "pp3"), "overrides": sets + ["parallel.pipeline_parallel_size=3"]}],
              tmp_path)
    torch.set_num_threads(1)
    train(load_config(TINY, sets), str(tmp_path / "single"))
    _assert_close_losses(_losses(tmp_path / "pp3"), _losses(tmp_path / "single"), "pp3 tied")


# ------------------------------------------------------------------ clean exit (slow)

# The trainer's own entry, then the gloo threads still running in the process (Linux: /proc names them).
_ENTRY = """import os, sys
from dsdata.train.__main__ import main
code = main(sys.argv[1:])
left = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print("gloo threads left:", sorted(n for n in left if "gloo" in n), file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
@pytest.mark.parametrize("layout", ["tp2", "pp2_1f1b"])
def test_distributed_runs_exit_0_every_time_with_no_gloo_thread_left(layout, tmp_path):
    """A finished tp=2 or 1F1B pp=2 run exits 0, ten times in a row: every rank meets at a barrier,
    destroys its process groups and frees them, so gloo's threads are joined before interpreter
    teardown (they used to outlive destroy_process_group, held by DTensor's caches, and a rank
    now and then aborted at exit with "terminate called without an active exception")."""
    entry = tmp_path / "entry.py"
    entry.write_text(_ENTRY)
    sets = [f"--set={s}" for s in [*LAYOUTS_2[layout], "training.steps=2", "checkpoint.interval=0",
                                   "logging.tensorboard=false", "logging.histogram_interval=0"]]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    for attempt in range(10):
        run_dir = tmp_path / f"run{attempt}"
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               str(entry), "--config", TINY, *sets, "--run-dir", str(run_dir), "--quiet"],
                              cwd=str(REPO), env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"run {attempt + 1}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
        assert proc.stderr.count("gloo threads left: []") == 2, proc.stderr[-4000:]
        assert json.loads(proc.stdout.strip().splitlines()[-1])["steps"] == 2
        assert (run_dir / "hf").is_dir()  # the export, the run's last collective step
        shutil.rmtree(run_dir)


def _worker(plan_path: str) -> None:
    """torchrun entry: train each planned run in turn within one process group."""
    import torch.distributed as dist

    from dsdata.train.loop import train

    torch.set_num_threads(1)
    for run in json.loads(Path(plan_path).read_text()):
        if run.get("copy_checkpoint") and int(os.environ["RANK"]) == 0:
            source = Path(run["copy_checkpoint"])
            shutil.copytree(source, Path(run["run_dir"]) / "checkpoints" / source.name)
        if dist.is_initialized():
            dist.barrier()
        began = time.perf_counter()
        summary = train(load_config(TINY, run["overrides"]), run["run_dir"])
        print(f"{run['run_dir']}: {time.perf_counter() - began:.1f} s, compiled blocks: {summary['compiled']}",
              file=sys.stderr)
    from dsdata.train.distributed import shutdown_distributed

    shutdown_distributed(completed=True)


if __name__ == "__main__":
    _worker(sys.argv[1])
