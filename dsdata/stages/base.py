"""The stage contract: small classes with no Beam import.

A stage has a `name`, keyword parameters from the recipe (documented in `params`), an optional
`setup()` that loads models once per worker, and either

* `process(doc) -> Document | Rejected`                      (per-document stages), or
* `process_batch(docs) -> list[Document | Rejected]`         (model stages; batched by Beam), or
* `beam_transform() -> PTransform`                          (whole-corpus stages: dedup, quantiles).

A `beam_transform` takes a PCollection of `Document` and returns a dict
`{"kept": PCollection[Document], "rejected": PCollection[Rejected]}`.
`annotations` declares the typed output columns the stage adds to kept/*.parquet.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa

from dsdata.document import Document, Rejected


@dataclass(frozen=True)
class Param:
    """One recipe parameter: its default and a one-line description shown by `dsdata stages`."""

    default: Any
    help: str
    # "path" parameters are resolved against the recipe's directory (and may not escape it) when
    # they come from a recipe, and against the working directory when given with --set.
    kind: str = "value"


class StageConfigError(ValueError):
    """A recipe gave a stage a parameter it does not take, or a bad value."""


class Stage:
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    params: ClassVar[dict[str, Param]] = {}
    annotations: ClassVar[dict[str, pa.DataType]] = {}
    # Batch size bounds used by the Beam wrapper for stages that define process_batch.
    batch_min: ClassVar[int] = 8
    batch_max: ClassVar[int] = 256
    # Set by the pipeline builder: the run's output directory (for stages that write files).
    run_dir: str | None = None

    def __init__(self, **kwargs: Any):
        unknown = sorted(set(kwargs) - set(self.params))
        if unknown:
            known = ", ".join(sorted(self.params)) or "none"
            raise StageConfigError(
                f"stage '{self.name}' has no parameter {', '.join(map(repr, unknown))} (it takes: {known})"
            )
        for key, spec in self.params.items():
            setattr(self, key, kwargs.get(key, spec.default))
        self.validate()

    def validate(self) -> None:
        """Check parameter values; raise StageConfigError with a message a user can act on."""

    def setup(self) -> None:
        """Load models or other per-worker state. Called once per worker before processing."""

    def reject(self, doc: Document, reason: str, detail: str = "") -> Rejected:
        return Rejected(doc=doc, stage=self.name, reason=reason, detail=detail)

    def config(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.params}
