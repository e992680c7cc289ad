"""`dsdata lm train`: train a per-language reference model (SentencePiece + Kneser-Ney n-grams)."""
from __future__ import annotations

import json
import sys

from dsdata.commands import CommandParser


def main(argv: list[str]) -> int:
    parser = CommandParser(prog="dsdata lm", description="Language models for difficulty grading.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train SentencePiece + an interpolated modified Kneser-Ney n-gram model")
    train.add_argument("--corpus", required=True, help=".txt (one line per sentence/paragraph), .jsonl or .parquet "
                       "(text in --text-field; only records whose --lang-field equals --lang are used)")
    train.add_argument("--lang", required=True, help="language code, e.g. en or zh (the subdirectory the stage looks up)")
    train.add_argument("--out", required=True, help="model directory to write, conventionally MODELS/<lang>")
    train.add_argument("--order", type=int, default=5, help="n-gram order (default 5)")
    train.add_argument("--vocab-size", type=int, default=8000, help="SentencePiece vocabulary (default 8000)")
    train.add_argument("--prune", type=int, nargs="*", default=[],
                       help="per order (unigrams first), drop n-grams seen at most this many times, e.g. 0 1 2 "
                            "(the last value repeats for higher orders; must not decrease)")
    train.add_argument("--max-lines", type=int, default=0, help="use only the first N lines (0: all)")
    train.add_argument("--text-field", default="text", help="JSONL/Parquet text field (default text)")
    train.add_argument("--lang-field", default="lang",
                       help="JSONL/Parquet field holding each record's language, filtered on --lang (default lang); "
                            "'' uses every record (a corpus in one language)")
    args = parser.parse_args(argv)

    from dsdata.lm.kneser_ney import EstimationError
    from dsdata.lm.training import TrainingError, TrainOptions, train_model

    options = TrainOptions(order=args.order, vocab_size=args.vocab_size, prune=tuple(args.prune),
                           max_lines=args.max_lines, text_field=args.text_field,
                           lang_field=args.lang_field)
    try:
        meta = train_model(args.corpus, args.lang, args.out, options,
                           log=lambda msg: print(msg, file=sys.stderr))
    except (TrainingError, EstimationError) as exc:
        print(f"dsdata lm: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: meta[k] for k in ("lang", "order", "vocab_size", "ngrams", "training_tokens")}))
    return 0
