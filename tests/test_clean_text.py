"""Text cleaning: invisible characters, leftover markup, symbol runs, whitespace, CJK-safe Unicode."""
import unicodedata

import pytest

from dsdata.clean.text import TextCleaner, normalize_unicode

ZH = "Debian 是一个自由的操作系统，由志愿者维护。你用过吗？当然！（见第 3 章：安装）“引号”、《书名》……——"


def test_cjk_text_is_untouched_by_default_cleaning():
    assert TextCleaner().clean(ZH) == ZH


@pytest.mark.parametrize("form", ["NFC", "NFKC_CJK", "none"])
def test_full_width_punctuation_survives_cjk_safe_forms(form):
    text = "你好，世界！真的吗？是的：（括号）；～\u3000下一句。"
    out = TextCleaner(unicode_form=form).clean(text)
    for ch in "，！？：（）；～。\u3000":
        assert ch in out, (form, ch)


def test_nfkc_folds_cjk_punctuation_and_nfkc_cjk_does_not():
    text = "你好，世界！ＡＢＣ１２３"
    assert normalize_unicode(text, "NFKC") == "你好,世界!ABC123"
    # NFKC_CJK still folds full-width Latin letters and digits, but not the punctuation.
    assert normalize_unicode(text, "NFKC_CJK") == "你好，世界！ABC123"


def test_nfc_composes_decomposed_latin():
    decomposed = "Cafe\u0301 re\u0301sume\u0301"
    out = TextCleaner().clean(decomposed)
    assert out == "Café résumé"
    assert unicodedata.is_normalized("NFC", out)


def test_control_and_zero_width_characters_removed_newline_and_tab_kept():
    text = "a\u200bb\ufeffc\x00d\x07e\tf\r\ng\u00adh\u2060i\x85j\x9bk"
    assert TextCleaner().clean(text) == "abcde\tf\nghi\njk"


def test_zwj_and_zwnj_are_kept():
    persian = "می\u200cخواهم"  # ZWNJ is part of Persian spelling
    family = "👩\u200d👩\u200d👧"  # ZWJ joins an emoji sequence
    assert TextCleaner().clean(persian) == persian
    assert TextCleaner().clean(family) == family


def test_leftover_tags_and_entities():
    text = "<p>Hello <b>wor</b>ld</p><p>next &amp; last &#8212; &eacute;t&eacute;</p><!-- c --><script>x=1</script>"
    assert TextCleaner().clean(text) == "Hello world\n\nnext & last — été"


def test_code_generics_placeholders_and_unterminated_ampersands_survive():
    text = "std::vector<int> v; Map<K, V> m; AT&T R&D a < b > c; the man<section> directories; <title>"
    assert TextCleaner().clean(text) == text
    assert TextCleaner().clean('<section class="x">body</section> <title>') == "body\n<title>"


def test_parser_output_keeps_literal_markup():
    # Text that came out of an HTML parser: '<p>' was written '&lt;p&gt;' on the page.
    text = "Use the <p> element for paragraphs."
    assert TextCleaner().clean(text, markup_possible=False) == text
    assert TextCleaner().clean(text, markup_possible=True) == "Use the\nelement for paragraphs."


def test_symbol_runs():
    text = "==========\nTitle\n**********\nrated ★★★★★ by ▲▲▲ readers\n+------+------+"
    assert TextCleaner().clean(text) == "Title\n\nrated by readers"


def test_symbol_runs_leave_code_and_cjk_punctuation_alone():
    text = "-----BEGIN PGP SIGNATURE-----\nprint('====')\nif a === b: x **= 2\n>>> 1 + 1\n哈哈哈……——！！！"
    assert TextCleaner().clean(text) == text


def test_whitespace_normalisation_keeps_indentation():
    text = "  def f():  \n        return   1\t \n\n\n\n\nnext  word\u00a0\u00a0here   \n"
    assert TextCleaner().clean(text) == "  def f():\n        return 1\n\nnext word here"
    assert TextCleaner(keep_indent=False).clean(text) == "def f():\nreturn 1\n\nnext word here"


def test_ideographic_space_run_collapses_to_one():
    assert TextCleaner().clean("第一句。\u3000\u3000\u3000第二句。") == "第一句。\u3000第二句。"


def test_each_step_can_be_switched_off():
    raw = "a\u200bb <b>x</b> &amp; ▲▲▲ c  d\x07"
    off = TextCleaner(
        remove_control=False, remove_zero_width=False, strip_tags=False, decode_entities=False,
        symbol_runs=False, normalize_whitespace=False, unicode_form="none",
    )
    assert off.clean(raw) == raw
    assert TextCleaner(remove_zero_width=False).clean(raw) == "a\u200bb x & c d"
    assert TextCleaner(strip_tags=False).clean(raw) == "ab <b>x</b> & c d"
    assert TextCleaner(decode_entities=False).clean(raw) == "ab x &amp; c d"
    assert TextCleaner(symbol_runs=False).clean(raw) == "ab x & ▲▲▲ c d"


