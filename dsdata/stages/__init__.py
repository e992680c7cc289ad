"""Stage registry: recipe names → stage classes, imported lazily so a recipe only pays for the
libraries (torch, fastText, …) of the stages it uses.  Stages that do not ship with dsdata come from
`register_stage(cls)` or the `dsdata.stages` entry-point group of installed distributions
(dsdata/stages/plugins.py)."""
from __future__ import annotations

import importlib
import importlib.util

from dsdata.stages.base import BatchStage, CorpusStage, DocumentStage, Param, SideOutput, Stage, StageConfigError
from dsdata.stages.plugins import ENTRY_POINT_GROUP, CustomStages

REGISTRY: dict[str, str] = {
    "clean": "dsdata.stages.clean:CleanStage",
    "lang": "dsdata.stages.lang:LanguageStage",
    "rules": "dsdata.stages.rules:QualityRulesStage",
    "relevance": "dsdata.stages.relevance:RelevanceStage",
    "decontaminate": "dsdata.stages.decontaminate:DecontaminateStage",
    "pii": "dsdata.stages.pii:PiiStage",
    "dedup": "dsdata.stages.dedup:DedupStage",
    "difficulty": "dsdata.stages.difficulty:DifficultyStage",
    "augment": "dsdata.stages.augment:AugmentStage",
    "tokenize": "dsdata.stages.tokenize:TokenizeStage",
    "shards": "dsdata.stages.shards:ShardsStage",
}

CUSTOM = CustomStages(REGISTRY)


def register_stage(cls: type[Stage]) -> type[Stage]:
    """Make `cls` (a DocumentStage or BatchStage subclass; its `name` is the recipe's name for it)
    usable in recipes run by this process, `dsdata.run()` included; returns `cls`, so it also serves
    as a class decorator.  A name taken by a built-in stage, or by another registered class, is a
    StageConfigError.  For `dsdata run` on the command line, declare the class in the
    `dsdata.stages` entry-point group of an installed distribution instead (docs/architecture.md)."""
    return CUSTOM.register(cls)


def stage_class(name: str) -> type[Stage]:
    if name not in REGISTRY:
        custom = CUSTOM.get(name)
        if custom is not None:
            return custom
        problem = CUSTOM.problem(name)
        if problem:
            raise StageConfigError(problem)
        known = sorted(REGISTRY) + sorted(set(CUSTOM.classes) | set(CUSTOM.pending))
        raise StageConfigError(f"unknown stage '{name}' (known: {', '.join(known)})")
    module, _, cls = REGISTRY[name].partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise StageConfigError(
            f"stage '{name}' needs the Python module '{exc.name}', which is not installed; "
            "install dsdata with its extras: pip install -e '.[all]'"
        ) from exc
    return getattr(mod, cls)


def available_stages() -> list[str]:
    """Registered stage names whose module exists in this checkout."""
    return [name for name, target in REGISTRY.items() if importlib.util.find_spec(target.partition(":")[0])]


def custom_stages() -> list[str]:
    """The names of the usable stages that do not ship with dsdata (each loaded once)."""
    return CUSTOM.names()


def custom_stage_problems() -> list[str]:
    """One line per plugin that is not used (cannot be loaded, is no stage, or takes a taken name)."""
    CUSTOM.names()
    return list(CUSTOM.problems.values())


def registered_side_outputs() -> list[SideOutput]:
    """The side outputs every registered stage declares: a run removes them all, so a directory
    never mixes this run's kept/ with another recipe's difficulty.json."""
    found: dict[str, SideOutput] = {}
    for name in available_stages():
        try:
            sides = stage_class(name).side_outputs
        except StageConfigError:  # an optional dependency is missing: that stage cannot have run here
            continue
        for side in sides:
            found.setdefault(side.name, side)
    return list(found.values())


__all__ = ["Param", "SideOutput", "Stage", "DocumentStage", "BatchStage", "CorpusStage", "StageConfigError",
           "REGISTRY", "ENTRY_POINT_GROUP", "stage_class", "available_stages",
           "registered_side_outputs", "register_stage", "custom_stages", "custom_stage_problems"]
