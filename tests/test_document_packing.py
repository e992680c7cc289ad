"""A Document crosses stage boundaries (Beam's coders pickle it) with its text compressed, and comes
back equal: long and short texts, CJK, lone surrogates, metadata and annotations."""
import pickle

from apache_beam.coders import registry

from dsdata.document import Document, Rejected, pack_document, unpack_document

PROSE = ("The quick brown fox jumps over the lazy dog; 敏捷的棕色狐狸跳过了懒狗。\n" * 60)


def _docs():
    return [
        Document("long", PROSE, {"source": "x", "n": 3}, {"lang": "en", "lang_score": 0.98}),
        Document("short", "a few words", {}, {}),
        Document("surrogate", "bad \ud800 half" * 100),
        Document("derived", PROSE, derived_from="long"),
        Document("empty", ""),
    ]


def test_documents_round_trip_through_beams_coder_and_pickle():
    coder = registry.get_coder(Document)
    for doc in _docs():
        assert coder.decode(coder.encode(doc)) == doc
        assert pickle.loads(pickle.dumps(doc)) == doc
        rejected = Rejected(doc, "rules", "too_short", "detail")
        assert coder.decode(coder.encode(rejected)) == rejected
        assert unpack_document(pack_document(doc)) == doc


def test_long_texts_are_shipped_compressed():
    coder = registry.get_coder(Document)
    doc = _docs()[0]
    assert len(coder.encode(doc)) < len(doc.text.encode("utf-8")) / 2


def test_a_text_is_compressed_once_and_a_changed_text_again():
    doc = unpack_document(pack_document(_docs()[0]))
    packed = pack_document(doc)[1]
    assert pack_document(doc)[1] is packed  # unchanged text: the bytes it was unpacked from
    doc.text = doc.text.upper()
    repacked = pack_document(doc)
    assert repacked[1] is not packed and unpack_document(repacked).text == PROSE.upper()
    changed = Document(doc.id, PROSE.lower(), doc.metadata, doc.annotations)
    assert unpack_document(pack_document(changed)).text == PROSE.lower()
    assert unpack_document(pack_document(doc)) == doc == pickle.loads(pickle.dumps(doc))


def test_an_unpacked_text_is_decompressed_when_first_read_and_reshipped_unread_as_it_came():
    from dsdata.beam.errors import copy_document

    packed = pack_document(_docs()[0])
    doc = unpack_document(packed)
    assert "text" not in vars(doc)  # parked, read back: nothing decompressed yet
    assert pack_document(doc)[1] is packed[1]  # shipped on unread: the same bytes
    copied = copy_document(doc)
    copied.metadata["n"] = 4
    assert "text" not in vars(copied) and doc.metadata["n"] == 3
    assert copied.text == PROSE and "text" in vars(copied) and "text" not in vars(doc)
    assert doc == Document("long", PROSE, {"source": "x", "n": 3}, {"lang": "en", "lang_score": 0.98})
    try:
        doc.no_such_field
    except AttributeError as exc:
        assert "no_such_field" in str(exc)
    else:
        raise AssertionError("a missing attribute must raise AttributeError")


def test_texts_pack_and_unpack_on_many_threads_at_once():
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"{i} " + PROSE * (1 + i % 3) for i in range(64)]

    def round_trip(text):
        return unpack_document(pack_document(Document("t", text))).text

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(round_trip, texts * 4)) == texts * 4
