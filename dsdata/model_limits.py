"""How many tokens a transformers model can take: the smallest of its position table and its
tokenizer's `model_max_length` (past the position table a model raises IndexError)."""
from __future__ import annotations

from typing import Any

# Names transformers configs use for the size of the (encoder's) position table.
_ENCODER_POSITIONS = ("max_position_embeddings", "max_source_positions", "n_positions", "max_seq_len", "n_ctx")
_DECODER_POSITIONS = ("max_target_positions", "max_position_embeddings", "n_positions")
# transformers sets model_max_length to int(1e30) when a tokenizer declares no limit.
_NO_TOKENIZER_LIMIT = 1_000_000


def _first_positive(config: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _position_offset(config: Any) -> int:
    # RoBERTa-family models number positions from padding_idx + 1: a 514-row table holds 512 tokens.
    if "roberta" in str(getattr(config, "model_type", "")) or getattr(config, "model_type", "") == "camembert":
        pad = getattr(config, "pad_token_id", None)
        return int(pad) + 1 if isinstance(pad, int) and pad >= 0 else 0
    return 0


def input_token_limit(config: Any, tokenizer: Any = None) -> int | None:
    """The most input tokens (special tokens included) the model accepts; None if nothing says."""
    limits = []
    positions = _first_positive(config, _ENCODER_POSITIONS)
    if positions is not None:
        limits.append(positions - _position_offset(config))
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < _NO_TOKENIZER_LIMIT:
        limits.append(tokenizer_limit)
    return min(limits) if limits else None


def output_token_limit(config: Any) -> int | None:
    """The most tokens a seq2seq decoder can emit (its position table less the start token)."""
    positions = _first_positive(config, _DECODER_POSITIONS)
    return positions - 1 if positions is not None else None
