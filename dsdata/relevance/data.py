"""Labelled JSONL (`text`, `label` 0/1) for relevance classifiers, and a grouped train/validation split."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass


class LabelledDataError(ValueError):
    """A labelled file that cannot be used; the message names the file, line and what to fix."""


@dataclass
class LabelledText:
    id: str
    text: str
    label: int
    group: str  # records sharing a group are never split across train and validation


def load_labelled(path: str) -> list[LabelledText]:
    """Read JSONL records with `text` and `label` (0/1); `id`, `source` are optional."""
    from dsdata.io.untrusted_files import UntrustedFileError, regular_file

    records = []
    try:
        fh = open(regular_file(path, "labelled data"), encoding="utf-8")  # a FIFO would wait for a writer
    except UntrustedFileError as exc:
        raise LabelledDataError(str(exc)) from None
    except OSError as exc:
        raise LabelledDataError(f"cannot read labelled data '{path}': {exc.strerror}") from None
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested past Python's limit
                why = getattr(exc, "msg", "nested too deeply")
                raise LabelledDataError(f"{path}:{n}: not valid JSON ({why}); fix or remove that line") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise LabelledDataError(f"{path}:{n}: each record needs a string field 'text'")
            label = obj.get("label")
            if label not in (0, 1, "0", "1", True, False):
                raise LabelledDataError(f"{path}:{n}: 'label' must be 0 or 1, got {label!r}")
            rid = str(obj.get("id", f"line-{n}"))
            records.append(LabelledText(rid, obj["text"], int(label), group_key(obj, rid)))
    if not records:
        raise LabelledDataError(f"{path}: no labelled records (expected JSONL lines with 'text' and 'label')")
    labels = {r.label for r in records}
    if labels != {0, 1}:
        raise LabelledDataError(f"{path}: needs both labels 0 and 1 to train or evaluate, found only {sorted(labels)}")
    return records


# Language tags in names and paths (help/zh-CN/, ch03.zh-tw.html), stripped: one page is one group.
_LANG_TAG = re.compile(r"(?<=[-_./])(?:en[-_]us|en|zh[-_](?:cn|tw|hans|hant)|zh)(?=[-_./:]|$)", re.IGNORECASE)
# Collections of independent short items (one fortune cookie, one poem, one verse is one document).
_ITEM_COLLECTIONS = ("fortunes", "fortunes-zh", "bible-kjv-text")


def group_key(obj: dict, rid: str) -> str:
    """The document a record comes from: its `source` page with language tags removed (all language
    versions of a page count as one document); items of fortune/poem/verse collections stand alone."""
    source = obj.get("source")
    if not isinstance(source, str) or not source:
        return f"id:{rid}"
    package, _, rest = source.partition(":")
    if package in _ITEM_COLLECTIONS:
        return source
    page = rest.split("#", 1)[0]
    key = _LANG_TAG.sub("", f"{package}:{page}".lower())
    key = re.sub(r"[-_.]+:", ":", key)
    return re.sub(r"[-_./]{2,}", lambda m: m.group(0)[-1], key)


def split_grouped(records: list[LabelledText], valid_fraction: float, seed: int = 0) -> tuple[list, list]:
    """Deterministic train/validation split by group hash (no group on both sides)."""
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"valid fraction must be between 0 and 1, got {valid_fraction}")
    train, valid = [], []
    for rec in records:
        digest = hashlib.sha256(f"{seed}:{rec.group}".encode("utf-8")).digest()
        bucket = int.from_bytes(digest[:8], "big") / 2**64
        (valid if bucket < valid_fraction else train).append(rec)
    return train, valid
