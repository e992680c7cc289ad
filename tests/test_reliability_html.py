"""HTML is decoded as browsers decode it (WHATWG labels, BOMs), and deeply nested pages are cleaned
completely, with a parse tree whose depth is bounded (the cost of the tree builder grows with it)."""
import io

import pytest
from selectolax.lexbor import LexborHTMLParser
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from dsdata.clean.html import MAX_NESTING, _outermost, cap_nesting, extract_dom
from dsdata.io.readers import decode_html, read_local


def _page(body: str, meta: str = "") -> str:
    head = f"<meta charset='{meta}'>" if meta else ""
    return f"<html><head>{head}</head><body><p>{body}</p></body></html>"


@pytest.mark.parametrize("label, text, codec", [
    ("gb2312", "喆镕 中文", "gbk"),                # GBK characters outside GB2312: browsers decode gb2312 as GBK
    ("GB_2312-80", "喆", "gbk"),
    ("shift_jis", "①～㈱", "cp932"),            # NEC extensions and U+FF5E: windows-31j
    ("x-sjis", "①", "cp932"),
    ("euc-kr", "똠방각하", "cp949"),             # windows-949 syllables outside EUC-KR
    ("big5", "嘅", "big5hkscs"),                # HKSCS
    (" Latin1 ", "“quoted” – €5", "cp1252"),    # iso-8859-1 and friends are windows-1252
    ("iso-8859-1", "naïve “x”", "cp1252"),
    ("ascii", "€", "cp1252"),
])
def test_whatwg_labels(label, text, codec):
    data = _page(text, label).encode(codec)
    assert text in decode_html(data)


def test_windows_1252_undefined_bytes_are_c1_controls():
    data = b"<html><body><p>a\x81b\x9dc</p></body></html>"
    assert "a\x81b\x9dc" in decode_html(data, "iso-8859-1")


