"""The runners dsdata knows, by the names users type: ONE registry, plain data, no Beam.  To add
one: its class under dsdata/beam/engines/, one `Runner` row below, docs/engines.md, tests/test_engines.py.
"""
from __future__ import annotations

from dataclasses import dataclass

IN_PROCESS_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"  # dsdata's default


class BeamOptionError(ValueError):
    """A Beam option a recipe may not carry, or a runner that does not exist; one line."""


@dataclass(frozen=True)
class Runner:
    name: str                   # as docs and messages spell it
    class_path: str             # the PipelineRunner class Beam runs for this name
    aliases: tuple[str, ...] = ()  # other names users type (matched case-insensitively)
    in_process: bool = False    # runs the pipeline in this process: the only runners a recipe may name
    replaces_beams: bool = False  # dsdata hands Beam `class_path`, not the name (Beam would pick another class)
    extra: str | None = None    # the pip extra its module needs, for the one-line error when it is missing
    summary: str = ""
    # modules whose PipelineOptions declare this runner's flags (to tell a typo from a Beam option)
    options_modules: tuple[str, ...] = ()
    # "module:function": function(args) → the Beam arguments a run on this runner gets by default
    defaults: str = ""

    def names(self) -> tuple[str, ...]:
        return (self.name.lower(), *self.aliases)


_BEAM = "apache_beam.runners."
RUNNERS: tuple[Runner, ...] = (
    # Beam's DirectRunner tries Prism first (a download, then a binary): dsdata's is the FnApiRunner
    Runner("FnApiRunner", IN_PROCESS_RUNNER, ("directrunner",), in_process=True,
           replaces_beams=True, summary="dsdata's default: Beam's FnApiRunner in this process"),
    Runner("BundleBasedDirectRunner", _BEAM + "direct.direct_runner.BundleBasedDirectRunner", in_process=True,
           summary="Beam's older in-process runner"),
    Runner("PrismRunner", _BEAM + "portability.prism_runner.PrismRunner",
           summary="Beam's portable Go runner (a binary)"),
    Runner("FlinkRunner", _BEAM + "portability.flink_runner.FlinkRunner",
           summary="Apache Flink through Beam's job-server jar",
           defaults="dsdata.beam.engines.artifacts:flink_defaults"),
    Runner("SparkRunner", _BEAM + "portability.spark_runner.SparkRunner",
           summary="Apache Spark through Beam's job-server jar"),
    Runner("PortableRunner", _BEAM + "portability.portable_runner.PortableRunner",
           summary="any Beam job service by endpoint"),
    Runner("DataflowRunner", _BEAM + "dataflow.dataflow_runner.DataflowRunner", extra="gcp",
           summary="Google Cloud Dataflow", options_modules=("apache_beam.runners.dataflow.dataflow_runner",)),
    # The rest of Beam's StandardOptions.ALL_KNOWN_RUNNERS (tests/test_engines.py keeps this list whole).
    Runner("SwitchingDirectRunner", _BEAM + "direct.direct_runner.SwitchingDirectRunner"),
    Runner("InteractiveRunner", _BEAM + "interactive.interactive_runner.InteractiveRunner", extra="interactive",
           options_modules=("apache_beam.runners.interactive.interactive_runner",)),
    Runner("KafkaStreamsRunner", _BEAM + "portability.kafka_streams_runner.KafkaStreamsRunner"),
    Runner("TestDirectRunner", _BEAM + "test.TestDirectRunner"),
    Runner("TestDataflowRunner", _BEAM + "test.TestDataflowRunner"),
)


def find_runner(name: str) -> Runner | None:
    """The registry entry for a name users type (any case; `Prism` finds PrismRunner as Beam does)."""
    lowered = name.lower()
    for runner in RUNNERS:
        if lowered in runner.names() or lowered + "runner" in runner.names() or lowered == runner.class_path.lower():
            return runner
    return None


def resolve_runner(name: str) -> str:
    """What dsdata hands Beam for --runner=NAME: the class of a runner dsdata replaces, else NAME."""
    runner = find_runner(name)
    return runner.class_path if runner is not None and runner.replaces_beams else name


def is_in_process(name: str | None) -> bool:
    """Whether --runner=NAME (None: the default) runs the pipeline in this process."""
    if name is None:
        return True
    runner = find_runner(name)
    return runner is not None and runner.in_process
