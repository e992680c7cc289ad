"""Input paths as the user gives them → the file patterns the pipeline reads: directories expanded,
each local file once, only regular files read, whatever is left out listed (docs/input-damage.md).
"""
from __future__ import annotations

import fnmatch
import glob
import os
import stat
from dataclasses import dataclass, field

from dsdata.io import local_paths
from dsdata.io.readers import InputFormatError, detect_format
from dsdata.io.untrusted_files import FILE_KINDS
from dsdata.core.names import shown_path


class InputPathError(ValueError):
    """An input path that names nothing to read (an empty directory, a dangling link, a FIFO)."""


@dataclass
class ExpandedInputs:
    patterns: list[str]
    skipped: list[str] = field(default_factory=list)  # files in given directories with no known format
    # (path, why): matched paths that are not regular files (FIFO, socket, device, dangling link)
    not_read: list[tuple[str, str]] = field(default_factory=list)
    # (path, the spelling read): files and directories matched again under another name
    duplicates: list[tuple[str, str]] = field(default_factory=list)
    not_followed: list[str] = field(default_factory=list)  # links to directories inside input directories
    # (folder, why): folders inside input directories that could not be listed; each is read as a
    # file, whose open fails, so it is one `unreadable_file` row (never silently absent)
    not_listed: list[tuple[str, str]] = field(default_factory=list)
    # files under the run's output directory, which lies inside an input directory: never inputs
    # (a second run would read the first one's outputs)
    in_output: list[str] = field(default_factory=list)


def _not_a_file(path: str) -> str | None:
    """Why `path` (not a directory) is not a regular file to read, or None when it is one (or cannot be
    examined: opening it then gives the reader's `unreadable_file` row with the system's reason)."""
    try:
        mode = local_paths.path_stat(path).st_mode
    except FileNotFoundError:
        if local_paths.is_link(path):
            return f"a symbolic link to {shown_path(local_paths.read_link(path))!r}, which does not exist"
        return None
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = next((name for test, name in FILE_KINDS if test(mode)), "of another kind")
    return f"not a regular file but {kind}"


def local_glob(pattern: str) -> list[str]:
    """What a local glob matches, sorted.  A `**` glob is matched against local_paths.walk_files (the
    folders that cannot be listed included): Python's glob silently stops at PATH_MAX or at a folder
    it cannot read."""
    parts = pattern.split(os.sep)
    if "**" not in parts:
        return sorted(glob.glob(pattern))
    first_magic = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    root = os.sep.join(parts[:first_magic]) or ("." if not pattern.startswith(os.sep) else os.sep)
    wanted = parts[first_magic:]
    if not local_paths.is_dir(root):
        return []
    try:
        listing = local_paths.walk_files(root)
    except OSError:
        return []
    found = []
    unlisted = {folder for folder, _ in listing.not_listed}
    for path in listing.files + sorted(unlisted):
        names = os.path.relpath(path, root).split(os.sep) if root != "." else os.path.normpath(path).split(os.sep)
        # A folder that cannot be listed, where the glob could match something, goes on as a match:
        # expanding it makes it its unreadable_file row.
        if any(glob_match(wanted, names[:k]) for k in range(len(names), 0, -1)) or (
                path in unlisted and _glob_prefix(wanted, names)):
            found.append(path if root != "." else os.path.normpath(path))
    return sorted(found)


def _glob_prefix(pattern: list[str], names: list[str]) -> bool:
    """Whether glob components `pattern` could match something inside the folder `names`."""
    if not names:
        return bool(pattern)
    if not pattern:
        return False
    if pattern[0] == "**":
        return True
    return fnmatch.fnmatchcase(names[0], pattern[0]) and _glob_prefix(pattern[1:], names[1:])


def glob_match(pattern: list[str], names: list[str]) -> bool:
    """Whether path components `names` match glob components `pattern` (`**`: any number of them)."""
    if not pattern:
        return not names
    if pattern[0] == "**":
        return glob_match(pattern[1:], names) or (bool(names) and glob_match(pattern, names[1:]))
    return bool(names) and fnmatch.fnmatchcase(names[0], pattern[0]) and glob_match(pattern[1:], names[1:])


def _has_format(path: str) -> bool:
    """Whether a file found in an input directory is read with format auto: its name gives a data
    format (.txt/.md there are READMEs and notes)."""
    try:
        return detect_format(path) != "text"
    except InputFormatError:
        return False


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


_real = local_paths.real_path


def _identity(path: str) -> tuple[int, int] | str:
    """The file itself: its device and inode (hard links to one file are one file), else its real path."""
    try:
        st = local_paths.path_stat(path)
    except OSError:
        return _real(path)
    return (st.st_dev, st.st_ino)


