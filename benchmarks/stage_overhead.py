#!/usr/bin/env python3
"""What a document costs in Beam's per-document stage wrapper, and what two changes to it would save.

The same N real paragraphs (lines of ../shared/data/prose-en.txt and prose-zh.txt, read from JSONL
by the project's ReadDocuments) go through K stages that do nothing (`process` returns the
document), on the in-process FnApiRunner, four ways:

  read-only   read → count                                  (the baseline)
  stagedofn   read → K × dsdata.beam.transforms.StageDoFn    (today's wrapper, one ParDo per stage)
  per-bundle  read → K × a DoFn that counts in plain ints and adds them to the Beam Metrics once
              per bundle (finish_bundle), and returns a list instead of yielding
  fused       read → one such DoFn running the K stages in turn (rejections tagged with the stage
              that made them, so the ledger and per-reason counts stay exact)
  stagedofn-fused  read → one StageDoFn over the K stages: what dsdata/beam/kinds.py ApplyStageChain
              now runs for consecutive per-document stages (per-stage Metrics, CPU clock, error rule)

and, for the write path, read → `beam.Map(kept_row, names)` (how pipeline.py builds Parquet rows:
an extra positional argument makes Beam take its general invoker, which inspects the arguments of
every call) against read → `beam.Map(partial)` of the same function (Beam's simple invoker); and
the Parquet write itself: read → Map(kept_row) → WriteToParquet (row dicts, as pipeline.py writes
kept/ until 2026-12) against read → BatchElements → one pyarrow Table per batch → WriteToParquetBatched
(same schema, same rows), and against how pipeline.py builds the rows of kept/ and rejected/:
read → `_ArrowTables` (record batches built a column at a time from the Documents) →
WriteToParquetBatched (`parquet-arrow`).

And the whole read → K stages → kept/ path as pipeline.py built it until 2026-12 (`path-docs`: one
runner element per document through the fused StageDoFn and _ArrowTables) against the batched path
(`path-batches`: the reader's Batches through BatchChainDoFn and _ArrowTables; per-stage Metrics,
CPU clock and error rule the same).

Every variant writes through Beam's WriteToParquetBatched, as pipeline.py did until 2026-12-02; it
now writes the same tables to its own part files (`pipeline.ParquetParts`, docs/history/2026-12-throughput.md §4),
which saves runner stages per run, not cost per document, so the figures stay comparable.

Printed: CPU-seconds of each run, the wrapper's cost per document per stage in microseconds
((run − read-only) / N / K), and the ratios.  A cProfile of the `stagedofn` run (--profile) shows
where that cost goes.  The variants are local experiments for docs/throughput.md; the project's
wrapper is dsdata/beam/transforms.py.

usage: python3 benchmarks/stage_overhead.py [--docs 40000] [--stages 4] [--profile]
Last line: one JSON object.
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import apache_beam as beam  # noqa: E402
import pyarrow as pa  # noqa: E402
from apache_beam.metrics import Metrics  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

from dsdata.beam.pipeline import DEFAULT_RUNNER  # noqa: E402
from dsdata.beam.kinds import ApplyBatchChain  # noqa: E402
from dsdata.beam.transforms import BATCH_DOCS, KEPT, REJECTED, ReadDocuments, StageDoFn  # noqa: E402
from dsdata.beam.pipeline import _ArrowTables  # noqa: E402
from dsdata.document import Document, Rejected, kept_columns, kept_row, kept_schema  # noqa: E402
from dsdata.stages.base import DocumentStage  # noqa: E402

SHARED = REPO.parent / "shared" / "data"


class NoopStage(DocumentStage):
    name = "noop"

    def process(self, doc: Document) -> Document | Rejected:
        return doc


class PerBundleCountsDoFn(beam.DoFn):
    """Runs stages in turn; counts in ints, flushed to Beam Metrics once per bundle."""

    def __init__(self, stages: list[DocumentStage]):
        self.stages = stages

    def setup(self):
        self._counters = {}
        for stage in self.stages:
            stage.setup()

    def start_bundle(self):
        self._counts: dict[tuple[str, str], int] = {}

    def process(self, doc: Document):
        counts = self._counts
        for stage in self.stages:
            key = (stage.name, "in")
            counts[key] = counts.get(key, 0) + 1
            result = stage.process(doc)
            if isinstance(result, Rejected):
                key = (stage.name, f"rejected.{result.reason}")
                counts[key] = counts.get(key, 0) + 1
                return [beam.pvalue.TaggedOutput(REJECTED, result)]
            key = (stage.name, "kept")
            counts[key] = counts.get(key, 0) + 1
            doc = result
        return [doc]

    def finish_bundle(self):
        for (stage, name), n in self._counts.items():
            counter = self._counters.get((stage, name))
            if counter is None:
                counter = self._counters[(stage, name)] = Metrics.counter(f"dsdata.{stage}", name)
            counter.inc(n)


def write_docs(path: Path, n: int) -> None:
    lines = []
    for name in ("prose-en.txt", "prose-zh.txt"):
        lines += [ln.strip() for ln in (SHARED / name).read_text(encoding="utf-8").split("\n") if len(ln.strip()) >= 20]
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"p{i}", "text": lines[i % len(lines)]}, ensure_ascii=False) + "\n")


def run(kind: str, data: Path, k: int, profile: bool = False) -> tuple[float, int, str]:
    out_dir = data.parent
    """CPU seconds of one pipeline run, the number of documents counted at the end, a profile."""
    prof = cProfile.Profile(time.process_time) if profile else None
    cpu = time.process_time()
    if prof:
        prof.enable()
    p = beam.Pipeline(options=PipelineOptions([f"--runner={DEFAULT_RUNNER}"]))
    docs = (p | ReadDocuments([str(data)], "jsonl", batch_docs=BATCH_DOCS if kind == "path-batches" else None))[KEPT]
    if kind in ("path-docs", "path-batches"):
        schema = kept_schema({})
        columns = functools.partial(kept_columns, annotation_names=[])
        if kind == "path-docs":
            docs = docs | "fused" >> beam.ParDo(StageDoFn([NoopStage() for _ in range(k)])).with_outputs(REJECTED, main=KEPT)
            docs = docs[KEPT]
            tables = docs | "tables" >> beam.ParDo(_ArrowTables(schema, columns))
        else:
            docs = docs | "chain" >> ApplyBatchChain([NoopStage() for _ in range(k)])
            tables = docs | "tables" >> beam.ParDo(_ArrowTables(schema, columns, "docs"))
        tables | "write" >> beam.io.WriteToParquetBatched(str(out_dir / kind / "part"), schema, file_name_suffix=".parquet")
    elif kind == "stagedofn-fused":
        docs = docs | "fused" >> beam.ParDo(StageDoFn([NoopStage() for _ in range(k)])).with_outputs(REJECTED, main=KEPT)
        docs = docs[KEPT]
    elif kind == "stagedofn":
        for i in range(k):
            docs = docs | f"stage{i}" >> beam.ParDo(StageDoFn(NoopStage())).with_outputs(REJECTED, main=KEPT)
            docs = docs[KEPT]
    elif kind == "per-bundle":
        for i in range(k):
            docs = docs | f"stage{i}" >> beam.ParDo(PerBundleCountsDoFn([NoopStage()])).with_outputs(REJECTED, main=KEPT)
            docs = docs[KEPT]
    elif kind == "fused":
        docs = docs | "fused" >> beam.ParDo(PerBundleCountsDoFn([NoopStage() for _ in range(k)])).with_outputs(
            REJECTED, main=KEPT)
        docs = docs[KEPT]
    elif kind == "map-extra-arg":
        docs = docs | "rows" >> beam.Map(kept_row, ["a", "b"])
    elif kind == "map-partial":
        docs = docs | "rows" >> beam.Map(functools.partial(kept_row, annotation_names=["a", "b"]))
    elif kind == "parquet-rows":
        rows = docs | "rows" >> beam.Map(kept_row, [])
        rows | "write" >> beam.io.WriteToParquet(str(out_dir / "rows" / "part"), kept_schema({}), file_name_suffix=".parquet")
    elif kind == "parquet-batched":
        schema = kept_schema({})
        tables = (docs | "batch" >> beam.BatchElements(min_batch_size=256, max_batch_size=4096)
                  | "table" >> beam.Map(lambda batch: pa.Table.from_pylist([kept_row(d, []) for d in batch], schema=schema)))
        tables | "write" >> beam.io.WriteToParquetBatched(str(out_dir / "batched" / "part"), schema, file_name_suffix=".parquet")
    elif kind == "parquet-arrow":
        schema = kept_schema({})
        tables = docs | "tables" >> beam.ParDo(_ArrowTables(schema, functools.partial(kept_columns, annotation_names=[])))
        tables | "write" >> beam.io.WriteToParquetBatched(str(out_dir / "arrow" / "part"), schema, file_name_suffix=".parquet")
    if kind == "path-batches":
        counted = docs | beam.Map(lambda batch: len(batch.docs)) | beam.CombineGlobally(sum)
    else:
        counted = docs | beam.combiners.Count.Globally()
    counted | beam.Map(lambda n: Metrics.counter("bench", "counted").inc(n))
    result = p.run()
    result.wait_until_finish()
    if prof:
        prof.disable()
    seconds = time.process_time() - cpu
    text = ""
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        text = buf.getvalue()
    from apache_beam.metrics.metric import MetricsFilter

    found = result.metrics().query(MetricsFilter().with_name("counted"))["counters"]
    return seconds, sum(c.committed for c in found), text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=40_000)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2, help="interleaved runs of each (best kept)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile (CPU time) of the stagedofn run")
    args = ap.parse_args(argv)
    kinds = ["read-only", "stagedofn", "per-bundle", "fused", "stagedofn-fused", "map-extra-arg", "map-partial", "parquet-rows",
             "parquet-batched", "parquet-arrow", "path-docs", "path-batches"]
    best = {k: float("inf") for k in kinds}
    with tempfile.TemporaryDirectory(prefix="dsdata-overhead-") as tmp:
        data = Path(tmp) / "docs.jsonl"
        write_docs(data, args.docs)
        run("read-only", data, args.stages)  # warm-up: first-run costs (lazy imports, caches) not counted
        for _ in range(max(1, args.repeat)):
            for kind in kinds:
                seconds, counted, _ = run(kind, data, args.stages)
                assert counted == args.docs, (kind, counted)
                best[kind] = min(best[kind], seconds)
        if args.profile:
            print(run("stagedofn", data, args.stages, profile=True)[2])
    n, k = args.docs, args.stages
    per_doc_stage = {kind: round((best[kind] - best["read-only"]) / n / k * 1e6, 2) for kind in kinds[1:5]}
    per_doc_row = {kind: round((best[kind] - best["read-only"]) / n * 1e6, 2) for kind in kinds[5:10]}
    path = {kind: round(best[kind] / n * 1e6, 2) for kind in kinds[10:]}
    print(f"{n} documents, {k} no-op stages; CPU-s: " + ", ".join(f"{kind} {best[kind]:.2f}" for kind in kinds))
    print("wrapper cost per document per stage (µs): " + ", ".join(f"{kind} {v}" for kind, v in per_doc_stage.items()))
    ratio = {kind: round(per_doc_stage["stagedofn"] / max(per_doc_stage[kind], 1e-9), 2) for kind in ("per-bundle", "fused", "stagedofn-fused")}
    print(f"stagedofn cost ÷ variant cost: {ratio}")
    print("write-path cost per document (µs): " + ", ".join(f"{kind} {v}" for kind, v in per_doc_row.items()))
    path_ratio = round(best["path-docs"] / best["path-batches"], 2)
    print("read → stages → kept/, CPU µs per document (start-up included): " +
          ", ".join(f"{kind} {v}" for kind, v in path.items()) + f"; documents ÷ batches: {path_ratio}x")
    print(json.dumps({"benchmark": "stage_overhead", "docs": n, "stages": k,
                      "cpu_s": {kind: round(v, 3) for kind, v in best.items()},
                      "us_per_doc_per_stage": per_doc_stage, "stagedofn_over_variant": ratio,
                      "us_per_doc_rows_map": per_doc_row, "us_per_doc_path": path,
                      "path_docs_over_batches": path_ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
