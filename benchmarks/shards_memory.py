"""Peak memory of the shards stage on the in-process runner, alone: N tokenized documents → shards.

    python benchmarks/shards_memory.py --docs 100000 --tokens 800
    python benchmarks/shards_memory.py --docs 100000 --tokens 800 --peer /path/to/older/checkout

The documents (random uint16 token ids, Poisson-distributed lengths around --tokens, a third of them
per difficulty bucket) are made inside the pipeline, a chunk of ids per element, so the launcher
never holds the corpus; they go through the shards stage's composite exactly as `dsdata run` builds
it (dsdata.beam.shards.composite), then to a counter.  Each variant runs in its own process; its
peak RSS (ru_maxrss) is measured against the same process doing everything but the shards stage
(`--variant baseline`), so the figure is what the stage adds.  With --peer, the same is run with
that checkout's dsdata (e.g. a commit before a change) and the shard files of both are compared.
The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "pipelines" / "models" / "tokenizer"


def _docs(chunk: int, per_chunk: int, tokens: int, vocab: int):
    import numpy as np

    from dsdata.document import Document

    rng = np.random.default_rng(chunk)
    for i in range(per_chunk):
        n = int(rng.poisson(tokens)) + 1
        doc_id = f"doc-{chunk:05d}-{i:06d}"
        yield Document(doc_id, "", annotations={"tokens": rng.integers(0, vocab, n, dtype=np.uint16),
                                                 "difficulty": ("easy", "medium", "hard")[i % 3]})


def run_variant(args) -> dict:
    """In this process: build and run the pipeline; returns peak RSS and what was written."""
    import apache_beam as beam

    from dsdata.beam.kinds import StageContext
    from dsdata.beam.pipeline import in_process_runner, pipeline_options
    from dsdata.beam.shards import composite
    from dsdata.stages.shards import ShardsStage
    from dsdata.stages.tokenize import TokenizeStage

    tokenize = TokenizeStage(tokenizer=str(TOKENIZER))
    vocab = tokenize.describe_tokenizer()["vocab_size"]
    chunks = max(1, args.docs // args.per_chunk)
    out = Path(args.out)
    options = pipeline_options([])
    start = time.perf_counter()
    with beam.Pipeline(runner=in_process_runner(options), options=options) as p:
        docs = (p | beam.Create(list(range(chunks)))
                | beam.FlatMap(_docs, args.per_chunk, args.tokens, vocab))
        if args.variant == "baseline":
            kept = docs
        else:
            stage = ShardsStage(shard_size=args.shard_size)
            kept = (docs | composite(stage, StageContext(str(out), (tokenize,))))["kept"]
        kept | beam.combiners.Count.Globally() | beam.Map(lambda n: None)
    wall = time.perf_counter() - start
    shards = out / "shards"
    digest = hashlib.sha256()
    files = sorted(shards.glob("*.arrow")) if shards.is_dir() else []
    for f in files:
        digest.update(f.name.encode() + f.read_bytes())
    return {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "wall_s": round(wall, 1), "shards": len(files), "shards_sha256": digest.hexdigest() if files else None}


def spawn(checkout: Path, variant: str, args, work: Path) -> dict:
    out = work / f"{variant}-{checkout.name}"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--variant", variant, "--docs", str(args.docs),
           "--tokens", str(args.tokens), "--per-chunk", str(args.per_chunk), "--shard-size", str(args.shard_size),
           "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(checkout))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=checkout)
    if done.returncode != 0:
        return {"finished": False, "error": done.stderr.strip().splitlines()[-1:]}
    return {"finished": True, **json.loads(done.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=800, help="mean token ids per document")
    parser.add_argument("--per-chunk", type=int, default=1000)
    parser.add_argument("--shard-size", type=int, default=1 << 22)
    parser.add_argument("--peer", type=Path, default=None, help="another checkout of dsdata to run the same on")
    parser.add_argument("--variant", choices=["shards", "baseline"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:  # one measured process
        print(json.dumps(run_variant(args)))
        return 0
    work = Path(tempfile.mkdtemp(prefix="dsdata-shards-memory-"))
    results = {"baseline": spawn(REPO, "baseline", args, work), "this": spawn(REPO, "shards", args, work)}
    print(json.dumps({"this": results["this"]}), flush=True)
    if args.peer:
        results["peer"] = spawn(args.peer.resolve(), "shards", args, work)
        print(json.dumps({"peer": results["peer"]}), flush=True)
    base = results["baseline"].get("peak_rss_mb") or 0
    added = {k: round(r["peak_rss_mb"] - base, 1) for k, r in results.items() if k != "baseline" and r.get("finished")}
    summary = {"benchmark": "shards_memory", "docs": args.docs, "mean_tokens": args.tokens,
               "baseline_peak_rss_mb": base, "peak_rss_mb": {k: r.get("peak_rss_mb") for k, r in results.items()},
               "added_by_shards_mb": added, "wall_s": {k: r.get("wall_s") for k, r in results.items()}}
    if "peer" in added and added.get("this"):
        summary["added_peer_vs_this"] = round(added["peer"] / added["this"], 2)
    if args.peer and results["peer"].get("finished") and results["this"].get("finished"):
        summary["same_shards_as_peer"] = results["peer"]["shards_sha256"] == results["this"]["shards_sha256"]
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
