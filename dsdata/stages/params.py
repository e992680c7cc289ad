"""Declared types of stage parameters: each checks (and where it must, converts) one value.

A type either returns the value to use or raises `BadValue`; the stage base class turns that into
one line naming the parameter, e.g. `lang.min_score must be a number between 0 and 1, got 'abc'`.
Recipe values and `--set` values (parsed as YAML scalars and lists) go through the same check,
once, before any pipeline is built.  `str(type)` is what `dsdata stages` shows.

Values a stage knows only from its other parameters (the labels of the language model it is given)
are declared as an `Allowed` set by the parameter's `choices` (dsdata/stages/base.py `Param`).  A
value close to an accepted one is answered with "did you mean …?" (`near_miss`).
"""
from __future__ import annotations

import difflib
import os
import re
from typing import Any, Callable, Collection, Iterable, NamedTuple


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
        if not _is_number(value):
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
    """One of fixed values; `aliases` maps values of earlier recipes to their current names."""

    def __init__(self, values: Iterable[Any], expect: str = "", aliases: dict[Any, Any] | None = None):
        self.values = tuple(values)
        self.aliases = [(k, v) for k, v in (aliases or {}).items()]
        self.expect = expect or f"one of {', '.join(_yaml_word(v) for v in self.values)}"

    @staticmethod
    def _find(value: Any, candidates: Iterable[Any]) -> tuple[bool, Any]:
        # Compare types too: YAML 1 must not pass for true (1 == True in Python).
        for candidate in candidates:
            if type(candidate) is type(value) and candidate == value:
                return True, candidate
        return False, None

    def check(self, value: Any) -> Any:
        for alias, current in self.aliases:
            if type(alias) is type(value) and alias == value:
                return current
        found, candidate = self._find(value, self.values)
        if not found:
            raise BadValue(self.expect, hint=near_miss(value, (_yaml_word(v) for v in self.values)))
        return candidate


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
    """A file or directory path.  Recipe paths are resolved against the recipe's folder first (and
    may not leave it); remote URLs (gs://, s3://) are not checked on this machine.

    must_exist: "any" | "dir" | None.  missing: the sentence after the path when it is absent.
    resolve: maps the given path to the one used (before the existence check)."""

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
