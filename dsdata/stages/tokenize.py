"""`tokenize` stage: documents → token ids + EOS, for the `shards` stage that follows it.

The ids travel in `doc.annotations["tokens"]` (dtype and the `keep_column` option: docs/shards.md).
Reason: `no_tokens` (fewer than `min_tokens`).
"""
from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from dsdata.document import Document, Rejected
from dsdata.stages.base import BatchStage, Param, StageConfigError
from dsdata.core.params import Boolean, Integer, Path, Text

TOKENS_ANNOTATION = "tokens"
# The recipe's default tokenizer, for stages built outside a recipe (tests, notebooks).
_PIPELINES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "pipelines")


def resolve_tokenizer_path(path: str) -> str:
    """A tokenizer path as given, or (when relative and absent from the working directory) under pipelines/."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    fallback = os.path.join(_PIPELINES_DIR, path)
    return fallback if os.path.exists(fallback) else path


class TokenizeStage(BatchStage):
    name = "tokenize"
    description = "encode text with a BPE tokenizer and append EOS (ids go to the shards stage)"
    params = {
        "tokenizer": Param("models/tokenizer", "tokenizer directory (tokenizer.json or AutoTokenizer files) "
                           "or a tokenizer.json file",
                           Path(must_exist="any", resolve=resolve_tokenizer_path,
                                missing="not found; train one with 'dsdata tokenizer train --input GLOB --out DIR' "
                                        "and pass --set tokenize.tokenizer=DIR")),
        "eos_token": Param(None, "end-of-text token appended to every document (default: the tokenizer's own)",
                           Text(nonempty=True), nullable=True),
        "min_tokens": Param(1, "reject documents with fewer ids than this (EOS not counted; at least 1)", Integer(min=1)),
        "keep_column": Param(False, "also write the ids as a tokens list<uint32> column in kept/*.parquet", Boolean()),
    }
    annotations: ClassVar[dict[str, pa.DataType]] = {"num_tokens": pa.int32()}
    batch_min = 16
    batch_max = 512

    _loaded = None  # the tokenizer, loaded per worker by setup()

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        if self.keep_column:
            # An instance attribute: the pipeline reads the declared columns from the stage object.
            self.annotations = {**type(self).annotations, TOKENS_ANNOTATION: pa.list_(pa.uint32())}

    def __getstate__(self) -> dict[str, Any]:
        # The loaded tokenizer is rebuilt by setup() on each worker, never shipped with the stage.
        state = dict(self.__dict__)
        state["_loaded"] = None
        return state

    def setup(self) -> None:
        from dsdata.tokenizer import TokenizerError, load_tokenizer

        # Beam's workers are the parallelism: encode on this thread, which the stage's CPU clock sees,
        # not on Rust threads it cannot see (a user's own TOKENIZERS_PARALLELISM stands).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

        try:
            self._loaded = load_tokenizer(self.tokenizer, self.eos_token)
        except TokenizerError as exc:
            raise StageConfigError(str(exc)) from None

    def describe_tokenizer(self) -> dict[str, Any]:
        """What the shard manifest records about this tokenizer (loads it if needed)."""
        if self._loaded is None:
            self.setup()
        return self._loaded.describe()

    @property
    def dtype(self) -> np.dtype:
        if self._loaded is None:
            self.setup()
        return self._loaded.dtype

    def process_batch(self, docs: list[Document]) -> list[Document | Rejected]:
        if self._loaded is None:
            self.setup()
        encoded = self._loaded.encode_batch([doc.text for doc in docs])
        eos, dtype = self._loaded.eos_id, self._loaded.dtype
        results: list[Document | Rejected] = []
        for doc, ids in zip(docs, encoded):
            if len(ids) < self.min_tokens:
                results.append(self.reject(doc, "no_tokens", f"{len(ids)} tokens < min_tokens {self.min_tokens}"))
                continue
            tokens = np.empty(len(ids) + 1, dtype=dtype)
            tokens[:-1] = ids
            tokens[-1] = eos
            doc.annotations[TOKENS_ANNOTATION] = tokens
            doc.annotations["num_tokens"] = len(tokens)
            results.append(doc)
        return results
