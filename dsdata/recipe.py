"""Recipes: YAML files that list a pipeline's input, output, stages and their parameters.

```yaml
name: pretrain
input:
  paths: [samples/*.jsonl]     # relative to this file's directory; may not escape it
  format: auto                 # auto (from the file name) or a format of dsdata/io/readers REGISTRY
  text_field: text
  id_field: id
output: out                    # relative to the working directory; may not leave it
stages:
  - clean: {}
  - lang: {keep: [zh, en]}
```

A recipe's paths stay inside its directory (`output`: the working directory), links resolved; other
locations are given on the command line.  Every check is one RecipeError line.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from dsdata.core.names import is_remote
from dsdata.core.params import unknown_keys
from dsdata.io.readers import FORMATS as READER_FORMATS
from dsdata.io.untrusted_files import UntrustedFileError, read_regular_file
from dsdata.runners import BeamOptionError, find_runner
from dsdata.safe_yaml import YamlBoundError, load_bounded, yaml_error_line
from dsdata.stages import Stage, StageConfigError, stage_class
from dsdata.stop_signals import is_stop

INPUT_FORMATS = ("auto", *READER_FORMATS)  # dsdata/io/readers REGISTRY
RECIPE_KEYS = ("name", "description", "input", "output", "stages", "beam")
INPUT_KEYS = ("paths", "format", "text_field", "id_field")
MAX_RECIPE_BYTES = 1 << 20


class RecipeError(ValueError):
    """A recipe that cannot be run; the message names the file and what to change."""


@dataclass
class StageSpec:
    name: str
    params: dict[str, Any]
    from_command_line: set[str] = field(default_factory=set)


@dataclass
class Recipe:
    path: str
    name: str
    inputs: list[str]
    input_format: str = "auto"
    text_field: str = "text"
    id_field: str = "id"
    output: str = "out"
    stages: list[StageSpec] = field(default_factory=list)
    beam_args: list[str] = field(default_factory=list)
    inputs_left_out: dict[str, Any] = field(default_factory=dict)  # for stats.json (inputs.left_out)
    limit: int | None = None  # --limit N
    # the file's own (resolved) inputs: while `inputs` are among them, a run stays in the recipe's folder
    file_inputs: tuple[str, ...] = ()
    inputs_checked: bool = False  # already expanded by dsdata.io.inputs.resolve_recipe_inputs

    @property
    def inputs_from_file(self) -> bool:
        return bool(self.inputs) and set(self.inputs) <= set(self.file_inputs)

    @property
    def directory(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))

    def build_stages(self) -> list[Stage]:
        built = []
        for spec in self.stages:
            try:
                built.append(stage_class(spec.name)(**spec.params))
            except StageConfigError as exc:
                raise RecipeError(f"{self.path}: {exc}") from None
            except BaseException as exc:  # noqa: BLE001 - a custom stage's constructor: its fault, one line
                if is_stop(exc):
                    raise
                text = str(exc).strip()
                raise RecipeError(f"{self.path}: stage '{spec.name}' cannot be built: {type(exc).__name__}"
                                  f"{': ' + text.splitlines()[0] if text else ''}") from None
        return built


def confine(base_dir: str, rel: str, what: str, recipe_path: str) -> str:
    """Resolve a recipe-relative path, refusing anything that escapes `base_dir`."""
    if "\0" in rel:
        raise RecipeError(f"{recipe_path}: {what} {rel!r} holds a NUL byte, which no file name can")
    if is_remote(rel) or os.path.isabs(rel):
        raise RecipeError(
            f"{recipe_path}: {what} '{rel}' is not relative to the recipe; recipes may only name paths "
            "inside their own directory. Give other locations on the command line (--input/--output/--set)."
        )
    base = os.path.realpath(base_dir)
    resolved = os.path.realpath(os.path.join(base, rel))
    if os.path.commonpath([base, resolved]) != base:
        raise RecipeError(f"{recipe_path}: {what} '{rel}' escapes the recipe's directory {base}")
    return resolved


def _as_stage_list(raw: Any, path: str) -> list[StageSpec]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise RecipeError(f"{path}: 'stages' must be a list like '- clean: {{}}'")
    specs = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            specs.append(StageSpec(item, {}))
        elif isinstance(item, dict) and len(item) == 1:
            (name, params), = item.items()
            if params is None:
                params = {}
            if not isinstance(params, dict):
                raise RecipeError(f"{path}: parameters of stage '{name}' (stages[{i}]) must be a mapping")
            specs.append(StageSpec(str(name), dict(params)))
        else:
            raise RecipeError(f"{path}: stages[{i}] must be a stage name or a one-key mapping 'NAME: {{params}}'")
    return specs


# A recipe's `beam:` section: many Beam options make a runner execute commands (an environment
# command, packages installed on workers, an image, a job server), which would run the recipe
# writer's code on the user's machine.  A recipe takes only runner choice and tuning, as scalars,
# an in-process runner of dsdata/runners.py and `in_memory` mode; the rest goes on the command line.
RECIPE_BEAM_OPTIONS = frozenset({
    "runner",
    "direct_num_workers", "direct_running_mode",
    "num_workers", "max_num_workers", "autoscaling_algorithm", "machine_type", "worker_machine_type",
    "disk_size_gb", "number_of_worker_harness_threads",
    "parallelism", "max_parallelism",
    "streaming",
})
DIRECT_RUNNING_MODES = ("in_memory", "multi_threading", "multi_processing")


def recipe_beam_args(cfg: Any, recipe_path: str) -> list[str]:
    """A recipe's `beam:` mapping → `--name=value` arguments, refusing options outside RECIPE_BEAM_OPTIONS."""
    if cfg is None:
        return []
    if not isinstance(cfg, dict):
        raise BeamOptionError(f"{recipe_path}: 'beam' must be a mapping of pipeline options")
    args = []
    for key, value in cfg.items():
        name = str(key).lstrip("-").replace("-", "_")
        if name not in RECIPE_BEAM_OPTIONS:
            raise BeamOptionError(
                f"{recipe_path}: beam option '{name}' may not be set in a recipe (a shared file may only "
                f"choose the runner and its tuning: {', '.join(sorted(RECIPE_BEAM_OPTIONS))}); "
                f"pass --{name}=... on the command line"
            )
        if not isinstance(value, (str, int, float, bool)) or (isinstance(value, str) and "\n" in value):
            raise BeamOptionError(f"{recipe_path}: beam option '{name}' must be a single scalar value")
        if name == "runner":
            value = _recipe_runner(str(value), recipe_path)
        if name == "direct_running_mode" and value not in DIRECT_RUNNING_MODES:
            raise BeamOptionError(f"{recipe_path}: direct_running_mode must be one of {', '.join(DIRECT_RUNNING_MODES)}")
        if name == "direct_running_mode" and value != "in_memory":
            raise BeamOptionError(
                f"{recipe_path}: direct_running_mode '{value}' starts worker processes, which a shared recipe "
                f"may not do; pass --direct_running_mode={value} on the command line"
            )
        args.append(f"--{name}={str(value).lower() if isinstance(value, bool) else value}")
    return args


