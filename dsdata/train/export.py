"""Export a trained model as a Hugging Face causal-LM directory (for the difficulty stage to score with).

A dense-attention model without MoE is exactly a Llama (RoPE in HF's rotate-half layout: no weight
permutation); other architectures are written native (docs/train.md, "Export for the difficulty stage").
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict

import torch

from dsdata.train.attention import ATTENTION_KERNELS

log = logging.getLogger("dsdata.train")


def llama_state_dict(state: dict[str, torch.Tensor], n_layers: int, tied: bool) -> dict[str, torch.Tensor]:
    """dsdata names → LlamaForCausalLM names."""
    out = {"model.embed_tokens.weight": state["tok_embeddings.weight"], "model.norm.weight": state["norm.weight"]}
    if not tied:
        out["lm_head.weight"] = state["output.weight"]
    names = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
             "attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
             "feed_forward.w2": "mlp.down_proj", "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    for i in range(n_layers):
        for ours, theirs in names.items():
            out[f"model.layers.{i}.{theirs}.weight"] = state[f"layers.{i}.{ours}.weight"]
    return out


def llama_config(args, special_ids: dict[str, int | None] | None = None):
    """LlamaConfig of the model; special_ids: bos/eos/pad_token_id (None: the model has none, so that
    generate() does not stop on an arbitrary token, as LlamaConfig's defaults 1 and 2 would)."""
    from transformers import LlamaConfig

    ids = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **(special_ids or {})}
    return LlamaConfig(vocab_size=args.vocab_size, hidden_size=args.dim, intermediate_size=args.hidden_dim,
                       num_hidden_layers=args.n_layers, num_attention_heads=args.n_heads,
                       num_key_value_heads=args.kv_heads, max_position_embeddings=args.max_seq_len,
                       rms_norm_eps=args.norm_eps, rope_theta=args.rope_theta, tie_word_embeddings=args.tie_embeddings,
                       attention_bias=False, mlp_bias=False, torch_dtype="float32", **ids)


def special_token_ids(tokenizer_dir: str, eos_id: int | None = None) -> dict[str, int | None]:
    """bos/eos/pad ids of the tokenizer files in tokenizer_dir; eos_id (the shard manifest's: the id
    every training document ended with) wins over the tokenizer's own EOS."""
    ids: dict[str, int | None] = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False)
        ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}
    except (OSError, ValueError, TypeError, KeyError) as exc:  # no tokenizer there, or one AutoTokenizer cannot read
        log.warning("export: no special token ids from the tokenizer in %s (%s)", tokenizer_dir, exc)
    if isinstance(eos_id, int) and not isinstance(eos_id, bool):
        ids["eos_token_id"] = eos_id
    return ids


def export_hf(state: dict[str, torch.Tensor], args, out_dir: str, tokenizer_path: str | None = None,
              eos_id: int | None = None) -> str:
    """Write out_dir; returns "llama" or "native" (what was written).  state: full model state dict;
    tokenizer_path: the shards' tokenizer (copied beside the weights; its bos/eos/pad ids go into
    config.json and generation_config.json); eos_id: the shards' end-of-document id."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.makedirs(out_dir, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in state.items()}
    special_ids = None
    if tokenizer_path:
        _copy_tokenizer(tokenizer_path, out_dir)
        special_ids = special_token_ids(out_dir, eos_id)
    if ATTENTION_KERNELS[args.attention].llama_compatible and not args.moe_experts:
        from transformers import LlamaForCausalLM
        from transformers.utils import logging as hf_logging

        config = llama_config(args, special_ids)
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        model.load_state_dict(llama_state_dict(state, args.n_layers, args.tie_embeddings), strict=False, assign=True)
        if args.tie_embeddings:
            model.tie_weights()
        hf_logging.disable_progress_bar()  # a tqdm bar for one file would break the trainer's log format
        model.save_pretrained(out_dir)
        kind = "llama"
    else:
        from safetensors.torch import save_file

        unique = {}  # by storage: a tied weight is saved once, under its first name
        for key, value in state.items():
            unique.setdefault(value.data_ptr(), (key, value.clone()))
        save_file(dict(unique.values()), os.path.join(out_dir, "model.safetensors"))
        kind = "native"
        log.warning("export: %s attention%s has no Hugging Face equivalent; %s holds dsdata-native weights "
                    "(model.safetensors + dsdata_model.json), not a LlamaForCausalLM", args.attention,
                    " with MoE" if args.moe_experts else "", out_dir)
    with open(os.path.join(out_dir, "dsdata_model.json"), "w") as fh:
        json.dump({"format": kind, "model": asdict(args), "special_token_ids": special_ids}, fh, indent=1)
    return kind


def _copy_tokenizer(path: str, out_dir: str) -> None:
    """Copy the shards' tokenizer next to the weights so AutoTokenizer finds it."""
    if os.path.isfile(path) and path.endswith(".json"):
        shutil.copy(path, os.path.join(out_dir, "tokenizer.json"))
    elif os.path.isdir(path):
        for name in os.listdir(path):
            if name.startswith(("tokenizer", "special_tokens_map", "vocab", "merges")):
                shutil.copy(os.path.join(path, name), os.path.join(out_dir, name))
