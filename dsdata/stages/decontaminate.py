"""`decontaminate`: reject documents that share an n-gram with an evaluation benchmark (docs/decontaminate.md).

As datatrove's NGramsDecontFilter and GPT-3 do: every `ngram`-token window of every benchmark item
is indexed; a document holding one is rejected `contaminated`.  With `max_doc_frequency` the counts
need the whole corpus (dsdata/beam/decontaminate.py calls `matches`, then `decide`); with it null
`process` decides one document at a time.  Tokens: docs/decontaminate.md.  The index is one sorted
uint64 array of n-gram hashes, built once per worker process.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import threading
import unicodedata
import zlib
from dataclasses import dataclass

import numpy as np

from dsdata.document import Document, Rejected
from dsdata.stages.base import DocumentStage, Param, StageConfigError
from dsdata.core.params import Integer, ListOf, Number, Path, Text
from dsdata.stages.rules import CJK_CHARS

# A CJK character alone, or a run of letters/digits of other scripts (no underscore: `a_b` is two).
TOKEN_RE = re.compile(f"[{CJK_CHARS}]|(?:(?![{CJK_CHARS}])[^\\W_])+")
_CJK_RE = re.compile(f"[{CJK_CHARS}]")
# An English clitic (s, t, re, ll, ve, d, m) joins the word before it across an apostrophe or spaces:
# "don't", "dont" and "don t" are one token, whichever a copy of the text was given.
_CLITIC_RE = re.compile(r"(?<=[a-z])(?:['\u2019\u02bc\u0060\u00b4]\s*|\s+)(?=(?:s|t|re|ll|ve|d|m)(?![^\W_]))")
# A "word" of punctuation alone between spaces ("-", "│", "=", "(+)"): no token, but a reader cutting
# 13 words out of a passage counts it as one (see _item_hashes).
_STANDALONE_RE = re.compile(r"(?<!\S)[^\w\s]+(?!\S)")
MARK = "\u01c2"  # ǂ: a letter, so TOKEN_RE keeps it as a token of its own
# Odd 64-bit multiplier of the polynomial n-gram hash (wraps modulo 2**64).
_MULT = np.uint64(0x9E3779B97F4A7C15)
# The annotation (and stats.json tally) naming the benchmark a rejected document matched.
TALLY = "decontaminate_benchmark"
# The stage's note in stats.json (stage_stats.decontaminate.notes, shown by the report): the most
# shared of the n-grams the document-frequency cap set aside, with the documents holding each.
CAPPED_NOTE = "n-grams shared by more than max_doc_frequency documents (not used to reject)"
CAPPED_LISTED = 50


def _normal(text: str) -> str:
    return _CLITIC_RE.sub("", unicodedata.normalize("NFKC", text).casefold())


def tokens(text: str) -> list[str]:
    """Decontamination tokens of `text`: NFKC, case-folded, CJK characters and other words."""
    return TOKEN_RE.findall(_normal(text))


def _marked_tokens(text: str) -> list[str] | None:
    """tokens(text) with a MARK where a word of punctuation alone stands between spaces ("a - b",
    "x │ y", "p = q"), or None when there is none."""
    norm = _normal(text)
    if not _STANDALONE_RE.search(norm):
        return None
    return TOKEN_RE.findall(_STANDALONE_RE.sub(MARK, norm))


def window_hashes(toks: list[str], lengths) -> dict[int, np.ndarray]:
    """For each n in `lengths`: the uint64 hash of every n-token window of `toks` (position i:
    toks[i:i+n]; empty when there are fewer tokens), one pass of multiply-adds for every n.  Token
    hashes are Python's str hash: stable within the process that builds and searches the index."""
    wanted = sorted(set(lengths))
    out = {n: np.empty(0, dtype=np.uint64) for n in wanted}
    size = len(toks)
    if not wanted or size < wanted[0]:
        return out
    longest = min(wanted[-1], size)
    h = np.zeros(size + longest, dtype=np.uint64)
    h[:size] = np.fromiter(map(hash, toks), dtype=np.int64, count=size).view(np.uint64)
    acc = h[:size].copy()
    for k in range(1, longest + 1):
        if k > 1:
            acc *= _MULT
            acc += h[k - 1:k - 1 + size]
        if k in out:
            out[k] = acc[:size - k + 1].copy()
    return out