def _recipe_runner(value: str, recipe_path: str) -> str:
    """The class path a recipe's `runner: NAME` runs on: an in-process runner of dsdata/runners.py only."""
    runner = find_runner(value)
    if runner is None or "." in value:  # a dotted class path imports that module: the user's choice
        raise BeamOptionError(
            f"{recipe_path}: runner '{value}' is not one of Beam's runners by name; "
            "a runner class path is given on the command line (--runner=package.module.Class)"
        )
    if not runner.in_process:
        raise BeamOptionError(
            f"{recipe_path}: runner '{value}' starts programs (a job server, a cluster or workers), "
            "which a shared recipe may not do; a recipe may name DirectRunner, FnApiRunner or "
            f"BundleBasedDirectRunner: pass --runner={value} on the command line"
        )
    return runner.class_path


def parse_value(text: str, item: str | None = None) -> Any:
    """A --set value: YAML (safe_load) syntax (1, 0.5, true, [zh, en], plain words).  Invalid YAML
    (`[zh, en`) is refused in one line, never taken as a string."""
    where = f"--set '{item}'" if item is not None else f"value {text!r}"
    try:
        return load_bounded(text, where)  # yaml.safe_load, bounded as a recipe file is
    except YamlBoundError as exc:
        raise RecipeError(str(exc)) from None
    except (yaml.YAMLError, UnicodeError) as exc:
        problem = yaml_error_line(exc) if isinstance(exc, yaml.YAMLError) else "bytes that are not UTF-8"
        raise RecipeError(f"{where}: not valid YAML ({problem}); write a list as [a, b], "
                          "and quote a string YAML cannot read ('...')") from None


