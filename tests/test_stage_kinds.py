"""The stage contract: every stage is one of three kinds, stages import no Beam, and the builder
owns the run directory (it removes every declared side output of an earlier run)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsdata.beam.kinds import COMPOSITES
from dsdata.beam.pipeline import run_recipe
from dsdata.recipe import load_recipe
from dsdata.stages import REGISTRY, BatchStage, CorpusStage, DocumentStage, registered_side_outputs, stage_class

REPO = Path(__file__).resolve().parents[1]


def test_every_stage_is_exactly_one_kind_and_corpus_stages_have_a_composite():
    for name in REGISTRY:
        cls = stage_class(name)
        kinds = [k for k in (DocumentStage, BatchStage, CorpusStage) if issubclass(cls, k)]
        assert len(kinds) == 1, (name, kinds)
        assert not getattr(cls, "__abstractmethods__", None), (name, cls.__abstractmethods__)
        if kinds[0] is CorpusStage:
            assert name in COMPOSITES, name


def test_stages_and_their_libraries_import_no_beam():
    modules = sorted({target.partition(":")[0] for target in REGISTRY.values()}
                     | {f"dsdata.{package}.{path.stem}" for package in ("clean", "dedup", "lm", "relevance", "augment")
                        for path in (REPO / "dsdata" / package).glob("*.py")})
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "import dsdata.recipe\n"
            "bad = sorted(m for m in sys.modules if m == 'apache_beam' or m.startswith('apache_beam.'))\n"
            "print(len(bad))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0"


def test_the_side_outputs_a_run_clears_are_what_the_stage_classes_declare(monkeypatch):
    expected = {side.name for name in REGISTRY for side in stage_class(name).side_outputs}
    assert expected == {"difficulty.json", "augment.json", "shards", "export"}
    monkeypatch.setitem(REGISTRY, "absent", "dsdata.stages.no_such_module:Absent")
    assert {s.name for s in registered_side_outputs()} == expected


def test_a_run_removes_every_declared_side_output_of_an_earlier_run(tmp_path):
    sides = registered_side_outputs()
    assert {s.name for s in sides} >= {"difficulty.json", "augment.json", "shards"}
    out = tmp_path / "out"
    for side in sides:
        if side.directory:
            (out / side.name).mkdir(parents=True)
            (out / side.name / "stale.arrow").write_bytes(b"stale")
        else:
            out.mkdir(exist_ok=True)
            (out / side.name).write_text("{}", encoding="utf-8")
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps({"id": str(i), "text": f"doc {i}"}) for i in range(3)) + "\n",
                                       encoding="utf-8")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("input: {paths: ['in.jsonl']}\nstages: []\n", encoding="utf-8")
    stats = run_recipe(load_recipe(str(recipe)), str(out))
    assert stats["kept"] == 3 and stats["ledger_ok"]
    assert sorted(p.name for p in out.iterdir()) == ["kept", "rejected", "report.html", "run.json", "stats.json"]


def test_remembered_option_views_behave_as_beams_own():
    """speedups.view_as: Beam makes ~160 option views while it builds and starts a run, each an
    argparse parse of the flags; the first view of each class is kept per options object.  What
    any view reads equals what Beam's own view_as gives, writes through one view are seen through
    the others and the object, another object has views of its own, and they go with it."""
    import gc

    from apache_beam.options.pipeline_options import (
        DebugOptions, DirectOptions, PipelineOptions, SetupOptions, StandardOptions, TypeOptions, WorkerOptions,
    )

    from dsdata.beam.engines import speedups

    assert PipelineOptions.view_as is speedups.view_as  # installed by importing dsdata.beam
    flags = ["--runner=DirectRunner", "--direct_num_workers=2", "--experiments=a", "--experiments=b",
             "--no_pipeline_type_check", "--unknown_flag=1"]
    ours, beams = PipelineOptions(flags), PipelineOptions(flags)
    for cls in (StandardOptions, TypeOptions, DebugOptions, DirectOptions, WorkerOptions, SetupOptions):
        view = ours.view_as(cls)
        assert view is ours.view_as(cls) and type(view) is cls
        want = speedups._original_view_as(beams, cls)
        assert view.get_all_options(retain_unknown_options=True) == want.get_all_options(retain_unknown_options=True)
        assert {n: getattr(view, n) for n in view._visible_option_list()} == \
            {n: getattr(want, n) for n in want._visible_option_list()}
    ours.view_as(StandardOptions).streaming = True
    ours.view_as(DebugOptions).add_experiment("c")
    assert ours.view_as(StandardOptions).streaming and ours.get_all_options()["streaming"]
    assert ours.view_as(DebugOptions).experiments == ["a", "b", "c"] == ours.get_all_options()["experiments"]
    other = PipelineOptions(flags)
    assert other.view_as(StandardOptions) is not ours.view_as(StandardOptions)
    assert other.view_as(StandardOptions).streaming is False
    # Other tests leave PipelineOptions in reference cycles that this collect may free too: the
    # other keys are held here while it runs, so exactly this object's entry must go (and the
    # object itself: its views do not keep it alive).
    import weakref
    gone = weakref.ref(other)
    others = [key for key in speedups._views.keys() if key is not other]
    del other
    gc.collect()
    assert gone() is None
    assert ours in speedups._views and len(speedups._views) == len(others)
    del others


def test_remembered_dofn_specs_equal_beams_for_every_dofn_of_a_real_graph():
    """dsdata/beam/engines/speedups.py keeps Beam's get_dofn_specs answer per DoFn instance: for every DoFn
    of the pretrain graph (dedup, difficulty, shards composites and Beam's own IO DoFns), a DoFn
    with state and a timer, and a Map of a plain function, it equals Beam's, and a second call
    answers from memory with sets the caller may change."""
    import apache_beam as beam
    from apache_beam.coders import VarIntCoder
    from apache_beam.transforms import userstate
    from apache_beam.transforms.timeutil import TimeDomain

    from dsdata.beam.engines import speedups
    from dsdata.beam.pipeline import build_pipeline, pipeline_options

    assert userstate.get_dofn_specs is speedups.get_dofn_specs  # installed by importing dsdata.beam

    class Stateful(beam.DoFn):
        BAG = userstate.BagStateSpec("bag", VarIntCoder())
        TIMER = userstate.TimerSpec("timer", TimeDomain.WATERMARK)

        def process(self, kv, bag=beam.DoFn.StateParam(BAG), timer=beam.DoFn.TimerParam(TIMER)):
            yield kv

        @userstate.on_timer(TIMER)
        def fire(self, bag=beam.DoFn.StateParam(BAG)):
            yield 0

    recipe = load_recipe(str(REPO / "pipelines" / "pretrain.yaml"))
    p = beam.Pipeline(options=pipeline_options([]))
    build_pipeline(p, recipe, "unused-out", recipe.build_stages())
    (p | "Kv" >> beam.Create([("a", 1)]) | "Stateful" >> beam.ParDo(Stateful())
     | "Plain" >> beam.Map(lambda x: x))
    fns = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            fn = getattr(node.transform, "fn", None)
            if isinstance(fn, beam.DoFn):
                fns.append(fn)

    p.visit(Visitor())
    assert len(fns) > 30
    stateful = 0
    for fn in fns:
        want = speedups._original(fn)
        first, second = speedups.get_dofn_specs(fn), speedups.get_dofn_specs(fn)
        assert first == second == want, fn
        stateful += bool(want[0] or want[1])
        first[0].add("caller's own")
        assert speedups.get_dofn_specs(fn) == want
    assert stateful >= 1
    assert all(speedups._memo[id(fn)][0]() is fn for fn in fns)


def test_building_and_running_a_pipeline_leaves_ipython_unimported_but_a_running_shell_is_seen():
    """speedups.is_in_ipython: Beam asks "in IPython?" for every top-level transform, and its own
    answer imports IPython (0.7 s) where the package is installed.  A whole `dsdata run` in a fresh
    process leaves IPython unimported; once an IPython shell exists, Beam's modules see it."""
    pytest.importorskip("IPython")  # without the package there is nothing to import by mistake
    recipe = REPO / "pipelines" / "langid.yaml"
    code = f"""
import json, sys, tempfile
from dsdata.beam.pipeline import run_recipe
from dsdata.recipe import load_recipe
tmp = tempfile.mkdtemp()
open(tmp + "/in.jsonl", "w").write(json.dumps({{"id": "a", "text": "A sentence in plain English words."}}) + "\\n")
r = load_recipe({str(recipe)!r})
r.inputs = [tmp + "/in.jsonl"]
assert run_recipe(r, tmp + "/out")["kept"] == 1
print("IPython" in sys.modules)
import apache_beam.pipeline, apache_beam.runners.direct.direct_runner as direct
from apache_beam.utils import interactive_utils
answers = [m.is_in_ipython() for m in (interactive_utils, apache_beam.pipeline, direct)]
from IPython.core.interactiveshell import InteractiveShell
InteractiveShell.instance()
print(answers, [m.is_in_ipython() for m in (interactive_utils, apache_beam.pipeline, direct)])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO),
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:2] == ["False", "[False, False, False] [True, True, True]"], out.stdout


def test_a_process_that_imported_dsdatas_beam_code_freezes_its_objects_before_the_other_exit_handlers():
    """speedups: the interpreter's last collections over everything Beam imported cost 0.3–0.7 s
    per process (each multi_processing worker, one after the other); `gc.freeze()` in an exit
    handler skips them.  Handlers registered before it (logging's, here the test's own) still run,
    after it; a process that never imports dsdata's Beam code is left alone."""
    probe = "import atexit, gc\natexit.register(lambda: print('frozen' if gc.get_freeze_count() else 'not frozen'))\n"
    for extra, want in (("import dsdata.beam.transforms\n", "frozen"), ("import dsdata.document\n", "not frozen")):
        out = subprocess.run([sys.executable, "-c", probe + extra], capture_output=True, text=True, cwd=str(REPO),
                             env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == want.split(), (extra, out.stdout)


def test_the_command_line_collects_nothing_while_starting_and_freezes_what_start_up_made(tmp_path):
    """cli._collect_after_startup: `dsdata run` as its own process starts with the collector off
    (Beam's and pyarrow's objects are not walked while they are made), freezes them once the
    recipe is checked and runs with the collector on; main(argv) called from Python leaves the
    caller's collector as it was, on or off, and freezes nothing."""
    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "a document of some words"}\n', encoding="utf-8")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("input: {paths: ['in.jsonl']}\nstages: []\n", encoding="utf-8")
    run = ["run", str(recipe), "--output", str(tmp_path / "out"), "--quiet"]
    code = f"""
import gc, sys
from dsdata import cli
from dsdata.beam import pipeline
seen = []
real = pipeline.run_recipe
def probe(*args, **kwargs):  # what the run starts with (start-up makes ~90k objects: Beam, pyarrow, dsdata)
    seen.append((gc.isenabled(), gc.get_freeze_count() > 50_000, gc.get_threshold()[0]))
    return real(*args, **kwargs)
pipeline.run_recipe = probe
if sys.argv[1].startswith("own"):
    if sys.argv[1] == "own-set":
        gc.set_threshold(1234)  # the user's own threshold: kept
    sys.argv = ["dsdata", *{run!r}]
    rc = cli.main()
else:
    if sys.argv[1] == "off":
        gc.disable()
    rc = cli.main({run!r})
print(rc, seen, gc.isenabled(), gc.get_freeze_count() > 0)
"""
    results = {}
    for mode in ("own", "own-set", "on", "off"):
        out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, cwd=str(REPO),
                             env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        results[mode] = out.stdout.split("\n")[-2]
    # The command's own process also collects its young generation every 10,000 objects, not 700
    # (dsdata/collector.py), unless the user set a threshold.
    assert results == {"own": "0 [(True, True, 10000)] True True", "own-set": "0 [(True, True, 1234)] True True",
                       "on": "0 [(True, False, 700)] True False", "off": "0 [(False, False, 700)] False False"}


def test_sdk_workers_freeze_their_start_up_objects_and_other_processes_do_not(tmp_path):
    """speedups: a multi_processing worker freezes what its start-up made (Beam's modules) when
    dsdata's Beam code is first imported there, so its collections while it works do not walk
    them again, and collects its young generation less often; the launcher, and any process that is
    not a Beam SDK worker, is left alone."""
    code = r"""
import json, sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

def probe(_):
    import gc
    import dsdata.beam.transforms  # what unpickling a dsdata DoFn imports first
    from dsdata.beam.engines import speedups
    return (speedups.is_sdk_worker(), gc.get_freeze_count() > 10_000, gc.get_threshold()[0])

from dsdata.beam.pipeline import in_process_runner
opts = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
with beam.Pipeline(runner=in_process_runner(opts), options=opts) as p:
    assert_that(p | beam.Create(list(range(8))) | beam.Map(probe), equal_to([(True, True, 10_000)] * 8))
import gc
from dsdata.beam.engines import speedups
print(json.dumps([speedups.is_sdk_worker(), gc.get_freeze_count(), gc.get_threshold()[0]]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path),
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, 0, 700]


def test_runinference_is_imported_without_torch_and_scipy_and_the_model_manager_still_loads():
    """dsdata/beam/engines/mlimport.py: Beam's inference base imports its optional ModelManager (torch,
    scipy.optimize: 2.5 CPU-s) at its top; dsdata's model stages import it without, and with
    `resource` (base's memory metric) still set; the model manager stays importable after."""
    code = r"""
import importlib.util, json, resource, sys
import dsdata.beam.relevance, dsdata.beam.augment
import apache_beam.ml.inference.base as base
seen = {"torch": "torch" in sys.modules, "scipy.optimize": "scipy.optimize" in sys.modules,
        "model_manager": base.ModelManager is None, "resource": base.resource is resource,
        "source": "class RunInference" in base.__loader__.get_source(base.__name__),
        "memory": base._get_current_process_memory_in_bytes() > 0}
if importlib.util.find_spec("torch") is not None and importlib.util.find_spec("scipy") is not None:
    from apache_beam.ml.inference.model_manager import ModelManager
    seen["later"] = ModelManager.__module__ == "apache_beam.ml.inference.model_manager" and "torch" in sys.modules
print(json.dumps(seen))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO),
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen.pop("later", True) is True
    assert seen == {"torch": False, "scipy.optimize": False, "model_manager": True, "resource": True,
                    "source": True, "memory": True}


@pytest.mark.parametrize("pool", [None, "mimalloc"])
def test_a_run_imports_no_pandas_uses_the_system_arrow_pool_and_pandas_works_after_it(tmp_path, pool):
    """dsdata/beam/engines/mlimport.py: Beam imports pandas only for its DataFrame type hints, and
    pyarrow at its first pa.array() of a list (~45 MB of every launcher); pymongo, bson and requests
    only for MongoDB and BigQuery IO, boto3 only for S3; beartype, fastavro, cryptography and httplib2
    only for a type check, Avro, GroupByEncryptedKey and HTTP proxies.  A real run loads none and says
    nothing of them; a plug-in's later `import pandas`, pyarrow's to_pandas() / pa.array(Series),
    Beam's BigQuery IO, its S3 client (boto3 imported then, its requests bounded), Avro files, Fernet
    keys, type hint checks and HTTP clients still work, with the real modules in Beam's names.
    Arrow allocates from the system pool unless the user named one (docs/memory.md)."""
    code = r"""
import json, sys
from dsdata.cli import main
rc = main(["run", sys.argv[1], "--output", sys.argv[2], "--quiet"])
during = sorted(m for m in ("pandas", "pymongo", "bson", "requests", "boto3", "beartype", "fastavro", "cryptography",
                            "httplib2", "pyparsing") if m in sys.modules)
import typing
from apache_beam.typehints import typehints
consistent = [typehints.is_consistent_with(typing.List[int], typing.Sequence[int]), typehints.is_consistent_with(int, str)]
import apache_beam as beam
from apache_beam.io import avroio
from apache_beam.transforms import util
from apache_beam.internal import http_client
schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
with beam.Pipeline() as p:
    _ = p | beam.Create([{"a": 1}, {"a": 2}]) | avroio.WriteToAvro(sys.argv[2] + "-avro/x", schema=schema)
with beam.Pipeline() as p:
    _ = p | avroio.ReadFromAvro(sys.argv[2] + "-avro/x*") | beam.Map(lambda d: d["a"]) | beam.io.WriteToText(sys.argv[2] + "-avro/a")
import glob
avro = sorted(int(v) for f in glob.glob(sys.argv[2] + "-avro/a*") for v in open(f).read().split())
from cryptography.fernet import Fernet
fernet = util.Fernet(Fernet.generate_key())
late = {"avro": avro, "fernet": fernet.decrypt(fernet.encrypt(b"x")).decode(), "consistent": consistent,
        "http": type(http_client.get_new_http()).__name__, "real": util.Fernet is Fernet and typehints.is_subhint.__module__.startswith("beartype.door.")}
import pandas, pyarrow as pa
from apache_beam.io.gcp import bigquery
from apache_beam.io.aws import s3io
s3 = s3io.S3IO(options={"s3_region_name": "us-east-1", "s3_access_key_id": "k", "s3_secret_access_key": "s",
                        "s3_endpoint_url": "http://127.0.0.1:9"}).client  # boto3 imported now, the client bounded
frame = pa.table({"a": [1, 2]}).to_pandas()
print(json.dumps({"rc": rc, "during": during, "frame": list(frame["a"]), "pool": pa.default_memory_pool().backend_name,
                  "series": pa.array(pandas.Series([3, 4])).to_pylist(), "requests": "requests" in sys.modules,
                  "s3": type(s3.client).__module__.split(".")[0], "boto3": "boto3" in sys.modules,
                  "bounded": getattr(type(s3), "dsdata_bounded", False), "late": late}))
"""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "pipelines" / "pretrain.yaml"), str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=str(tmp_path), timeout=600,
                         env={**env, "PYTHONPATH": str(REPO), **({"ARROW_DEFAULT_MEMORY_POOL": pool} if pool else {})})
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"rc": 0, "during": [], "frame": [1, 2], "series": [3, 4], "pool": pool or "system", "requests": True,
                    "s3": "botocore", "boto3": True, "bounded": True,
                    "late": {"avro": [1, 2], "fernet": "x", "consistent": [True, False], "http": "Http",
                             "real": True}}
    assert "bson" not in out.stderr and "apitools" not in out.stderr, out.stderr[-3000:]


def test_a_relevance_run_imports_neither_torch_scipy_nor_pandas_in_the_launcher_or_its_workers(tmp_path):
    """The fastText relevance stage on two multi_processing workers: Python's import log
    (PYTHONPROFILEIMPORTTIME, inherited by the SDK workers) shows the stage's modules loaded in the
    launcher and in the workers, and torch, scipy.optimize and pandas in none of them (the workers
    run Beam's worker main through dsdata/beam/engines/lean_worker.py), and nothing else on stderr."""
    lines = (REPO / "pipelines" / "samples" / "docs.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "r.yaml").write_text("input: {paths: ['in.jsonl']}\nstages:\n  - relevance: {threshold: 0}\n",
                                     encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "dsdata.cli", "run", str(tmp_path / "r.yaml"), "--output", str(tmp_path / "out"),
         "--quiet", "--set", f"relevance.model={REPO / 'pipelines' / 'models' / 'relevance-fasttext'}",
         "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
        capture_output=True, text=True, cwd=str(tmp_path), timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONPROFILEIMPORTTIME": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["kept"] == 40
    imported = [line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    # Each process logs a module once: dsdata's transforms and the relevance scorer in the launcher
    # and in at least one worker (the log of the workers came through), Beam's inference base too.
    assert imported.count("dsdata.beam.transforms") >= 2 and imported.count("dsdata.relevance.scorer") >= 2
    assert "apache_beam.ml.inference.base" in imported
    assert "torch" not in imported and "scipy.optimize" not in imported
    assert not [m for m in imported if m.startswith("pandas.")]  # (a refused `import pandas` is logged too)
    # What Beam imports but uses only in some IO or type check is a stand-in in every process (the
    # import log names the stand-in modules only): not beartype's, fastavro's, cryptography's or
    # httplib2's own modules, nor pyparsing (mlimport.StandIn).
    late = {m for m in imported if m.split(".")[0] in ("beartype", "fastavro", "cryptography", "httplib2", "pyparsing")}
    assert late <= {"beartype", "beartype.door", "beartype.roar", "fastavro", "fastavro.read", "fastavro.write",
                    "cryptography", "cryptography.fernet", "httplib2"}, late
    # --quiet: the workers' stderr has none of Beam's start-up lines ("Logging handler created.",
    # "apitools not found") nor records in logging's default format.
    said = [line for line in out.stderr.splitlines() if not line.startswith("import time:")]
    assert said == []
    assert imported.count("dsdata.beam.engines.lean_worker") >= 1


def test_a_stage_added_by_a_module_and_a_row_shows_its_chart_and_its_preflight_need(tmp_path):
    """A test-only stage, added by one class and one registration (no edit of the report, the
    launcher or any table): the histogram it declares appears in report.html with its threshold
    line, and what its preflight says is missing stops the run before anything starts, in one line."""
    import re

    import pyarrow as pa

    import dsdata
    from dsdata import Document, DocumentStage, Number, Param, Rejected, Text
    from dsdata.core.chart import Chart

    class VowelShare(DocumentStage):
        name = "test_vowel_share"
        description = "share of a document's letters that are vowels"
        params = {"min_share": Param(0.1, "lowest share kept", Number(0, 1)),
                  "needs_tool": Param("", "a program that must be on PATH before the run", Text())}
        annotations = {"vowel_share": pa.float64()}
        charts = (Chart("histogram", "vowel_share", "hist-vowel-share", "Vowel share", "vowel share",
                        label="vowel_share", threshold="min_share"),)

        def preflight(self) -> str | None:
            import shutil

            if self.needs_tool and shutil.which(self.needs_tool) is None:
                return f"{self.name}: the program '{self.needs_tool}' is not on PATH"
            return None

        def process(self, doc: Document) -> Document | Rejected:
            letters = [c for c in doc.text.lower() if c.isalpha()]
            share = sum(c in "aeiou" for c in letters) / max(1, len(letters))
            if share < self.min_share:
                return self.reject(doc, "few_vowels", f"{share:.2f}")
            doc.annotations["vowel_share"] = share
            return doc

    dsdata.register_stage(VowelShare)
    docs = [{"id": f"d{i}", "text": ("banana split " * (i + 1)) if i % 3 else "rhythm crwth"} for i in range(30)]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (tmp_path / "r.yaml").write_text("input: {paths: [in.jsonl]}\nstages:\n  - test_vowel_share: {min_share: 0.2}\n")
    stats = dsdata.run(str(tmp_path / "r.yaml"), output=str(tmp_path / "out"), progress="off")
    assert stats["kept"] == 20 and stats["rejected"] == {"test_vowel_share": {"few_vowels": 10}}
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    (img,) = re.findall(r'<img id="hist-vowel-share"[^>]*src="data:image/svg\+xml;base64,([^"]+)"', page)
    import base64

    svg = base64.b64decode(img).decode("utf-8")
    assert "Vowel share" in svg and 'data-label="min_share 0.2"' in svg
    with pytest.raises(dsdata.RunError) as info:
        dsdata.run(str(tmp_path / "r.yaml"), output=str(tmp_path / "out2"), progress="off",
                   overrides={"test_vowel_share.needs_tool": "no-such-tool-dsdata"})
    assert "the program 'no-such-tool-dsdata' is not on PATH" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out2" / "stats.json").exists()


class _Scores(BatchStage):
    name = "scores_test_only"
    description = "test-only"

    def process_batch(self, docs):
        return docs


def test_a_batched_stage_with_a_composite_is_committed_per_unit_when_its_module_offers_batch_run(monkeypatch):
    """One row per composite: whether `--resume` commits a composite stage per unit is the composite
    module's own `batch_run`, not a second table."""
    from dsdata.beam.kinds import committable

    stage = _Scores()
    assert committable(stage)  # no composite: it runs in the batch chain
    monkeypatch.setitem(COMPOSITES, stage.name, "dsdata.beam.difficulty")  # a composite without batch_run
    assert not committable(stage)
    monkeypatch.setitem(COMPOSITES, stage.name, "dsdata.beam.relevance")  # relevance's module offers one
    assert committable(stage)