def ngram_hashes(toks: list[str], n: int) -> np.ndarray:
    """uint64 hash of every n-token window of `toks`."""
    return window_hashes(toks, (n,))[n]


@dataclass(frozen=True)
class Match:
    """One benchmark n-gram found in a document: its tokens as text, its benchmark, its length."""

    key: str
    benchmark: str
    n: int
    at: int    # the token position of its first occurrence in the document
    item: int  # the benchmark item it is credited to (BenchmarkIndex.item)


@dataclass(frozen=True)
class BenchmarkIndex:
    """Sorted n-gram hashes of every benchmark and, for each, the benchmark (file) it came from."""

    hashes: np.ndarray      # sorted unique uint64
    source: np.ndarray      # int32: index into names (the first file listed that holds the n-gram)
    names: tuple[str, ...]
    per_file: tuple[int, ...]  # n-grams each file yielded
    lengths: tuple[int, ...]   # window lengths indexed: ngram, and those of whole short items
    item: np.ndarray        # int32: the item (numbered over all files) each n-gram is credited to
    item_size: np.ndarray   # int32 per item: the n-grams credited to it

    def all_matches(self, doc_hashes: np.ndarray) -> np.ndarray:
        """Positions in `doc_hashes` of every hash in the index."""
        if not len(doc_hashes) or not len(self.hashes):
            return np.empty(0, dtype=np.int64)
        pos = np.searchsorted(self.hashes, doc_hashes)
        pos[pos == len(self.hashes)] = 0
        return np.flatnonzero(self.hashes[pos] == doc_hashes)


# A benchmark line longer than this is not an item but a file that is not line-based text (or a
# decompression bomb): refused rather than read whole into memory.
MAX_LINE_BYTES = 16 << 20
_GZIP_MAGIC = b"\x1f\x8b"


def _strings(value, out: list[str]) -> None:
    # Iterative: a JSON value nested as deep as the parser allows does not exhaust Python's stack here.
    stack = [value]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            stack.extend(reversed(value))
        elif isinstance(value, dict):
            stack.extend(reversed(list(value.values())))


def _lines(path: str):
    """(line number, text) of a benchmark file, `.gz` decompressed; StageConfigError, one line, for a
    file that is not UTF-8 text: binary (a NUL byte, or bytes that are not UTF-8), a `.gz` that is not
    gzip or is truncated, a plain file that is really gzip, a line over MAX_LINE_BYTES."""
    def bad(why: str) -> StageConfigError:
        return StageConfigError(f"decontaminate: benchmark {path} {why}: it must be UTF-8 text "
                                f"(.jsonl/.ndjson or one item per line, optionally .gz)")

    with open(path, "rb") as raw:
        gz = path.endswith(".gz")
        if not gz and raw.read(2) == _GZIP_MAGIC:
            raise bad("is gzip-compressed but not named .gz")
        raw.seek(0)
        fh = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        lineno = 0
        try:
            while True:
                line = fh.readline(MAX_LINE_BYTES + 1)
                if not line:
                    return
                lineno += 1
                if len(line) > MAX_LINE_BYTES:
                    raise bad(f"line {lineno} is longer than {MAX_LINE_BYTES >> 20} MiB")
                if b"\0" in line:
                    raise bad(f"line {lineno} holds a NUL byte (a binary file?)")
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise bad(f"line {lineno} is not UTF-8 (byte {exc.start + 1}: a binary file?)") from None
                yield lineno, text
        except (OSError, EOFError, zlib.error) as exc:
            raise bad(f"cannot be decompressed after line {lineno} ({exc.__class__.__name__}: {exc})") from None