def test_fast_space_passes_match_their_plain_patterns():
    """Inner space runs are found from the run (not a look-behind tried at every character) and
    line ends are stripped per line in C; on random text both equal the plain regex formulation."""
    import random
    import re

    from dsdata.clean import text as text_mod

    hspace = text_mod._HSPACE
    inner_run = re.compile(
        "(?<=[^\\n \t\f\v\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000])"
        f"(?: (?={hspace})|[\t\f\v\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]){hspace}*"
    )
    trailing = re.compile(f"{hspace}+$", re.M)
    assert set(text_mod._HSPACE_CHARS) == {chr(c) for c in range(0x3100) if re.fullmatch(hspace, chr(c))}
    rng = random.Random(7)
    pieces = ["a", "字", " ", "  ", "\t", "\n", "\u3000", "\u00a0", "\u2003", "\u202f", "\f", "\v", "\r", "x y"]
    for _ in range(5000):
        sample = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 40)))
        assert (text_mod._INNER_SPACE_RUN.sub(text_mod._space_run_replacement, sample)
                == inner_run.sub(text_mod._space_run_replacement, sample)), repr(sample)
        stripped = "\n".join([line.rstrip(text_mod._HSPACE_CHARS) for line in sample.split("\n")])
        assert stripped == trailing.sub("", sample), repr(sample)


def test_printable_but_cleaned_lists_every_printable_character_the_steps_act_on():
    """The fast path skips the control, zero-width and space patterns when str.isprintable() says
    a text has none of their characters; the few printable ones among them are checked by name."""
    import re

    from dsdata.clean import text as text_mod

    acted_on = re.compile("|".join(p.pattern for p in (text_mod._CONTROL, text_mod._ZERO_WIDTH,
                                                        text_mod._LINE_SEPARATORS)) + f"|{text_mod._HSPACE}")
    every = "".join(map(chr, range(0x110000)))
    found = {m.group(0) for m in acted_on.finditer(every)} - {"\n", "\t", " "}
    assert len(found) > 80  # C0, C1, zero-width and the Unicode spaces really were found
    assert {c for c in found if c.isprintable()} == set(text_mod._PRINTABLE_BUT_CLEANED)


def _cleaners():
    return [TextCleaner(), TextCleaner(keep_indent=False), TextCleaner(unicode_form="NFKC_CJK"),
            TextCleaner(unicode_form="NFKC"), TextCleaner(remove_control=False),
            TextCleaner(remove_zero_width=False), TextCleaner(symbol_runs=False),
            TextCleaner(decode_entities=False, unicode_form="none")]


def _same_with_and_without_fast_paths(monkeypatch, samples, markup_possible):
    from dsdata.clean import text as text_mod

    checked = changed = 0
    for cleaner in _cleaners():
        fast = [cleaner.clean(s, markup_possible) for s in samples]
        monkeypatch.setattr(text_mod, "FAST_PATHS", False)
        plain = [cleaner.clean(s, markup_possible) for s in samples]
        monkeypatch.setattr(text_mod, "FAST_PATHS", True)
        for sample, a, b in zip(samples, fast, plain):
            assert a == b, (cleaner, sample[:200])
            checked += 1
            changed += a != sample
    return checked, changed


def test_fast_paths_equal_the_plain_patterns_on_generated_text(monkeypatch):
    import random

    rng = random.Random(11)
    pieces = ["a", "字", "word", " ", "  ", "\t", "\n", "\n\n\n", "\r\n", "\r", "\u3000", "\u00a0", "\u2003",
              "\u202f", "\f", "\v", "\x00", "\x85", "\u2028", "\u200b", "\u00ad", "\ufeff", "\u034f", "\u200d",
              "----", "====", " ** ", "-", "=\u0338", "▲▲▲", "★", "&nbsp;", "&#0;", "&#8203;", "&amp;", "&#x3000;",
              "<b>", "</p>", "<!--", "-->", "<br/>", "<script>", "</script>", "ｆｕｌｌ", "，", "e\u0301", "\ud800"]
    samples = ["".join(rng.choice(pieces) for _ in range(rng.randrange(0, 30))) for _ in range(3000)]
    for markup_possible in (True, False):
        checked, changed = _same_with_and_without_fast_paths(monkeypatch, samples, markup_possible)
        assert changed > checked // 2  # the samples really exercise the cleaning


def test_fast_paths_equal_the_plain_patterns_on_real_text(monkeypatch, shared_data):
    from dsdata.clean.html import extract_main_text

    pages = sorted((shared_data / "html-dev").glob("*.html"))
    raw = [p.read_text(encoding="utf-8", errors="replace") for p in pages]
    extracted = [extract_main_text(h).text for h in raw]
    prose = [(shared_data / name).read_text(encoding="utf-8") for name in ("prose-en.txt", "prose-zh.txt")]
    assert len(extracted) >= 60
    _same_with_and_without_fast_paths(monkeypatch, extracted + prose, False)
    _, changed = _same_with_and_without_fast_paths(monkeypatch, raw[:20], True)
    assert changed == 20 * len(_cleaners())
