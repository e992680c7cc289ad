"""The compiled n-gram statistics of the rules stage give exactly what the pure-Python reference
gives: the same floats for every n, and the same verdicts, reasons and detail strings on real en/zh
documents and on generated text full of repeats."""
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from dsdata.document import Document, Rejected  # noqa: E402
from dsdata.stages import rules  # noqa: E402
from dsdata.stages.rules import QualityRulesStage, _dup_ngram_char_frac, _top_ngram_char_frac  # noqa: E402
from dsdata.stages import rules_kernels  # noqa: E402
from dsdata.stages.rules_kernels import ngram_char_fractions  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[1] / "pipelines" / "samples" / "docs.jsonl"


def reference(tokens, top_ns, dup_ns):
    return [_top_ngram_char_frac(tokens, n) for n in top_ns], [_dup_ngram_char_frac(tokens, n) for n in dup_ns]


# Few distinct tokens so that n-grams repeat, overlap and tie; mixed lengths so a tie between two
# n-grams of different character counts shows which one was picked; tokens whose lower-case form
# is longer (İ) or depends on the position in the word (final sigma), ones equal only after
# lower-casing (The/the), and CJK characters as in the CJK path.
VOCAB = ["a", "bb", "the", "The", "ccc", "İstanbul", "ΟΔΟΣ", "Σ", "ΣΑ", "of", "安", "装", "系统", "。", "x" * 13]
tokens_st = st.lists(st.sampled_from(VOCAB), max_size=400)
sizes_st = st.lists(st.integers(1, 22), max_size=8)


@settings(max_examples=400, deadline=None)
@given(tokens_st, sizes_st, sizes_st, st.booleans())
def test_fractions_equal_reference_on_generated_tokens(tokens, top_ns, dup_ns, lower):
    expected = reference([t.lower() for t in tokens] if lower else tokens, top_ns, dup_ns)
    assert ngram_char_fractions(tokens, top_ns, dup_ns, lower=lower) == expected


# Any non-empty run of non-whitespace characters: what the rules stage's words are.
word_st = st.text(min_size=1, max_size=6).filter(lambda w: not any(ch.isspace() for ch in w))


@settings(max_examples=500, deadline=None)
@given(st.lists(word_st, max_size=30))
def test_lowering_the_joined_tokens_lowers_each_token(tokens):
    # Why the kernel may lower-case one space-joined string instead of every token: the space
    # bounds the final-sigma context as a token's ends do, and nothing lower-cases to a space.
    assert " ".join(tokens).lower().split(" ") == ([t.lower() for t in tokens] if tokens else [""])


@settings(max_examples=300, deadline=None)
@given(st.lists(word_st, max_size=60), st.lists(st.integers(1, 6), min_size=1, max_size=4))
def test_fractions_equal_reference_on_arbitrary_unicode_words(words_, sizes):
    # Arbitrary code points (surrogates, combining marks, astral planes) through the code-point
    # hashing of the tokens; repeats made by doubling the list.
    tokens = words_ + words_[: len(words_) // 2]
    for lower in (False, True):
        expected = reference([t.lower() for t in tokens] if lower else tokens, sizes, sizes)
        assert ngram_char_fractions(tokens, sizes, sizes, lower=lower) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(VOCAB[:3]), min_size=1, max_size=30), st.integers(1, 40), st.integers(1, 12))
def test_fractions_equal_reference_on_periodic_tokens(unit, repeats, n):
    # A repeated unit is the worst case for the skip-over rule of the duplicated n-gram count.
    tokens = unit * repeats
    assert ngram_char_fractions(tokens, [n], [n]) == reference(tokens, [n], [n])


def test_distinct_ngrams_never_merge():
    # 20,000 distinct tokens: every n-gram is unique, so nothing is duplicated and the top n-gram
    # occurs once.  The table (2^16 slots) sees thousands of probe collisions on the way; had any
    # merged two different n-grams, the duplicated fraction would not be 0.
    tokens = [f"w{i}" for i in range(20_000)]
    top, dup = ngram_char_fractions(tokens, [2, 3], [5, 10])
    assert dup == [0.0, 0.0]
    assert (top, dup) == reference(tokens, [2, 3], [5, 10])


def fnv1a(word):
    h = int(rules_kernels._FNV_OFFSET)
    for ch in word:
        h = ((h ^ ord(ch)) * int(rules_kernels._FNV_PRIME)) % 2**64
    return h