def benchmark_items(path: str, fields: list[str] | None):
    """The text items of one benchmark file (see the module docstring); StageConfigError on a bad line."""
    base = path[:-3] if path.endswith(".gz") else path
    is_jsonl = base.lower().endswith((".jsonl", ".ndjson"))
    for lineno, line in _lines(path):
        line = line.strip().lstrip("\ufeff") if lineno == 1 else line.strip()
        if not line:
            continue
        if not is_jsonl:
            yield line
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise StageConfigError(f"decontaminate: benchmark {path} line {lineno} is not JSON ({why})") from None
        found: list[str] = []
        if fields is None:
            _strings(obj, found)
        elif isinstance(obj, dict):
            for field in fields:
                _strings(obj.get(field), found)
        else:
            raise StageConfigError(f"decontaminate: benchmark {path} line {lineno} is not a JSON object, "
                                   f"so it has no field {fields[0]!r}")
        yield from found


def _item_hashes(item: str, n: int, min_tokens: int, lengths: set[int]) -> np.ndarray:
    """The hashes of an item's n-grams (or of the whole item when it is short); and, for each n-word
    window without CJK holding one or two words of punctuation alone ("-", "│"), the hash of its
    other tokens (13 words cut out of "set the mode - then restart …" are 12 tokens)."""
    toks = tokens(item)
    if len(toks) >= n:
        out = [ngram_hashes(toks, n)]
        marked = _marked_tokens(item) if n > 2 else None
        if marked is not None:
            is_mark = np.fromiter((t == MARK for t in marked), dtype=bool, count=len(marked))
            is_cjk = np.fromiter((bool(_CJK_RE.match(t)) for t in marked), dtype=bool, count=len(marked))
            window = np.ones(n, dtype=int)
            marks = np.convolve(is_mark, window, mode="valid")  # per n-window: its marks, its CJK tokens
            cjk = np.convolve(is_cjk, window, mode="valid")
            for k in (1, 2):
                # Words only: Chinese is not cut into words at spaces, and its 11 characters are a phrase.
                starts = np.flatnonzero((marks == k) & (cjk == 0))
                if len(starts):
                    lengths.add(n - k)
                    out.append(np.array([ngram_hashes([t for t in marked[i:i + n] if t != MARK], n - k)[0]
                                         for i in starts.tolist()], dtype=np.uint64))
        return np.concatenate(out)
    if min_tokens and len(toks) >= min_tokens:
        lengths.add(len(toks))
        return ngram_hashes(toks, len(toks))  # the whole short item is one n-gram of its own length
    return np.empty(0, dtype=np.uint64)


def build_index(paths: list[str], names: list[str], fields: list[str] | None, n: int, min_tokens: int) -> BenchmarkIndex:
    chunks, sources, items, per_file, lengths = [], [], [], [], {n}
    for i, path in enumerate(paths):
        file_chunks = []
        for item in benchmark_items(path, fields):
            got = np.unique(_item_hashes(item, n, min_tokens, lengths))
            if len(got):
                file_chunks.append(got)
                items.append(np.full(len(got), len(items), dtype=np.int32))
        file_hashes = np.concatenate(file_chunks) if file_chunks else np.empty(0, dtype=np.uint64)
        if not len(file_hashes):
            what = f"the fields {', '.join(fields)}" if fields else "its items"
            raise StageConfigError(
                f"decontaminate: benchmark {path} yields no n-gram ({what} have fewer than "
                f"min_tokens={min_tokens} tokens, or the file is empty): it would decontaminate nothing")
        per_file.append(len(np.unique(file_hashes)))
        chunks.append(file_hashes)
        sources.append(np.full(len(file_hashes), i, dtype=np.int32))
    hashes = np.concatenate(chunks)
    source = np.concatenate(sources)
    item = np.concatenate(items)
    # Stable sort by hash, then keep each hash's first occurrence: the first file (and item) listed wins.
    order = np.argsort(hashes, kind="stable")
    hashes, source, item = hashes[order], source[order], item[order]
    first = np.ones(len(hashes), dtype=bool)
    first[1:] = hashes[1:] != hashes[:-1]
    item = item[first]
    return BenchmarkIndex(hashes[first], source[first], tuple(names), tuple(per_file), tuple(sorted(lengths)),
                          item, np.bincount(item, minlength=len(items)).astype(np.int32))


