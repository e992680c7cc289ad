"""The trainer on real shards written by the pipeline (tokenize → shards), through the contract
command: torchrun, 2 gloo processes, checkpoints, resume in the same run dir, HF export."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
TOKENIZER = REPO / "pipelines" / "models" / "tokenizer"


@pytest.fixture(scope="module")
def pipeline_shards(tmp_path_factory, shared_data):
    """~300 real English paragraphs run through `dsdata run` with the tokenize and shards stages."""
    if not (REPO / "dsdata" / "stages" / "shards.py").is_file() or not TOKENIZER.is_dir():
        pytest.skip("the pipeline's tokenize/shards stages or the default tokenizer are not in this checkout")
    tmp = tmp_path_factory.mktemp("shardrun")
    text = (shared_data / "prose-en.txt").read_text(encoding="utf-8")
    paragraphs = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 80][:300]
    (tmp / "data").mkdir()
    with open(tmp / "data" / "docs.jsonl", "w", encoding="utf-8") as fh:
        for i, p in enumerate(paragraphs):
            fh.write(json.dumps({"id": f"p{i:04d}", "text": p}) + "\n")
    (tmp / "recipe.yaml").write_text(
        "name: trainshards\ninput:\n  paths: [data/*.jsonl]\noutput: out\nstages:\n"
        "  - tokenize: {}\n  - shards: {shard_size: 8000}\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", str(tmp / "recipe.yaml"), "--output",
                           str(tmp / "out"), "--quiet", "--set", f"tokenize.tokenizer={TOKENIZER}"],
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp / "out" / "shards" / "manifest.json").is_file()
    return tmp / "out"


def torchrun(run_dir, shards, steps, nproc=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "dsdata.train", "--config", str(REPO / "models" / "tiny.toml"), "--run-dir", str(run_dir),
           "--set", f"data.path={shards}", "--set", f"training.steps={steps}", "--set", "checkpoint.interval=8",
           "--set", "logging.console_interval=0", "--set", "training.global_batch_size=8",
           "--set", "schedule.warmup_steps=5", "--set", "logging.histogram_interval=0"]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_loss_falls_on_pipeline_shards_and_the_run_resumes(pipeline_shards, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = tmp_path / "run"
    # The run output dir is accepted as well as its shards/ folder.
    torchrun(run_dir, pipeline_shards, steps=24)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 25))
    losses = [r["loss"] for r in rows]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 1.0, (first, last)  # from ~ln(16384) = 9.7 down
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir())[-1] == "step_00000024"

    torchrun(run_dir, pipeline_shards, steps=28)  # same run dir: resumes at step 24
    resumed = metrics(run_dir)
    assert [r["step"] for r in resumed] == list(range(1, 29))
    assert [r["loss"] for r in resumed[:24]] == losses

    hf_dir = run_dir / "hf"
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    ids = tokenizer("The installation guide explains how to", return_tensors="pt").input_ids
    assert model(ids).logits.shape[-1] == json.loads((hf_dir / "config.json").read_text())["vocab_size"] >= len(tokenizer)
    # generate() stops at the id every training document ended with, which is the tokenizer's EOS.
    manifest = json.loads((pipeline_shards / "shards" / "manifest.json").read_text())
    for name in ("config.json", "generation_config.json"):
        saved = json.loads((hf_dir / name).read_text())
        assert saved["eos_token_id"] == manifest["tokenizer"]["eos_id"] == tokenizer.eos_token_id, name


def test_export_takes_only_the_tokenizer_the_manifest_recorded(tmp_path):
    # A shard manifest is untrusted, and the export copies its tokenizer into the model folder that
    # people share: a manifest naming someone's credentials file must not get it copied.
    from types import SimpleNamespace

    from dsdata.io.outfiles import file_sha256
    from dsdata.train.loop import _shard_tokenizer

    shards = tmp_path / "shards"
    shards.mkdir()
    secret = tmp_path / "credentials.json"
    secret.write_text('{"private_key": "not for sharing"}')
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "tokenizer.json").write_bytes((TOKENIZER / "tokenizer.json").read_bytes())
    good_sha = file_sha256(str(tok_dir / "tokenizer.json"))

    def named(path, sha):
        entry = {"path": path, "sha256": sha, "eos_id": 0}  # the manifest's tokenizer entry
        return _shard_tokenizer(SimpleNamespace(tokenizer=lambda: (entry, str(shards / "manifest.json"))))

    assert named(str(secret), "0" * 64) == (None, 0)
    assert named(str(secret), None) == (None, 0)
    assert named("../credentials.json", good_sha) == (None, 0)
    assert named(str(tok_dir), good_sha) == (str(tok_dir), 0)
    assert named("../tok", good_sha) == (str(shards / "../tok"), 0)
    assert named(str(tok_dir / "tokenizer.json"), good_sha) == (str(tok_dir / "tokenizer.json"), 0)
    (tok_dir / "tokenizer.json").write_text("{}")  # changed since the shards were written
    assert named(str(tok_dir), good_sha) == (None, 0)
    assert named(str(tmp_path / "nowhere"), good_sha) == (None, 0)
