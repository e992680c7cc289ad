"""Stages from outside dsdata: classes given to `register_stage()`, and the stages installed
distributions declare in the `dsdata.stages` entry-point group (docs/architecture.md).

The group is read once per process, only when a name is not built in or the whole list is asked
for; an entry point's module is imported only when its stage is used or listed.  A plugin never
breaks dsdata's own stages: one that cannot be loaded (whatever its import raises but Ctrl-C), is no
stage, or takes a taken name is one line naming the distribution, and the first one runs.
"""
from __future__ import annotations

import importlib.metadata
import re
from typing import Callable, Mapping

from dsdata.stages.base import BatchStage, CorpusStage, DocumentStage, Stage, StageConfigError
from dsdata.stop_signals import is_stop

ENTRY_POINT_GROUP = "dsdata.stages"

# Names a recipe cannot give a custom stage: `read` is the stage of reader rejections in
# rejected/*.parquet, `input` is what `--set input.format=...` addresses.
RESERVED_NAMES = frozenset({"read", "input"})

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # a recipe key that --set STAGE.PARAM can address


def custom_stage_problem(cls: object, name: str | None = None) -> str | None:
    """Why `cls` cannot be a custom stage (registered under `name`, default its own), or None."""
    if not isinstance(cls, type) or not issubclass(cls, Stage):
        return f"{cls!r} is not a stage class (a subclass of dsdata.stages.DocumentStage or BatchStage)"
    if issubclass(cls, CorpusStage):
        return (f"{cls.__qualname__} is a CorpusStage; a custom stage must be a DocumentStage or a BatchStage "
                "(a whole-corpus stage needs a Beam composite in dsdata/beam/kinds.py)")
    if not issubclass(cls, (DocumentStage, BatchStage)):
        return f"{cls.__qualname__} is neither a DocumentStage nor a BatchStage"
    if getattr(cls, "__abstractmethods__", None):
        return f"{cls.__qualname__} does not implement {', '.join(sorted(cls.__abstractmethods__))}"
    if not isinstance(cls.name, str) or not _NAME.fullmatch(cls.name):
        return f"{cls.__qualname__}.name must be a name such as 'my_filter' (letters, digits, _ and -), not {cls.name!r}"
    if name is not None and cls.name != name:
        return f"{cls.__qualname__}.name is {cls.name!r}, but it is registered as {name!r}; the two must be equal"
    if cls.side_outputs:
        return f"{cls.__qualname__} declares side_outputs, which only dsdata's whole-corpus stages can write"
    return _declaration_problem(cls)


def _declaration_problem(cls: type[Stage]) -> str | None:
    """What is wrong with the class attributes dsdata reads from a stage before and while it runs."""
    import pyarrow as pa

    from dsdata.stages.base import Param

    where = cls.__qualname__
    if not isinstance(cls.params, dict) or not all(isinstance(k, str) and isinstance(v, Param)
                                                   for k, v in cls.params.items()):
        return f"{where}.params must map parameter names to dsdata.stages.Param"
    if not isinstance(cls.annotations, dict) or not all(isinstance(k, str) and isinstance(v, pa.DataType)
                                                        for k, v in cls.annotations.items()):
        return f"{where}.annotations must map column names to pyarrow types (pa.int64(), pa.string(), …)"
    errors = cls.environment_errors
    if not isinstance(errors, tuple) or not all(isinstance(e, type) and issubclass(e, BaseException) for e in errors):
        return f"{where}.environment_errors must be a tuple of exception classes"
    if issubclass(cls, BatchStage):
        low, high = cls.batch_min, cls.batch_max
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (low, high)) or not 1 <= low <= high <= 1 << 20:
            return f"{where}: batch_min and batch_max must be whole numbers, 1 <= batch_min <= batch_max <= {1 << 20}, " \
                   f"got {low!r} and {high!r}"
    return None


