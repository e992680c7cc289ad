"""fastText supervised prediction (k = 1), compiled: the same label and probability as fastText's
`predictLine`, computed by one numba call per batch of lines (arrays from fasttext_model).

Every step follows fastText's C++ (dictionary.cc, model.cc, loss.cc, quantmatrix.cc,
productquantizer.cc) in the same order and float32 arithmetic, so the results are bit-identical:
- words split on space, \\t, \\v, \\f, \\r and \\0; a line ends at \\n with </s> (a literal </s> ends it too);
- a word's rows: its id, and its character n-grams of "<word>" (FNV-1a with fastText's signed-char
  quirk, mod bucket, through a quantized model's pruned map); word n-grams from the words' hashes;
- the hidden vector is the float32 sum of those rows in order times float32(1 / count);
- hierarchical softmax walks the Huffman tree depth-first, left before right, pruning on the best
  leaf so far, a later leaf winning a tie; softmax takes the largest, a later label winning a tie.
A line with no rows has no prediction (label -1), as fastText returns none.
"""
from __future__ import annotations

import math

import numpy as np

from dsdata.compiled import export, njit

_EOS = np.frombuffer(b"</s>", dtype=np.uint8)
_LABEL = np.frombuffer(b"__label__", dtype=np.uint8)


@njit(cache=True, nogil=True)
def _fnv_step(h, byte):
    # fastText hashes the byte as a signed char widened to uint32 (see Dictionary::hash); numba
    # widens uint32 arithmetic to 64 bits, so the product is masked back to 32.
    x = np.uint64(byte)
    if byte >= 128:
        x = x | np.uint64(0xFFFFFF00)
    return ((h ^ x) * np.uint64(16777619)) & np.uint64(0xFFFFFFFF)


@export("uint64(uint8[::1], int64, int64)", cache=True, nogil=True)
def _hash(buf, start, end):
    h = np.uint64(2166136261)
    for i in range(start, end):
        h = _fnv_step(h, buf[i])
    return h


@njit(cache=True, nogil=True)
def _same_bytes(x, xa, y, ya, n):
    for k in range(n):
        if x[xa + k] != y[ya + k]:
            return False
    return True


@export("int32[::1](uint8[::1], int64[::1])", cache=True, nogil=True)
def build_word_table(words, word_offsets):
    """fastText's word2int: open addressing, ceil(size / 0.7) slots, linear probing."""
    size = word_offsets.shape[0] - 1
    slots = np.int64(math.ceil(size / 0.7))
    table = np.full(max(slots, 1), -1, dtype=np.int32)
    for w in range(size):
        a, b = word_offsets[w], word_offsets[w + 1]
        slot = np.int64(_hash(words, a, b)) % table.shape[0]
        while table[slot] != -1:
            o = table[slot]
            oa, ob = word_offsets[o], word_offsets[o + 1]
            if ob - oa == b - a and _same_bytes(words, oa, words, a, b - a):
                break  # a word given twice: the later entry wins, as in fastText's load
            slot = (slot + 1) % table.shape[0]
        table[slot] = w
    return table


