"""A fastText supervised model read into numpy arrays, for the compiled predictor in
dsdata.stages.fasttext_kernels: the lang stage's fast path for the top label.

`load(path)` reads fastText's binary format (src/fasttext.cc `loadModel`: magic and version, Args,
Dictionary, the input matrix dense or product-quantized, the output matrix) and checks every size
and index against the others before any compiled code touches the arrays.  It returns None, and the
caller uses the fastText binding as before, for what the compiled path does not cover: losses other
than hierarchical softmax and softmax, unsupervised models, numba missing or disabled, or a file
this reader finds inconsistent (the binding then gives its own error).  Reading is plain byte
parsing: nothing in the file is executed or unpickled.

Why: fastText's binding costs ~5 µs a text before it predicts anything (a std::stringstream, a
vector per line, a numpy array and a Python list per result), and builds every character n-gram
as a std::string.  The compiled predictor reads the batch as one UTF-8 buffer and hashes n-grams in
place, 2-3× faster on lid.176.ftz, with the same labels and the same float32 probabilities.
"""
from __future__ import annotations

import mmap
import os
import re
import struct

import numpy as np

from dsdata.compiled import import_compiled

_MAGIC = 793712314
_MAX_VERSION = 12
_HS, _NS, _SOFTMAX, _OVA = 1, 2, 3, 4
_SUPERVISED = 3
_KSUB = 256
_MAX_DECODED_BYTES = 512 << 20  # a quantized matrix is decoded to float32 rows up to this size
_SURROGATE = re.compile("[\ud800-\udfff]")  # no UTF-8 form: fastText's binding would fail the batch

_kernels = None  # dsdata.stages.fasttext_kernels once imported; False without numba


def kernels():
    global _kernels
    if _kernels is None:
        _kernels = import_compiled("dsdata.stages.fasttext_kernels")
    return _kernels or None


class UnusableModel(ValueError):
    """A model file that fastText's own binding would crash on: refused with this message."""


class _Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ValueError("truncated")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values if len(values) > 1 else values[0]

    def array(self, dtype, count: int) -> np.ndarray:
        size = np.dtype(dtype).itemsize * count
        if count < 0 or self.pos + size > len(self.data):
            raise ValueError("truncated")
        out = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.pos)
        self.pos += size
        return out


class _Matrix:
    """Dense (m × n float32) or product-quantized rows, as the kernel takes them."""

    def __init__(self, reader: _Reader, quantized: bool):
        self.quant = quantized
        empty_u8, empty_f32 = np.zeros(0, np.uint8), np.zeros(0, np.float32)
        if not quantized:
            self.m, self.n = reader.take("<qq")
            if self.m < 0 or self.n <= 0 or self.m * self.n > (1 << 34):
                raise ValueError("bad dense matrix size")
            self.dense = reader.array("<f4", self.m * self.n).reshape(self.m, self.n)
            self.codes, self.centroids, self.norm_codes, self.norm_centroids = empty_u8, empty_f32, empty_u8, empty_f32
            self.nsubq = self.dsub = self.lastdsub = 0
            return
        self.dense = np.zeros((0, 0), np.float32)
        qnorm = reader.take("<?")
        self.m, self.n = reader.take("<qq")
        codesize = reader.take("<i")
        self.codes = reader.array(np.uint8, codesize)
        dim, self.nsubq, self.dsub, self.lastdsub = reader.take("<iiii")
        if (self.m < 0 or self.n <= 0 or dim != self.n or self.dsub <= 0 or self.nsubq <= 0
                or not 0 < self.lastdsub <= self.dsub
                or (self.nsubq - 1) * self.dsub + self.lastdsub != dim or codesize != self.m * self.nsubq):
            raise ValueError("bad product quantizer")
        self.centroids = reader.array("<f4", dim * _KSUB)
        if qnorm:
            self.norm_codes = reader.array(np.uint8, self.m)
            ndim, nsubq, dsub, lastdsub = reader.take("<iiii")
            if (ndim, nsubq, dsub, lastdsub) != (1, 1, 1, 1):
                raise ValueError("bad norm quantizer")
            self.norm_centroids = reader.array("<f4", _KSUB)
        else:
            self.norm_codes, self.norm_centroids = empty_u8, empty_f32

    def rows(self, norm_inside: bool) -> tuple[np.ndarray, np.ndarray]:
        """The matrix as dense float32 rows and a per-row factor, decoded once.  A quantized row's
        value n of sub-quantizer m is centroid[m][code] (the last sub-quantizer has lastdsub
        columns); with norm_inside (the input matrix: addcode adds norm·c as a float32 product)
        each value is norm·c, and the factor is 1; else (the output matrix: mulcode sums x·c and
        multiplies by the norm at the end) the factor is the norm.  Both give fastText's own float32
        results, since it rounds each product before adding it."""
        ones = np.ones(max(self.m, 0), np.float32)
        if self.quant and self.m * self.n * 4 > _MAX_DECODED_BYTES:
            raise LookupError("quantized matrix too large to decode")  # the binding reads it in place
        if not self.quant:
            return np.ascontiguousarray(self.dense, np.float32), ones
        codes = self.codes.reshape(self.m, self.nsubq).astype(np.int64)
        out = np.empty((self.m, self.n), np.float32)
        for m in range(self.nsubq):
            d = self.lastdsub if m == self.nsubq - 1 else self.dsub
            table = self.centroids[m * _KSUB * self.dsub:m * _KSUB * self.dsub + _KSUB * d].reshape(_KSUB, d)
            out[:, m * self.dsub:m * self.dsub + d] = table[codes[:, m]]
        norms = self.norm_centroids[self.norm_codes] if len(self.norm_codes) else ones
        if norm_inside:
            if len(self.norm_codes):
                out *= norms[:, None]  # float32 × float32, rounded as fastText's alpha * c[n]
            return out, ones
        return out, norms.astype(np.float32)


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
        r = _Reader(data)
        magic, version = r.take("<ii")
        if magic != _MAGIC or not 0 < version <= _MAX_VERSION:
            raise ValueError("not a fastText model")
        (dim, _ws, _epoch, _min_count, _neg, word_ngrams, loss, model, bucket, minn, maxn, _lr_update,
         _t) = r.take("<12id")
        if model != _SUPERVISED or loss not in (_HS, _SOFTMAX):
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
        self.labels = [bytes(words[offsets[nwords + i]:offsets[nwords + i + 1]]).decode("utf-8", "replace")
                       for i in range(nlabels)]
        pruned = prune_size >= 0
        prune_keys = prune_values = np.zeros(0, np.int32)
        if pruned:
            if prune_size > bucket:
                raise ValueError("bad pruned index")
            pairs = r.array("<i4", 2 * prune_size).reshape(-1, 2)
            if len(pairs) and (pairs.min() < 0 or pairs[:, 0].max() >= bucket):
                raise ValueError("bad pruned index")
            # fastText reads the pairs into a map: a key given twice keeps its last value.
            keys, last = np.unique(pairs[::-1, 0], return_index=True)
            prune_keys, prune_values = keys.astype(np.int32), pairs[::-1, 1][last].astype(np.int32)
        prune_map, prune_bits = self._k.build_prune_table(prune_keys, prune_values, int(bucket))
        quant_input = r.take("<?")
        self._input = _Matrix(r, quant_input)
        qout = r.take("<?")
        self._output = _Matrix(r, quant_input and qout)
        rows = nwords + (int(prune_values.max(initial=-1)) + 1 if pruned else bucket)
        if (self._input.n != dim or self._input.m < rows or self._output.n != dim
                or self._output.m < (nlabels - 1 if loss == _HS else nlabels)):
            raise ValueError("matrix sizes")
        self._hs = loss == _HS
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


