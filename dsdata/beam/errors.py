"""What a run does when code raises for one record, and when a run as a whole fails.

* An exception raised while one record is read or processed (only a stop ends the run) rejects that
  record: reason `error`, detail the exception's first line.  A failing batch is retried record by
  record, each from a copy of the documents as they were before.  A malformed stage result is that
  record's error the same way (StageResultError).
* An *environment* error (ENVIRONMENT_ERRORS, anything a stage's `setup()` raises, the stage's
  declared `environment_errors`) is never blamed on a record: one line (StageEnvironmentError).
* After the run, the errors are held against a budget (`--max-errors`, default 0.1 % of the input):
  over it, the run fails with one line (ErrorBudgetExceeded) — its outputs are written first.

No Beam import here: the DoFns in dsdata/beam/ apply these rules, run_recipe applies the budget.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, TypeVar

from dsdata.document import Document, Rejected
from dsdata.io.object_storage import EndpointUnreachable
from dsdata.io.readers import scrub_surrogates
from dsdata.io.storage_errors import is_storage_error
from dsdata.stages.base import StageConfigError

T = TypeVar("T")
R = TypeVar("R")

ERROR = "error"
DEFAULT_MAX_ERRORS = "0.1%"
# Never a record's fault: the next record would fail the same way (an object store's endpoint that
# stopped answering mid-run too; a vanished object, an answer of 404, stays that object's row).
ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (ImportError, MemoryError, StageConfigError,
                                                       EndpointUnreachable)
_DETAIL_LIMIT = 500


class RunFailed(RuntimeError):
    """A run that cannot (or must not) succeed, for a reason one line states."""


class StageEnvironmentError(RunFailed):
    """A stage cannot run in this environment (missing model or module, out of memory)."""


class StorageUnreachable(StageEnvironmentError):
    """The object store's endpoint stopped answering mid-run: what the run wrote is partial (a local
    OUT is marked incomplete), unlike a stage's own environment error, which is no fault of OUT's."""


class ErrorBudgetExceeded(RunFailed):
    """More records failed with an exception than the error budget allows."""


def first_line(exc: BaseException) -> str:
    """'TypeError: first line of the message' — printable as UTF-8 whatever the message holds (a lone
    surrogate from the record is escaped, since rejected rows are written as UTF-8)."""
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else ""
    out = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return out.encode("utf-8", "backslashreplace").decode("utf-8")[:_DETAIL_LIMIT]


def passes_through(exc: BaseException) -> bool:
    """True for what a per-record handler must let pass: a stop (KeyboardInterrupt, Interrupted,
    GeneratorExit).  Every other BaseException is the record's (pyo3's PanicException, SystemExit)."""
    from dsdata.stop_signals import is_stop

    return is_stop(exc) or isinstance(exc, GeneratorExit)


class StageResultError(TypeError):
    """A stage returned something that is not a Document or a Rejected for a record."""


def result_problem(result: object) -> str | None:
    """What is wrong with a stage's result for one record (None: a well-formed Document or Rejected);
    a malformed one would otherwise fail far from the stage (the writers, the ledger)."""
    if isinstance(result, Rejected):
        if not (isinstance(result.reason, str) and result.reason and isinstance(result.detail, str)):
            return "a Rejected whose reason is not a non-empty string or whose detail is not a string"
        doc, what = result.doc, "a Rejected of "
        if not isinstance(doc, Document):
            return f"a Rejected of {type(doc).__name__}, not of a Document"
    elif isinstance(result, Document):
        doc, what = result, ""
    else:
        return f"{type(result).__name__}, not a Document or Rejected"
    for name, kind in _DOCUMENT_FIELDS:
        value = getattr(doc, name)
        if not isinstance(value, kind):
            return f"{what}a Document whose {name} is {type(value).__name__}, not {kind.__name__}"
    return None


_DOCUMENT_FIELDS = (("id", str), ("text", str), ("metadata", dict), ("annotations", dict))


def checked_result(stage_name: str, result: object, checks: tuple = ()) -> Document | Rejected:
    """`result` when it is a well-formed Document or Rejected whose declared annotations (`checks`:
    annotation_checks of the stage's) hold values of their column's kind; StageResultError otherwise."""
    if not (type(result) is Document and type(result.text) is str and type(result.id) is str
            and type(result.metadata) is dict and type(result.annotations) is dict):  # else the general checks
        problem = result_problem(result)
        if problem is not None:
            raise StageResultError(f"stage '{stage_name}' returned {problem}")
        if not isinstance(result, Document):
            return result  # type: ignore[return-value]
    annotations = result.annotations
    for name, fast, kinds in checks:
        value = annotations.get(name)
        if value is not None and type(value) is not fast and not isinstance(value, kinds):
            raise StageResultError(f"stage '{stage_name}' set annotation '{name}' to {type(value).__name__} "
                                   f"{_short(value)}, which its declared column cannot hold")
    return result  # type: ignore[return-value]


def annotation_checks(annotations) -> tuple:
    """(name, the usual Python type, the accepted ones) for each declared annotation of a simple kind:
    a value of another kind would fail the kept/ writer for the whole bundle, not that one record."""
    import numbers

    import pyarrow as pa

    checks = []
    for name, kind in annotations.items():
        if pa.types.is_boolean(kind):
            checks.append((name, bool, (bool,)))
        elif pa.types.is_integer(kind):
            checks.append((name, int, (numbers.Integral,)))
        elif pa.types.is_floating(kind):
            checks.append((name, float, (numbers.Real,)))
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
            checks.append((name, str, (str,)))
    return tuple(checks)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def copy_document(doc: Document) -> Document:
    """A copy of `doc` that a stage can change in place without changing `doc`: its dicts and lists
    (metadata, annotations, and what they hold) are new, its strings shared (and a text not yet
    unpacked: dsdata/document.py unpack_document)."""
    copied = Document.__new__(Document)
    copied.__dict__.update(doc.__dict__, metadata=_copied(doc.metadata), annotations=_copied(doc.annotations))
    return copied


def _copied(value):
    kind = type(value)
    if kind is dict:
        return {key: item if type(item) in _IMMUTABLE else _copied(item) for key, item in value.items()}
    if kind is list:
        return [item if type(item) in _IMMUTABLE else _copied(item) for item in value]
    if kind in _IMMUTABLE:
        return value
    return copy.deepcopy(value)


_IMMUTABLE = frozenset({str, int, float, bool, bytes, type(None)})


def is_environment_error(exc: BaseException, declared: tuple[type[BaseException], ...] = ()) -> bool:
    # A full or read-only disk (a spill file, a shard) fails every record after it alike.
    return isinstance(exc, ENVIRONMENT_ERRORS + tuple(declared)) or is_storage_error(exc)


def environment_failure(stage_name: str, exc: BaseException, when: str = "") -> StageEnvironmentError:
    """The fatal one-line error for `exc`; a StageConfigError's own message already names the stage."""
    if isinstance(exc, StageEnvironmentError):
        return exc
    if isinstance(exc, EndpointUnreachable):  # its message names the endpoint
        return StorageUnreachable(first_line(exc).split(": ", 1)[-1])
    if isinstance(exc, StageConfigError):
        return StageEnvironmentError(first_line(exc).split(": ", 1)[-1])  # its own message names the stage
    return StageEnvironmentError(f"stage '{stage_name}'{when}: {first_line(exc)}")


def _stop_if_environment(stage_name: str, exc: BaseException, declared: tuple[type[BaseException], ...]) -> None:
    if isinstance(exc, StageEnvironmentError) or is_environment_error(exc, declared):
        raise environment_failure(stage_name, exc) from exc


def error_rejection(doc: Document, stage_name: str, exc: BaseException,
                    declared: tuple[type[BaseException], ...] = ()) -> Rejected:
    """`doc` rejected by `stage_name` with reason `error`; raises instead for an environment error."""
    _stop_if_environment(stage_name, exc, declared)
    return Rejected(_writable(doc), stage_name, ERROR, first_line(exc))


def retry_one_at_a_time(stage_name: str, items: Sequence[T], run: Callable[[Sequence[T]], Iterable[R]],
                        on_error: Callable[[T, BaseException], R],
                        declared: tuple[type[BaseException], ...] = (),
                        fresh: Callable[[T], T] | None = None) -> list[R]:
    """`run(items)`, and when the batch raises, `run([item])` for each item: `on_error(item, exc)`
    stands in for each that raises alone.  An environment error stops the run instead.  fresh: a
    copy function, for a `run` that changes its items in place (each retry runs on a new copy)."""
    saved = [fresh(item) for item in items] if fresh is not None else items
    try:
        return list(run(items))
    except BaseException as exc:  # noqa: BLE001 - find the item(s) that raise, one at a time
        if passes_through(exc):  # a stop; a native binding's panic (a BaseException) is the item's
            raise
        _stop_if_environment(stage_name, exc, declared)
    results: list[R] = []
    for item in saved:
        try:
            results.extend(run([fresh(item) if fresh is not None else item]))
        except BaseException as one:  # noqa: BLE001 - this item alone raises
            if passes_through(one):
                raise
            _stop_if_environment(stage_name, one, declared)
            results.append(on_error(item, one))
    return results


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _writable(doc: Document) -> Document:
    """`doc`, or a copy a rejected row can hold: lone surrogates replaced, a field a stage set to the
    wrong type before it failed (text = None) made one of the right type."""
    if result_problem(doc) is not None:
        doc = Document(str(doc.id), "" if doc.text is None else str(doc.text),
                       doc.metadata if isinstance(doc.metadata, dict) else {"metadata": str(doc.metadata)},
                       doc.annotations if isinstance(doc.annotations, dict) else {}, doc.derived_from)
    if not any(_unencodable(s) for s in (doc.id, doc.text)) and not _unencodable(
            json.dumps([doc.metadata, doc.annotations], ensure_ascii=False, default=str)):
        return doc
    return Document(scrub_surrogates(doc.id), scrub_surrogates(doc.text), scrub_surrogates(doc.metadata),
                    scrub_surrogates(doc.annotations), doc.derived_from)


_WHILE_RUNNING = re.compile(r"\s*\[while running '[^']*'\]\s*$")
_NAMED = re.compile(r"(StageEnvironmentError|StorageUnreachable): (.+)")


def find_environment_error(exc: BaseException) -> StageEnvironmentError | None:
    """The StageEnvironmentError behind a runner's exception: the object itself in process, else
    parsed from the traceback a remote worker sent back."""
    seen = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, (StageEnvironmentError, EndpointUnreachable)):  # the latter: from a writer
            kind = StorageUnreachable if isinstance(current, (StorageUnreachable, EndpointUnreachable)) \
                else StageEnvironmentError
            return kind(_WHILE_RUNNING.sub("", str(current).splitlines()[0] if str(current) else ""))
        # Beam's BeamIOError holds a file system's errors per path (exception_details), not as a cause.
        details = getattr(current, "exception_details", None)
        todo.extend(e for e in (details.values() if isinstance(details, dict) else ()) if isinstance(e, BaseException))
        todo.extend(e for e in (current.__cause__ or current.__context__,) if e is not None)
    match = _NAMED.search(str(exc))
    if match:
        kind = StorageUnreachable if match.group(1) == "StorageUnreachable" else StageEnvironmentError
        return kind(_WHILE_RUNNING.sub("", match.group(2)))
    return None


