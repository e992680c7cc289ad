"""ARPA writer for `KneserNeyModel` (the text format KenLM, SRILM and others load)."""
from __future__ import annotations

import gzip
from typing import IO, Sequence

import numpy as np

from dsdata.lm.kneser_ney import KneserNeyModel

# ARPA's conventional log10 probability for <s>, which is never predicted.
BOS_LOG10 = -99.0


def _log10(values: np.ndarray) -> np.ndarray:
    return np.log10(np.maximum(values, 1e-99))


def write_arpa(model: KneserNeyModel, words: Sequence[str], path: str) -> dict[str, int]:
    """Write `model` as ARPA to `path` (gzip when it ends in .gz); returns n-grams per order.
    words: the surface string of every word id (no whitespace; <s>, </s>, <unk> at the model's ids)."""
    if len(words) != model.vocab_size:
        raise ValueError(f"{len(words)} words given for a vocabulary of {model.vocab_size}")
    for special, wid in (("<s>", model.bos), ("</s>", model.eos), ("<unk>", model.unk)):
        if words[wid] != special:
            raise ValueError(f"word id {wid} must be '{special}' in an ARPA file (got '{words[wid]}')")
    bad = [w for w in words if not w or any(ch.isspace() for ch in w)]
    if bad:
        raise ValueError(f"ARPA words may not be empty or contain whitespace (e.g. {bad[0]!r})")
    opener = gzip.open if path.endswith(".gz") else open
    levels = model.levels
    vocab = model.vocab_size
    # A backoff weight is written only for n-grams that are the context of a kept longer n-gram.
    has_child = []
    for n, level in enumerate(levels, start=1):
        if n == len(levels):
            has_child.append(np.zeros(len(level.keys), dtype=bool))
        else:
            upper = levels[n]
            has_child.append(np.bincount(upper.keys[upper.keep] // vocab, minlength=len(level.keys)) > 0)
    counts = [int(level.keep.sum()) for level in levels]
    with opener(path, "wt", encoding="utf-8", newline="\n") as fh:
        fh.write("\\data\\\n")
        for n, c in enumerate(counts, start=1):
            fh.write(f"ngram {n}={c}\n")
        strings: list[str] = list(words)
        for n, level in enumerate(levels, start=1):
            fh.write(f"\n\\{n}-grams:\n")
            logp = _log10(level.prob)
            logb = _log10(level.backoff) if n < len(levels) else None
            if n == 1:
                logp = logp.copy()
                logp[model.bos] = BOS_LOG10
                current = strings
            else:
                prefixes = level.keys // vocab
                last = level.keys % vocab
                # Strings of this order are needed only while writing the next one.
                current = [f"{strings[p]} {words[w]}" if k else ""
                           for p, w, k in zip(prefixes.tolist(), last.tolist(), level.keep.tolist())]
            _write_level(fh, current, logp, logb, level.keep, has_child[n - 1])
            strings = current
        fh.write("\n\\end\\\n")
    return {f"{n}": c for n, c in enumerate(counts, start=1)}


def _write_level(fh: IO[str], strings: list[str], logp: np.ndarray, logb: np.ndarray | None,
                 keep: np.ndarray, has_child: np.ndarray) -> None:
    lines = []
    for i in np.flatnonzero(keep).tolist():
        if logb is not None and has_child[i]:
            lines.append(f"{logp[i]:.6g}\t{strings[i]}\t{logb[i]:.6g}\n")
        else:
            lines.append(f"{logp[i]:.6g}\t{strings[i]}\n")
        if len(lines) >= 65536:
            fh.writelines(lines)
            lines.clear()
    fh.writelines(lines)