def _distribution(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return f"the distribution declaring {ep.value!r}"
    return f"distribution '{dist.name} {dist.version}'"


class CustomStages:
    """The stages that do not ship with dsdata, by recipe name (see the module's docstring)."""

    def __init__(self, builtin: Mapping[str, str], entry_points: Callable[[], list] | None = None):
        self.builtin = builtin
        self._entry_points = entry_points or (lambda: list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)))
        self.classes: dict[str, type[Stage]] = {}  # register_stage() and entry points loaded
        self.pending: dict[str, importlib.metadata.EntryPoint] = {}  # entry points found, not loaded yet
        self.problems: dict[str, str] = {}  # name → the one line saying why that plugin is not used
        self.read = False

    def _taken(self, name: str) -> str | None:
        if name in self.builtin:
            return "a built-in stage has that name"
        if name in RESERVED_NAMES:
            return "dsdata reserves that name"
        return None

    def register(self, cls: type[Stage]) -> type[Stage]:
        problem = custom_stage_problem(cls)
        if problem is None:
            taken = self._taken(cls.name)
            known = self.classes.get(cls.name)
            if taken:
                problem = f"stage name '{cls.name}' is refused: {taken}"
            elif known is not None and known is not cls:
                problem = f"stage name '{cls.name}' is already registered for {known.__module__}.{known.__qualname__}"
        if problem:
            raise StageConfigError(f"register_stage: {problem}")
        self.classes[cls.name] = cls
        self.pending.pop(cls.name, None)
        return cls

    def _read_group(self) -> None:
        if self.read:
            return
        self.read = True
        try:
            found = self._entry_points()
        except Exception as exc:  # noqa: BLE001 - broken metadata on sys.path must not break built-in stages
            self.problems["*"] = f"the '{ENTRY_POINT_GROUP}' entry points could not be read: {type(exc).__name__}: {exc}"
            return
        first: dict[str, importlib.metadata.EntryPoint] = {}
        for ep in found:
            taken = self._taken(ep.name)
            if taken is None and ep.name in first and first[ep.name].value != ep.value:
                taken = f"{_distribution(first[ep.name])} declares it too"
            if taken:
                # Under its name where a recipe naming it would otherwise hear "unknown stage" (a reserved
                # name); a built-in's name or a second declaration is the stage already there.
                key = ep.name if ep.name in RESERVED_NAMES else f"{ep.name} ({_distribution(ep)})"
                self.problems[key] = f"stage '{ep.name}' of {_distribution(ep)} is refused: {taken}"
                continue
            first.setdefault(ep.name, ep)
        for name, ep in first.items():
            if name not in self.classes:  # register_stage() before the group was read wins
                self.pending[name] = ep

    def _load(self, name: str) -> type[Stage] | None:
        ep = self.pending.pop(name)
        try:
            cls = ep.load()
        except BaseException as exc:  # noqa: BLE001 - any fault of a plugin's import is that plugin's, in one line
            # sys.exit() at import is the plugin's fault too; Ctrl-C (or SIGINT/SIGTERM) is the user's stop.
            if is_stop(exc):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self.problems[name] = (f"stage '{name}' of {_distribution(ep)} cannot be loaded "
                                   f"({ep.value}): {type(exc).__name__}{': ' + first if first else ''}")
            return None
        problem = custom_stage_problem(cls, name)
        if problem:
            self.problems[name] = f"stage '{name}' of {_distribution(ep)} is not usable: {problem}"
            return None
        self.classes[name] = cls
        return cls

    def get(self, name: str) -> type[Stage] | None:
        """The custom stage `name`, or None (then `problem(name)` may say why)."""
        if name in self.classes:
            return self.classes[name]
        self._read_group()
        if name in self.pending:
            return self._load(name)
        return None

    def problem(self, name: str) -> str | None:
        return self.problems.get(name)

    def names(self) -> list[str]:
        """Every usable custom stage, each loaded (so a broken one is found and left out)."""
        self._read_group()
        for name in list(self.pending):
            self._load(name)
        return sorted(self.classes)