def load_recipe(path: str, overrides: list[str] | None = None) -> Recipe:
    """Read a recipe, resolve its paths and apply `--set STAGE.PARAM=VALUE` overrides."""
    if not os.path.lexists(path):
        raise RecipeError(f"recipe '{path}' not found; pass a YAML file such as pipelines/pretrain.yaml")
    try:
        data = read_regular_file(path, "recipe", MAX_RECIPE_BYTES)
        raw = load_bounded(data, path, max_bytes=MAX_RECIPE_BYTES) or {}
    except (YamlBoundError, BeamOptionError, UntrustedFileError) as exc:
        raise RecipeError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {yaml_error_line(exc)}") from None
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a recipe must be a mapping with 'input', 'output' and 'stages'")
    _refuse_unknown_keys(raw, RECIPE_KEYS, "", path)
    for key in ("name", "description"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            raise RecipeError(f"{path}: '{key}' must be a string, not {_shown(value)}")
    base = os.path.dirname(os.path.abspath(path))
    inp = raw.get("input") or {}
    if isinstance(inp, (str, list)):
        inp = {"paths": inp}
    if not isinstance(inp, dict):
        raise RecipeError(f"{path}: 'input' must be a mapping like {{paths: [data/*.jsonl]}}")
    _refuse_unknown_keys(inp, INPUT_KEYS, "input.", path)
    paths = inp.get("paths") or []
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise RecipeError(f"{path}: input.paths must be a file pattern or a list of them")
    for key in ("format", "text_field", "id_field"):
        if key in inp and not isinstance(inp[key], str):
            raise RecipeError(f"{path}: input.{key} must be a string, not {inp[key]!r}")
    if inp.get("format", "auto") not in INPUT_FORMATS:
        raise RecipeError(f"{path}: input.format '{inp['format']}' is not one of {', '.join(INPUT_FORMATS)}")
    inputs = [confine(base, p, "input path", path) for p in paths]
    output = raw.get("output", "out")
    if (not isinstance(output, str) or not output.strip() or "\0" in output or is_remote(output)
            or os.path.isabs(output) or ".." in output.replace(os.sep, "/").split("/")):
        raise RecipeError(f"{path}: 'output' must be a plain relative directory name; pass other locations with --output")
    stages = _as_stage_list(raw.get("stages"), path)
    for stage in stages:
        cls = _stage_class_or_error(stage.name, path)
        for key, spec in cls.params.items():
            if spec.is_path and isinstance(stage.params.get(key), str):
                stage.params[key] = confine(base, stage.params[key], f"{stage.name}.{key}", path)
            elif spec.is_path and isinstance(stage.params.get(key), list):  # a list of paths, each confined
                stage.params[key] = [confine(base, v, f"{stage.name}.{key}", path) if isinstance(v, str) else v
                                     for v in stage.params[key]]
    try:
        beam_args = recipe_beam_args(raw.get("beam"), path)  # runner choice and tuning only
    except BeamOptionError as exc:
        raise RecipeError(str(exc)) from None
    recipe = Recipe(
        path=path,
        name=str(raw.get("name") or os.path.splitext(os.path.basename(path))[0]),
        inputs=inputs,
        file_inputs=tuple(inputs),
        input_format=str(inp.get("format", "auto")),
        text_field=str(inp.get("text_field", "text")),
        id_field=str(inp.get("id_field", "id")),
        output=output,
        stages=stages,
        beam_args=beam_args,
    )
    for item in overrides or []:
        apply_override(recipe, item)
    check_parameters(recipe)
    return recipe


def _shown(value: Any, most: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= most else text[: most - 1] + "…"


def _refuse_unknown_keys(mapping: dict, known: tuple[str, ...], prefix: str, path: str) -> None:
    """One line naming the keys of `mapping` that are not `known` (YAML keys may be any scalar: 1, true, null)."""
    extra = [key for key in mapping if not isinstance(key, str) or key not in known]
    if extra:
        names = ", ".join(prefix + (key if isinstance(key, str) else _shown(key)) for key in extra)
        raise RecipeError(f"{path}: unknown key(s) {names} (known: {', '.join(prefix + k for k in sorted(known))})")


def recipe_output(recipe: Recipe, cwd: str | None = None) -> str:
    """The recipe's `output` as an absolute path under the working directory `cwd`, refused when
    links resolved lead outside it (an --output given on the command line is the user's choice)."""
    base = os.path.realpath(cwd or os.getcwd())
    resolved = os.path.realpath(os.path.join(base, recipe.output))
    if os.path.commonpath([base, resolved]) != base:
        raise RecipeError(f"{recipe.path}: 'output' '{recipe.output}' leads to {resolved}, outside the working "
                          f"directory {base} (a symbolic link); pass --output DIR to write there")
    return os.path.join(os.path.abspath(cwd or os.getcwd()), recipe.output)


def check_parameters(recipe: Recipe) -> None:
    """Each given stage parameter checked against its declared type: one line naming STAGE.PARAM."""
    for spec in recipe.stages:
        cls = _stage_class_or_error(spec.name, recipe.path)
        try:
            cls.check_params(spec.params)  # together: a value's allowed set may depend on the others
        except StageConfigError as exc:
            from_command_line = exc.param is not None and exc.param in spec.from_command_line
            raise RecipeError(str(exc) if from_command_line else f"{recipe.path}: {exc}") from None


def _stage_class_or_error(name: str, path: str) -> type[Stage]:
    try:
        return stage_class(name)
    except StageConfigError as exc:
        raise RecipeError(f"{path}: {exc}") from None


def apply_override(recipe: Recipe, item: str) -> None:
    """Apply one `STAGE.PARAM=VALUE` (or `input.KEY=VALUE`) to the recipe."""
    key, sep, value = item.partition("=")
    target, dot, param = key.partition(".")
    if not sep or not dot or not param:
        raise RecipeError(f"--set '{item}': expected STAGE.PARAM=VALUE, e.g. --set lang.min_score=0.6")
    parsed = parse_value(value, item)
    if target == "input":
        attr = {"format": "input_format", "text_field": "text_field", "id_field": "id_field"}.get(param)
        if attr is None:
            raise RecipeError(f"--set '{item}': input takes format, text_field, id_field (use --input for paths)")
        if parsed is None or isinstance(parsed, (list, dict)):
            raise RecipeError(f"--set '{item}': input.{param} must be a single name, got {parsed!r}")
        setattr(recipe, attr, str(parsed))
        return
    matches = [s for s in recipe.stages if s.name == target]
    if not matches:
        names = ", ".join(s.name for s in recipe.stages) or "none"
        raise RecipeError(f"--set '{item}': recipe {recipe.path} has no stage '{target}' (its stages: {names})")
    cls = _stage_class_or_error(target, recipe.path)
    if param not in cls.params:
        raise RecipeError(f"--set '{item}': {unknown_keys(f'stage {target!r}', [param], cls.params)}")
    if isinstance(parsed, str) and "\0" in parsed:
        raise RecipeError(f"--set '{key}=…': the value holds a NUL byte")
    if cls.params[param].is_path and isinstance(parsed, str) and not is_remote(parsed):
        parsed = os.path.abspath(parsed)
    elif cls.params[param].is_path and isinstance(parsed, list):
        parsed = [os.path.abspath(v) if isinstance(v, str) and not is_remote(v) else v for v in parsed]
    for spec in matches:
        spec.params[param] = parsed
        spec.from_command_line.add(param)
