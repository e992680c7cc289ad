"""What a stage declares for the run report to draw: written by the stage (its class's `charts`),
recorded in the run's run.json, read back by dsdata/report/charts.py, which has one renderer per
`kind`.  Plain strings only, so a run's file describes it whole."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chart:
    """A chart of the run report (report.html), drawn from a column of the kept documents that the
    declaring stage writes.  `kind` names a renderer of dsdata/report/charts.py: `histogram` (a
    numeric column; `threshold` names the stage parameter drawn on it as a line), `categories` (the
    20 most common values), `cutoffs` (one log-scale panel per value of `group`, with the cut-offs of
    the stage's JSON side output `side_output`), `grades` (the counts of `side_output`), `clusters`
    (cluster sizes from `column`, else counted from `also`).  `alt` is the image's text."""

    kind: str
    column: str
    element_id: str
    title: str
    alt: str
    label: str = ""
    threshold: str = ""
    group: str = ""
    side_output: str = ""
    also: str = ""
