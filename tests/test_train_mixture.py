"""Weighted mixing of shard sets (`data.sources`): realised proportions, determinism, exact resume
(in process, and after a SIGKILL at a random step of the real trainer), config errors in one line."""
import json
import random
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from shard_sets import ShardSetWriter
from dsdata.train.config import ConfigError, DataConfig, load_config
from dsdata.train.mixture import MixtureBatches
from test_train import TINY, _env, command, metrics, run_train, wait_for_lines

# Source s holds ids in [100 s + 1, 100 s + 100) (and EOS 0): a window's source is its largest id // 100.
VOCAB = 400


def make_source(directory: Path, index: int, docs: int = 60, seed: int = 0) -> Path:
    rng = np.random.default_rng([seed, index])
    writer = ShardSetWriter(str(directory), shard_size=1500, tokenizer={"vocab_size": VOCAB, "eos_id": 0,
                                                                        "eos_token": "<|endoftext|>"})
    for i in range(docs):
        ids = rng.integers(100 * index + 1, 100 * index + 100, int(rng.integers(20, 120)))
        writer.add(f"s{index}-{i}", np.append(ids, 0).astype(np.uint16), ("easy", "medium", "hard")[i % 3])
    writer.close()
    return directory


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    return [make_source(root / name, i, docs) for i, (name, docs) in enumerate([("web", 90), ("code", 40),
                                                                                ("books", 25)])]


