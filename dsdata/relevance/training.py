"""Train relevance classifiers into directories the `relevance` stage loads, each with its
`dsdata-relevance.json`.  BERT: the frozen bottom of the encoder runs once (outputs cached); the top
`train_layers` layers plus pooler and classifier train (0: head only, -1: all).
"""
from __future__ import annotations

import json
import os
import random
import time
from typing import Callable, Sequence

from dsdata.relevance.bert_backend import (META_FILE, WindowTokenizer, _offline, check_model_dir, default_encoder_dir,
                                           length_batches, pad_batch, resolve_device)
from dsdata.relevance.data import LabelledText

Log = Callable[[str], None]


def write_meta(out_dir: str, meta: dict) -> None:
    with open(os.path.join(out_dir, META_FILE), "w", encoding="utf-8") as fh:
        json.dump(meta, fh, indent=2, ensure_ascii=False)
        fh.write("\n")


def train_fasttext_model(records: Sequence[LabelledText], out_dir: str, quantize: bool = True,
                         log: Log = print, **overrides) -> dict:
    """Train and save a supervised fastText model; returns the metadata written beside it."""
    from dsdata.relevance.fasttext_backend import DEFAULT_TRAIN_ARGS, train_fasttext

    start = time.time()
    path = train_fasttext([r.text for r in records], [r.label for r in records], out_dir, quantize=quantize,
                          **overrides)
    meta = {"backend": "fasttext", "model_file": os.path.basename(path), "quantized": quantize,
            "train_args": {**DEFAULT_TRAIN_ARGS, **overrides}, "train_records": len(records),
            "train_seconds": round(time.time() - start, 1)}
    write_meta(out_dir, meta)
    log(f"fasttext: trained on {len(records)} records in {meta['train_seconds']} s → {path}")
    return meta


class _TopLayers:
    """Runs the trainable top of a BertForSequenceClassification on cached frozen hidden states."""

    def __init__(self, model, first_trained: int):
        import torch
        from transformers.masking_utils import create_bidirectional_mask

        base = model.base_model
        if not hasattr(base, "encoder") or not hasattr(base.encoder, "layer") or getattr(base, "pooler", None) is None \
                or not hasattr(model, "classifier"):
            raise ValueError(f"partial training needs a BERT-architecture classifier (encoder.layer, pooler, classifier); "
                             f"'{model.config.model_type}' has another layout: use --train-layers all")
        self.model, self.torch = model, torch
        self.layers = base.encoder.layer[first_trained:]
        self.pooler, self.dropout, self.classifier = base.pooler, model.dropout, model.classifier
        self._mask = create_bidirectional_mask

    def parameters(self):
        for module in (*self.layers, self.pooler, self.classifier):
            yield from module.parameters()

    def __call__(self, hidden, mask):
        attn = self._mask(config=self.model.config, inputs_embeds=hidden, attention_mask=mask)
        for layer in self.layers:
            out = layer(hidden, attn)
            hidden = out[0] if isinstance(out, tuple) else out
        return self.classifier(self.dropout(self.pooler(hidden)))


def train_bert_model(records: Sequence[LabelledText], out_dir: str, encoder: str | None = None,
                     train_layers: int = 2, epochs: int = 3, lr: float = 1e-4, batch_size: int = 16,
                     max_length: int = 256, device: str = "auto", seed: int = 0, log: Log = print) -> dict:
    """Train a BERT-family relevance classifier from `encoder` (default all-MiniLM-L6-v2) and save it."""
    _offline()
    import torch

    encoder = encoder or default_encoder_dir()
    check_model_dir(encoder, "encoder")
    device = resolve_device(device)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer, model = _load_encoder(encoder, device)
    n_layers = int(model.config.num_hidden_layers)
    k = n_layers if train_layers < 0 or train_layers >= n_layers else train_layers
    limit = int(getattr(model.config, "max_position_embeddings", 512) or 512)
    windows_of = WindowTokenizer(tokenizer, min(max_length, limit), "head_tail")
    windows, labels = _labelled_windows(windows_of, records)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    start = time.time()

    if k < n_layers:
        forward, params = _frozen_below(model, n_layers - k, windows, pad_id, device, log, start)
    else:
        params = list(model.parameters())

        def forward(batch):
            ids, mask = pad_batch(batch, pad_id)
            return model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits

    _train_only(model, params)
    batches = length_batches(windows, batch_size, batch_size * windows_of.max_length)
    model.train()
    _fit(forward, params, batches, labels, epochs, lr, rng, device, log, start)
    model.eval()
    os.makedirs(out_dir, exist_ok=True)
    model.to("cpu").save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    meta = {"backend": "bert", "encoder": os.path.abspath(encoder), "train_layers": k, "num_layers": n_layers,
            "epochs": epochs, "lr": lr, "batch_size": batch_size, "max_length": windows_of.max_length,
            "long_documents": "head_tail", "positive_index": 1, "train_records": len(records),
            "train_windows": len(windows), "seed": seed, "train_seconds": round(time.time() - start, 1)}
    write_meta(out_dir, meta)
    log(f"bert: trained {k}/{n_layers} layers + head on {len(records)} records in {meta['train_seconds']} s → {out_dir}")
    return meta


