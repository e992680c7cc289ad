"""The `clean` stage: which documents are HTML, rejections, annotations, configuration errors, and
the extract recipe end to end on Beam with the ledger law."""
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.document import Document, Rejected
from dsdata.recipe import RecipeError, load_recipe
from dsdata.stages import StageConfigError, stage_class
from dsdata.stages.clean import CleanStage, looks_like_html

REPO = Path(__file__).resolve().parents[1]
ARTICLE = "Dies ist der eigentliche Artikeltext, lang genug, um als Inhalt zu gelten. " * 3
PAGE = (
    "<!DOCTYPE html><html><head><title>Artikel &amp; mehr</title></head><body>"
    '<nav><a href="/">Start</a> <a href="/b">Blog</a></nav>'
    f"<main><h1>Überschrift</h1><p>{ARTICLE}</p></main><footer>Impressum</footer></body></html>"
)


def run(stage: CleanStage, text: str, **metadata) -> Document | Rejected:
    return stage.process(Document(id="d", text=text, metadata=dict(metadata)))


def test_registry_maps_clean_to_this_stage():
    assert stage_class("clean") is CleanStage
    assert CleanStage.annotations == {"html_title": pa.string()}


def test_html_page_becomes_main_text_with_title():
    doc = run(CleanStage(), PAGE, content_type="text/html")
    assert isinstance(doc, Document)
    assert doc.text.startswith("Überschrift\n\nDies ist der eigentliche Artikeltext")
    assert "Start" not in doc.text and "Impressum" not in doc.text
    assert doc.annotations["html_title"] == "Artikel & mehr"
    assert doc.metadata == {"content_type": "text/html"}  # metadata is carried through unchanged


@pytest.mark.parametrize(
    "text, expected",
    [
        (PAGE, True),
        ("  <!-- saved page -->\n<html lang='en'><body><p>x</p></body></html>", True),
        ("<?xml version='1.0'?>\n<!DOCTYPE html>\n<html><body>x</body></html>", True),
        ("<div><p>one</p><p>two</p><ul><li>three</li></ul></div>", True),  # a fragment
        ("Plain text that mentions <br> once and a < b in a formula.", False),
        ("std::vector<int> v; if (a < b && c > d) { return; }", False),
        ("这是一篇普通的中文文章，没有任何标记。" * 20, False),
    ],
)
def test_html_sniffing(text, expected):
    assert looks_like_html(text) is expected


def test_html_param_auto_true_false():
    fragment_in_text = f"Notes: see <b>this</b> word. {ARTICLE}"
    # auto: no content type and no HTML look → text cleaning only (leftover tags removed)
    auto = run(CleanStage(), fragment_in_text)
    assert auto.text.startswith("Notes: see this word.") and "html_title" not in auto.annotations
    # content_type decides even when the text does not look like a page
    by_type = run(CleanStage(), "<p>short</p>", content_type="text/html; charset=utf-8")
    assert by_type.text == "short"
    # html: false never extracts, even a full page: its text is only regex-cleaned
    forced_off = run(CleanStage(html=False), PAGE, content_type="text/html")
    assert "Start" in forced_off.text and "Impressum" in forced_off.text
    # html: true extracts everything
    forced_on = run(CleanStage(html=True), f"<div><nav>Menu</nav><p>{ARTICLE}</p></div>")
    assert "Menu" not in forced_on.text


def test_text_documents_are_cleaned_and_cjk_is_kept():
    zh = "你好，世界！这是第一段。\u200b\n\n\n\n第二段：（括号）？\x07"
    doc = run(CleanStage(), zh)
    assert doc.text == "你好，世界！这是第一段。\n\n第二段：（括号）？"
    nfkc = run(CleanStage(unicode_form="NFKC"), zh)
    assert "，" not in nfkc.text  # what the default protects against


def test_empty_after_clean_rejections():
    nav_only = "<html><body><nav><a href='/'>Home</a></nav><footer>©</footer></body></html>"
    for text in (nav_only, "\u200b\u200b \x07 \n", "<html><head><title>T</title></head><body></body></html>"):
        result = run(CleanStage(), text)
        assert isinstance(result, Rejected)
        assert (result.stage, result.reason) == ("clean", "empty_after_clean")
        assert result.doc.text == text  # the rejected row keeps the input for inspection


