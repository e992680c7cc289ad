"""`dsdata tokenizer train|encode`: train a byte-level BPE tokenizer; try one on a text."""
from __future__ import annotations

import json
import sys
import time

from dsdata.commands import CommandParser
from dsdata.tokenizer import TokenizerError, iter_training_texts, load_tokenizer, train_bpe


def cmd_train(argv: list[str]) -> int:
    parser = CommandParser(prog="dsdata tokenizer train",
                                     description="Train a byte-level BPE tokenizer (zh + en safe: no unknown tokens).")
    parser.add_argument("--input", action="append", required=True, metavar="GLOB",
                        help="training text: .txt (documents separated by blank lines), .jsonl or .parquet; repeatable")
    parser.add_argument("--vocab-size", type=int, default=16000, help="vocabulary size including the EOS token (default 16000)")
    parser.add_argument("--min-frequency", type=int, default=2, help="minimum pair count for a merge (default 2)")
    parser.add_argument("--text-field", default="text", help="field/column holding the text in .jsonl/.parquet")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (tokenizer.json, tokenizer_config.json)")
    args = parser.parse_args(argv)
    start = time.time()
    counted = {"documents": 0, "characters": 0}

    def texts():
        for text in iter_training_texts(args.input, args.text_field):
            counted["documents"] += 1
            counted["characters"] += len(text)
            yield text

    provenance = {"inputs": args.input, "vocab_size_requested": args.vocab_size, "min_frequency": args.min_frequency,
                  "command": "dsdata tokenizer train " + " ".join(argv)}
    try:
        path = train_bpe(texts(), args.vocab_size, args.out, args.min_frequency, provenance)
        if counted["documents"] == 0:
            raise TokenizerError(f"--input {' '.join(args.input)} holds no text")
        loaded = load_tokenizer(args.out)
    except TokenizerError as exc:
        print(f"dsdata: error: {exc}", file=sys.stderr)
        return 2
    summary = {"tokenizer": path, "vocab_size": loaded.vocab_size, "eos_id": loaded.eos_id, "sha256": loaded.sha256,
               **counted, "seconds": round(time.time() - start, 2)}
    print(json.dumps(summary, ensure_ascii=False))
    return 0


def cmd_encode(argv: list[str]) -> int:
    parser = CommandParser(prog="dsdata tokenizer encode", description="Print the token ids of a text.")
    parser.add_argument("tokenizer", help="tokenizer directory or tokenizer.json")
    parser.add_argument("text", help="text to encode")
    args = parser.parse_args(argv)
    try:
        loaded = load_tokenizer(args.tokenizer)
    except TokenizerError as exc:
        print(f"dsdata: error: {exc}", file=sys.stderr)
        return 2
    ids = loaded.encode_batch([args.text])[0]
    print(json.dumps({"ids": ids, "count": len(ids), "chars_per_token": round(len(args.text) / max(1, len(ids)), 3)}))
    return 0


def main(argv: list[str]) -> int:
    commands = {"train": cmd_train, "encode": cmd_encode}
    if not argv or argv[0] not in commands:
        print("usage: dsdata tokenizer {train,encode} ...\n"
              "  train   --input GLOB --vocab-size N --out DIR   train a byte-level BPE tokenizer\n"
              "  encode  TOKENIZER TEXT                          show the ids of a text", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return commands[argv[0]](argv[1:])