# (paths with their size and mtime, fields, n, min_tokens) → index: built once per process.
_INDEXES: dict[tuple, BenchmarkIndex] = {}
_INDEX_LOCK = threading.Lock()


def shared_index(paths: list[str], names: list[str], fields: list[str] | None, n: int, min_tokens: int) -> BenchmarkIndex:
    key_files = []
    for p in paths:
        st = os.stat(p)
        key_files.append((p, st.st_size, st.st_mtime_ns))
    key = (tuple(key_files), tuple(names), tuple(fields) if fields is not None else None, n, min_tokens)
    with _INDEX_LOCK:
        if key not in _INDEXES:
            _INDEXES[key] = build_index(paths, names, fields, n, min_tokens)
        return _INDEXES[key]


def shown(toks: list[str]) -> str:
    """Tokens as text: a space between two non-CJK tokens only ("巴黎是法国的首都", "the capital of")."""
    out: list[str] = []
    for tok in toks:
        if out and not _CJK_RE.match(tok) and not _CJK_RE.match(out[-1][-1]):
            out.append(" ")
        out.append(tok)
    return "".join(out)


def benchmark_names(paths: list[str]) -> list[str]:
    """Each file's base name, or its path where two files share a base name."""
    bases = [os.path.basename(p) for p in paths]
    return [b if bases.count(b) == 1 else p for b, p in zip(bases, paths)]