def test_parse_failures_are_rejected_not_raised():
    frameset = "<html><head><title>Frames</title></head><frameset><frame src='a.html'></frameset></html>"
    result = run(CleanStage(), frameset, content_type="text/html")
    assert isinstance(result, Rejected) and result.reason == "html_parse_error"
    assert "no <body>" in result.detail and result.doc.text == frameset


def test_lone_surrogates_do_not_crash_the_stage():
    result = run(CleanStage(), f"<html><body><p>{ARTICLE}\ud800</p></body></html>")
    assert isinstance(result, (Document, Rejected))


@pytest.mark.parametrize("extractor", ["auto", "dom", "trafilatura", "selectolax-body"])
def test_every_extractor_runs_in_the_stage(extractor):
    doc = run(CleanStage(extractor=extractor), PAGE, content_type="text/html")
    assert "eigentliche Artikeltext" in doc.text


@pytest.mark.parametrize(
    "params, message",
    [
        ({"extractor": "readability"}, "clean.extractor must be one of auto, dom, trafilatura"),
        ({"html": "yes"}, "clean.html must be auto, true or false"),
        ({"unicode_form": "NFKX"}, "clean.unicode_form must be one of NFC"),
        ({"symbol_runs": "no"}, "clean.symbol_runs must be true or false"),
        ({"strip_html": True}, "has no parameter 'strip_html'"),
    ],
)
def test_bad_parameters_are_one_clear_error(params, message):
    with pytest.raises(StageConfigError, match=message):
        CleanStage(**params)


def test_bad_parameter_in_a_recipe_names_the_file(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("input: {paths: ['*.html']}\nstages:\n  - clean: {extractor: magic}\n", encoding="utf-8")
    with pytest.raises(RecipeError, match=r"r\.yaml: clean\.extractor must be one of"):
        load_recipe(str(recipe)).build_stages()


@pytest.mark.slow
def test_extract_recipe_end_to_end_with_ledger(tmp_path):
    recipe = load_recipe(str(REPO / "pipelines" / "extract.yaml"))
    assert [s.name for s in recipe.stages] == ["clean"]
    shipped = sorted(Path(p) for p in __import__("glob").glob(recipe.inputs[0]))
    if not shipped:
        pytest.skip("pipelines/samples/html/ holds no pages yet")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "nav-only.html").write_text("<html><body><nav><a href='/'>Home</a></nav></body></html>", encoding="utf-8")
    (extra / "blank.html").write_text("   \n", encoding="utf-8")
    (extra / "binary.html").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00binary")
    (extra / "zh.html").write_text(
        "<html><head><title>标题</title></head><body><div class='sidebar'>侧栏</div>"
        "<div><p>这是正文，包含全角标点：逗号，句号。问号？感叹号！</p></div></body></html>",
        encoding="utf-8",
    )
    recipe.inputs = list(recipe.inputs) + [str(extra / "*.html")]
    out = tmp_path / "out"
    stats = run_recipe(recipe, str(out))

    kept = [r for f in sorted((out / "kept").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    rejected = [r for f in sorted((out / "rejected").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    n_files = len(shipped) + 4
    assert stats["input"] == n_files
    assert stats["ledger_ok"] and stats["input"] + stats["augmented"] == len(kept) + len(rejected)
    assert stats["rejected"] == {
        "clean": {"empty_after_clean": 1},
        "read": {"binary_file": 1, "empty_text": 1},
    }
    by_id = {r["id"]: r for r in kept}
    # Each document's id is its input file's path.
    assert set(by_id) == {str(p) for p in shipped} | {str(extra / "zh.html")}
    zh = by_id[str(extra / "zh.html")]
    assert zh["text"] == "这是正文，包含全角标点：逗号，句号。问号？感叹号！"
    assert zh["html_title"] == "标题"
    schema = pq.read_schema(next((out / "kept").glob("*.parquet")))
    assert schema.field("html_title").type == pa.string()
    for path in shipped:
        row = by_id[str(path)]
        assert row["html_title"] and len(row["text"]) > 500
        lines = {line.strip() for line in row["text"].split("\n")}
        assert not lines & {"Table of Contents", "Previous topic", "Next topic", "This Page", "Navigation"}