@pytest.mark.parametrize("bom, codec", [(b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"), (b"\xef\xbb\xbf", "utf-8")])
def test_byte_order_mark_wins_over_any_label(bom, codec):
    data = bom + _page("héllo 世界", "windows-1252").encode(codec)
    text = decode_html(data, declared="iso-8859-1")
    assert "héllo 世界" in text and not text.startswith("\ufeff")


def test_meta_utf16_label_means_utf8():
    data = _page("héllo", "utf-16").encode("utf-8")
    assert "héllo" in decode_html(data)


def test_html_file_and_warc_record_use_whatwg_labels(tmp_path):
    (tmp_path / "page.html").write_bytes(_page("喆镕", "gb2312").encode("gbk"))
    (doc,) = read_local(str(tmp_path / "page.html"))
    assert "喆镕" in doc.text
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=Shift_JIS")], protocol="HTTP/1.0")
    writer.write_record(writer.create_warc_record("http://jp.example/", "response",
                                                  payload=io.BytesIO(_page("①～").encode("cp932")),
                                                  http_headers=headers))
    (tmp_path / "c.warc.gz").write_bytes(buf.getvalue())
    (rec,) = read_local(str(tmp_path / "c.warc.gz"))
    assert "①～" in rec.text


@pytest.mark.parametrize("label, text, data", [
    # Bytes the standard's indexes define and Python's codecs lack (checked with a browser's TextDecoder).
    ("gbk", "价格：100€", "价格：100".encode("gbk") + b"\x80"),
    ("big5", "價格：100€", "價格：100".encode("big5") + b"\xa3\xe1"),
    ("euc-jp", "手順①Ⅱを参照", "手順".encode("euc_jp") + b"\xad\xa1\xad\xb6" + "を参照".encode("euc_jp")),
])
def test_bytes_python_codecs_lack_decode_as_the_standard_says(label, text, data):
    head = f"<html><head><meta charset='{label}'></head><body><p>".encode()
    assert text in decode_html(head + data + b"</p></body></html>")


def test_a_few_invalid_bytes_are_replaced_not_the_page_lost():
    # A crawl cut inside the last character, a stray byte: the page, with U+FFFD there, as a browser shows it.
    page = _page("这是一个很长的中文页面。" * 40, "utf-8").encode("utf-8")
    cut = page[:page.rindex("。".encode()) + 1]  # ends inside 。
    assert decode_html(cut).endswith("这是一个很长的中文页面\ufffd")
    stray = _page("欢迎光临本站，这里是正文。" * 20, "gb2312").encode("gbk").replace("，".encode("gbk"), "，".encode("gbk") + b"\xff", 1)
    assert "欢迎光临本站，\ufffd这里是正文" in decode_html(stray)
    # A page in another encoding than the one tried fails on most characters: still no text.
    assert decode_html(_page("欢迎光临本站，这里是正文。" * 20).encode("gbk")) is None


@pytest.mark.parametrize("head", [
    "<!-- <meta charset='utf-8'> --><meta charset='gbk'>",
    "<!-- <meta http-equiv='Content-Type' content='text/html; charset=iso-8859-1'> --><meta charset=gbk>",
    "<meta name='description' content='pages in charset=utf-8 are best'><meta charset='gbk'>",
    "<script>" + "var x = 1;\n" * 800 + "</script><meta charset='gbk'>",  # a meta after 9 KB: browsers switch there
    "<meta content='text/html;charset=gbk' http-equiv=Content-Type>",
])
def test_meta_charset_is_found_as_the_tree_builder_meets_it(head):
    data = f"<html><head>{head}</head><body><p>欢迎光临本站，这里是正文。</p></body></html>".encode("gbk")
    assert "欢迎光临本站" in decode_html(data)


def test_xhtml_xml_declaration_names_the_encoding():
    data = ("<?xml version='1.0' encoding='gb2312'?>\n<html xmlns='http://www.w3.org/1999/xhtml'><body>"
            "<p>欢迎光临本站</p></body></html>").encode("gbk")
    assert "欢迎光临本站" in decode_html(data)


@pytest.mark.parametrize("payload, content_type", [
    (b"\xff\xfe" + _page("utf-16 页面 with a BOM").encode("utf-16-le"), "text/html"),
    (_page("utf-16 页面 by its charset").encode("utf-16-le"), "text/html; charset=utf-16le"),
])
def test_warc_payload_in_utf16_is_read(tmp_path, payload, content_type):
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=False)
    headers = StatusAndHeaders("200 OK", [("Content-Type", content_type)], protocol="HTTP/1.0")
    writer.write_record(writer.create_warc_record("http://x.example/", "response", payload=io.BytesIO(payload),
                                                  http_headers=headers))
    (tmp_path / "u.warc").write_bytes(buf.getvalue())
    (rec,) = read_local(str(tmp_path / "u.warc"))
    assert "utf-16 页面" in rec.text


# ------------------------------------------------------------------------------------- nesting


def _tree_depth(html: str) -> int:
    tree = LexborHTMLParser(html)
    deepest = 0
    stack = [(tree.root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        child = node.child
        while child is not None:
            stack.append((child, depth + 1))
            child = child.next
    return deepest


@pytest.mark.parametrize("open_tag, close_tag", [
    ("<div>", "</div>"), ("<div class='sidebar-wrapper content'>", "</div>"),
    ("<main><article>", "</article></main>"), ("<section id='related-work'><h2>related work</h2>", "</section>"),
    ("<div hidden><script>var x = '<div>';</script>", "</div>"),
])
def test_depth_10k_extracts_every_word_with_a_bounded_tree(open_tag, close_tag):
    depth = 10_000
    words = [f"w{i}" for i in range(depth)]
    html = "<html><body>" + "".join(f"{open_tag}<p>{w}</p>" for w in words) + close_tag * depth + "</body></html>"
    capped = cap_nesting(html)
    assert _tree_depth(capped) <= MAX_NESTING + 8
    text = extract_dom(html).text
    if "hidden" in open_tag or "sidebar" in open_tag:
        # Hidden / furniture containers are dropped whole; the first one holds the whole nest.
        assert "w0" not in text
    else:
        assert set(words) <= set(text.split())


def test_ordinary_pages_are_not_rewritten():
    html = _page("x" * 10) + "<ul>" + "<li><a href='/a'>a</a>" * 2000 + "</ul>" + "<p>para" * 3000
    assert cap_nesting(html) is html


def test_outermost_of_a_deep_chain_is_its_top():
    depth = 5000
    tree = LexborHTMLParser("<html><body>" + "<section>" * depth + "x" + "</section>" * depth + "</body></html>")
    nodes = tree.css("section")
    assert len(nodes) == depth
    (top,) = _outermost(nodes)
    assert top.mem_id == nodes[0].mem_id


def test_a_page_with_a_very_wide_select_keeps_its_text_and_drops_the_options():
    """Tens of thousands of <option>s cost lexbor's "in select" mode ~N² (issue 35): the <select>
    tags are renamed before parsing, and the options are still no main text (benchmarks/html_nesting.py
    measures the cost)."""
    from dsdata.clean.html import _WIDE_SELECT_OPTIONS, extract_main_text

    for n in (10, _WIDE_SELECT_OPTIONS + 1, 20_000):
        options = "".join(f"<OPTION value='{i}'>Choice {i}</option>" for i in range(n))
        page = (f"<html><body><p>Intro text here.</p><Select name=a>{options}</SELECT>"
                f"<p>Outro text.</p><select><option>x</option></select></body></html>")
        text = extract_main_text(page).text
        assert text == "Intro text here.\n\nOutro text.", (n, text[:200])
