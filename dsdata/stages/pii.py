"""`pii`: find personal data (e-mail and public IP addresses, phone numbers, PRC resident identity
numbers, bank card numbers) and redact (each match → <EMAIL>, <IP>, …), tag (`pii_spans`, the text
unchanged) or reject (`pii`).  Every kept document gets `pii_counts`, summed into the `pii_counts`
tally.  What each kind is and how it is validated: dsdata/stages/pii_kinds.py and docs/pii.md.
"""
from __future__ import annotations

import pyarrow as pa

from dsdata.document import Document, Rejected
from dsdata.stages.base import DocumentStage, Param
from dsdata.core.params import Choice, ListOf
from dsdata.stages.pii_kinds import PII_TYPES, TOKENS, PiiFinder

COUNTS = "pii_counts"

def redact(text: str, spans: list[tuple[int, int, str]]) -> str:
    out, pos = [], 0
    for start, end, kind in spans:
        out.append(text[pos:start])
        out.append(TOKENS[kind])
        pos = end
    out.append(text[pos:])
    return "".join(out)


_SPAN_TYPE = pa.struct([("type", pa.string()), ("start", pa.int64()), ("end", pa.int64())])


class PiiStage(DocumentStage):
    name = "pii"
    description = ("personal data (e-mail, public IP, phone incl. mainland mobiles, PRC identity numbers, bank "
                   "cards): redact (<EMAIL>, <IP>, <PHONE>, <ID>, <CARD>) | tag | reject")
    params = {
        "mode": Param("redact", "redact (replace with <EMAIL>, <IP>, <PHONE>, <ID>, <CARD>) | tag (pii_spans, "
                                "text unchanged) | reject (reason pii)", Choice(("redact", "tag", "reject"))),
        "types": Param(list(PII_TYPES), "which kinds to find: email, ip, phone, id, card",
                       ListOf(Choice(PII_TYPES), nonempty=True, single=True)),
    }
    annotations = {
        COUNTS: pa.struct([(t, pa.int64()) for t in PII_TYPES]),
        "pii_spans": pa.list_(_SPAN_TYPE),
    }
    tallies = (COUNTS,)

    def validate(self) -> None:
        self._finder = PiiFinder(tuple(self.types))

    def process(self, doc: Document) -> Document | Rejected:
        spans = self._finder.find(doc.text)
        counts = dict.fromkeys(PII_TYPES, 0)
        for _, _, kind in spans:
            counts[kind] += 1
        doc.annotations[COUNTS] = counts
        if not spans:
            return doc
        if self.mode == "reject":
            return self.reject(doc, "pii", ", ".join(f"{k} {n}" for k, n in counts.items() if n))
        if self.mode == "tag":
            doc.annotations["pii_spans"] = [{"type": k, "start": s, "end": e} for s, e, k in spans]
        else:
            # Positions in tag mode refer to the text as it is; after redaction they would not.
            doc.text = redact(doc.text, spans)
        return doc