def expand_directories(patterns: list[str], fmt: str = "auto", confine_to: str | None = None,
                       output: str | None = None) -> ExpandedInputs:
    """Replace every local directory (given, or matched by a glob) by the files under it, each local
    file once.  confine_to: a recipe's directory, which every file read must lie inside with links
    resolved, else InputPathError.  output: the run's local OUT: its files found in a directory or by
    a glob are not read (`in_output`); an input named by itself that lies in OUT is an InputPathError."""
    expansion = _Expansion(fmt, confine_to, output)
    for pattern in patterns:
        expansion.add(pattern)
    out = expansion.out
    if not out.patterns and out.not_read:
        raise InputPathError(f"no regular file to read among the inputs: {_listed(_why(out.not_read))}; "
                             "pass regular files or directories")
    return out


class _Expansion:
    """expand_directories' state: what it found so far (`out`), the files taken by identity and
    the directories walked by real path, so that each file is read once."""

    def __init__(self, fmt: str, confine_to: str | None, output: str | None):
        self.out = ExpandedInputs([])
        self.fmt, self.output = fmt, output
        self.seen: dict[tuple[int, int] | str, str] = {}  # a file (device, inode) → the spelling read
        self.walked: dict[str, str] = {}  # real path of a directory expanded → the spelling expanded
        self.base = _real(confine_to) if confine_to is not None else None
        self.out_real = _real(output) if output is not None and "://" not in output else None

    def in_output(self, path: str, real: str | None = None) -> bool:
        if self.out_real is None or not _inside(real or _real(path), self.out_real):
            return False
        self.out.in_output.append(path)
        return True

    def take(self, path: str) -> bool:
        """Whether `path` is a file to read now: a regular file not read under another name."""
        why = _not_a_file(path)
        if why is not None:
            self.out.not_read.append((path, why))
            return False
        if self.in_output(path):
            return False
        if self.base is not None and not _inside(_real(path), self.base):
            raise InputPathError(
                f"recipe input '{path}' is, with links resolved, {_real(path)}: outside the recipe's directory "
                f"{self.base}; a recipe reads only its own files: remove the link, or give the input on the "
                "command line (--input)")
        key = _identity(path)
        if key in self.seen:
            self.out.duplicates.append((path, self.seen[key]))
            return False
        self.seen[key] = path
        return True

    def add(self, pattern: str) -> None:
        """One --input value (or recipe path): a remote pattern, a named file or folder, or a glob."""
        out = self.out
        if "://" in pattern:
            out.patterns.append(pattern)
            return
        if "\0" in pattern:
            raise InputPathError(f"input path {pattern!r} holds a NUL byte; no file name can")
        named = not glob.has_magic(pattern)
        if named and self.out_real is not None and _inside(_real(pattern), self.out_real):
            raise InputPathError(f"input '{shown_path(pattern)}' lies in the output directory "
                                 f"{shown_path(self.output)}, which the run replaces; pass another --output")
        if named:
            why = None if local_paths.is_dir(pattern) else _not_a_file(pattern)
            if why is not None:
                raise InputPathError(f"input '{pattern}' is {why}; pass regular files or directories "
                                     "(write a stream to a file first)")
            if not local_paths.is_dir(pattern):
                if self.take(pattern) or not local_paths.exists(pattern, follow_symlinks=False):
                    out.patterns.append(pattern)  # a missing path is the caller's to report
                return
            matches = [pattern]
        else:
            matches = local_glob(pattern)
        chosen: list[str] = []
        # Files before directories, and within each the links last: a link to a file or directory that
        # the same glob also names is the repeat, not the file or directory itself.
        for match in sorted(matches, key=lambda m: (local_paths.is_dir(m), local_paths.is_link(m))):
            if not local_paths.is_dir(match):
                if self.take(match):
                    chosen.append(match)
                continue
            chosen.extend(self._directory(match, pattern, named))
        # Every local glob is handed on as the files chosen here, never to Beam's matcher (its fnmatch
        # takes hidden files), so globs and folders select by the same rules; a name with [, * or ?
        # is escaped, since Beam matches every input as a pattern.
        out.patterns.extend(glob.escape(f) if glob.has_magic(f) else f for f in chosen)

    def _directory(self, match: str, pattern: str, named: bool) -> list[str]:
        """The files to read in the directory `match` (named by `pattern`), each recorded once."""
        out = self.out
        real = _real(match)
        if self.in_output(match, real):
            return []
        holder = next((w for w in self.walked if _inside(real, w)), None)
        if holder is not None:
            out.duplicates.append((match, self.walked[holder]))
            return []
        if not named and local_paths.is_link(match) and _inside(_real(os.path.dirname(os.path.abspath(match))), real):
            out.not_followed.append(match)  # a link to a directory holding it: a cycle
            return []
        self.walked[real] = match
        try:
            listing = local_paths.walk_files(match)
        except OSError as exc:
            if match == pattern:
                raise InputPathError(f"input directory '{shown_path(pattern)}' cannot be listed: "
                                     f"{exc.strerror or exc}") from None
            listing = local_paths.Listing(not_listed=[(match, exc.strerror or str(exc))])
        files = listing.files
        if self.out_real is not None and _inside(self.out_real, real):
            # OUT inside this folder: its files are told by their place under the folder (walk_files
            # follows no link to a directory), a link to a file by where it leads (take).
            files = [f for f in files if not self.in_output(f, os.path.join(real, os.path.relpath(f, match)))]
        out.not_followed.extend(listing.dir_links)
        out.not_listed.extend(listing.not_listed)
        chosen = [folder for folder, _ in listing.not_listed]
        regular = [f for f in files if _not_a_file(f) is None]
        readable = regular if self.fmt != "auto" else [f for f in regular if _has_format(f)]
        if not readable and not listing.not_listed and match == pattern:
            what = ("no files" if not files else
                    f"no regular file ({len(files)} other entries)" if not regular else
                    f"no file whose name gives its format ({len(files)} other files)")
            raise InputPathError(f"input directory '{pattern}' holds {what}; "
                                 "pass --format FMT to read files by content type, or another --input")
        kept = set(readable)
        out.skipped.extend(f for f in regular if f not in kept)
        regular_set = set(regular)
        for f in sorted(files, key=local_paths.is_link):
            if f not in regular_set:
                self.take(f)  # records why it is not read
            elif f in kept and self.take(f):
                chosen.append(f)
        return chosen


