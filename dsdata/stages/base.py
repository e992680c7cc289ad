"""The stage contract: three kinds of small classes, none of which imports Beam (the table of
kinds, and how Beam runs each: docs/architecture.md).

Every parameter is a typed `Param` (dsdata/core/params.py; the trainer's config tables use it too),
checked and converted once when the stage is built (and by `load_recipe` for recipe and --set
values): a bad value is one line naming STAGE.PARAM; `validate()` is left with checks across
parameters.  `annotations` declares the typed columns the stage adds to kept/*.parquet,
`side_outputs` the files its composite writes under the run directory.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa

from dsdata.core.chart import Chart
from dsdata.core.params import ConfigError as StageConfigError  # one error for every parameter
from dsdata.core.params import Param, unknown_keys
from dsdata.document import Document, Rejected


@dataclass(frozen=True)
class SideOutput:
    """A file (or, with `directory`, a folder) the stage's composite writes under the run directory.

    The builder removes it before a run; a file's content is the one dict the composite returns under
    its name, written as JSON with these options."""

    name: str
    directory: bool = False
    sort_keys: bool = False
    ensure_ascii: bool = True


class Stage:
    """What every kind shares: name, typed parameters, checks, setup and rejections."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    params: ClassVar[dict[str, Param]] = {}
    annotations: ClassVar[dict[str, pa.DataType]] = {}
    side_outputs: ClassVar[tuple[SideOutput, ...]] = ()
    # Annotations holding {key: count}, summed over every document that carries them (kept, or
    # rejected by this or a later stage) into stats.json["tallies"][annotation][key] and the report:
    # counts a stage's rejection reasons cannot carry (which benchmark, how many e-mails redacted).
    tallies: ClassVar[tuple[str, ...]] = ()
    # What the run report draws of this stage's columns (one Chart each; dsdata/report/charts.py).
    charts: ClassVar[tuple[Chart, ...]] = ()
    # Exceptions that mean "this stage cannot run here" rather than "this record is bad": they stop
    # the run with one line instead of rejecting the record (ImportError, MemoryError and
    # StageConfigError always do; see dsdata/beam/errors.py).
    environment_errors: ClassVar[tuple[type[Exception], ...]] = ()

    def __init__(self, **kwargs: Any):
        self.__dict__.update(self.check_params(kwargs, defaults=True))
        self.validate()

    @classmethod
    def check_params(cls, given: dict[str, Any], defaults: bool = False) -> dict[str, Any]:
        """The checked values of `given` (with the defaults of the others when `defaults`)."""
        unknown = set(given) - set(cls.params)
        if unknown:
            raise StageConfigError(unknown_keys(f"stage '{cls.name}'", unknown, cls.params))
        checked = {key: spec.coerce(f"{cls.name}.{key}", given.get(key, spec.default))
                   for key, spec in cls.params.items() if defaults or key in given}
        if any(cls.params[key].choices is not None for key in checked):
            values = {key: spec.default for key, spec in cls.params.items()} | checked
            for key, value in checked.items():
                cls.params[key].check_choices(f"{cls.name}.{key}", value, values)
        return checked

    def validate(self) -> None:
        """Checks across parameters; raise StageConfigError with a message a user can act on."""

    def setup(self) -> None:
        """Load models or other per-worker state. Called once per worker before processing."""

    def preflight(self) -> str | None:
        """What stops this stage from running here (a library that does not work, say), in one line,
        checked before a run starts; None when nothing does.  Unlike `validate`, it looks at the
        machine, not at the parameters."""
        return None

    def uses_composite(self) -> bool:
        """Whether this stage, with these parameters, runs through the composite registered for its
        name (dsdata/beam/kinds.py COMPOSITES); a per-document stage whose corpus-wide part a
        parameter turns off answers False and runs one document at a time."""
        return True

    def reject(self, doc: Document, reason: str, detail: str = "") -> Rejected:
        return Rejected(doc=doc, stage=self.name, reason=reason, detail=detail)

    def parameter_values(self) -> dict[str, Any]:
        """Every parameter's checked value (the run report shows the recipe as run)."""
        return {key: getattr(self, key) for key in self.params}


class DocumentStage(Stage, ABC):
    """A stage that looks at one document at a time."""

    @abstractmethod
    def process(self, doc: Document) -> Document | Rejected:
        """The document (possibly changed or annotated) or its rejection."""


class BatchStage(Stage, ABC):
    """A model stage: it is handed batches of `batch_max` documents (a bundle's last one smaller);
    `batch_min` bounds the batches RunInference sizes adaptively (the relevance stage)."""

    batch_min: ClassVar[int] = 8
    batch_max: ClassVar[int] = 256

    @abstractmethod
    def process_batch(self, docs: list[Document]) -> list[Document | Rejected]:
        """Exactly one Document or Rejected per input document, in order."""

    def process(self, doc: Document) -> Document | Rejected:
        """One document outside a pipeline (tests, notebooks): a batch of one."""
        return self.process_batch([doc])[0]


class ScoringStage(BatchStage, ABC):
    """A model stage whose Beam composite scores documents through Beam's RunInference (relevance:
    dsdata/beam/relevance.py): the model handler loads the model once per worker and scores batches,
    then the stage judges each document by its score.  What that composite needs, declared here."""

    model: str  # the model directory (a Path parameter)

    @abstractmethod
    def load_options(self) -> dict[str, Any]:
        """Keyword arguments for loading the model (backend, device, batch size, …): plain data."""

    @abstractmethod
    def judge(self, doc: Document, score: float) -> Document | Rejected:
        """The document annotated with its score, or its rejection."""


class CorpusStage(Stage, ABC):
    """A whole-corpus stage (dedup, per-language quantiles, shard writing): dsdata/beam/kinds.py maps
    it to its composite transform, which reads what it needs from `transform_config()`."""

    @abstractmethod
    def transform_config(self) -> Any:
        """Everything the stage's composite needs, as plain picklable data (no Beam objects)."""