def check_model_file(path: str) -> None:
    """Raise UnusableModel unless `path` is a whole fastText model file: magic and version, Args,
    every dictionary entry, the pruned index, both matrices (dense or product-quantized) with sizes
    that fit the header and each other, and nothing after the output matrix.  fastText's binding
    reads sizes from the file and trusts them: a truncated or garbled model segfaulted the process
    (exit 139, no message).  Covers every loss and model kind, since the binding loads them all."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as exc:
        raise UnusableModel(f"{path}: cannot read the model ({exc.strerror or exc})") from None
    try:
        problem = _structure_problem(data)
    except (ValueError, struct.error, OverflowError) as exc:
        problem = f"the file ends or breaks off inside the model ({exc}) at byte {size}"
    finally:
        if isinstance(data, mmap.mmap):
            data.close()
    if problem:
        raise UnusableModel(f"{path}: not a usable fastText model: {problem}")


def _structure_problem(data) -> str | None:
    r = _Reader(data)
    magic, version = r.take("<ii")
    if magic != _MAGIC or not 0 < version <= _MAX_VERSION:
        return "no fastText magic number and version at its start"
    (dim, _ws, _epoch, _min_count, _neg, word_ngrams, loss, model, bucket, minn, maxn, _lr_update,
     _t) = r.take("<12id")
    if not (0 < dim <= 1 << 16 and loss in (_HS, _NS, _SOFTMAX, _OVA) and model in (1, 2, _SUPERVISED)
            and bucket >= 0 and word_ngrams >= 1 and 0 <= minn and maxn <= 64):
        return f"impossible arguments (dim {dim}, loss {loss}, model {model}, bucket {bucket}, minn {minn}, maxn {maxn})"
    if bucket == 0 and ((maxn > 0 and maxn >= minn and version != 11) or word_ngrams > 1):
        return "bucket is 0 but the model hashes n-grams into buckets (fastText would divide by zero)"
    n_entries, nwords, nlabels = r.take("<iii")
    _ntokens, prune_size = r.take("<qq")
    if not (0 <= nwords <= n_entries and nlabels == n_entries - nwords and n_entries <= len(data)):
        return f"a dictionary of {n_entries} entries ({nwords} words, {nlabels} labels) cannot be"
    for _ in range(n_entries):
        end = data.find(b"\0", r.pos)
        if end < 0:
            return f"the dictionary is cut off at byte {len(data)}"
        r.pos = end + 1
        _count, kind = r.take("<qb")
        if kind not in (0, 1):
            return f"dictionary entry of unknown kind {kind}"
    if prune_size > 0:
        if prune_size > bucket:
            return f"a pruned index of {prune_size} entries for {bucket} buckets"
        r.array("<i4", 2 * prune_size)
    quant_input = r.take("<?")
    input_matrix = _Matrix(r, quant_input)
    quant_output = r.take("<?")
    output_matrix = _Matrix(r, quant_output)
    if input_matrix.n != dim or output_matrix.n != dim:
        return f"matrix widths {input_matrix.n} and {output_matrix.n} differ from the model's dim {dim}"
    if prune_size < 0 and input_matrix.m < nwords + bucket:
        return f"the input matrix has {input_matrix.m} rows, the dictionary needs {nwords + bucket}"
    needed_out = nlabels if model == _SUPERVISED else nwords
    if output_matrix.m < needed_out:
        return f"the output matrix has {output_matrix.m} rows, the model needs {needed_out}"
    if r.pos != len(data):
        return f"{len(data) - r.pos} bytes after the output matrix (two files joined, or not a model)"
    return None


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
