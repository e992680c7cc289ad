"""fastText's binary model format (src/fasttext.cc `loadModel`): a reader of its parts and
`check_model_file`, the structural check every model passes before anything reads it.  Plain byte
parsing: nothing in the file is executed or unpickled."""
from __future__ import annotations

import mmap
import os
import struct

import numpy as np

MAGIC = 793712314
MAX_VERSION = 12
HS, NS, SOFTMAX, OVA = 1, 2, 3, 4
SUPERVISED = 3
KSUB = 256
MAX_DECODED_BYTES = 512 << 20  # a quantized matrix is decoded to float32 rows up to this size


class UnusableModel(ValueError):
    """A model file that fastText's own binding would crash on: refused with this message."""


class ModelReader:
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


class ModelMatrix:
    """Dense (m × n float32) or product-quantized rows, as the kernel takes them."""

    def __init__(self, reader: ModelReader, quantized: bool):
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
        self.centroids = reader.array("<f4", dim * KSUB)
        if qnorm:
            self.norm_codes = reader.array(np.uint8, self.m)
            ndim, nsubq, dsub, lastdsub = reader.take("<iiii")
            if (ndim, nsubq, dsub, lastdsub) != (1, 1, 1, 1):
                raise ValueError("bad norm quantizer")
            self.norm_centroids = reader.array("<f4", KSUB)
        else:
            self.norm_codes, self.norm_centroids = empty_u8, empty_f32

    def rows(self, norm_inside: bool) -> tuple[np.ndarray, np.ndarray]:
        """The matrix as dense float32 rows and a per-row factor, decoded once.  With norm_inside (the
        input matrix: fastText's addcode) each value is norm·c and the factor 1; else (mulcode) the
        factor is the norm: both round as fastText's own float32 products do."""
        ones = np.ones(max(self.m, 0), np.float32)
        if self.quant and self.m * self.n * 4 > MAX_DECODED_BYTES:
            raise LookupError("quantized matrix too large to decode")  # the binding reads it in place
        if not self.quant:
            return np.ascontiguousarray(self.dense, np.float32), ones
        codes = self.codes.reshape(self.m, self.nsubq).astype(np.int64)
        out = np.empty((self.m, self.n), np.float32)
        for m in range(self.nsubq):
            d = self.lastdsub if m == self.nsubq - 1 else self.dsub
            table = self.centroids[m * KSUB * self.dsub:m * KSUB * self.dsub + KSUB * d].reshape(KSUB, d)
            out[:, m * self.dsub:m * self.dsub + d] = table[codes[:, m]]
        norms = self.norm_centroids[self.norm_codes] if len(self.norm_codes) else ones
        if norm_inside:
            if len(self.norm_codes):
                out *= norms[:, None]  # float32 × float32, rounded as fastText's alpha * c[n]
            return out, ones
        return out, norms.astype(np.float32)


def check_model_file(path: str) -> None:
    """Raise UnusableModel unless `path` is a whole fastText model file: header, dictionary, pruned
    index, both matrices with sizes that fit each other, nothing after.  fastText's binding trusts
    the sizes in the file: a truncated or garbled model segfaults the process."""
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
        raise UnusableModel(f"'{path}' is not a fastText model ({problem})")


def _structure_problem(data) -> str | None:
    r = ModelReader(data)
    magic, version = r.take("<ii")
    if magic != MAGIC or not 0 < version <= MAX_VERSION:
        return "no fastText magic number and version at its start"
    (dim, _ws, _epoch, _min_count, _neg, word_ngrams, loss, model, bucket, minn, maxn, _lr_update,
     _t) = r.take("<12id")
    if not (0 < dim <= 1 << 16 and loss in (HS, NS, SOFTMAX, OVA) and model in (1, 2, SUPERVISED)
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
    input_matrix = ModelMatrix(r, quant_input)
    quant_output = r.take("<?")
    output_matrix = ModelMatrix(r, quant_output)
    if input_matrix.n != dim or output_matrix.n != dim:
        return f"matrix widths {input_matrix.n} and {output_matrix.n} differ from the model's dim {dim}"
    if prune_size < 0 and input_matrix.m < nwords + bucket:
        return f"the input matrix has {input_matrix.m} rows, the dictionary needs {nwords + bucket}"
    needed_out = nlabels if model == SUPERVISED else nwords
    if output_matrix.m < needed_out:
        return f"the output matrix has {output_matrix.m} rows, the model needs {needed_out}"
    if r.pos != len(data):
        return f"{len(data) - r.pos} bytes after the output matrix (two files joined, or not a model)"
    return None