def window_sources(batch) -> list[int]:
    return [int(row.max()) // 100 for row in batch.long()]


def data_config(sources, shares, key="weight", **extra) -> DataConfig:
    return DataConfig(sources=[{"path": str(p), key: w} for p, w in zip(sources, shares)], **extra)


def test_realised_proportions_follow_the_weights_from_the_first_batch(sources):
    mix = MixtureBatches(data_config(sources, [0.6, 0.3, 0.1]), seq_len=16, total_steps=100, batch_size=10)
    seen = np.zeros(3)
    for step in range(60):
        batch = mix.next_batch(step)
        assert tuple(batch.shape) == (10, 17) and str(batch.dtype) == "torch.uint16"
        for s in window_sources(batch):
            seen[s] += 1
        n = seen.sum()
        # every source within one window of its share, at every step
        assert np.all(np.abs(seen - np.array([0.6, 0.3, 0.1]) * n) <= 1.0), (step, seen)
    assert mix.proportions() == {"web": seen[0] / 600, "code": seen[1] / 600, "books": seen[2] / 600}
    assert mix.step_metrics() == {"mix/web": 0.6, "mix/code": 0.3, "mix/books": 0.1}


def test_epochs_weigh_sources_by_their_tokens_times_the_epochs(sources):
    mix = MixtureBatches(data_config(sources, [1, 2, 4], key="epochs"), seq_len=16, total_steps=10, batch_size=16)
    tokens = np.array([d.manifest["totals"]["tokens"] for d in mix.datasets], dtype=float)
    expected = tokens * [1, 2, 4] / (tokens * [1, 2, 4]).sum()
    assert np.allclose(mix.weights, expected)
    # a source seen more often than its size allows wraps into its next epoch (its own reshuffle)
    for step in range(40):
        mix.next_batch(step)
    assert mix.datasets[2].state_dict()["groups"]["all"][0] >= 1


@pytest.mark.parametrize("curriculum", [{}, {"schedule": "linear", "warmup_fraction": 0.5,
                                             "start": {"easy": 0.8, "medium": 0.15, "hard": 0.05}}],
                         ids=["plain", "curriculum"])
def test_the_mix_is_deterministic_and_resumes_exactly_at_any_step(sources, curriculum):
    def fresh():
        return MixtureBatches(data_config(sources, [0.5, 0.3, 0.2], curriculum=curriculum), seq_len=16,
                              total_steps=30, batch_size=6)

    straight = fresh()
    batches = [straight.next_batch(step).clone() for step in range(30)]
    again = fresh()
    assert all(np.array_equal(again.next_batch(step), batches[step]) for step in range(30))
    for cut in (1, 7, 19):
        first = fresh()
        for step in range(cut):
            first.next_batch(step)
        state = json.loads(json.dumps(first.state_dict()))  # plain JSON, as checkpointed
        resumed = fresh()
        resumed.load_state_dict(state)
        for step in range(cut, 30):
            assert np.array_equal(resumed.next_batch(step), batches[step]), (cut, step)
        assert resumed.proportions() == straight.proportions()


def test_a_state_of_other_sources_or_weights_is_refused(sources):
    state = MixtureBatches(data_config(sources, [0.5, 0.3, 0.2]), 16, 10, 6).state_dict()
    with pytest.raises(ValueError, match="saved with other data.sources"):
        MixtureBatches(data_config(sources, [0.4, 0.4, 0.2]), 16, 10, 6).load_state_dict(state)
    with pytest.raises(ValueError, match="saved with other data.sources"):
        MixtureBatches(data_config(sources[:2], [0.5, 0.3]), 16, 10, 6).load_state_dict(state)


def test_sources_of_another_tokenizer_are_refused(sources, tmp_path):
    other = tmp_path / "other"
    writer = ShardSetWriter(str(other), tokenizer={"vocab_size": 999, "eos_id": 0})
    writer.add("x", np.arange(1, 200, dtype=np.uint16))
    writer.close()
    with pytest.raises(ConfigError, match="another tokenizer than .*vocab_size 999 vs 400"):
        MixtureBatches(data_config([sources[0], other], [1, 1]), 16, 10, 6)


@pytest.mark.parametrize("sets, message", [
    (['data.sources=[{path="a", weight=1}]', 'data.path="b"'], "data.path and data.sources are both set"),
    (['data.sources=[{path="a"}]'], "data.sources[0] needs exactly one of weight or epochs, got neither"),
    (['data.sources=[{path="a", weight=1, epochs=2}]'], "needs exactly one of weight or epochs, got ['weight', 'epochs']"),
    (['data.sources=[{path="a", weight=-1}]'], "data.sources[0].weight must be a number strictly between 0 and 1e+06, got -1"),
    (['data.sources=[{path="a", weight=inf}]'], "data.sources[0].weight must be a number strictly between 0 and 1e+06, got inf"),
    # Huge finite shares overflowed (their sum, epochs × tokens) into a silently wrong mix.
    (['data.sources=[{path="a", weight=1e308}, {path="b", weight=1e308}]'],
     "data.sources[0].weight must be a number strictly between 0 and 1e+06, got 1e+308"),
    (['data.sources=[{path="a", epochs=1e300}, {path="b", epochs=1}]'],
     "data.sources[0].epochs must be a number strictly between 0 and 1e+06, got 1e+300"),
    (['data.seed=-1'], "data.seed must be a non-negative integer, got -1"),
    (['data.curriculum={schedule="fixed", weights={easy=1e308, hard=1e308}}'],
     "data.curriculum: fixed curriculum: weight of 'easy' must be a number between 0 and 1e+06, 1e+06 excluded, got 1e+308"),
    (['data.curriculum={schedule="linear", warmup_fraction=inf}'],
     "data.curriculum: linear curriculum: warmup_fraction must be a number between 0 and 1, got inf"),
    (['data.curriculum={schedule="table", rows=[[0, {easy="x"}]]}'],
     "data.curriculum: table curriculum row at step 0: weight of 'easy' must be a number between 0 and 1e+06, 1e+06 excluded, got 'x'"),
    (['data.sources=[{path="a", weight=1}, {path="b", epochs=1}]'], "mixes weight and epochs"),
    (['data.sources=[{path="a", weight=1, share=2}]'], "[data.sources[0]] has no parameter 'share' (it takes: epochs, name, path, weight)"),
    (['data.sources=[{weight=1}]'], "data.sources[0].path must be a shard directory"),
    (['data.sources=["a"]'], "data.sources[0] must be a table"),
])
def test_bad_sources_are_one_line_errors(sets, message):
    with pytest.raises(ConfigError) as info:
        load_config(TINY, sets)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_mixture_built_in_python_checks_its_shares_too(sources):
    with pytest.raises(ConfigError, match=r"data: data.sources\[1\].weight must be a number strictly between 0 and 1e\+06, got 1e\+300"):
        MixtureBatches(data_config(sources[:2], [1.0, 1e300]), 16, 10, 4)


def test_the_cli_reports_a_bad_source_in_one_line(tmp_path):
    proc = subprocess.run(command(tmp_path / "run", ['data.sources=[{path="nowhere", weight=1}]']), env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "dsdata-train: error: data.sources[0].path = 'nowhere': no manifest.json there")


@pytest.mark.slow
def test_a_mixture_run_killed_at_a_random_step_resumes_with_identical_losses(sources, tmp_path):
    mixture = "data.sources=[" + ", ".join(
        f'{{path="{p}", weight={w}}}' for p, w in zip(sources, (0.5, 0.3, 0.2))) + "]"
    sets = [mixture, "training.steps=20", "training.global_batch_size=5", "checkpoint.interval=3",
            "checkpoint.keep=2", "schedule.warmup_steps=3", "model.vocab_size=0",
            'data.curriculum={schedule="linear", warmup_fraction=0.5, start={easy=0.7, medium=0.2, hard=0.1}}']
    straight = tmp_path / "straight"
    run_train(straight, sets)
    expected = metrics(straight)
    assert [m["step"] for m in expected] == list(range(1, 21))
    last = expected[-1]
    assert (last["mix/web"], last["mix/code"], last["mix/books"]) == (0.5, 0.3, 0.2)  # 100 windows: exact

    kill_after = random.SystemRandom().randint(4, 17)
    broken = tmp_path / "broken"
    proc = subprocess.Popen(command(broken, sets), env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True)
    wait_for_lines(broken / "metrics.jsonl", kill_after, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"killed after {kill_after} steps"
    proc = run_train(broken, sets)
    # it continued from a checkpoint (a restart from step 0 would log the same losses too)
    assert "resumed from" in proc.stderr and "at step 0" not in proc.stderr, proc.stderr[-2000:]
    resumed = metrics(broken)
    assert [m["step"] for m in resumed] == list(range(1, 21)), f"killed after {kill_after} steps"
    for key in ("loss", "grad_norm", "mix/web", "mix/code", "mix/books"):
        assert [m[key] for m in resumed] == [m[key] for m in expected], (key, f"killed after {kill_after} steps")
