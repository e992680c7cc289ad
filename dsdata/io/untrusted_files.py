"""Reading files that arrive from others (manifests, trainer_state.json, a model folder's lm.json
and the files it names) under one set of rules, each refusal an `UntrustedFileError` (a ValueError)
whose text is one line naming the path:

* **Regular files only**, stat-ed before they are opened (a FIFO would block the reader for ever).
* **Confined names**: a plain relative path that stays inside its folder once links are resolved.
* **Bounded JSON**: at most `MAX_JSON_BYTES`, nested at most `MAX_JSON_DEPTH` levels (measured
  before parsing: Python's decoder recurses into a RecursionError).
* **Honest .npy headers**: the expected dtype (never object: no pickle), C order and a shape whose
  bytes are exactly the file's.
"""
from __future__ import annotations

import json
import os
import stat
from typing import Any, Sequence

from dsdata.core.names import shown_path  # names in messages as every line shows them

MAX_JSON_DEPTH = 64
MAX_JSON_BYTES = 256 << 20


class UntrustedFileError(ValueError):
    """A file that is not what it claims to be; one line naming it."""


FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")


def regular_file(path: str, what: str) -> str:
    """`path` when it is (or links to) a regular file; else UntrustedFileError, without opening it."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UntrustedFileError(f"{what} {shown_path(path)} does not exist") from None
    except OSError as exc:
        raise UntrustedFileError(f"{what} {shown_path(path)} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UntrustedFileError(f"{what} {shown_path(path)} is {_kind(info.st_mode)}, not a regular file")
    return path


def confined_path(directory: str, name: Any, what: str) -> str:
    """The path of `name` inside `directory` with links resolved; UntrustedFileError when the name is
    not a plain relative path or leads out of the folder.  (It need not exist.)"""
    if not isinstance(name, str) or not name or os.path.isabs(name) or "\x00" in name or "\\" in name:
        raise UntrustedFileError(f"{what}: {name!r} is not a plain relative file name inside {shown_path(directory)}")
    base = os.path.realpath(directory)
    resolved = os.path.realpath(os.path.join(base, name))
    if resolved == base or os.path.commonpath([base, resolved]) != base:
        raise UntrustedFileError(f"{what}: {name!r} escapes {shown_path(directory)}: it leads out of it to "
                                 f"{shown_path(resolved)}; refusing to follow it")
    return resolved


def confined_file(directory: str, name: Any, what: str) -> str:
    """The regular file `name` inside `directory` (confined_path), or UntrustedFileError."""
    return regular_file(confined_path(directory, name, what), what)


def json_depth_problem(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """'nested deeper than N levels' when brackets outside strings nest deeper than max_depth."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return None  # too few brackets to nest that deep: no scan
    depth, in_string, escaped = 0, False, False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels"
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return None


def loads_bounded(text: str | bytes, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads with the depth bound; UntrustedFileError (one line) for anything unparseable."""
    problem = json_depth_problem(text, max_depth)
    if problem:
        raise UntrustedFileError(f"{what}: {problem}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UntrustedFileError(f"{what}: not valid JSON ({' '.join(str(exc).split())})") from None


def read_regular_file(path: str, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file `path` (at most `max_bytes`, else UntrustedFileError): checked
    before it is opened, then opened with O_NONBLOCK (a FIFO swapped in meanwhile opens at once) and
    checked again on the open file."""
    regular_file(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise UntrustedFileError(f"{what} {shown_path(path)} is {_kind(mode)}, not a regular file")
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise UntrustedFileError(f"{what} {shown_path(path)} cannot be read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise UntrustedFileError(f"{what} {shown_path(path)} is over {max_bytes} bytes; a file here may hold at most "
                                 f"{max_bytes}")
    return data


def load_json_file(path: str, what: str, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON file read under the rules above."""
    return loads_bounded(read_regular_file(path, what, max_bytes), f"{what} {shown_path(path)}", max_depth)


def npy_header(path: str, what: str, dtype: str, shape: Sequence[int | None]) -> tuple[tuple[int, ...], int]:
    """(shape, offset of the data) of the .npy file `path` when its header says dtype `dtype` (e.g.
    "<u4"), C order and a shape matching `shape` (None: any length) whose bytes are exactly what the
    file holds after the header; else UntrustedFileError.  Reads the header only."""
    import numpy as np

    regular_file(path, what)
    try:
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                found, fortran, kind = np.lib.format.read_array_header_1_0(fh)
            elif version in ((2, 0), (3, 0)):
                found, fortran, kind = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unknown .npy version {version}")
            offset = fh.tell()
        size = os.stat(path).st_size
    except OSError as exc:
        raise UntrustedFileError(f"{what} {shown_path(path)} cannot be read: {exc.strerror or exc}") from None
    except (ValueError, SyntaxError, TypeError) as exc:  # not an .npy file, or a header numpy refuses
        raise UntrustedFileError(f"{what} {shown_path(path)} is not a .npy array file "
                                 f"({' '.join(str(exc).split())[:200]})") from None
    expected = np.dtype(dtype)
    if kind != expected or kind.hasobject:
        raise UntrustedFileError(f"{what} {shown_path(path)} holds {kind.str} values, not {expected.str}")
    if fortran:
        raise UntrustedFileError(f"{what} {shown_path(path)} is in Fortran order; expected C order")
    if len(found) != len(shape) or any(want is not None and got != want for got, want in zip(found, shape)):
        want = "(" + ", ".join("n" if w is None else str(w) for w in shape) + ")"
        raise UntrustedFileError(f"{what} {shown_path(path)} has shape {tuple(found)}, expected {want}")
    data_bytes = int(np.prod(found, dtype=object)) * expected.itemsize
    if data_bytes != size - offset:
        raise UntrustedFileError(f"{what} {shown_path(path)}: its header's shape {tuple(found)} needs {data_bytes} "
                                 f"bytes of data, the file holds {size - offset}")
    return tuple(found), offset


def load_npy(path: str, what: str, dtype: str, shape: Sequence[int | None]):
    """The array in `path`, its header checked first (npy_header): never more memory than the file's
    own size, never pickle."""
    import numpy as np

    found, offset = npy_header(path, what, dtype, shape)
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            count = int(np.prod(found, dtype=object))
            data = np.fromfile(fh, dtype=np.dtype(dtype), count=count)
    except OSError as exc:
        raise UntrustedFileError(f"{what} {shown_path(path)} cannot be read: {exc.strerror or exc}") from None
    if data.size != count:  # shrunk since its header was read
        raise UntrustedFileError(f"{what} {shown_path(path)} is shorter than its header says")
    return data.reshape(found)
