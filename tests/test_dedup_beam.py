"""The dedup stage on Beam: transitive clusters, CJK near-duplicates, exact duplicates, keep rules,
connected components against union-find, and the ledger law (via run_recipe on the default runner)."""
import json
import random
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that

from dsdata.beam.dedup.composite import ConnectedComponents
from dsdata.beam.pipeline import pipeline_options, run_recipe
from dsdata.dedup.minhash import MinHasher
from dsdata.recipe import load_recipe

pytestmark = pytest.mark.slow


def _words(rnd: random.Random, n: int) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rnd.choice(letters) for _ in range(rnd.randint(3, 9))) for _ in range(n)]


def _substitute(words: list[str], positions: list[int], tag: str) -> list[str]:
    out = list(words)
    for i, p in enumerate(positions):
        out[p] = f"{tag}{i}x"
    return out


def _corpus() -> tuple[list[dict], dict[str, list[str]]]:
    rnd = random.Random(11)
    docs: list[dict] = []
    # A chain: each hop changes 3 words (J ≈ 0.93 to the next), four hops apart J ≈ 0.74.
    base = _words(rnd, 400)
    chain = [base]
    for hop in range(4):
        chain.append(_substitute(chain[-1], [40 + hop * 90 + k * 25 for k in range(3)], f"hop{hop}q"))
    for i, words in enumerate(chain):
        docs.append({"id": f"chain{i}", "text": " ".join(words)})
    # Exact duplicates under other ids: verbatim, and differing only in case and whitespace.
    original = " ".join(_words(rnd, 300))
    docs += [
        {"id": "exact-b", "text": original},
        {"id": "exact-a", "text": original.upper().replace(" ", "  \n")},
        {"id": "exact-c", "text": original},
    ]
    # Chinese near-duplicates: 600 characters, the copy has 4 characters changed and punctuation.
    han = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]
    zh = [rnd.choice(han) for _ in range(600)]
    zh_copy = list(zh)
    for p in (100, 250, 400, 550):
        zh_copy[p] = "的"
    zh_copy.insert(300, "，")
    docs += [{"id": "zh-2", "text": "".join(zh_copy)}, {"id": "zh-1", "text": "".join(zh)}]
    # Distinct documents (English and Chinese) and two without any shingle.
    for i in range(6):
        docs.append({"id": f"solo{i}", "text": " ".join(_words(rnd, 200))})
    docs.append({"id": "solo-zh", "text": "".join(rnd.choice(han) for _ in range(400))})
    docs += [{"id": "punct1", "text": "!!! ---"}, {"id": "punct2", "text": "???"}]
    # The same record twice (same id, same text): one copy is kept.
    docs.append(dict(next(d for d in docs if d["id"] == "solo5")))
    clusters = {
        "chain0": [f"chain{i}" for i in range(5)],
        "exact-a": ["exact-a", "exact-b", "exact-c"],
        "zh-1": ["zh-1", "zh-2"],
    }
    return docs, clusters


def _rows(out: Path, kind: str) -> list[dict]:
    rows = []
    for f in sorted((out / kind).glob("*.parquet")):
        rows.extend(pq.read_table(f).to_pylist())
    return rows


def _run(tmp_path: Path, docs: list[dict], stage_yaml: str, name: str = "out") -> tuple[dict, list, list]:
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(d, ensure_ascii=False) for d in docs) + "\n", "utf-8")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: t\ninput: {{paths: [in.jsonl]}}\nstages:\n  - dedup: {stage_yaml}\n", "utf-8")
    out = tmp_path / name
    stats = run_recipe(load_recipe(str(recipe)), str(out))
    written = json.loads((out / "stats.json").read_text())
    return written, _rows(out, "kept"), _rows(out, "rejected")