class DecontaminateStage(DocumentStage):
    name = "decontaminate"
    description = ("benchmark decontamination: rejects documents sharing an n-gram (13 words; CJK: characters) "
                   "with a benchmark file (contaminated)")
    params = {
        "benchmarks": Param(None, "benchmark files: .jsonl (one JSON object per line; strings of `fields`) or "
                                  "plain text (one item per line), .gz allowed",
                            ListOf(Path(must_exist="any"), nonempty=True, single=True), nullable=True),
        "fields": Param(None, "JSONL fields whose strings are items (e.g. [question, answer, passage]); "
                              "null: every string value", ListOf(Text(nonempty=True), nonempty=True, single=True),
                        nullable=True),
        "ngram": Param(13, "tokens per n-gram (a token is a word, or one CJK character)", Integer(min=1)),
        "max_doc_frequency": Param(
            20, "a benchmark n-gram found in more than this many documents of the corpus is shared text "
                "(a footer, licence, navigation), counted and listed in stats.json but not used to reject; "
                "null: every n-gram rejects, one document at a time", Integer(min=1), nullable=True),
        "copy_fraction": Param(
            0.5, "a document holding at least this share of one benchmark item's n-grams is rejected even "
                 "when they are over max_doc_frequency (a passage copied into many documents)",
            Number(0, 1, open_min=True)),
        "min_tokens": Param(8, "an item shorter than ngram but with at least this many tokens is indexed whole "
                               "(0: never)", Integer(min=0)),
    }
    tallies = (TALLY,)
    _index: BenchmarkIndex | None = None

    def validate(self) -> None:
        if not self.benchmarks:
            raise StageConfigError("stage 'decontaminate' needs benchmarks: [FILE, …] (JSONL or plain text)")
        if self.min_tokens > self.ngram:
            raise StageConfigError(f"decontaminate.min_tokens ({self.min_tokens}) must be at most ngram ({self.ngram})")
        for path in self.benchmarks:
            if "://" in path:
                raise StageConfigError(f"decontaminate.benchmarks: {path} must be a local file")
            if not os.path.isfile(path):
                raise StageConfigError(f"decontaminate.benchmarks: {path} is not a file")
        # Built (and checked) now so that an empty benchmark stops the run before any record is read.
        self.setup()

    def setup(self) -> None:
        self._index = shared_index(list(self.benchmarks), benchmark_names(self.benchmarks), self.fields,
                                   self.ngram, self.min_tokens)

    def __getstate__(self):
        # The index is not shipped with the pipeline: each worker process builds (or reuses) its own.
        state = dict(self.__dict__)
        state.pop("_index", None)
        return state

    @property
    def index(self) -> BenchmarkIndex:
        if self._index is None:
            self.setup()
        return self._index

    def uses_composite(self) -> bool:
        # With a document-frequency cap the decision needs the whole corpus (dsdata/beam/decontaminate.py).
        return self.max_doc_frequency is not None

    def matches(self, doc: Document) -> list[Match]:
        """Every distinct benchmark n-gram of `doc`, in the order they first occur in it (at one
        position, the longer window first).  Its key is the n-gram's tokens joined by spaces: the same
        in every worker process (the hashes are not), so the corpus-wide counts can be keyed on it."""
        index = self.index
        toks = tokens(doc.text)
        if len(toks) < index.lengths[0]:
            return []
        found: list[tuple[int, int, str]] = []
        for n, hashes in window_hashes(toks, index.lengths).items():
            hits = index.all_matches(hashes)
            if len(hits):
                at = np.searchsorted(index.hashes, hashes[hits])
                found.extend(zip(hits.tolist(), [-n] * len(hits), (index.names[s] for s in index.source[at].tolist()),
                                 index.item[at].tolist()))
        out: dict[str, Match] = {}
        for i, neg, bench, item in sorted(found):
            key = " ".join(toks[i:i - neg])
            if key not in out:
                out[key] = Match(key, bench, -neg, i, item)
        return list(out.values())

    def decide(self, doc: Document, matches: list[Match], capped=frozenset()) -> Document | Rejected:
        """`doc` rejected `contaminated` on its first benchmark n-gram that neither is `capped` (shared
        by more than max_doc_frequency documents) nor overlaps a capped n-gram in this document (text
        next to a footer is partly the footer); or, whatever the cap, when it holds at least
        copy_fraction of one item's n-grams, and at least `ngram` of them.  Kept otherwise."""
        if not matches:
            return doc
        chosen = None
        if capped:
            spans = [(m.at, m.at + m.n) for m in matches if m.key in capped]
            covered = np.zeros(max(end for _, end in spans) + 1 if spans else 0, dtype=bool)
            for start, end in spans:
                covered[start:end] = True
            for m in matches:
                if m.key not in capped and not covered[m.at:m.at + m.n].any():
                    chosen = m
                    break
            if chosen is None:
                held = np.bincount([m.item for m in matches])
                sizes = self.index.item_size[:len(held)]
                # At least `ngram` n-grams too (a run of 2 × ngram - 1 tokens): a short item is a phrase
                # the corpus may share, like any boilerplate.
                copied = np.flatnonzero((held >= self.copy_fraction * sizes) & (held >= self.ngram))
                if len(copied):
                    chosen = next(m for m in matches if m.item == copied[0])
        else:
            chosen = matches[0]
        if chosen is None:
            return doc
        doc.annotations[TALLY] = {chosen.benchmark: 1}
        return self.reject(doc, "contaminated",
                           f"benchmark {chosen.benchmark}: {chosen.n}-gram {shown(chosen.key.split(' '))!r}")

    def process(self, doc: Document) -> Document | Rejected:
        """Without the corpus: every benchmark n-gram rejects (what the stage does with
        max_doc_frequency null, and what a direct call does)."""
        return self.decide(doc, self.matches(doc))
