"""No document's text can stall a run: each per-document stage finishes, in time linear in the
document, on long runs of the characters its patterns look at (rule lines of dashes, runs of dots,
spaces, tabs, '<' that never closes, '<!--' without '-->', decorative symbols, 'a.a.a.…').

A regular expression that backtracks is the usual way one document holds a run for hours: the
clean stage's rule-line pattern took 2^(n/4) steps on a line of n dashes followed by a letter (80
dashes: hours), and several patterns were O(n²) on a long run.  Each case here runs under a
watchdog (SIGALRM) far above what linear work takes on these ~200 KB texts, so a return to
quadratic or exponential matching fails the test by name instead of hanging CI; the watchdog is
a hang detector, not a speed assertion."""
import signal

import pytest

from dsdata.augment.sentences import split_sentences
from dsdata.dedup.minhash import shingle_strings
from dsdata.document import Document, Rejected
from dsdata.stages.clean import CleanStage
from dsdata.stages.lang import LanguageStage
from dsdata.stages.rules import QualityRulesStage

SIZE = 200_000
WATCHDOG_S = 10  # linear work on SIZE characters takes under a second per stage here (0.7 s at most)

UNITS = ["-", "=", "-\\", "= ", "*#", " ", "\t", " \t", ".", "!", "?.", "。", "！", "a.", "e.g.",
         "<", "<a", "<a ", "<b ", "<!--", "<script>", "<style ", "</", "&", "&#", "&amp", "▲",
         "★ ", "·", "\u3000", "\u200b", "a ", "中", "\n", " \n", "-\n", "1. ", "http://x", "'", "\"."]
TAILS = ["x", "\n"]


def _texts():
    for unit in UNITS:
        body = unit * (SIZE // len(unit))
        for tail in TAILS:
            yield pytest.param(body + tail, id=f"{unit!r}x{len(body) // len(unit)}+{tail!r}")


class _Stalled(Exception):
    pass


def _alarm(signum, frame):
    raise _Stalled()


@pytest.fixture(scope="module")
def stages():
    lang = LanguageStage(backend="fasttext", keep=["en", "zh"])
    lang.setup()
    return {
        "clean": CleanStage().process,
        "clean-html": CleanStage(html=True).process,
        "clean-text": CleanStage(html=False).process,
        "rules": QualityRulesStage().process,
        "lang": lambda doc: lang.process_batch([doc])[0],
        "sentences": lambda doc: split_sentences(doc.text),
        "shingles": lambda doc: shingle_strings(doc.text),
    }


@pytest.mark.parametrize("text", list(_texts()))
def test_every_stage_finishes_on_long_runs(stages, text):
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for name, run in stages.items():
            signal.setitimer(signal.ITIMER_REAL, WATCHDOG_S)
            try:
                result = run(Document("adversarial", text))
            except _Stalled:
                pytest.fail(f"{name} ran over {WATCHDOG_S} s on {len(text)} characters: superlinear "
                            f"matching (a backtracking pattern?)")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if isinstance(result, (Document, Rejected)):
                assert isinstance(result, Rejected) or isinstance(result.text, str)
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_rule_lines_of_any_length_are_still_removed():
    """The linear rule-line pattern removes what the old one did: lines of rule runs only."""
    cleaner = CleanStage(html=False)
    text = "Title\n" + "-" * 200 + "\n==== ---- ====\nbody text here\n" + "-" * 200 + "x\n"
    out = cleaner.process(Document("d", text)).text
    assert [line for line in out.splitlines() if line] == ["Title", "body text here", "-" * 200 + "x"]
