"""Find a relevance model's backend from its files and load it: one entry point for the stage, the
Beam model handler and `dsdata classifier eval`."""
from __future__ import annotations

import os
from typing import Protocol, Sequence

from dsdata.relevance.bert_backend import META_FILE, read_meta

BACKENDS = ("auto", "bert", "fasttext")
_FASTTEXT_FILES = ("model.ftz", "model.bin")


class Scorer(Protocol):
    backend: str

    def score(self, texts: Sequence[str]) -> list[float]:
        """P(relevant) for each text, in order."""


def detect_backend(model: str) -> str:
    """bert for a save_pretrained directory, fasttext for a .ftz/.bin file or a directory holding one."""
    if os.path.isfile(model):
        if model.endswith((".ftz", ".bin")):
            return "fasttext"
        raise ValueError(f"model '{model}' is a file but not a fastText .ftz/.bin; a BERT model is a directory")
    if not os.path.isdir(model):
        raise ValueError(f"model '{model}' does not exist; train one with "
                         "'dsdata classifier train --backend fasttext|bert --data F --out DIR'")
    meta_backend = read_meta(model).get("backend")
    if meta_backend in ("bert", "fasttext"):
        return meta_backend
    if os.path.isfile(os.path.join(model, "config.json")):
        return "bert"
    if any(os.path.isfile(os.path.join(model, f)) for f in _FASTTEXT_FILES):
        return "fasttext"
    raise ValueError(f"model '{model}' holds neither a save_pretrained classifier (config.json) nor a fastText "
                     f"model ({' or '.join(_FASTTEXT_FILES)}) nor {META_FILE}")


def fasttext_file(model: str) -> str:
    if os.path.isfile(model):
        return model
    for name in _FASTTEXT_FILES:
        if os.path.isfile(os.path.join(model, name)):
            return os.path.join(model, name)
    raise ValueError(f"model '{model}' has no fastText model file ({' or '.join(_FASTTEXT_FILES)})")


SCORES = ("probability", "raw")


def load_scorer(model: str, backend: str = "auto", device: str = "auto", batch_size: int = 32,
                max_length: int | None = None, long_documents: str = "head_tail",
                positive_label: str | list[str] | None = None, score: str = "probability") -> Scorer:
    """Load a relevance model once; the BERT options are ignored for fastText.  positive_label: the
    label(s) whose probability is the score; raw: a one-output head's value (FineWeb-Edu's 0-5)."""
    if score not in SCORES:
        raise ValueError(f"score '{score}' unknown (choose one of {', '.join(SCORES)})")
    if backend not in BACKENDS:
        raise ValueError(f"backend '{backend}' unknown (choose one of {', '.join(BACKENDS)})")
    found = detect_backend(model)
    if backend != "auto" and backend != found:
        raise ValueError(f"model '{model}' is a {found} model but backend={backend} was asked for; "
                         f"set backend to {found} or auto")
    if found == "fasttext":
        from dsdata.relevance.fasttext_backend import FastTextScorer

        if score == "raw":
            raise ValueError(f"model '{model}' is a fastText classifier: its scores are probabilities (score: raw "
                             "is for a one-output BERT-family head)")
        # dsdata's own models (dsdata-relevance.json beside them) were trained on lower-cased text.
        own = os.path.isdir(model) and read_meta(model).get("backend") == "fasttext"
        return FastTextScorer(fasttext_file(model), positive_label=positive_label, lowercase=own)
    from dsdata.relevance.bert_backend import BertScorer

    return BertScorer(model, device=device, max_length=max_length, batch_size=batch_size,
                      long_policy=long_documents, positive_label=positive_label, raw=score == "raw")