def test_tokens_with_the_same_64_bit_hash_stay_apart():
    # Two different 3-character tokens with the same FNV-1a hash (found by a birthday search over
    # 6 million 2-character prefixes, then a third character fixing the low bits).  Had the kernel
    # trusted the hash, they would be one token and the duplicated fraction would not be 0.
    a, b = "".join(map(chr, (906395, 615564, 0x100))), "".join(map(chr, (906398, 617134, 614079)))
    assert a != b and fnv1a(a) == fnv1a(b)
    tokens = [a, b, "x", "y", a, b, "z", "w"]
    assert ngram_char_fractions(tokens, [1, 2], [2, 3]) == reference(tokens, [1, 2], [2, 3])
    alternating = [a, b] * 10
    assert ngram_char_fractions(alternating, [1], [1]) == reference(alternating, [1], [1]) == ([0.5], [0.9])


def test_de_bruijn_tokens_distinguish_n_from_n_minus_1():
    # B(2, 10): every 10-gram of {a, b} occurs once, every shorter n-gram repeats.
    k, n = 2, 10
    a = [0] * k * n
    seq = []

    def db(t, p):
        if t > n:
            if n % p == 0:
                seq.extend(a[1 : p + 1])
        else:
            a[t] = a[t - p]
            db(t + 1, p)
            for j in range(a[t - p] + 1, k):
                a[t] = j
                db(t + 1, t)

    db(1, 1)
    tokens = ["ab"[i] for i in seq + seq[: n - 1]]
    top, dup = ngram_char_fractions(tokens, list(range(1, 12)), list(range(1, 12)))
    assert dup[n - 1] == 0.0 and dup[n - 2] > 0.0
    assert (top, dup) == reference(tokens, list(range(1, 12)), list(range(1, 12)))


def verdict(result):
    if isinstance(result, Rejected):
        return ("rejected", result.reason, result.detail, result.doc.annotations)
    return ("kept", result.text, result.annotations)


def both_ways(stage, text, monkeypatch):
    """The stage's result with the compiled kernels, then with the pure-Python reference."""
    assert rules._repetition_kernels() is not None
    fast = verdict(stage.process(Document("d", text)))
    with monkeypatch.context() as m:
        m.setattr(rules, "_kernels", False)
        assert rules._repetition_kernels() is None
        slow = verdict(stage.process(Document("d", text)))
    return fast, slow


def real_documents(shared_data):
    docs = [json.loads(line)["text"] for line in SAMPLES.read_text(encoding="utf-8").splitlines() if line.strip()]
    for name in ("prose-en.txt", "prose-zh.txt"):
        parts = [p for p in (shared_data / name).read_text(encoding="utf-8").split("\n\n") if p.strip()]
        docs += parts[::5]  # every fifth document: all kinds of verdict, a few seconds of reference time
    return docs


def test_same_verdicts_on_real_documents(shared_data, monkeypatch):
    stage = QualityRulesStage()
    docs = real_documents(shared_data)
    fast, slow = [], []
    for text in docs:
        f, s = both_ways(stage, text, monkeypatch)
        fast.append(f)
        slow.append(s)
    assert fast == slow
    reasons = {v[1] for v in fast if v[0] == "rejected"}
    # The comparison reached the repetition rules, both Latin and CJK, not only the earlier ones.
    assert {"gopher_dup_5gram", "gopher_top_2gram", "gopher_top_4gram"} <= reasons, reasons
    zh_rejected = [v for v, t in zip(fast, docs) if v[0] == "rejected" and v[3].get("rules_cjk") and v[1].startswith("gopher_")]
    assert zh_rejected


# Generated documents: lines drawn from a few real en and zh sentences, repeated and shuffled, so
# duplicate lines, paragraphs and n-grams all occur at every rate.
SENTENCES = [
    "The package manager keeps a list of the files that each package installed.",
    "Run the command as root and check the output of the log file.",
    "It is a good idea to have a backup of the configuration before you upgrade.",
    "使用软件包管理器可以安装和删除系统中的软件。",
    "这是一个在系统启动时运行的服务。",
    "Click here.",
    "Buy the cheap pills now",
    "数据库的备份和恢复",
]
line_st = st.lists(st.sampled_from(SENTENCES), min_size=1, max_size=4).map(" ".join)
doc_st = st.lists(st.tuples(line_st, st.sampled_from(["\n", "\n\n", "\n \n"])), min_size=1, max_size=40).map(
    lambda parts: "".join(line + sep for line, sep in parts)
)
ratios_st = st.dictionaries(st.integers(1, 10), st.floats(0.0, 0.6, allow_nan=False), max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc_st, ratios_st, ratios_st)
def test_same_verdicts_on_generated_documents(monkeypatch, text, top, dup):
    # Loose quality rules so that most documents reach the repetition rules.
    stage = QualityRulesStage(
        min_words=1, c4_min_sentences=None, min_stop_words=None, min_mean_word_length=None,
        top_ngram_max_ratio=top, dup_ngram_max_ratio=dup,
    )
    fast, slow = both_ways(stage, text, monkeypatch)
    assert fast == slow