def test_clusters_reasons_annotations_and_ledger(tmp_path):
    docs, clusters = _corpus()
    hasher = MinHasher()
    by_id = {d["id"]: d["text"] for d in docs}
    sig = dict(zip(by_id, hasher.signatures(list(by_id.values()))[0]))
    est = lambda a, b: float(np.mean(sig[a] == sig[b]))  # noqa: E731
    # Premises: neighbours in the chain are near-duplicates, its ends are not (A~B~…~E, A≁E),
    # and the Chinese copy is one by its character shingles.
    assert all(est(f"chain{i}", f"chain{i + 1}") >= 0.85 for i in range(4))
    assert est("chain0", "chain4") < 0.8 and est("chain0", "chain3") < 0.8
    assert est("zh-1", "zh-2") >= 0.85

    stats, kept, rejected = _run(tmp_path, docs, "{cc_rounds: 4}")
    assert stats["ledger_ok"] and stats["input"] == len(docs)
    assert stats["input"] == stats["kept"] + stats["rejected_total"] == len(kept) + len(rejected)
    n_removed = sum(len(m) - 1 for m in clusters.values()) + 1  # + the repeated record
    assert stats["kept"] == len(docs) - n_removed
    assert stats["rejected"] == {"dedup": {"exact_duplicate": 3, "near_duplicate": 5}}

    kept_ids = {r["id"] for r in kept}
    for keeper, members in clusters.items():
        assert keeper in kept_ids and not (set(members) - {keeper}) & kept_ids
    for r in kept:
        cluster = next((k for k, m in clusters.items() if r["id"] in m), r["id"])
        assert r["dup_cluster"] == cluster
        size = len(clusters[cluster]) if cluster in clusters else 1
        assert r["dup_cluster_size"] == (2 if r["id"] == "solo5" else size)
    assert sum(r["id"] == "solo5" for r in kept) == 1
    reasons = {r["id"]: r["reason"] for r in rejected}
    assert reasons == {"solo5": "exact_duplicate",
        "exact-b": "exact_duplicate", "exact-c": "exact_duplicate", "zh-2": "near_duplicate",
        **{f"chain{i}": "near_duplicate" for i in range(1, 5)},
    }
    for r in rejected:
        ann = json.loads(r["annotations"])
        expected = next((k for k, m in clusters.items() if r["id"] in m), r["id"])
        assert r["stage"] == "dedup" and ann["dup_cluster"] == expected


def test_keep_highest_score_and_exact_only(tmp_path):
    docs, _ = _corpus()
    scores = {"chain3": 0.9, "chain1": 0.5, "zh-1": 0.1}
    for d in docs:
        if d["id"] in scores:
            d["quality_score"] = scores[d["id"]]
    stats, kept, rejected = _run(tmp_path, docs, "{keep: highest_score, score_field: quality_score, verify: signature}")
    kept_ids = {r["id"] for r in kept}
    assert "chain3" in kept_ids and not {"chain0", "chain1", "chain2", "chain4"} & kept_ids
    assert "zh-1" in kept_ids and "zh-2" not in kept_ids  # unscored documents rank last
    assert "exact-a" in kept_ids  # no scores in the cluster: lowest id
    assert {r["dup_cluster"] for r in kept if r["id"] == "chain3"} == {"chain3"}

    stats, kept, rejected = _run(tmp_path, docs, "{near: false}", name="exact-only")
    assert stats["rejected"] == {"dedup": {"exact_duplicate": 3}}
    assert stats["ledger_ok"] and stats["kept"] == len(docs) - 3


