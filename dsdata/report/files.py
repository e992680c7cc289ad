"""The few file operations the report needs: local paths with os and glob, a remote one
(`scheme://...`) through the store dsdata's Beam side registers, so this package imports no Beam.
"""
from __future__ import annotations

import os
from typing import IO, Protocol

from dsdata.core.names import is_remote


class RunFiles(Protocol):
    """A file store: what the report does with a run's directory."""

    def join(self, base: str, *parts: str) -> str: ...
    def exists(self, path: str) -> bool: ...
    def open(self, path: str) -> IO[bytes]: ...  # binary, seekable (pyarrow reads Parquet footers)
    def create(self, path: str) -> IO[bytes]: ...
    def files_in(self, folder: str, suffix: str) -> list[str]: ...  # the files directly in `folder` named *SUFFIX
    def delete(self, paths: list[str]) -> None: ...


class LocalFiles:
    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def open(self, path: str) -> IO[bytes]:
        return open(path, "rb")

    def create(self, path: str) -> IO[bytes]:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return open(path, "wb")

    def files_in(self, folder: str, suffix: str) -> list[str]:
        # listed, not globbed: OUT's own name may hold *, ? or [
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
        return sorted(os.path.join(folder, n) for n in names if n.endswith(suffix) and not n.startswith("."))

    def delete(self, paths: list[str]) -> None:
        for path in paths:
            os.remove(path)


class RemoteOutputError(RuntimeError):
    """A remote run output with no remote store registered (dsdata's Beam side not loaded)."""


LOCAL = LocalFiles()
_remote: RunFiles | None = None


def register_remote_files(store: RunFiles) -> None:
    """Serve `scheme://` paths from `store` (dsdata/beam/run_files.py registers Beam's FileSystems)."""
    global _remote
    _remote = store


def files_for(path: str) -> RunFiles:
    """The store that serves `path`: local files here, a remote path through the registered store."""
    if not is_remote(path):
        return LOCAL
    if _remote is None:
        raise RemoteOutputError(f"{path} is remote: reading it needs dsdata's Beam side "
                                "(import dsdata.beam.run_files, as `dsdata run` and `dsdata report` do)")
    return _remote