def resolve_recipe_inputs(recipe, confined: bool, output: str | None = None) -> ExpandedInputs:
    """Check and expand `recipe.inputs` in place, the one path every run takes: no input or a local
    pattern matching nothing is an InputPathError; `confined` (the recipe file's own inputs) keeps
    every file read inside the recipe's folder.  Sets `recipe.inputs` and `recipe.inputs_left_out`;
    returns the expansion, whose notes are the caller's to print."""
    if not recipe.inputs:
        raise InputPathError(f"no input: {recipe.path} names no input.paths; pass --input GLOB")
    for pattern in recipe.inputs:
        if "://" not in pattern and not (local_glob(pattern) if glob.has_magic(pattern)
                                         else local_paths.exists(pattern, follow_symlinks=False)):
            raise InputPathError(f"no files match input '{pattern}'; check the path or pass --input GLOB")
    expanded = expand_directories(recipe.inputs, recipe.input_format,
                                  confine_to=recipe.directory if confined else None, output=output)
    recipe.inputs = expanded.patterns
    recipe.inputs_left_out = left_out(expanded)
    recipe.inputs_checked = True
    return expanded


_LEFT_OUT_LISTED = 1000  # paths listed per kind in stats.json; the count is always whole


def left_out(expanded: ExpandedInputs) -> dict:
    """stats.json's "inputs_left_out": each kind of matched path not read, as a count and (up to
    _LEFT_OUT_LISTED) the paths; empty when nothing was left out."""
    kinds = {
        "not_regular_files": [{"path": shown_path(p), "why": why} for p, why in expanded.not_read],
        "repeats": [{"path": shown_path(p), "same_as": shown_path(first)} for p, first in expanded.duplicates],
        "links_not_followed": [shown_path(p) for p in expanded.not_followed],
        "no_known_format": [shown_path(p) for p in expanded.skipped],
        "in_output_directory": [shown_path(p) for p in expanded.in_output],
    }
    return {kind: {"count": len(items), "paths": items[:_LEFT_OUT_LISTED]} for kind, items in kinds.items() if items}


def _why(items: list[tuple[str, str]]) -> list[str]:
    return [f"{shown_path(path)} is {why}" for path, why in items]


def _listed(items: list[str], most: int = 3) -> str:
    shown = "; ".join(items[:most])
    return shown + (f"; and {len(items) - most} more" if len(items) > most else "")


def input_notes(expanded: ExpandedInputs, quiet: bool = False) -> list[str]:
    """The lines a caller prints about inputs left out: paths that are not regular files always
    (they were matched and are not read), repeats and links not followed unless `quiet`."""
    lines = []
    if expanded.not_read:
        lines.append(f"warning: {len(expanded.not_read)} matched path(s) are not read: {_listed(_why(expanded.not_read))}")
    if expanded.not_listed:
        lines.append(f"warning: {len(expanded.not_listed)} folder(s) in the input directories cannot be listed, each "
                     "one unreadable_file row: " + _listed([f"{shown_path(p)} ({why})" for p, why in expanded.not_listed]))
    if quiet:
        return lines
    if expanded.in_output:
        lines.append(f"the output directory lies inside an input directory: the {len(expanded.in_output)} path(s) "
                     f"in it ({_listed([shown_path(p) for p in expanded.in_output], most=1)}) are not read as input")
    if expanded.duplicates:
        lines.append(f"{len(expanded.duplicates)} input path(s) name a file or directory already read and add "
                     "nothing: " + _listed([f"{shown_path(p)} (named twice)" if p == first
                                            else f"{shown_path(p)} (read as {shown_path(first)})"
                                            for p, first in expanded.duplicates]))
    if expanded.not_followed:
        shown = (", ".join(shown_path(p) for p in expanded.not_followed[:3])
                 + (", …" if len(expanded.not_followed) > 3 else ""))
        lines.append(f"{len(expanded.not_followed)} link(s) to directories are not followed ({shown}): they lie "
                     "inside an input directory or lead back to one holding them; pass a directory as --input to read it")
    return lines