def test_verification_splits_a_candidate_component(tmp_path):
    """One candidate component (the chain collides band by band) holds one true cluster at a high
    threshold: only the pair above it is removed; the chain links below it keep their documents."""
    docs, _ = _corpus()
    chain0 = next(d["text"] for d in docs if d["id"] == "chain0").split()
    docs.append({"id": "chain0b", "text": " ".join(_substitute(chain0, [200], "near"))})  # J ≈ 0.975 to chain0
    by_id = {d["id"]: d["text"].split() for d in docs}

    def jaccard(a: str, b: str) -> float:  # of word 5-gram sets, as verify: exact computes it
        x, y = ({tuple(by_id[k][i:i + 5]) for i in range(len(by_id[k]) - 4)} for k in (a, b))
        return len(x & y) / len(x | y)

    assert jaccard("chain0", "chain0b") >= 0.97  # premises: one pair above 0.95, chain links below
    assert all(0.9 <= jaccard(f"chain{i}", f"chain{i + 1}") < 0.95 for i in range(4))
    assert jaccard("chain0b", "chain1") < 0.95

    stats, kept, rejected = _run(tmp_path, docs, "{threshold: 0.95, bands: 16, rows: 8}")
    assert stats["ledger_ok"]
    near = {r["id"] for r in rejected if r["reason"] == "near_duplicate"}
    assert near == {"chain0b"}
    kept_by_id = {r["id"]: r for r in kept}
    assert kept_by_id["chain0"]["dup_cluster_size"] == 2
    for i in range(1, 5):
        assert kept_by_id[f"chain{i}"]["dup_cluster"] == f"chain{i}"
        assert kept_by_id[f"chain{i}"]["dup_cluster_size"] == 1

    # Without verification the candidate component is the cluster: the whole chain goes but one.
    stats, kept, rejected = _run(tmp_path, docs, "{threshold: 0.95, bands: 16, rows: 8, verify: none}", name="none")
    assert {f"chain{i}" for i in range(1, 5)} | {"chain0b"} <= {r["id"] for r in rejected}
    assert stats["ledger_ok"]


def _union_find_labels(edges):
    parent = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups = {}
    for node in list(parent):
        groups.setdefault(find(node), []).append(node)
    return {node: min(members) for members in groups.values() for node in members}


def test_connected_components_match_union_find():
    rnd = random.Random(5)
    edges = [(f"p{i:03d}", f"p{i + 1:03d}") for i in range(60)]  # a long path, shuffled names below
    names = [f"r{i:03d}" for i in range(80)]
    edges += [(rnd.choice(names), rnd.choice(names)) for _ in range(70)]
    edges += [("s000", f"s{i:03d}") for i in range(1, 30)] + [("t005", "t001"), ("t001", "t009")]
    perm = [f"q{i:03d}" for i in range(61)]
    rnd.shuffle(perm)
    edges += [(perm[i], perm[i + 1]) for i in range(60)]  # a path whose order is not the id order
    edges = [(a, b) for a, b in edges if a != b]
    expected = sorted(_union_find_labels(edges).items())

    def check(actual):
        assert sorted(actual) == expected

    with beam.Pipeline(options=pipeline_options([])) as p:
        labels = p | beam.Create(edges) | ConnectedComponents(rounds=8)
        assert_that(labels, check)


def test_dedup_recipe_removes_the_sample_mirrors(tmp_path):
    """pipelines/dedup.yaml as users run it, on the real sample corpus with its two mirror copies."""
    repo = Path(__file__).resolve().parents[1]
    recipe = load_recipe(str(repo / "pipelines" / "dedup.yaml"))
    assert [s.name for s in recipe.stages] == ["dedup"] and recipe.stages[0].params["threshold"] == 0.8
    stats = run_recipe(recipe, str(tmp_path / "out"))
    n_input = sum(1 for line in (repo / "pipelines/samples/docs.jsonl").read_text("utf-8").splitlines() if line.strip())
    assert stats["ledger_ok"] and stats["input"] == n_input == stats["kept"] + stats["rejected_total"]
    rejected = _rows(tmp_path / "out", "rejected")
    page = "apt-doc:usr/share/doc/apt-doc/guide.html/ch4.html"
    mirrors = {f"mirror-a/{page}", f"mirror-b/{page}"}
    assert {r["id"] for r in rejected if r["reason"] == "exact_duplicate"} == mirrors
    kept = {r["id"]: r for r in _rows(tmp_path / "out", "kept")}
    assert kept[f"en/{page}"]["dup_cluster_size"] == 3
    assert all(json.loads(r["annotations"])["dup_cluster"] == f"en/{page}" for r in rejected if r["id"] in mirrors)