@export("Tuple((int32[:, ::1], uint64[::1]))(int32[::1], int32[::1], int64)", cache=True, nogil=True)
def build_prune_table(keys, values, bucket):
    """The pruned n-gram map (bucket → row): a bitmap of the kept buckets, which answers most n-grams
    (not kept) with one bit test, and an open-addressing table of (key, value) pairs."""
    size = 1
    while size < 2 * keys.shape[0] + 2:
        size *= 2
    table = np.full((size, 2), -1, dtype=np.int32)
    bits = np.zeros(max(bucket, 1) // 64 + 1, dtype=np.uint64)
    mask = size - 1
    for i in range(keys.shape[0]):
        key = np.int64(keys[i])
        bits[key >> 6] |= np.uint64(1) << np.uint64(key & 63)
        slot = (key * np.int64(2654435761)) & mask
        while table[slot, 0] != -1 and table[slot, 0] != keys[i]:
            slot = (slot + 1) & mask
        table[slot, 0] = keys[i]
        table[slot, 1] = values[i]
    return table, bits


@njit(cache=True, nogil=True)
def _pruned_row(table, bits, key):
    if (bits[key >> 6] >> np.uint64(key & 63)) & np.uint64(1) == 0:
        return np.int64(-1)
    mask = table.shape[0] - 1
    slot = (key * np.int64(2654435761)) & mask
    while True:
        k = table[slot, 0]
        if k == key:
            return np.int64(table[slot, 1])
        if k == -1:
            return np.int64(-1)
        slot = (slot + 1) & mask


@export("int64(uint8[::1], int64, int64, uint64, uint8[::1], int64[::1], int32[::1])", cache=True, nogil=True)
def _word_id(buf, a, b, h, words, word_offsets, table):
    slot = np.int64(h) % table.shape[0]
    while True:
        w = table[slot]
        if w == -1:
            return -1
        wa, wb = word_offsets[w], word_offsets[w + 1]
        if wb - wa == b - a and _same_bytes(words, wa, buf, a, b - a):
            return w
        slot = (slot + 1) % table.shape[0]


@njit(cache=True, nogil=True)
def _matches(buf, a, b, lit):
    return b - a == lit.shape[0] and _same_bytes(buf, a, lit, 0, lit.shape[0])


@njit(cache=True, nogil=True)
def _starts_with(buf, a, b, lit):
    return b - a >= lit.shape[0] and _same_bytes(buf, a, lit, 0, lit.shape[0])


@njit(cache=True, nogil=True)
def _add_row(hidden, rows, row):
    for j in range(hidden.shape[0]):
        hidden[j] += rows[row, j]


@njit(cache=True, nogil=True)
def _dot_row(hidden, rows, norms, row):
    res = np.float32(0.0)
    for j in range(hidden.shape[0]):
        res += hidden[j] * rows[row, j]
    return res * norms[row]


@njit(cache=True, nogil=True)
def _mod(h, bucket, inv_bucket):
    """h % bucket for h < 2**32 (a uint64 division costs tens of cycles): the quotient from a
    float64 product, off by at most one, then corrected, so the remainder is exact."""
    q = np.int64(np.float64(h) * inv_bucket)
    r = np.int64(h) - q * bucket
    if r < 0:
        r += bucket
    elif r >= bucket:
        r -= bucket
    return r


@njit(cache=True, nogil=True)
def _subword_rows(buf, a, b, minn, maxn, bucket, prune_map, prune_bits, pruned, nwords, out, nout):
    """computeSubwords("<" + buf[a:b] + ">") written to out[nout:] as input rows (nwords + bucket
    id, through the pruned map): n-grams of minn…maxn whole UTF-8 characters, but not "<" or ">"
    alone.  out must have room for (b - a + 2) · maxn more; returns its new length."""
    glen = b - a + 2
    inv_bucket = 1.0 / max(bucket, 1)
    for i in range(glen):
        ci = 60 if i == 0 else (62 if i == glen - 1 else np.int64(buf[a + i - 1]))
        if (ci & 0xC0) == 0x80:
            continue
        gh = np.uint64(2166136261)
        j = i
        ln = 1
        while j < glen and ln <= maxn:
            gh = _fnv_step(gh, 60 if j == 0 else (62 if j == glen - 1 else np.int64(buf[a + j - 1])))
            j += 1
            while j < glen - 1 and (buf[a + j - 1] & 0xC0) == 0x80:
                gh = _fnv_step(gh, np.int64(buf[a + j - 1]))
                j += 1
            if ln >= minn and not (ln == 1 and (i == 0 or j == glen)):
                hid = _mod(gh, bucket, inv_bucket)
                if pruned:
                    hid = _pruned_row(prune_map, prune_bits, hid)
                if hid >= 0:
                    out[nout] = nwords + hid
                    nout += 1
            ln += 1
    return nout


@export(
        "UniTuple(int64[::1], 2)(uint8[::1], int64[::1], boolean[::1], int64, int32[:, ::1], "
        "uint64[::1], boolean, int64, int64, int64)",
        cache=True, nogil=True)
def build_word_rows(words, word_offsets, word_is_label, nwords, prune_map, prune_bits, pruned, bucket, minn, maxn):
    """Each vocabulary word's input rows, as fastText lists them in initNgrams: the word's own id,
    then (except for </s>, and when maxn > 0) its character n-grams."""
    size = word_offsets.shape[0] - 1
    row_offsets = np.zeros(size + 1, dtype=np.int64)
    rows = np.zeros(16 * size + 16, dtype=np.int64)
    n = 0
    for w in range(size):
        if not word_is_label[w]:
            if n == rows.shape[0]:
                grown = np.zeros(2 * rows.shape[0], dtype=np.int64)
                grown[:n] = rows[:n]
                rows = grown
            rows[n] = w
            n += 1
            a, b = word_offsets[w], word_offsets[w + 1]
            if maxn > 0 and not _matches(words, a, b, _EOS):
                need = n + (b - a + 2) * maxn
                if need > rows.shape[0]:
                    grown = np.zeros(2 * need, dtype=np.int64)
                    grown[:n] = rows[:n]
                    rows = grown
                n = _subword_rows(words, a, b, minn, maxn, bucket, prune_map, prune_bits, pruned, nwords, rows, n)
        row_offsets[w + 1] = n
    return row_offsets, rows[:n].copy()


@njit(cache=True, nogil=True)
def _widen(h):
    # A word's uint32 hash as fastText keeps it (int32) widened to uint64: sign-extended.
    if h >= np.uint64(0x80000000):
        return h | np.uint64(0xFFFFFFFF00000000)
    return h


@njit(cache=True, nogil=True)
def _std_log(x):
    # fastText's std_log(real x): log(x + 1e-5) in double, returned as float.
    return np.float32(math.log(np.float64(x) + 1e-5))


# Long on purpose: one compiled loop over the bytes; split into calls, numba would pass state between
# them through arrays or tuples each step (the point of the kernel is one pass without that).
@export(
        "Tuple((int32[::1], float32[::1]))(uint8[::1], uint8[::1], int64[::1], boolean[::1], int32[::1], "
        "int64[::1], int64[::1], int64, int64, int32[:, ::1], uint64[::1], boolean, int64, int64, int64, "
        "int64, int64, float32[:, ::1], float32[:, ::1], float32[::1], boolean, int32[::1], int32[::1], "
        "int64, float32, int64)",
        cache=True, nogil=True)
def predict_lines(buf, words, word_offsets, word_is_label, table, word_row_offsets, word_rows, eos_id, nwords,
                  prune_map, prune_bits, pruned, bucket, minn, maxn, word_ngrams, dim,
                  in_rows, out_rows, out_norms,
                  hs, tree_left, tree_right, nlabels, threshold, n_lines):
    """Label index (-1: none) and probability for each \\n-terminated line of `buf` (UTF-8)."""
    labels = np.full(n_lines, -1, dtype=np.int32)
    probs = np.zeros(n_lines, dtype=np.float32)
    hidden = np.zeros(dim, dtype=np.float32)
    output = np.zeros(max(nlabels, 1), dtype=np.float32)
    hashes = np.zeros(buf.shape[0] // 2 + 2, dtype=np.uint64)
    scratch = np.zeros(256, dtype=np.int64)
    stack_node = np.zeros(2 * max(nlabels, 1) + 2, dtype=np.int32)
    stack_score = np.zeros(2 * max(nlabels, 1) + 2, dtype=np.float32)
    log_threshold = _std_log(threshold)
    pos = 0
    n = buf.shape[0]
    for line in range(n_lines):
        for j in range(dim):
            hidden[j] = 0.0
        count = 0
        nhash = 0
        stop = False
        while not stop:
            # readWord: skip separators; a \n before any byte is the end-of-sentence token.
            while pos < n and (buf[pos] == 32 or buf[pos] == 13 or buf[pos] == 9 or buf[pos] == 11
                               or buf[pos] == 12 or buf[pos] == 0):
                pos += 1
            if pos >= n or buf[pos] == 10:
                # </s>: in the vocabulary it adds its own row only (initNgrams gives it no n-grams).
                if pos < n:
                    pos += 1
                if eos_id != -2:  # -2: </s> is a label in this model
                    hashes[nhash] = _hash(_EOS, 0, 4)
                    nhash += 1
                if eos_id >= 0:
                    _add_row(hidden, in_rows, eos_id)
                    count += 1
                break
            a = pos
            while pos < n and not (buf[pos] == 32 or buf[pos] == 10 or buf[pos] == 13 or buf[pos] == 9
                                   or buf[pos] == 11 or buf[pos] == 12 or buf[pos] == 0):
                pos += 1
            b = pos
            h = _hash(buf, a, b)
            wid = _word_id(buf, a, b, h, words, word_offsets, table)
            is_eos = _matches(buf, a, b, _EOS)
            if wid >= 0:
                is_label = word_is_label[wid]
            else:
                is_label = _starts_with(buf, a, b, _LABEL)
            if not is_label:
                hashes[nhash] = h
                nhash += 1
                if wid >= 0:
                    # In the vocabulary: its own row and its n-grams' rows, listed at load (initNgrams).
                    for r in range(word_row_offsets[wid], word_row_offsets[wid + 1]):
                        _add_row(hidden, in_rows, word_rows[r])
                    count += word_row_offsets[wid + 1] - word_row_offsets[wid]
                elif not is_eos and maxn > 0:
                    if scratch.shape[0] < (b - a + 2) * maxn:
                        scratch = np.zeros(2 * (b - a + 2) * maxn, dtype=np.int64)
                    nrows = _subword_rows(buf, a, b, minn, maxn, bucket, prune_map, prune_bits, pruned, nwords,
                                          scratch, 0)
                    for r in range(nrows):
                        _add_row(hidden, in_rows, scratch[r])
                    count += nrows
            if is_eos:
                # A literal </s> ends the line for fastText; the rest of it up to \n is never read.
                while pos < n and buf[pos] != 10:
                    pos += 1
                if pos < n:
                    pos += 1
                stop = True
        # addWordNgrams: hashes as int32 widened to uint64 (sign-extended), h * 116049371 + next.
        if word_ngrams > 1:
            for i in range(nhash):
                wh = _widen(hashes[i])
                for j in range(i + 1, min(nhash, i + word_ngrams)):
                    wh = wh * np.uint64(116049371) + _widen(hashes[j])
                    hid = np.int64(wh % np.uint64(bucket))  # 64-bit: no shortcut
                    if pruned:
                        hid = _pruned_row(prune_map, prune_bits, hid)
                    if hid >= 0:
                        _add_row(hidden, in_rows, nwords + hid)
                        count += 1
        if count == 0:
            continue
        scale = np.float32(1.0 / count)
        for j in range(dim):
            hidden[j] *= scale
        best = -1
        best_score = np.float32(0.0)
        if hs:
            # dfs(k=1): an explicit stack, right child pushed first so the left one is visited first.
            stack_node[0] = 2 * nlabels - 2
            stack_score[0] = 0.0
            top = 1
            while top > 0:
                top -= 1
                node = stack_node[top]
                score = stack_score[top]
                if score < log_threshold:
                    continue
                if best >= 0 and score < best_score:
                    continue
                if tree_left[node] == -1 and tree_right[node] == -1:
                    best = node
                    best_score = score
                    continue
                f = _dot_row(hidden, out_rows, out_norms, node - nlabels)
                f = np.float32(1.0 / np.float32(np.float32(1.0) + np.float32(math.exp(-f))))
                stack_node[top] = tree_right[node]
                stack_score[top] = score + _std_log(f)
                stack_node[top + 1] = tree_left[node]
                stack_score[top + 1] = score + _std_log(np.float32(1.0 - np.float64(f)))
                top += 2
        else:
            # softmax: output = wo · hidden, exp(o - max) / z; findKBest with k = 1.
            mx = np.float32(0.0)
            for i in range(nlabels):
                output[i] = _dot_row(hidden, out_rows, out_norms, i)
            mx = output[0]
            for i in range(nlabels):
                if output[i] > mx:
                    mx = output[i]
            z = np.float32(0.0)
            for i in range(nlabels):
                # loss.cc's unqualified exp(float) is the C library's double exp.
                output[i] = np.float32(math.exp(np.float64(np.float32(output[i] - mx))))
                z += output[i]
            for i in range(nlabels):
                output[i] = output[i] / z
            for i in range(nlabels):
                if output[i] < threshold:
                    continue
                s = _std_log(output[i])
                if best >= 0 and s < best_score:
                    continue
                best = i
                best_score = s
        if best >= 0:
            labels[line] = best
            probs[line] = np.float32(math.exp(best_score))
    return labels, probs
