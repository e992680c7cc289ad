"""A fastText supervised model read into numpy arrays, for the compiled predictor in
dsdata.stages.fasttext_kernels: the lang stage's fast path for the top label.

`load(path)` reads fastText's binary format (src/fasttext.cc `loadModel`) and checks every size and
index before compiled code touches the arrays; it returns None, and the caller uses the fastText
binding, for what the compiled path does not cover (losses other than hierarchical softmax and
softmax, unsupervised models, no numba, a file it finds inconsistent).  Nothing in the file is
executed or unpickled.
"""
from __future__ import annotations

import mmap
import os
import re
import struct

import numpy as np

from dsdata.compiled import import_compiled
from dsdata.io.fasttext_file import (HS, MAGIC, MAX_VERSION, SOFTMAX, SUPERVISED, UnusableModel, ModelMatrix,
                                     ModelReader, check_model_file)

_SURROGATE = re.compile("[\ud800-\udfff]")  # no UTF-8 form: fastText's binding would fail the batch

_kernels = None  # dsdata.stages.fasttext_kernels once imported; False without numba


def kernels():
    global _kernels
    if _kernels is None:
        _kernels = import_compiled("dsdata.stages.fasttext_kernels")
    return _kernels or None


def _huffman(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HierarchicalSoftmaxLoss::buildTree: children of each of the 2·osz − 1 nodes (−1: a leaf)."""
    osz = len(counts)
    count = [1e15] * (2 * osz - 1)
    count[:osz] = [int(c) for c in counts]
    left, right = np.full(2 * osz - 1, -1, np.int32), np.full(2 * osz - 1, -1, np.int32)
    leaf, node = osz - 1, osz
    for i in range(osz, 2 * osz - 1):
        mini = [0, 0]
        for j in range(2):
            if leaf >= 0 and count[leaf] < count[node]:
                mini[j], leaf = leaf, leaf - 1
            else:
                mini[j], node = node, node + 1
        left[i], right[i] = mini
        count[i] = count[mini[0]] + count[mini[1]]
    return left, right


class CompiledFastText:
    """predict(lines) → (labels, probabilities) of fastText's predict(lines, k=1, threshold)."""

    def __init__(self, path: str, data, kernels_module):
        self.path = path
        self._k = kernels_module
        r = ModelReader(data)
        dim, word_ngrams, loss, bucket, minn, maxn, size, nwords, nlabels, prune_size = _read_header(r, path)
        words, offsets, is_label, counts = _read_dictionary(r, size, nwords)
        self.labels = [bytes(words[offsets[nwords + i]:offsets[nwords + i + 1]]).decode("utf-8", "replace")
                       for i in range(nlabels)]
        pruned = prune_size >= 0
        prune_keys, prune_values = _read_pruned_index(r, prune_size, bucket)
        prune_map, prune_bits = self._k.build_prune_table(prune_keys, prune_values, int(bucket))
        quant_input = r.take("<?")
        self._input = ModelMatrix(r, quant_input)
        qout = r.take("<?")
        self._output = ModelMatrix(r, quant_input and qout)
        rows = nwords + (int(prune_values.max(initial=-1)) + 1 if pruned else bucket)
        if (self._input.n != dim or self._input.m < rows or self._output.n != dim
                or self._output.m < (nlabels - 1 if loss == HS else nlabels)):
            raise ValueError("matrix sizes")
        self._hs = loss == HS
        in_rows, _ = self._input.rows(norm_inside=True)
        out_rows, out_norms = self._output.rows(norm_inside=False)
        if self._hs:
            left, right = _huffman(np.asarray(counts, np.int64))
        else:
            left = right = np.zeros(0, np.int32)
        self._words = np.frombuffer(bytes(words), np.uint8)
        self._offsets = np.asarray(offsets, np.int64)
        table = self._k.build_word_table(self._words, self._offsets)
        eos_bytes = np.frombuffer(b"</s>", np.uint8)
        eos = self._k._word_id(eos_bytes, 0, 4, self._k._hash(eos_bytes, 0, 4), self._words, self._offsets, table)
        if eos >= 0 and is_label[eos]:
            eos = -2  # "</s>" typed a label: fastText adds neither its row nor its hash
        row_offsets, rows = self._k.build_word_rows(self._words, self._offsets, is_label, int(nwords), prune_map,
                                                    prune_bits, pruned, int(bucket), int(minn), int(maxn))
        self._args = (self._words, self._offsets, is_label, table, row_offsets, rows, int(eos), int(nwords),
                      prune_map, prune_bits, pruned, int(bucket), int(minn), int(maxn), int(word_ngrams), int(dim),
                      in_rows, out_rows, out_norms, self._hs, left, right, int(nlabels))

    def predict(self, lines: list[str], threshold: float = 0.0) -> tuple[list[str | None], list[float]]:
        """The top label of each line (None where fastText gives none) and its probability.
        Lines must hold no newline; a lone surrogate is encoded as U+FFFD."""
        if not lines:
            return [], []
        text = "\n".join(lines) + "\n"
        try:
            buf = text.encode("utf-8")
        except UnicodeEncodeError:
            buf = _SURROGATE.sub("\ufffd", text).encode("utf-8")
        idx, probs = self._k.predict_lines(np.frombuffer(buf, np.uint8), *self._args, np.float32(threshold),
                                           len(lines))
        names = self.labels
        return [names[i] if i >= 0 else None for i in idx.tolist()], probs.tolist()


def load(path: str) -> CompiledFastText | None:
    """The compiled predictor for the model at `path`, or None (use the fastText binding)."""
    k = kernels()
    if k is None:
        return None
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        return CompiledFastText(path, data, k)
    except UnusableModel:
        raise
    except (OSError, ValueError, LookupError, struct.error, IndexError, OverflowError, MemoryError):
        return None


def _read_dictionary(r: ModelReader, size: int, nwords: int):
    """The dictionary's entries: (their bytes end to end, each one's start offset and the end,
    which entries are labels, the labels' counts); words come first, then labels."""
    words, offsets, is_label, counts = bytearray(), [0], np.zeros(size, np.bool_), []
    data_bytes = r.data
    for i in range(size):
        end = data_bytes.find(b"\0", r.pos)
        if end < 0:
            raise ValueError("truncated dictionary")
        words += data_bytes[r.pos:end]
        offsets.append(len(words))
        r.pos = end + 1
        count, kind = r.take("<qb")
        is_label[i] = kind == 1
        if kind == 1:
            counts.append(count)
    if is_label[:nwords].any() or not is_label[nwords:].all():
        raise ValueError("dictionary order")
    return words, offsets, is_label, counts


def _read_pruned_index(r: ModelReader, prune_size: int, bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """A quantized model's pruned bucket index (keys, the rows they map to); empty when not pruned."""
    if prune_size < 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    if prune_size > bucket:
        raise ValueError("bad pruned index")
    pairs = r.array("<i4", 2 * prune_size).reshape(-1, 2)
    if len(pairs) and (pairs.min() < 0 or pairs[:, 0].max() >= bucket):
        raise ValueError("bad pruned index")
    # fastText reads the pairs into a map: a key given twice keeps its last value.
    keys, last = np.unique(pairs[::-1, 0], return_index=True)
    return keys.astype(np.int32), pairs[::-1, 1][last].astype(np.int32)


def _read_header(r: ModelReader, path: str):
    """The model's arguments and dictionary sizes, checked: (dim, word_ngrams, loss, bucket, minn,
    maxn, size, nwords, nlabels, prune_size)."""
    magic, version = r.take("<ii")
    if magic != MAGIC or not 0 < version <= MAX_VERSION:
        raise ValueError("not a fastText model")
    (dim, _ws, _epoch, _min_count, _neg, word_ngrams, loss, model, bucket, minn, maxn, _lr_update,
     _t) = r.take("<12id")
    if model != SUPERVISED or loss not in (HS, SOFTMAX):
        raise LookupError(f"loss {loss}, model {model}")
    if version == 11:
        maxn = 0  # as fastText: old supervised models have no character n-grams
    if bucket == 0 and ((maxn > 0 and maxn >= minn) or word_ngrams > 1):
        raise UnusableModel(f"{path}: bucket is 0 but the model hashes character or word n-grams into buckets "
                            "(fastText would divide by zero); this file is damaged or was not written by fastText")
    size, nwords, nlabels = r.take("<iii")
    _ntokens, prune_size = r.take("<qq")
    if not (0 <= nwords <= size and nlabels == size - nwords and nlabels > 0 and bucket >= 0
            and dim > 0 and word_ngrams >= 1 and maxn <= 64 and minn >= 0):
        raise ValueError("bad dictionary header")
    return dim, word_ngrams, loss, bucket, minn, maxn, size, nwords, nlabels, prune_size
