"""The rules stage's compiled pass (rules_kernels.measure) gives exactly what its pure-Python
reference gives: every count and n-gram fraction, on generated, hostile and real text, and the same
verdicts, reasons and detail strings on real en/zh documents and on text full of repeats."""
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from dsdata.document import Document, Rejected  # noqa: E402
from dsdata.stages import rules  # noqa: E402
from dsdata.stages.rules import QualityRulesStage, _dup_ngram_char_frac, _top_ngram_char_frac  # noqa: E402
from dsdata.stages import rules_kernels  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[1] / "pipelines" / "samples" / "docs.jsonl"


def reference(tokens, top_ns, dup_ns):
    return [_top_ngram_char_frac(tokens, n) for n in top_ns], [_dup_ngram_char_frac(tokens, n) for n in dup_ns]


def compiled():
    assert rules._compiled() is not None  # real numba: the compiled path is the one under test
    return rules._compiled()


def measures(text, cjk, top_ns=(2, 3, 4), dup_ns=(5, 6, 7, 8, 9, 10), path="compiled", **params):
    """The stage's measures of text by the compiled pass or by the pure-Python reference."""
    stage = QualityRulesStage(top_ngram_max_ratio=dict.fromkeys(top_ns, 0.5), dup_ngram_max_ratio=dict.fromkeys(dup_ns, 0.5), **params)
    m = vars(stage._measure(text, text.lower(), cjk, compiled() if path == "compiled" else None))
    return {**m, "top": list(m["top"]), "dup": list(m["dup"])}


def ngram_fractions(tokens, top_ns, dup_ns):
    """(compiled, reference) n-gram fractions of tokens joined by spaces on the Latin path: the
    reference's tokens are the words the stage sees there, lower-cased one by one."""
    m = measures(" ".join(tokens), False, top_ns, dup_ns)
    words = [w.lower() for w in rules._NON_SYMBOL_WORD_RE.findall(" ".join(tokens))]
    return (m["top"], m["dup"]), reference(words, sorted(set(top_ns)), sorted(set(dup_ns)))


# Few distinct tokens so that n-grams repeat, overlap and tie; mixed lengths so a tie between two
# n-grams of different character counts shows which one was picked; tokens whose lower-case form
# is longer (İ) or depends on the position in the word (final sigma), ones equal only after
# lower-casing (The/the), and CJK characters as in the CJK path.
VOCAB = ["a", "bb", "the", "The", "ccc", "İstanbul", "ΟΔΟΣ", "Σ", "ΣΑ", "of", "安", "装", "系统", "。", "x" * 13]
tokens_st = st.lists(st.sampled_from(VOCAB), max_size=400)
sizes_st = st.lists(st.integers(1, 22), max_size=8)


@settings(max_examples=300, deadline=None)
@given(tokens_st, sizes_st, sizes_st)
def test_fractions_equal_reference_on_generated_tokens(tokens, top_ns, dup_ns):
    fast, expected = ngram_fractions(tokens, top_ns, dup_ns)
    assert fast == expected
    text = " ".join(tokens)  # and the CJK path (no lower-casing, character 2n-grams)
    assert measures(text, True, top_ns, dup_ns) == measures(text, True, top_ns, dup_ns, path="python")


# Any non-empty run of non-whitespace characters: what the rules stage's words are made of.
word_st = st.text(min_size=1, max_size=6).filter(lambda w: not any(ch.isspace() for ch in w))


def test_lower_casing_keeps_each_characters_class():
    # Why the compiled pass may take the words of the lower-cased text for the lower-cased words:
    # str.lower maps each code point on its own (Σ aside, whose final form depends on its
    # neighbours: the stage passes text with a Σ word by word), and no code point changes class
    # by it (space, CJK, letter or digit), so the same runs are the same words.
    table = compiled()[1]
    everything = "".join(chr(c) for c in range(0x110000) if c != 0x3A3)
    assert everything.lower() == "".join(ch.lower() for ch in everything)
    for ch in everything:
        low = ch.lower()
        if low != ch:
            kind, kinds = int(table[ord(ch)]), [int(table[ord(c)]) for c in low]
            both = rules_kernels.SPACE | rules_kernels.CJK
            assert all(k & both == kind & both for k in kinds), hex(ord(ch))
            assert bool(kind & rules_kernels.ALNUM) == any(k & rules_kernels.ALNUM for k in kinds), hex(ord(ch))
    # and the table's whitespace is str.strip's (the lines and paragraphs are stripped in the kernel)
    spaces = [c for c in range(0x110000) if chr(c).isspace()]
    assert list(map(int, (table & rules_kernels.SPACE).nonzero()[0])) == spaces


