"""Character encodings of web pages as browsers decode them: the WHATWG Encoding Standard.

A page's declared charset is a *label*; the standard maps each label browsers accept to one
encoding, unlike Python's codec names (`gb2312` is GBK, `shift_jis` is cp932, `iso-8859-1` is
windows-1252).  A byte-order mark overrides any label.  https://encoding.spec.whatwg.org/#names-and-labels
"""
from __future__ import annotations

import codecs

# Encoding name (the standard's) → (Python codec, labels).  "replacement" decodes to one U+FFFD
# (encodings whose labels are refused because they let scripts be smuggled past filters).
_ENCODINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "UTF-8": ("utf-8", ("unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "utf-8", "utf8", "x-unicode20utf8")),
    "IBM866": ("cp866", ("866", "cp866", "csibm866", "ibm866")),
    "ISO-8859-2": ("iso8859_2", ("csisolatin2", "iso-8859-2", "iso-ir-101", "iso8859-2", "iso88592", "iso_8859-2",
                                 "iso_8859-2:1987", "l2", "latin2")),
    "ISO-8859-3": ("iso8859_3", ("csisolatin3", "iso-8859-3", "iso-ir-109", "iso8859-3", "iso88593", "iso_8859-3",
                                 "iso_8859-3:1988", "l3", "latin3")),
    "ISO-8859-4": ("iso8859_4", ("csisolatin4", "iso-8859-4", "iso-ir-110", "iso8859-4", "iso88594", "iso_8859-4",
                                 "iso_8859-4:1988", "l4", "latin4")),
    "ISO-8859-5": ("iso8859_5", ("csisolatincyrillic", "cyrillic", "iso-8859-5", "iso-ir-144", "iso8859-5",
                                 "iso88595", "iso_8859-5", "iso_8859-5:1988")),
    "ISO-8859-6": ("iso8859_6", ("arabic", "asmo-708", "csiso88596e", "csiso88596i", "csisolatinarabic", "ecma-114",
                                 "iso-8859-6", "iso-8859-6-e", "iso-8859-6-i", "iso-ir-127", "iso8859-6", "iso88596",
                                 "iso_8859-6", "iso_8859-6:1987")),
    "ISO-8859-7": ("iso8859_7", ("csisolatingreek", "ecma-118", "elot_928", "greek", "greek8", "iso-8859-7",
                                 "iso-ir-126", "iso8859-7", "iso88597", "iso_8859-7", "iso_8859-7:1987", "sun_eu_greek")),
    "ISO-8859-8": ("iso8859_8", ("csiso88598e", "csisolatinhebrew", "hebrew", "iso-8859-8", "iso-8859-8-e",
                                 "iso-ir-138", "iso8859-8", "iso88598", "iso_8859-8", "iso_8859-8:1988", "visual")),
    "ISO-8859-8-I": ("iso8859_8", ("csiso88598i", "iso-8859-8-i", "logical")),
    "ISO-8859-10": ("iso8859_10", ("csisolatin6", "iso-8859-10", "iso-ir-157", "iso8859-10", "iso885910", "l6",
                                   "latin6")),
    "ISO-8859-13": ("iso8859_13", ("iso-8859-13", "iso8859-13", "iso885913")),
    "ISO-8859-14": ("iso8859_14", ("iso-8859-14", "iso8859-14", "iso885914")),
    "ISO-8859-15": ("iso8859_15", ("csisolatin9", "iso-8859-15", "iso8859-15", "iso885915", "iso_8859-15", "l9")),
    "ISO-8859-16": ("iso8859_16", ("iso-8859-16",)),
    "KOI8-R": ("koi8_r", ("cskoi8r", "koi", "koi8", "koi8-r", "koi8_r")),
    "KOI8-U": ("koi8_u", ("koi8-ru", "koi8-u")),
    "macintosh": ("mac_roman", ("csmacintosh", "mac", "macintosh", "x-mac-roman")),
    "windows-874": ("cp874", ("dos-874", "iso-8859-11", "iso8859-11", "iso885911", "tis-620", "windows-874")),
    "windows-1250": ("cp1250", ("cp1250", "windows-1250", "x-cp1250")),
    "windows-1251": ("cp1251", ("cp1251", "windows-1251", "x-cp1251")),
    "windows-1252": ("cp1252", ("ansi_x3.4-1968", "ascii", "cp1252", "cp819", "csisolatin1", "ibm819", "iso-8859-1",
                                "iso-ir-100", "iso8859-1", "iso88591", "iso_8859-1", "iso_8859-1:1987", "l1",
                                "latin1", "us-ascii", "windows-1252", "x-cp1252")),
    "windows-1253": ("cp1253", ("cp1253", "windows-1253", "x-cp1253")),
    "windows-1254": ("cp1254", ("cp1254", "csisolatin5", "iso-8859-9", "iso-ir-148", "iso8859-9", "iso88599",
                                "iso_8859-9", "iso_8859-9:1989", "l5", "latin5", "windows-1254", "x-cp1254")),
    "windows-1255": ("cp1255", ("cp1255", "windows-1255", "x-cp1255")),
    "windows-1256": ("cp1256", ("cp1256", "windows-1256", "x-cp1256")),
    "windows-1257": ("cp1257", ("cp1257", "windows-1257", "x-cp1257")),
    "windows-1258": ("cp1258", ("cp1258", "windows-1258", "x-cp1258")),
    "x-mac-cyrillic": ("mac_cyrillic", ("x-mac-cyrillic", "x-mac-ukrainian")),
    "GBK": ("gb18030", ("chinese", "csgb2312", "csiso58gb231280", "gb2312", "gb_2312", "gb_2312-80", "gbk",
                        "iso-ir-58", "x-gbk")),
    "gb18030": ("gb18030", ("gb18030",)),
    "Big5": ("big5hkscs", ("big5", "big5-hkscs", "cn-big5", "csbig5", "x-x-big5")),
    "EUC-JP": ("euc_jp", ("cseucpkdfmtjapanese", "euc-jp", "x-euc-jp")),
    "ISO-2022-JP": ("iso2022_jp", ("csiso2022jp", "iso-2022-jp")),
    "Shift_JIS": ("cp932", ("csshiftjis", "ms932", "ms_kanji", "shift-jis", "shift_jis", "sjis", "windows-31j",
                            "x-sjis")),
    "EUC-KR": ("cp949", ("cseuckr", "csksc56011987", "euc-kr", "iso-ir-149", "korean", "ks_c_5601-1987",
                         "ks_c_5601-1989", "ksc5601", "ksc_5601", "windows-949")),
    "replacement": ("replacement", ("csiso2022kr", "hz-gb-2312", "iso-2022-cn", "iso-2022-cn-ext", "iso-2022-kr",
                                    "replacement")),
    "UTF-16BE": ("utf-16-be", ("unicodefffe", "utf-16be")),
    "UTF-16LE": ("utf-16-le", ("csunicode", "iso-10646-ucs-2", "ucs-2", "unicode", "unicodefeff", "utf-16",
                               "utf-16le")),
    "x-user-defined": ("x-user-defined", ("x-user-defined",)),
}
_BY_LABEL = {label: name for name, (_, labels) in _ENCODINGS.items() for label in labels}
_BOMS = ((b"\xef\xbb\xbf", "UTF-8"), (b"\xfe\xff", "UTF-16BE"), (b"\xff\xfe", "UTF-16LE"))
# Single-byte windows code pages: the standard's indexes map the bytes Python leaves undefined
# (0x81, 0x8D, 0x8F, 0x90, 0x9D in windows-1252) to the C1 control of the same number.
_SINGLE_BYTE_C1 = frozenset({"windows-874", "windows-1250", "windows-1251", "windows-1252", "windows-1253",
                             "windows-1254", "windows-1255", "windows-1256", "windows-1257", "windows-1258"})


def _c1_controls(error: UnicodeDecodeError) -> tuple[str, int]:
    byte = error.object[error.start]
    if 0x80 <= byte <= 0x9F:
        return chr(byte), error.start + 1
    raise error


codecs.register_error("dsdata-whatwg-c1", _c1_controls)


def _gbk_gap(error: UnicodeDecodeError) -> tuple[str, int]:
    """The standard's GBK decoder reads 0x80 as the euro sign (cp936); Python's gb18030 has no 0x80."""
    if error.object[error.start] == 0x80:
        return "\u20ac", error.start + 1
    return "\ufffd", error.end


def _big5_gap(error: UnicodeDecodeError) -> tuple[str, int]:
    """index-big5 has A3E1 = the euro sign (cp950); Python's big5hkscs has not."""
    if error.object[error.start:error.start + 2] == b"\xa3\xe1":
        return "\u20ac", error.start + 2
    return "\ufffd", error.end


def _euc_jp_gap(error: UnicodeDecodeError) -> tuple[str, int]:
    """index-jis0208 holds NEC's row 13 (①, Ⅰ, ㍉ …) and the IBM extensions, which Python's euc_jp
    lacks and cp932 has: the JIS row and cell of the pair, as Shift_JIS bytes, decoded by cp932."""
    pair = error.object[error.start:error.start + 2]
    if len(pair) == 2 and 0xA1 <= pair[0] <= 0xFE and 0xA1 <= pair[1] <= 0xFE:
        row, cell = pair[0] - 0x80, pair[1] - 0x80
        lead = (row + 1) // 2 + (0x70 if row <= 0x5E else 0xB0)
        trail = cell + (0x1F if row % 2 else 0x7D)
        if row % 2 and trail >= 0x7F:
            trail += 1
        try:
            return bytes((lead, trail)).decode("cp932"), error.start + 2
        except UnicodeDecodeError:
            pass
    return "\ufffd", error.end


codecs.register_error("dsdata-gbk", _gbk_gap)
codecs.register_error("dsdata-big5", _big5_gap)
codecs.register_error("dsdata-euc-jp", _euc_jp_gap)
_LENIENT_ERRORS = {"GBK": "dsdata-gbk", "gb18030": "dsdata-gbk", "Big5": "dsdata-big5", "EUC-JP": "dsdata-euc-jp"}


def decode_with_replacement(data: bytes, encoding: str) -> tuple[str, int]:
    """Decode as browsers do once an encoding is chosen: the bytes the standard's index defines and
    Python's codec lacks (GBK 0x80, Big5 A3E1, EUC-JP's NEC and IBM rows) as the standard says, any
    other invalid byte as U+FFFD.  Returns the text and how many U+FFFD it holds."""
    codec = _ENCODINGS[encoding][0]
    if codec in ("replacement", "x-user-defined"):
        return decode(data, encoding), 0
    errors = "dsdata-whatwg-c1" if encoding in _SINGLE_BYTE_C1 else _LENIENT_ERRORS.get(encoding, "replace")
    try:
        text = data.decode(codec, errors)
    except UnicodeDecodeError:  # a single-byte code page's undefined byte outside 0x80-0x9F
        text = data.decode(codec, "replace")
    return text, text.count("\ufffd")


def encoding_for_label(label: str | None) -> str | None:
    """The Encoding Standard's name for a charset label (case- and whitespace-insensitive), or None."""
    if not label:
        return None
    return _BY_LABEL.get(label.strip(" \t\n\f\r").lower())


def bom_encoding(data: bytes) -> tuple[str, int] | None:
    """(encoding, BOM length) when `data` starts with a UTF-8 or UTF-16 byte-order mark."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            return name, len(bom)
    return None


def decode(data: bytes, encoding: str) -> str:
    """Decode with one of the standard's encodings; UnicodeDecodeError on invalid bytes (multi-byte
    encodings), which callers use to fall back to another candidate."""
    codec = _ENCODINGS[encoding][0]
    if codec == "replacement":
        return "\ufffd" if data else ""
    if codec == "x-user-defined":
        return "".join(chr(b) if b < 0x80 else chr(0xF780 + b - 0x80) for b in data)
    errors = "dsdata-whatwg-c1" if encoding in _SINGLE_BYTE_C1 else "strict"
    return data.decode(codec, errors)


def meta_encoding(label: str | None) -> str | None:
    """The encoding a <meta charset> label selects: UTF-16 labels mean UTF-8 there (a page whose
    meta tag was readable as ASCII is not UTF-16) and x-user-defined means windows-1252."""
    name = encoding_for_label(label)
    if name in ("UTF-16BE", "UTF-16LE"):
        return "UTF-8"
    if name == "x-user-defined":
        return "windows-1252"
    return name
