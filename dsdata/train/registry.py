"""Rows by name for the trainer's extension points (attention kernels, optimizers)."""
from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import is_dataclass

from dsdata.core.params import Settings

log = logging.getLogger("dsdata.train")


class Registry:
    """Rows by name: the built-in ones, `register`ed ones, and the entry-point `group`'s, read on the
    first lookup.  `problem(row)` says why an object cannot be a row (None: it can).  A plugin that
    cannot be loaded, is no row or takes a name already there is a warning line; the rows stay."""

    def __init__(self, kind: str, group: str, problem, rows: dict):
        self.kind, self.group, self.problem = kind, group, problem
        self._rows = dict(rows)
        self._read = False

    def register(self, name: str, row) -> None:
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered ({self._rows[name]!r})")
        why = self.problem(row)
        config = getattr(row, "Config", None)
        if not why and not (isinstance(config, type) and issubclass(config, Settings) and is_dataclass(config)):
            why = "its Config must be a dataclass subclassing dsdata.core.params.Settings"
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