@settings(max_examples=300, deadline=None)
@given(st.lists(word_st, max_size=60), st.lists(st.integers(1, 6), min_size=1, max_size=4))
def test_fractions_equal_reference_on_arbitrary_unicode_words(words_, sizes):
    # Arbitrary code points (surrogates, combining marks, astral planes) through the code-point
    # hashing of the words; repeats made by doubling the list.
    tokens = words_ + words_[: len(words_) // 2]
    fast, expected = ngram_fractions(tokens, sizes, sizes)
    assert fast == expected
    text = " ".join(tokens)
    assert measures(text, True, sizes, sizes) == measures(text, True, sizes, sizes, path="python")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(VOCAB[:3]), min_size=1, max_size=30), st.integers(1, 40), st.integers(1, 12))
def test_fractions_equal_reference_on_periodic_tokens(unit, repeats, n):
    # A repeated unit is the worst case for the skip-over rule of the duplicated n-gram count.
    fast, expected = ngram_fractions(unit * repeats, [n], [n])
    assert fast == expected


def test_distinct_ngrams_never_merge():
    # 20,000 distinct tokens: every n-gram is unique, so nothing is duplicated and the top n-gram
    # occurs once.  The table (2^16 slots) sees thousands of probe collisions on the way; had any
    # merged two different n-grams, the duplicated fraction would not be 0.
    (top, dup), expected = ngram_fractions([f"w{i}" for i in range(20_000)], [2, 3], [5, 10])
    assert dup == [0.0, 0.0]
    assert (top, dup) == expected


def fnv1a(word):
    h = int(rules_kernels._FNV_OFFSET)
    for ch in word:
        h = ((h ^ ord(ch)) * int(rules_kernels._FNV_PRIME)) % 2**64
    return h


def test_tokens_with_the_same_64_bit_hash_stay_apart():
    # Two different 3-character strings with the same FNV-1a hash (found by a birthday search over
    # 6 million 2-character prefixes, then a third character fixing the low bits); a common suffix
    # keeps the hashes equal and makes them words.  Had the kernel trusted the hash, they would be
    # one word and the duplicated fraction would not be 0.
    a, b = "".join(map(chr, (906395, 615564, 0x100))) + "x", "".join(map(chr, (906398, 617134, 614079))) + "x"
    assert a != b and fnv1a(a) == fnv1a(b)
    for tokens in ([a, b, "x", "y", a, b, "z", "w"], [a, b] * 10):
        fast, expected = ngram_fractions(tokens, [1, 2], [1, 2, 3])
        assert fast == expected
    assert fast == ([0.5, 1.0], [0.9, 0.9, 0.9])
    for text in (a + "\n" + b, a + "\n\n" + b):  # nor two lines or paragraphs
        m = measures(text, False)
        assert (m["line_dup"], m["para_dup"]) == (0, 0)


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
    (top, dup), expected = ngram_fractions(tokens, list(range(1, 12)), list(range(1, 12)))
    assert dup[n - 1] == 0.0 and dup[n - 2] > 0.0
    assert (top, dup) == expected


def verdict(result):
    if isinstance(result, Rejected):
        return ("rejected", result.reason, result.detail, result.doc.annotations)
    return ("kept", result.text, result.annotations)


def both_ways(stage, text, monkeypatch):
    """The stage's result with the compiled kernels, then with the pure-Python reference."""
    compiled()
    fast = verdict(stage.process(Document("d", text)))
    with monkeypatch.context() as m:
        m.setattr(rules, "_kernels", False)
        assert rules._compiled() is None
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


# Hostile text: every kind of character the counts look at, mixed (a Σ before a case-ignorable CJK
# mark and a letter lower-cases differently in the text than in its word).
HOSTILE = st.lists(st.sampled_from(
    list("aZé_1٣²-.,#…!?'\"()）」』 \t\r\n\x85\u2028\u3000\xa0中文的了・ーアｱ한İΣςσ{}•*–。！？．：;")
    + ["...", "。。。", "ΑΣ\u309bb", "ΑΣ", "\u309b", "x" * 7, "The", "the", "\ud800", "\U0001f600", "e\u0301", "\n\n", "\n \n"]),
    max_size=120).map("".join)


@settings(max_examples=600, deadline=None)
@given(HOSTILE, st.booleans(), st.integers(1, 40))
@example("ΑΣ\u309bb ΑΣ ΑΣ\u309bb", False, 5)  # in the lower-cased text the first Σ is σ, in its word ς
def test_every_count_equals_the_reference_on_hostile_text(text, cjk, short):
    params = dict(fineweb_short_line_chars=short, fineweb_short_line_chars_cjk=short)
    assert measures(text, cjk, (1, 2, 3), (1, 4), **params) == measures(text, cjk, (1, 2, 3), (1, 4), path="python", **params)
    kernels, table = compiled()
    letters, cjk_letters, longest = kernels.prescan(kernels.code_points(text), table)
    assert (cjk_letters / letters if letters else 0.0) == rules.cjk_ratio(text)
    for limit in (1, 3, 5):
        assert (longest > limit) == bool(rules._long_word(limit).search(text))


def test_every_count_equals_the_reference_on_real_documents(shared_data):
    for text in real_documents(shared_data)[::2]:
        for cjk in (False, True):
            assert measures(text, cjk) == measures(text, cjk, path="python")
