"""Typed settings: the trainer's config tables, an attention kernel's and an optimizer's options.

A settings class is a dataclass whose fields declare their own checks (`setting(default, bound=…,
choices=…)`); `parse` turns a TOML table into one, generically: types coerced, unknown keys, ranges
and choices refused in one line naming the key.  A field `options_for(registry, selector)` holds the
typed options of the registry row that the sibling field `selector` names (model.attention_config,
optimizer.config), so a kernel or an optimizer brings its options class with its row.
"""
from __future__ import annotations

import importlib.metadata
import logging
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, get_args, get_type_hints


log = logging.getLogger("dsdata.train")


class ConfigError(ValueError):
    """A configuration mistake the user can fix (printed as one line)."""


@dataclass(frozen=True)
class Bound:
    """A numeric key's allowed range: low (inclusive unless low_open), high (exclusive) or none."""

    low: float
    low_open: bool = False
    high: float | None = None

    def admits(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and (self.high is None or value < self.high)

    def __str__(self) -> str:
        low = f"{'>' if self.low_open else '>='} {self.low:g}"
        return low if self.high is None else f"{low} and < {self.high:g}"


POSITIVE, SIZE, COUNT, FRACTION = Bound(0, low_open=True), Bound(1), Bound(0), Bound(0, high=1)
ANY_INTEGER = Bound(-math.inf)  # seeds


def setting(default: Any, bound: Bound | None = None, choices=None):
    """A field with its check: `bound` for numbers (every numeric field has one), `choices` for a
    string (a tuple, or a Registry, whose names are read when a config is checked)."""
    return field(default=default, metadata={"bound": bound, "choices": choices})


def options_for(registry: dict, selector: str):
    """A field holding the options (an instance of the row's `Config`) of `registry[self.<selector>]`."""
    return field(default=None, metadata={"registry": registry, "selector": selector})


class Settings:
    """Base of every settings dataclass: `check` for rules across fields (one line, ValueError)."""

    legacy_prefix = ""  # the flat key prefix these options had before they got their own table

    def check(self, where: str) -> None:
        pass


@dataclass
class NoOptions(Settings):
    """The options of a kernel or optimizer that has none: its table must be empty."""


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", dict: "a table", list: "an array"}


def _coerce(where: str, kind: type, value: Any) -> Any:
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConfigError(f"{where} must be {_KIND_NAMES.get(kind, kind.__name__)}, got {value!r}")
    return value


def _check_value(where: str, spec, value: Any) -> None:
    """A declared field's bound and choices (spec: a dataclass field)."""
    bound, choices = spec.metadata.get("bound"), spec.metadata.get("choices")
    if value is None:  # an optional key left unset: derived from others (model.n_kv_heads)
        return
    if bound is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and bound.admits(value)):
        raise ConfigError(f"{where} must be {bound}, got {value!r}")
    if choices is not None and value not in choices:
        raise ConfigError(f"{where} = {value!r}; choose {one_of(choices)}")


def one_of(choices) -> str:
    """'a, b or c'."""
    names = list(choices)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _default(spec) -> Any:
    return spec.default_factory() if spec.default is MISSING else spec.default


def parse(cls, values: Any, where: str):
    """The settings instance `cls(**values)` with every field checked; `where` names the table."""
    if not isinstance(values, dict):
        raise ConfigError(f"[{where}] must be a table")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(_unknown_message(cls, where, unknown))
    hints = get_type_hints(cls)
    coerced = {}
    for key, value in values.items():
        spec = known[key]
        if "registry" in spec.metadata:
            continue  # parsed below, once the selector is known
        default = _default(spec)
        # int | None keys (n_kv_heads, ffn_hidden_dim) default to None ("derived"): a given value is an int.
        kind = type(default) if default is not None else next(t for t in get_args(hints[key]) if t is not type(None))
        coerced[key] = _coerce(f"{where}.{key}", kind, value)
    for key, spec in known.items():
        value = coerced.get(key, _default(spec))
        if "registry" not in spec.metadata:
            _check_value(f"{where}.{key}", spec, value)
            continue
        registry, selector = spec.metadata["registry"], spec.metadata["selector"]
        row = registry.get(coerced.get(selector, _default(known[selector])))
        if row is not None:  # an unknown selector was refused by its choices above
            coerced[key] = parse(row.Config, values.get(key, {}), f"{where}.{key}")
    try:
        instance = cls(**coerced)
        instance.check(where)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return instance


def _unknown_message(cls, where: str, unknown: list[str]) -> str:
    """Unknown keys; a flat key that moved into a kernel's or optimizer's own table names its new place."""
    for spec in fields(cls):
        if "registry" not in spec.metadata:
            continue
        for name, row in spec.metadata["registry"].items():
            prefix = row.Config.legacy_prefix
            moved = [k for k in unknown if k.startswith(prefix) and k[len(prefix):] in {f.name for f in fields(row.Config)}]
            if moved:
                key = moved[0]
                return (f"{where}.{key} is now {where}.{spec.name}.{key[len(prefix):]} (the options of "
                        f"{where}.{spec.metadata['selector']} = \"{name}\" have their own table)")
    return f"[{where}] has unknown key(s) {unknown}; known: {sorted(f.name for f in fields(cls))}"


class Registry:
    """Rows by name (attention kernels, optimizers): the built-in ones given here, `register`ed ones,
    and those installed distributions declare in the entry-point `group` (`name = "module:object"`),
    read on the first lookup (a plugin module may import the module that holds the registry).

    `problem(row)` says why an object cannot be a row (None: it can).  A plugin never breaks the
    built-in rows: one that cannot be loaded, is no row, or takes a name already there is a warning
    line, and the registry keeps what it had."""

    def __init__(self, kind: str, group: str, problem, rows: dict):
        self.kind, self.group, self.problem = kind, group, problem
        self._rows = dict(rows)
        self._read = False

    def register(self, name: str, row) -> None:
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered ({self._rows[name]!r})")
        why = self.problem(row)
        if why:
            raise ValueError(f"{self.kind} {name!r}: {why}")
        self._rows[name] = row

    def _all(self) -> dict:
        if not self._read:
            self._read = True
            for ep in importlib.metadata.entry_points(group=self.group):
                try:
                    self.register(ep.name, ep.load())
                except Exception as exc:  # noqa: BLE001 - a broken plugin is one line, never a traceback
                    log.warning("%s entry point %s = %r not used: %s: %s", self.kind, ep.name, ep.value,
                                type(exc).__name__, exc)
        return self._rows

    def __contains__(self, name) -> bool:
        return name in self._all()

    def __getitem__(self, name: str):
        return self._all()[name]

    def get(self, name: str, default=None):
        return self._all().get(name, default)

    def __iter__(self):
        return iter(list(self._all()))

    def items(self):
        return list(self._all().items())
