"""One parameter system for recipe stages (`params = {name: Param}`) and the trainer's config tables
(`Settings` dataclasses whose fields are Params, read by `parse`).  A type (`Integer`, `Choice` …)
returns the value to use or raises `BadValue`; `Param.coerce` turns that into one line naming the
parameter.  `str(type)` is what `dsdata stages` shows.
"""
from __future__ import annotations

import copy
import difflib
import math
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Collection, Iterable, NamedTuple


class ConfigError(ValueError):
    """A configuration mistake the user can fix, printed as one line; `param` names the parameter
    whose value was refused (None: not one parameter's)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class BadValue(ValueError):
    """A value a type refuses: `expect` completes 'must be …', or `sentence` replaces it; `hint`
    (" did you mean 'en'?") is added after the value."""

    def __init__(self, expect: str = "", sentence: str = "", hint: str = ""):
        super().__init__(sentence or expect)
        self.expect, self.sentence, self.hint = expect, sentence, hint


class Allowed(NamedTuple):
    """The values a parameter (each item, for a list) may take where the stage knows them: `source`
    completes "is not one of …" (e.g. "the languages model lid.176.ftz reports")."""

    values: Collection[Any]
    source: str


def near_miss(value: Any, candidates: Iterable[Any]) -> str:
    """'; did you mean X?' for a string close to one of `candidates` (strings), else ''.  A value
    holding a comma is also told how a list is written (`--set lang.keep=zh,en` is one string)."""
    if not isinstance(value, str):
        return ""
    words = [c for c in candidates if isinstance(c, str)]
    close = difflib.get_close_matches(value, words, n=1, cutoff=0.6)
    if "," in value:
        items = [part.strip() for part in value.split(",")]
        return f"; a list is written [{', '.join(items)}]"
    return f"; did you mean {close[0]!r}?" if close else ""


class ParamType:
    """Base of the declared types; `expect` completes the sentence 'PARAM must be …'."""

    expect = "a value"

    def check(self, value: Any) -> Any:
        return value

    def __str__(self) -> str:
        return self.expect


def _is_number(value: Any) -> bool:
    # YAML true/false are Python bools, which are ints; a flag is never a count or a ratio.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fmt(x: float) -> str:
    return f"{x:g}"


class Boolean(ParamType):
    expect = "true or false"

    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise BadValue(self.expect)
        return value


class Integer(ParamType):
    """An int in [min, max]; `where` adds a condition that `expect` then describes."""

    def __init__(self, min: int | None = None, max: int | None = None,
                 where: Callable[[int], bool] | None = None, expect: str = ""):
        self.min, self.max, self.where = min, max, where
        if expect:
            self.expect = expect
        elif min == 1 and max is None:
            self.expect = "a positive integer"
        elif min == 0 and max is None:
            self.expect = "a non-negative integer"
        elif min is not None and max is not None:
            self.expect = f"an integer between {min} and {max}"
        elif min is not None:
            self.expect = f"an integer >= {min}"
        else:
            self.expect = "an integer"

    def check(self, value: Any) -> int:
        if (not isinstance(value, int) or isinstance(value, bool)
                or (self.min is not None and value < self.min) or (self.max is not None and value > self.max)
                or (self.where is not None and not self.where(value))):
            raise BadValue(self.expect)
        return value


class Number(ParamType):
    """An int or float in [min, max] (open ends with `open_min` / `open_max`), returned as float."""

    def __init__(self, min: float | None = None, max: float | None = None,
                 open_min: bool = False, open_max: bool = False):
        self.min, self.max, self.open_min, self.open_max = min, max, open_min, open_max
        if min is not None and max is not None:
            if open_min and open_max:
                self.expect = f"a number strictly between {_fmt(min)} and {_fmt(max)}"
            else:
                self.expect = f"a number between {_fmt(min)} and {_fmt(max)}"
                if open_min or open_max:
                    self.expect += f", {_fmt(min) if open_min else _fmt(max)} excluded"
        elif min == 0 and open_min:
            self.expect = "a positive number"
        elif min == 0:
            self.expect = "a non-negative number"
        elif min is not None:
            self.expect = f"a number {'>' if open_min else '>='} {_fmt(min)}"
        else:
            self.expect = "a number"

    def check(self, value: Any) -> float:
        if not _is_number(value) or not math.isfinite(value):
            raise BadValue(self.expect)
        v = float(value)
        if self.min is not None and (v < self.min or (self.open_min and v == self.min)):
            raise BadValue(self.expect)
        if self.max is not None and (v > self.max or (self.open_max and v == self.max)):
            raise BadValue(self.expect)
        return v


class Text(ParamType):
    """A string; `pattern` (a regex the whole string must match) and `expect` narrow it."""

    def __init__(self, nonempty: bool = False, pattern: str | None = None, expect: str = ""):
        self.nonempty = nonempty
        self.pattern = re.compile(pattern) if pattern else None
        self.expect = expect or ("a non-empty string" if nonempty else "a string")

    def check(self, value: Any) -> str:
        if (not isinstance(value, str) or (self.nonempty and not value)
                or (self.pattern is not None and not self.pattern.fullmatch(value))):
            raise BadValue(self.expect)
        return value


def _yaml_word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


class Choice(ParamType):
    """One of fixed values, or of a registry's names (read when a value is checked); `aliases` maps
    values of earlier recipes to their current names."""

    def __init__(self, values: Iterable[Any], expect: str = "", aliases: dict[Any, Any] | None = None):
        self._values = values if hasattr(values, "register") else tuple(values)
        self.aliases = list((aliases or {}).items())
        self._expect = expect

    @property
    def values(self) -> tuple[Any, ...]:
        return tuple(self._values)

    @property
    def expect(self) -> str:
        return self._expect or f"one of {', '.join(_yaml_word(v) for v in self.values)}"

    def check(self, value: Any) -> Any:
        for given, result in [*self.aliases, *((v, v) for v in self.values)]:
            if type(given) is type(value) and given == value:  # YAML 1 must not pass for true (1 == True)
                return result
        raise BadValue(self.expect, hint=near_miss(value, (_yaml_word(v) for v in self.values)))


class ListOf(ParamType):
    """A list whose items all pass `item`; `single` also takes one bare item as a one-item list."""

    def __init__(self, item: ParamType, length: int | None = None, nonempty: bool = False, single: bool = False):
        self.item, self.length, self.nonempty, self.single = item, length, nonempty, single
        size = f"a list of {length}" if length is not None else ("a non-empty list" if nonempty else "a list")
        self.expect = f"{size} (each {item.expect})"

    def check(self, value: Any) -> list[Any]:
        if self.single and not isinstance(value, (list, tuple)):
            value = [value]
        if (not isinstance(value, (list, tuple)) or (self.length is not None and len(value) != self.length)
                or (self.nonempty and not value)):
            raise BadValue(self.expect)
        try:
            return [self.item.check(v) for v in value]
        except BadValue as bad:
            raise BadValue(self.expect, hint=bad.hint) from None


class MappingOf(ParamType):
    """A mapping whose keys pass `key` and values pass `value` (None: any YAML value)."""

    def __init__(self, key: ParamType, value: ParamType | None = None, expect: str = ""):
        self.key, self.value = key, value
        self.expect = expect or (f"a mapping of {key.expect} to {value.expect}" if value is not None
                                 else f"a mapping whose keys are each {key.expect}")

    def check(self, value: Any) -> dict[Any, Any]:
        if not isinstance(value, dict):
            raise BadValue(self.expect)
        try:
            return {self.key.check(k): (self.value.check(v) if self.value is not None else v)
                    for k, v in value.items()}
        except BadValue:
            raise BadValue(self.expect) from None


class Path(ParamType):
    """A file or directory path; remote URLs are not checked.  must_exist: "any" | "dir" | None.
    missing: the sentence after an absent path.  resolve: maps the given path to the one used."""

    expect = "a path"

    def __init__(self, must_exist: str | None = None, missing: str = "", resolve: Callable[[str], str] | None = None):
        self.must_exist, self.resolve = must_exist, resolve
        self.missing = missing or ("is not a directory" if must_exist == "dir" else "does not exist")
        if must_exist == "dir":
            self.expect = "a directory"
        elif must_exist:
            self.expect = "an existing path"

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise BadValue(self.expect)
        if self.resolve is not None:
            value = self.resolve(value)
        if self.must_exist and "://" not in value:
            exists = os.path.isdir(value) if self.must_exist == "dir" else os.path.exists(value)
            if not exists:
                raise BadValue(sentence=f"'{value}' {self.missing}")
        return value


class AnyOf(ParamType):
    """The first of several types that accepts the value."""

    def __init__(self, *types: ParamType, expect: str = ""):
        self.types = types
        self.expect = expect or " or ".join(t.expect for t in types)

    def check(self, value: Any) -> Any:
        for t in self.types:
            try:
                return t.check(value)
            except BadValue:
                continue
        raise BadValue(self.expect)


@dataclass(frozen=True)
class Param:
    """One parameter: default, a one-line help, its type.  nullable: null (None) is accepted as 'off'.
    choices: given every parameter's checked value, the `Allowed` values of this one (each item, for
    a list), or None where they are not known."""

    default: Any
    help: str
    type: ParamType
    nullable: bool = False
    choices: Callable[[dict[str, Any]], Allowed | None] | None = None

    @property
    def is_path(self) -> bool:
        """A path, or a list of paths (each resolved the same way)."""
        return isinstance(self.type, Path) or (isinstance(self.type, ListOf) and isinstance(self.type.item, Path))

    def describe(self) -> str:
        expect = str(self.type)
        if not self.nullable:
            return expect
        return f"{expect}, or null" if " or " in expect else f"{expect} or null"

    def coerce(self, key: str, value: Any) -> Any:
        """The value to use for parameter `key` (STAGE.PARAM, TABLE.KEY), or ConfigError in one line."""
        if value is None and self.nullable:
            return None
        try:
            return self.type.check(value)
        except BadValue as bad:
            param = key.rpartition(".")[2]
            if bad.sentence:
                raise ConfigError(f"{key} {bad.sentence}{bad.hint}", param) from None
            raise ConfigError(f"{key} must be {self.describe()}, got {value!r}{bad.hint}", param) from None

    def check_choices(self, key: str, value: Any, values: dict[str, Any]) -> None:
        """Refuse a checked `value` (or item of it) outside `choices(values)`, in one line."""
        allowed = None if self.choices is None or value is None else self.choices(values)
        if allowed is None:
            return
        for item in value if isinstance(value, list) else [value]:
            if item not in allowed.values:
                raise ConfigError(f"{key}: {item!r} is not one of {allowed.source}"
                                  f"{near_miss(item, allowed.values)}", key.rpartition(".")[2])


def unknown_keys(what: str, unknown: Iterable[str], known: Iterable[str]) -> str:
    """"WHAT has no parameter 'x' (it takes: a, b); did you mean 'a'?" """
    unknown, known = sorted(unknown), sorted(known)
    return (f"{what} has no parameter {', '.join(map(repr, unknown))} (it takes: {', '.join(known) or 'none'})"
            f"{near_miss(unknown[0], known)}")


class Options(ParamType):
    """The options (a `Settings` table) of the row of `registry` that the sibling parameter `selector`
    names: an attention kernel or an optimizer brings its own options class with its row."""

    expect = "a table"

    def __init__(self, registry: Any, selector: str):
        self.registry, self.selector = registry, selector


class Settings:
    """Base of a trainer table: a dataclass whose fields are declared `name: type = Param(…)`;
    `check` holds the rules across fields (raise ValueError with one line).  A default of None means
    "unset" (derived from other keys): TOML has no null, so a given value is always checked."""

    legacy_prefix: ClassVar[str] = ""  # the flat key prefix these options had before their own table

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        for name in cls.__dict__.get("__annotations__", {}):
            spec = cls.__dict__.get(name)
            if isinstance(spec, Param):  # the dataclass field: its default, and the Param in its metadata
                default = ({"default_factory": lambda d=spec.default: copy.deepcopy(d)}
                           if isinstance(spec.default, (dict, list)) else {"default": spec.default})
                setattr(cls, name, field(**default, metadata={"param": spec}))

    def __post_init__(self) -> None:
        for spec, kind in _options(type(self)):  # unset options: the defaults of the selected row
            row = kind.registry.get(getattr(self, kind.selector))
            if getattr(self, spec.name) is None and row is not None:
                setattr(self, spec.name, row.Config())

    def check(self, where: str) -> None:
        pass


@dataclass
class NoOptions(Settings):
    """The options of a kernel or optimizer that has none: its table must be empty."""


def _options(cls: type) -> list[tuple[Any, Options]]:
    return [(f, f.metadata["param"].type) for f in fields(cls) if isinstance(f.metadata["param"].type, Options)]


def parse(cls: type, values: Any, where: str) -> Any:
    """The Settings instance `cls(**values)` with every parameter checked; `where` names the table."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a table, got {values!r}")
    params = {f.name: f.metadata["param"] for f in fields(cls)}
    unknown = set(values) - set(params)
    if unknown:
        raise ConfigError(_moved(cls, where, unknown) or unknown_keys(f"[{where}]", unknown, params))
    checked = {key: params[key].coerce(f"{where}.{key}", value) for key, value in values.items()
               if not isinstance(params[key].type, Options)}
    for spec, kind in _options(cls):
        row = kind.registry[checked.get(kind.selector, params[kind.selector].default)]
        checked[spec.name] = parse(row.Config, values.get(spec.name, {}), f"{where}.{spec.name}")
    try:
        instance = cls(**checked)
        instance.check(where)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return instance


def _moved(cls: type, where: str, unknown: set[str]) -> str:
    """A flat key that moved into a kernel's or optimizer's own table, named with its new place."""
    for spec, kind in _options(cls):
        for name, row in kind.registry.items():
            prefix, own = row.Config.legacy_prefix, {f.name for f in fields(row.Config)}
            for key in sorted(k for k in unknown if k.startswith(prefix) and k[len(prefix):] in own):
                return (f"{where}.{key} is now {where}.{spec.name}.{key[len(prefix):]} (the options of "
                        f"{where}.{kind.selector} = \"{name}\" have their own table)")
    return ""