def _frozen_below(model, first_trained: int, windows, pad_id: int, device: str, log: Log, start: float):
    """(forward over the top layers, their parameters): the frozen layers below `first_trained` run
    once over every window, and their hidden states are cached for all epochs."""
    import torch

    top = _TopLayers(model, first_trained)
    cache: dict[int, torch.Tensor] = {}
    model.eval()
    with torch.inference_mode():
        for batch in length_batches(windows, 64, 16384):
            ids, mask = pad_batch(batch, pad_id)
            hidden = model.base_model(input_ids=ids.to(device), attention_mask=mask.to(device),
                                      output_hidden_states=True).hidden_states[first_trained]
            for row, w in enumerate(batch):
                cache[w.doc] = hidden[row, : len(w.ids)].clone()
    log(f"bert: frozen layers 1–{first_trained} ran once over {len(windows)} windows "
        f"in {time.time() - start:.0f} s")

    def forward(batch):
        width = max(len(w.ids) for w in batch)
        hidden = torch.zeros(len(batch), width, model.config.hidden_size, device=device)
        mask = torch.zeros(len(batch), width, dtype=torch.long, device=device)
        for row, w in enumerate(batch):
            hidden[row, : len(w.ids)] = cache[w.doc]
            mask[row, : len(w.ids)] = 1
        return top(hidden, mask)

    return forward, list(top.parameters())


def _fit(forward, params, batches, labels, epochs: int, lr: float, rng: random.Random, device: str, log: Log,
         start: float) -> None:
    """AdamW with linear warm-up and decay over `epochs` passes of the batches, in random order."""
    import torch

    n_windows = sum(len(b) for b in batches)
    total_steps = max(1, epochs * len(batches))
    warmup = max(1, total_steps // 10)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, (total_steps - s) / total_steps))
    for epoch in range(epochs):
        rng.shuffle(batches)  # length-sorted batches in random order: little padding, no length curriculum
        epoch_loss = 0.0
        for batch in batches:
            target = torch.tensor([labels[w.doc] for w in batch], device=device)
            loss = torch.nn.functional.cross_entropy(forward(batch).float(), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            epoch_loss += float(loss.detach()) * len(batch)
        log(f"bert: epoch {epoch + 1}/{epochs} loss {epoch_loss / n_windows:.4f} ({time.time() - start:.0f} s)")


def _load_encoder(encoder: str, device: str):
    """(tokenizer, a two-label sequence classifier on `encoder`), on `device`; no remote code."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(encoder, trust_remote_code=False)
    model = AutoModelForSequenceClassification.from_pretrained(
        encoder, trust_remote_code=False, num_labels=2, id2label={0: "irrelevant", 1: "relevant"},
        label2id={"irrelevant": 0, "relevant": 1})
    model.to(device)
    return tokenizer, model


def _labelled_windows(windows_of: WindowTokenizer, records: Sequence[LabelledText]):
    """Every window of a document is an example with the document's label (window.doc → label)."""
    windows = windows_of.windows([r.text for r in records])
    labels = [records[w.doc].label for w in windows]
    for i, w in enumerate(windows):
        w.doc = i
    return windows, labels


def _train_only(model, params) -> None:
    """Gradients for `params` alone."""
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
