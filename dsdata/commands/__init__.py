"""Sub-commands of `dsdata` beyond `run` and `stages`, one module each, imported on demand."""
from __future__ import annotations

import argparse
import difflib
import sys


class CommandParser(argparse.ArgumentParser):
    """argparse for a sub-command: one-line errors (exit 2), a mistyped flag named with the closest."""

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        sys.stderr.write(f"dsdata: error: {self.prog}: {self._mistyped_flag() or ' '.join(message.split())}\n")
        sys.exit(2)

    def _flags(self) -> list[str]:
        """This parser's long flags and its sub-commands' (a flag may be written before or after one)."""
        flags = []
        for action in self._actions:
            flags += [opt for opt in action.option_strings if opt.startswith("--")]
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 - argparse's only handle on them
                for sub in action.choices.values():
                    flags += sub._flags() if isinstance(sub, CommandParser) else []
        return flags

    def _mistyped_flag(self) -> str | None:
        flags = self._flags()
        for arg in getattr(self, "_given", []):
            if arg == "--":
                break
            name = arg.split("=", 1)[0]
            if not name.startswith("--") or name in flags or len([f for f in flags if f.startswith(name)]) == 1:
                continue
            close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
            return f"unknown option {name}" + (f"; did you mean {close[0]}?" if close else f" (see {self.prog} --help)")
        return None
