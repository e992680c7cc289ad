"""Dedup benchmark: MinHash signature speed against datasketch and rensa, and the quality of the whole
dedup recipe against a plain datasketch MinHashLSH + union-find, in one run.

    python benchmarks/dedup.py                 # ~3–5 minutes on 2 busy cores
    python benchmarks/dedup.py --scale 200000  # also push N documents through pipelines/dedup.yaml
                                               # (+ ~4 min; peak RSS and docs/s in the "scale" line)

Speed: ~2 KB documents cut from real prose (../shared/data/prose-en.txt, prose-zh.txt); every library
gets the same shingles (word 5-grams, character 5-grams for Chinese; the per-document counts are
checked equal) and num_perm = 128.  Two figures per method:

* "step": the signature step alone on pre-computed shingles — dsdata on its shingle hashes (its
  hashing of the shingles happens in its shingling step), the peers on the shingle strings (so
  their step includes hashing the strings, which is how their APIs take input);
* "e2e": from raw text to signatures — dsdata's own normalising + shingling + signatures, timed;
  the peers' step plus the Python shingling they need (`shingle_strings`, timed separately).

dsdata runs with numba kernels when numba is installed and is also timed on its numpy fallback
(identical signatures).  Ratios in the JSON line are the worse of the two languages.

Quality: real documents plus perturbed copies (word or character substitutions, deletions,
insertions, swaps, truncation); ground truth is the exact Jaccard of every pair's shingle sets
(sparse matrix product), so real near-duplicates already in the documentation (the same guide for
two architectures, two versions of a page) count too.  A pair with true J ≥ 0.85 must end up in
one cluster (recall); a pair the method puts in one cluster is correct when a chain of pairs with
true J ≥ 0.8, the recipe's threshold, connects it (precision; `strict_precision` asks for ≥ 0.85).
The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = REPO.parent / "shared" / "data"

from dsdata.dedup.minhash import MinHasher, shingle_strings  # noqa: E402

NUM_PERM = 128
THRESHOLD = 0.8


def documents(path: Path, target_bytes: int, limit: int) -> list[str]:
    """Consecutive paragraphs of one document joined until ~target_bytes of UTF-8."""
    docs: list[str] = []
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        current, size = [], 0
        for para in block.splitlines():
            para = para.strip()
            if not para:
                continue
            current.append(para)
            size += len(para.encode("utf-8"))
            if size >= target_bytes:
                docs.append("\n".join(current))
                current, size = [], 0
                if len(docs) >= limit:
                    return docs
    return docs


def timed(fn, repeat: int = 1):
    """(best seconds, result, tracemalloc peak bytes of one call)."""
    gc.collect()
    tracemalloc.start()
    result = fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result, peak


def numba_first_call_seconds() -> dict | None:
    """Seconds from a fresh interpreter to the first signature (imports and the character-class
    table included): numba with an empty cache (compiling), numba with the cache that run left,
    and numpy only."""
    from dsdata.dedup.minhash import numba_kernels

    if numba_kernels() is None:
        return None
    code = ("import time; t = time.perf_counter(); from dsdata.dedup.minhash import MinHasher; "
            "MinHasher().signatures(['warm up the kernels']); print(time.perf_counter() - t)")
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        for label, extra in (("cold_compile_s", {}), ("cached_s", {}), ("numpy_only_s", {"DSDATA_NO_NUMBA": "1"})):
            env = dict(os.environ, NUMBA_CACHE_DIR=cache, **extra)
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True)
            out[label] = round(float(proc.stdout.strip()), 2)
    return out


def speed(texts: list[str], label: str, loop_docs: int) -> dict:
    import datasketch
    import rensa

    fast = MinHasher(NUM_PERM)  # numba kernels when installed
    slow = MinHasher(NUM_PERM, backend="numpy")
    batches = [texts[i: i + 256] for i in range(0, len(texts), 256)]
    for h in (fast, slow):
        h.signatures(texts[:8])  # builds the character-class table, compiles/loads the kernels

    # The same shingles for everyone: dsdata's shingle hashes are hashes of exactly the strings the
    # peers get (checked here per document).
    t_shingle, shingles, m_shingle = timed(lambda: [shingle_strings(t) for t in texts])
    encoded = [[s.encode("utf-8") for s in sh] for sh in shingles]
    t_dsh, shingled, _ = timed(lambda: [fast.shingle(b) for b in batches], repeat=2)
    counts = np.concatenate([np.diff(s.offsets) for s in shingled])
    assert counts.tolist() == [len(sh) for sh in shingles], "dsdata and peer shingles differ"

    sub = encoded[:loop_docs]

    def ds_loop():
        for sh in sub:
            m = datasketch.MinHash(num_perm=NUM_PERM, seed=1)
            for s in sh:
                m.update(s)

    def ds_batch():
        for sh in encoded:
            m = datasketch.MinHash(num_perm=NUM_PERM, seed=1)
            m.update_batch(sh)

    def ds_bulk():
        return datasketch.MinHash.bulk(encoded, num_perm=NUM_PERM, seed=1)

    def rensa_loop():
        for sh in shingles:
            m = rensa.RMinHash(NUM_PERM, 1)
            m.update(sh)
            m.digest()

    def rensa_bulk():
        return rensa.RMinHash.digest_matrix_from_token_sets(shingles, NUM_PERM, 1)

    # name → (function, documents, end-to-end extra seconds per document on top of the step)
    per_doc_shingle_s = t_shingle / len(texts)
    methods = [
        (f"dsdata signatures ({fast.backend})", lambda: [fast.signatures_from_shingles(s) for s in shingled], len(texts),
         lambda: [fast.signatures(b) for b in batches]),
        ("dsdata signatures (numpy fallback)", lambda: [slow.signatures_from_shingles(s) for s in shingled], len(texts),
         lambda: [slow.signatures(b) for b in batches]),
        ("datasketch MinHash.update loop", ds_loop, len(sub), None),
        ("datasketch update_batch", ds_batch, len(texts), None),
        ("datasketch MinHash.bulk", ds_bulk, len(texts), None),
        ("rensa RMinHash.update", rensa_loop, len(texts), None),
        ("rensa digest_matrix_from_token_sets", rensa_bulk, len(texts), None),
    ]
    print(f"\n== signatures, {label}: {len(texts)} docs, mean {np.mean([len(t.encode()) for t in texts]):.0f} bytes, "
          f"{np.mean(counts):.0f} shingles/doc; shingling from text: python (peers) {len(texts) / t_shingle:,.0f} docs/s, "
          f"dsdata {fast.backend} {len(texts) / t_dsh:,.0f} docs/s")
    print(f"{'method':40s} {'step docs/s':>12s} {'e2e docs/s':>11s} {'peak MiB':>9s}")
    out = {}
    for name, step, n, end_to_end in methods:
        t, _, m = timed(step, repeat=2 if n == len(texts) else 1)
        rate = n / t
        if end_to_end is None:
            # From text, the peers also have to build the shingle strings (in Python).
            e2e = 1.0 / (t / n + per_doc_shingle_s)
        else:
            e2e = len(texts) / timed(end_to_end, repeat=2)[0]
        print(f"{name:40s} {rate:12,.0f} {e2e:11,.0f} {m / 2**20:9.1f}")
        out[name.replace(f"({fast.backend})", "(fast)")] = {
            "docs_per_s": round(rate, 1), "e2e_docs_per_s": round(e2e, 1), "peak_mib": round(m / 2**20, 2)}
    return out


# -- quality ---------------------------------------------------------------------------------------
def perturb_words(text: str, rate: float, vocab: list[str], rnd: random.Random) -> str:
    words = text.split()
    out: list[str] = []
    for w in words:
        r = rnd.random()
        if r < rate / 4:
            continue  # delete
        if r < rate / 2:
            out.append(rnd.choice(vocab))  # substitute
        elif r < 3 * rate / 4:
            out += [w, rnd.choice(vocab)]  # insert
        elif r < rate and out:
            out.insert(len(out) - 1, w)  # swap with the previous word
        else:
            out.append(w)
    return " ".join(out)


def perturb_chars(text: str, rate: float, rnd: random.Random) -> str:
    chars = list(text)
    out: list[str] = []
    for ch in chars:
        r = rnd.random()
        if r < rate / 3:
            continue
        if r < 2 * rate / 3:
            out.append(rnd.choice(chars))
        elif r < rate:
            out += [ch, rnd.choice("的了是在，。")]
        else:
            out.append(ch)
    return "".join(out)


def build_quality_set(n_en: int, n_zh: int, seed: int = 7) -> list[dict]:
    rnd = random.Random(seed)
    en = documents(DATA / "prose-en.txt", 2000, n_en)
    zh = documents(DATA / "prose-zh.txt", 2000, n_zh)
    vocab = sorted({w for t in en[:300] for w in t.split()})
    docs = []
    for lang, originals in (("en", en), ("zh", zh)):
        for i, text in enumerate(originals):
            docs.append({"id": f"{lang}-{i:05d}", "text": text, "lang": lang, "origin": f"{lang}-{i:05d}"})
            if rnd.random() < 0.5:
                for c in range(rnd.choice((1, 1, 2, 3))):
                    rate = rnd.uniform(0.0, 0.06)
                    copy = perturb_words(text, rate, vocab, rnd) if lang == "en" else perturb_chars(text, rate, rnd)
                    if rnd.random() < 0.2:
                        copy = copy[: int(len(copy) * rnd.uniform(0.85, 1.0))]
                    docs.append({"id": f"{lang}-{i:05d}-copy{c}", "text": copy, "lang": lang, "origin": f"{lang}-{i:05d}"})
    rnd.shuffle(docs)
    return docs


def exact_pairs(docs: list[dict], min_j: float) -> dict[tuple[int, int], float]:
    """Every pair (i < j) with exact shingle Jaccard ≥ min_j, by a sparse matrix product."""
    from scipy import sparse

    sets = MinHasher(NUM_PERM).shingle_sets([d["text"] for d in docs])
    cols = np.concatenate(sets)
    _, col_ids = np.unique(cols, return_inverse=True)
    rows = np.repeat(np.arange(len(sets)), [len(s) for s in sets])
    m = sparse.csr_matrix((np.ones(len(cols), dtype=np.float32), (rows, col_ids)), shape=(len(sets), col_ids.max() + 1))
    inter = sparse.triu(m @ m.T, k=1).tocoo()
    sizes = np.array([len(s) for s in sets], dtype=np.float64)
    jac = inter.data / (sizes[inter.row] + sizes[inter.col] - inter.data)
    keep = jac >= min_j
    return {(int(a), int(b)): float(j) for a, b, j in zip(inter.row[keep], inter.col[keep], jac[keep])}


def components(n: int, pairs) -> np.ndarray:
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(i) for i in range(n)])


def score(cluster_of: np.ndarray, truth: dict, langs: np.ndarray, lang: str | None = None) -> dict:
    n = len(cluster_of)
    sel = np.ones(n, bool) if lang is None else langs == lang
    chain80 = components(n, [p for p, j in truth.items() if j >= THRESHOLD])
    chain85 = components(n, [p for p, j in truth.items() if j >= 0.85])
    positives = [p for p, j in truth.items() if j >= 0.85 and sel[p[0]]]
    found = sum(1 for a, b in positives if cluster_of[a] == cluster_of[b])
    groups: dict = {}
    for i in np.flatnonzero(sel):
        groups.setdefault(cluster_of[i], []).append(i)
    predicted = ok = strict = 0
    for members in groups.values():
        for x in range(len(members)):
            for y in range(x + 1, len(members)):
                a, b = members[x], members[y]
                predicted += 1
                ok += chain80[a] == chain80[b]
                strict += chain85[a] == chain85[b]
    precision = ok / predicted if predicted else 1.0
    recall = found / len(positives) if positives else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
            "strict_precision": round(strict / predicted if predicted else 1.0, 4),
            "positive_pairs": len(positives), "predicted_pairs": predicted,
            "removed": int(sum(1 for g in groups.values() for _ in g[1:]))}


def score_table(methods, truth: dict, langs: np.ndarray) -> dict:
    """Score each (name, cluster labels, seconds) overall and per language; print one table."""
    results = {}
    print(f"{'method':44s} {'lang':4s} {'prec':>6s} {'strict':>6s} {'recall':>6s} {'f1':>6s} {'pos':>5s} {'pred':>5s} {'removed':>7s}")
    for name, labels, secs in methods:
        results[name] = {"seconds": round(secs, 1)}
        for lang in (None, "en", "zh"):
            s = score(labels, truth, langs, lang)
            results[name][lang or "all"] = s
            print(f"{name:44s} {lang or 'all':4s} {s['precision']:6.3f} {s['strict_precision']:6.3f} {s['recall']:6.3f} "
                  f"{s['f1']:6.3f} {s['positive_pairs']:5d} {s['predicted_pairs']:5d} {s['removed']:7d}")
    return results


def run_dsdata_recipe(docs: list[dict], workdir: Path, overrides: list[str]) -> tuple[np.ndarray, float, dict]:
    import pyarrow.parquet as pq

    from dsdata.beam.pipeline import run_recipe
    from dsdata.recipe import load_recipe

    inp = workdir / "quality.jsonl"
    inp.write_text("".join(json.dumps({"id": d["id"], "text": d["text"]}, ensure_ascii=False) + "\n" for d in docs), "utf-8")
    recipe = load_recipe(str(REPO / "pipelines" / "dedup.yaml"), overrides)
    recipe.inputs = [str(inp)]
    t = time.perf_counter()
    stats = run_recipe(recipe, str(workdir / "out"))
    seconds = time.perf_counter() - t
    cluster = {}
    for kind in ("kept", "rejected"):
        for f in (workdir / "out" / kind).glob("*.parquet"):
            for row in pq.read_table(f).to_pylist():
                cluster[row["id"]] = row["dup_cluster"] if kind == "kept" else json.loads(row["annotations"])["dup_cluster"]
    index = {d["id"]: i for i, d in enumerate(docs)}
    labels = np.array([index[cluster[d["id"]]] for d in docs])
    return labels, seconds, stats


def run_datasketch_baseline(docs: list[dict]) -> tuple[np.ndarray, float]:
    import datasketch

    t = time.perf_counter()
    encoded = [[s.encode("utf-8") for s in shingle_strings(d["text"])] or [b""] for d in docs]
    sigs = datasketch.MinHash.bulk(encoded, num_perm=NUM_PERM, seed=1)
    lsh = datasketch.MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    for i, m in enumerate(sigs):
        lsh.insert(str(i), m)
    pairs = [(i, int(j)) for i, m in enumerate(sigs) for j in lsh.query(m) if int(j) != i]
    return components(len(docs), pairs), time.perf_counter() - t


def quality(n_en: int, n_zh: int) -> dict:
    docs = build_quality_set(n_en, n_zh)
    langs = np.array([d["lang"] for d in docs])
    truth = exact_pairs(docs, 0.5)
    real = sum(1 for (a, b), j in truth.items() if j >= 0.85 and docs[a]["origin"] != docs[b]["origin"])
    print(f"\n== quality: {len(docs)} docs ({(langs == 'en').sum()} en, {(langs == 'zh').sum()} zh); pairs with "
          f"true J ≥ 0.85: {sum(j >= 0.85 for j in truth.values())} (of which {real} between different real "
          f"documents), 0.8–0.85: {sum(0.8 <= j < 0.85 for j in truth.values())}, 0.5–0.8: "
          f"{sum(j < 0.8 for j in truth.values())}")
    with tempfile.TemporaryDirectory() as tmp:
        ours, t_ours, stats = run_dsdata_recipe(docs, Path(tmp), [])
        ours_sig, t_sig, _ = run_dsdata_recipe(docs, Path(tmp), ["dedup.verify=signature"])
    base, t_base = run_datasketch_baseline(docs)
    results = score_table((("dsdata pipelines/dedup.yaml (DirectRunner)", ours, t_ours),
                           ("  same, --set dedup.verify=signature", ours_sig, t_sig),
                           ("datasketch MinHashLSH(0.8,128)+union-find", base, t_base)), truth, langs)
    print(f"dsdata recipe {t_ours:.1f} s (ledger ok: {stats['ledger_ok']}, rejected {stats['rejected']}); "
          f"datasketch baseline {t_base:.1f} s in memory")
    return results


# -- real near-duplicates ------------------------------------------------------------------------
GUIDES = Path("/usr/share/doc")


def real_guide_set() -> list[dict]:
    """The Debian installation guide's pages for every installed architecture, English and Chinese:
    real near-duplicates (the same page with architecture-specific paragraphs, device names, boot
    loaders), exact duplicates (arch-neutral pages) and distinct pages.  Text as dsdata's `clean`
    stage extracts it from the HTML."""
    from dsdata.clean.html import extract_dom

    docs = []
    for guide in sorted(GUIDES.glob("installation-guide-*")):
        arch = guide.name.removeprefix("installation-guide-")
        for lang_dir, lang in (("en", "en"), ("zh_CN", "zh")):
            for page in sorted((guide / lang_dir).glob("*.html")):
                text = extract_dom(page.read_text("utf-8", errors="replace")).text
                if text.strip():
                    docs.append({"id": f"{arch}/{lang_dir}/{page.name}", "text": text, "lang": lang, "origin": arch})
    return docs


def real_quality() -> dict | None:
    docs = real_guide_set()
    archs = sorted({d["origin"] for d in docs})
    if len(archs) < 2:
        print(f"\n== real near-duplicates: skipped — needs the Debian installation guide for two or more "
              f"architectures (apt-get install installation-guide-amd64 installation-guide-arm64 "
              f"installation-guide-i386); found {archs or 'none'}")
        return None
    langs = np.array([d["lang"] for d in docs])
    truth = exact_pairs(docs, 0.5)
    exact = sum(1 for j in truth.values() if j >= 0.999)
    print(f"\n== real near-duplicates: Debian installation guide for {', '.join(archs)} (GPL-2; read from "
          f"{GUIDES}/installation-guide-*, not shipped), {len(docs)} pages ({(langs == 'en').sum()} en, "
          f"{(langs == 'zh').sum()} zh); pairs with true J ≥ 0.85: {sum(j >= 0.85 for j in truth.values())} "
          f"({exact} of them identical shingle sets), 0.8–0.85: {sum(0.8 <= j < 0.85 for j in truth.values())}, "
          f"0.5–0.8: {sum(j < 0.8 for j in truth.values())}")
    with tempfile.TemporaryDirectory() as tmp:
        ours, t_ours, stats = run_dsdata_recipe(docs, Path(tmp), [])
    base, t_base = run_datasketch_baseline(docs)
    results = score_table((("dsdata pipelines/dedup.yaml (DirectRunner)", ours, t_ours),
                           ("datasketch MinHashLSH(0.8,128)+union-find", base, t_base)), truth, langs)
    print(f"dsdata recipe {t_ours:.1f} s (ledger ok: {stats['ledger_ok']}, rejected {stats['rejected']}); "
          f"datasketch baseline {t_base:.1f} s in memory")
    return results


# -- scale -----------------------------------------------------------------------------------------
def scale(n_docs: int) -> dict:
    rnd = random.Random(1)
    base = documents(DATA / "prose-en.txt", 2000, 3000) + documents(DATA / "prose-zh.txt", 2000, 1500)
    vocab = sorted({w for t in base[:200] for w in t.split()})
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "scale.jsonl"
        with inp.open("w", encoding="utf-8") as fh:
            for i in range(n_docs):
                src = base[i % len(base)]
                # Beyond the real documents: shifted windows of them with a few substituted words,
                # so most are distinct and some are near-duplicates, like a crawl.
                words = src.split()
                start = rnd.randrange(0, max(1, len(words) // 3))
                text = perturb_words(" ".join(words[start:] + words[:start]), rnd.uniform(0, 0.2), vocab, rnd)
                if i < len(base):
                    text = src
                fh.write(json.dumps({"id": f"s{i:07d}", "text": text}, ensure_ascii=False) + "\n")
        size = inp.stat().st_size
        cmd = [sys.executable, "-m", "dsdata.cli", "run", str(REPO / "pipelines" / "dedup.yaml"),
               "--input", str(inp), "--output", str(Path(tmp) / "out"), "--quiet"]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        seconds = time.perf_counter() - t
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if proc.returncode != 0:
            print(proc.stderr[-3000:])
            raise SystemExit(f"scale run failed with status {proc.returncode}")
        stats = json.loads(proc.stdout.strip().splitlines()[-1])
    out = {"docs": n_docs, "input_mib": round(size / 2**20, 1), "seconds": round(seconds, 1),
           "docs_per_s": round(n_docs / seconds, 1), "peak_rss_mib": round(peak_kib / 1024, 1),
           "kept": stats["kept"], "rejected": stats["rejected_total"]}
    print(f"\n== scale: {n_docs} docs ({out['input_mib']} MiB JSONL) through pipelines/dedup.yaml on the default "
          f"in-process runner: {seconds:.1f} s, {out['docs_per_s']:.0f} docs/s, peak RSS {out['peak_rss_mib']:.0f} MiB, "
          f"kept {stats['kept']}, rejected {stats['rejected_total']}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=2000, help="documents per language for the speed test")
    parser.add_argument("--loop-docs", type=int, default=150, help="documents for datasketch's slow update loop")
    parser.add_argument("--quality-en", type=int, default=1500, help="real English documents in the quality set")
    parser.add_argument("--quality-zh", type=int, default=1000, help="real Chinese documents in the quality set")
    parser.add_argument("--scale", type=int, default=0, help="also run N synthetic-from-real documents through the recipe")
    args = parser.parse_args()
    if not DATA.is_dir():
        raise SystemExit(f"shared data not found at {DATA}")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    first_call = numba_first_call_seconds()
    if first_call:
        print(f"fresh process to first signature: numba {first_call['cold_compile_s']} s compiling (empty cache), "
              f"{first_call['cached_s']} s with its cache; numpy only {first_call['numpy_only_s']} s")
    speeds = {}
    for lang, name in (("en", "prose-en.txt"), ("zh", "prose-zh.txt")):
        speeds[lang] = speed(documents(DATA / name, 2000, args.docs), lang, args.loop_docs)
    qual = quality(args.quality_en, args.quality_zh)
    real = real_quality()
    scaled = scale(args.scale) if args.scale else None

    def ratio(peer: str, key: str = "docs_per_s", ours: str = "dsdata signatures (fast)") -> float:
        """Worst language's ratio dsdata / peer."""
        return round(min(speeds[l][ours][key] / speeds[l][peer][key] for l in speeds), 2)

    ours = qual["dsdata pipelines/dedup.yaml (DirectRunner)"]["all"]
    summary = {
        "backend": MinHasher().backend,
        "speedup_vs_datasketch": ratio("datasketch MinHash.update loop"),
        "speedup_vs_datasketch_bulk": ratio("datasketch MinHash.bulk"),
        "speedup_vs_rensa": ratio("rensa RMinHash.update"),
        "speedup_vs_rensa_bulk": ratio("rensa digest_matrix_from_token_sets"),
        "speedup_vs_rensa_end_to_end": ratio("rensa RMinHash.update", "e2e_docs_per_s"),
        "numpy_fallback_speedup_vs_rensa": ratio("rensa RMinHash.update", ours="dsdata signatures (numpy fallback)"),
        "numpy_fallback_speedup_vs_rensa_end_to_end": ratio(
            "rensa RMinHash.update", "e2e_docs_per_s", ours="dsdata signatures (numpy fallback)"),
        "dsdata_signature_docs_per_s": {l: speeds[l]["dsdata signatures (fast)"]["docs_per_s"] for l in speeds},
        "dsdata_e2e_docs_per_s": {l: speeds[l]["dsdata signatures (fast)"]["e2e_docs_per_s"] for l in speeds},
        "numba_first_call": first_call,
        "precision": ours["precision"], "recall": ours["recall"], "f1": ours["f1"],
        "strict_precision": ours["strict_precision"],
        "precision_en": qual["dsdata pipelines/dedup.yaml (DirectRunner)"]["en"]["precision"],
        "recall_en": qual["dsdata pipelines/dedup.yaml (DirectRunner)"]["en"]["recall"],
        "precision_zh": qual["dsdata pipelines/dedup.yaml (DirectRunner)"]["zh"]["precision"],
        "recall_zh": qual["dsdata pipelines/dedup.yaml (DirectRunner)"]["zh"]["recall"],
        "signature_verify_precision": qual["  same, --set dedup.verify=signature"]["all"]["precision"],
        "signature_verify_recall": qual["  same, --set dedup.verify=signature"]["all"]["recall"],
        "datasketch_lsh_precision": qual["datasketch MinHashLSH(0.8,128)+union-find"]["all"]["precision"],
        "datasketch_lsh_recall": qual["datasketch MinHashLSH(0.8,128)+union-find"]["all"]["recall"],
    }
    if real:
        ours_real = real["dsdata pipelines/dedup.yaml (DirectRunner)"]["all"]
        peer_real = real["datasketch MinHashLSH(0.8,128)+union-find"]["all"]
        summary.update({"real_precision": ours_real["precision"], "real_recall": ours_real["recall"],
                        "real_f1": ours_real["f1"], "real_positive_pairs": ours_real["positive_pairs"],
                        "datasketch_lsh_real_precision": peer_real["precision"],
                        "datasketch_lsh_real_recall": peer_real["recall"]})
    if scaled:
        summary["scale"] = scaled
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
