"""Tiny random MarianMT models with a real SentencePiece tokenizer, for tests and benchmarks
(test scaffolding: it lives here, not in the package, and tests import it from benchmarks/).

They translate nothing meaningful, but they go through exactly the code path of a real opus-mt
model: AutoTokenizer (MarianTokenizer + SentencePiece), AutoModelForSeq2SeqLM, generate().
"""
from __future__ import annotations

import io
import json
import os
import random

_EN_WORDS = (
    "the a data model text file system user run stage page line word code test small big fast slow "
    "read write open close list tree node graph train learn is are of to and in for with this that"
).split()
_ZH_CHARS = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面"
    "而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性"
    "好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第"
    "向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管"
    "特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处"
)


def sample_sentences(count: int, seed: int = 0) -> list[str]:
    """`count` made-up sentences, alternating English words and Chinese characters."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if i % 2 == 0:
            words = [rng.choice(_EN_WORDS) for _ in range(rng.randint(4, 12))]
            out.append(" ".join(words).capitalize() + rng.choice(".!?"))
        else:
            out.append("".join(rng.choice(_ZH_CHARS) for _ in range(rng.randint(5, 18))) + rng.choice("。！？"))
    return out


def build_tiny_marian(directory: str, seed: int = 0, vocab_size: int = 450, d_model: int = 32,
                      layers: int = 1, init_std: float = 1.0, pad_vocab_to: int = 0) -> str:
    """Train a SentencePiece tokenizer on made-up zh/en text and save a random MarianMT model.

    init_std: a large init makes outputs depend on the input (the default 0.02 gives every input
    the same output), so tests can tell sentences apart after the round trip.
    """
    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    os.makedirs(directory, exist_ok=True)
    model_proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample_sentences(600, seed)), model_writer=model_proto, vocab_size=vocab_size,
        character_coverage=1.0, model_type="unigram", bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1,
        minloglevel=2, num_threads=1, hard_vocab_limit=False,
    )
    for name in ("source.spm", "target.spm"):
        with open(os.path.join(directory, name), "wb") as fh:
            fh.write(model_proto.getvalue())
    processor = spm.SentencePieceProcessor(model_proto=model_proto.getvalue())
    vocab = {"</s>": 0, "<unk>": 1, "<pad>": 2}
    for i in range(processor.get_piece_size()):
        vocab.setdefault(processor.id_to_piece(i), len(vocab))
    while len(vocab) < pad_vocab_to:
        vocab[f"<unused{len(vocab)}>"] = len(vocab)
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as fh:
        json.dump(vocab, fh, ensure_ascii=False)
    tokenizer = MarianTokenizer(
        source_spm=os.path.join(directory, "source.spm"), target_spm=os.path.join(directory, "target.spm"),
        vocab=os.path.join(directory, "vocab.json"),
    )
    tokenizer.save_pretrained(directory)
    config = MarianConfig(
        vocab_size=len(vocab), d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model, max_position_embeddings=512, pad_token_id=2, eos_token_id=0,
        decoder_start_token_id=2, forced_eos_token_id=0, init_std=init_std,
    )
    torch.manual_seed(seed)
    MarianMTModel(config).save_pretrained(directory)
    return directory