@dataclass(frozen=True)
class ErrorBudget:
    """How many records may fail with an exception before a run fails: a share of the input
    (`fraction`, from "0.1%") or a count (`count`, from "25")."""

    text: str
    fraction: float | None = None
    count: int | None = None

    @classmethod
    def parse(cls, value: "str | int | ErrorBudget | None") -> "ErrorBudget":
        if isinstance(value, ErrorBudget):
            return value
        text = DEFAULT_MAX_ERRORS if value is None else str(value).strip()
        try:
            if text.endswith("%"):
                pct = float(text[:-1])
                if not 0 <= pct <= 100:
                    raise ValueError
                return cls(text, fraction=pct / 100)
            count = int(text)
            if count < 0:
                raise ValueError
            return cls(text, count=count)
        except ValueError:
            raise ValueError(f"--max-errors must be a count (e.g. 25) or a percentage of the input "
                             f"between 0% and 100% (e.g. 0.1%), got {text!r}") from None

    def allowed(self, n_input: int) -> float:
        return self.count if self.count is not None else self.fraction * n_input

    def describe(self, n_input: int) -> str:
        if self.count is not None:
            return f"{self.count} record{'s' if self.count != 1 else ''}"
        allowed = int(self.allowed(n_input))
        return f"{self.text} of {n_input} input records ({allowed} record{'s' if allowed != 1 else ''})"

    def check(self, stats: dict, output: str) -> None:
        """Raise ErrorBudgetExceeded when stats' errors (reason `error`, every stage) exceed the budget."""
        n_errors = stats["errors"]["count"]
        n_input = stats["input"]
        if n_errors > self.allowed(n_input):
            share = 100.0 * n_errors / n_input if n_input else 100.0
            raise ErrorBudgetExceeded(
                f"{n_errors} record{'s' if n_errors != 1 else ''} ({share:.3g} %) failed with an exception, "
                f"over the budget of {self.describe(n_input)}; see {output}/rejected (reason {ERROR})"
            )

    def summary(self, stats: dict) -> dict:
        """stats.json's "errors": the count of records rejected with reason `error`, by stage, and the budget."""
        by_stage = {stage: reasons[ERROR] for stage, reasons in stats["rejected"].items() if ERROR in reasons}
        n_errors = sum(by_stage.values())
        return {"count": n_errors, "by_stage": by_stage, "budget": self.text,
                "over_budget": n_errors > self.allowed(stats["input"])}
