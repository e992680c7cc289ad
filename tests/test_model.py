"""Model: Hugging Face Llama parity of the export, MoE routing, config errors, pipeline-stage shape."""
import json

import pytest
import torch

from dsdata.train.export import export_hf
from dsdata.train.model import ModelArgs, Transformer
from dsdata.train.moe import MoEFeedForward

torch.set_num_threads(1)


@pytest.mark.parametrize("tied,kv_heads", [(False, None), (True, 2)])
def test_dense_export_loads_as_llama_with_identical_logits(tmp_path, tied, kv_heads):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=kv_heads, vocab_size=97, max_seq_len=64,
                     tie_embeddings=tied)
    model = Transformer(args).eval()
    assert export_hf(model.state_dict(), args, str(tmp_path / "hf")) == "llama"
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), torch_dtype=torch.float32).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    tokens = torch.randint(0, 97, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), rtol=1e-4, atol=1e-4)


def test_export_takes_special_ids_from_the_tokenizer_and_generation_stops_at_eos(tmp_path):
    """LlamaConfig's defaults (bos 1, eos 2) are `!` and `"` in the shipped tokenizer, whose EOS is id 0."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer_dir = Path(__file__).resolve().parents[1] / "pipelines" / "models" / "tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    eos = tokenizer.eos_token_id
    assert tokenizer.convert_ids_to_tokens([eos, 1, 2]) == ["<|endoftext|>", "!", '"']
    args = ModelArgs(dim=32, n_layers=1, n_heads=2, vocab_size=len(tokenizer), max_seq_len=64)
    state = Transformer(args).state_dict()
    # Zero output weights: every logit is equal and greedy decoding picks the lowest id, the EOS (0).
    # The control export names another end-of-document id (as a manifest may): the same model then
    # generates id 0 until max_new_tokens.
    state["output.weight"] = torch.zeros_like(state["output.weight"])
    export_hf(state, args, str(tmp_path / "eos"), str(tokenizer_dir))
    export_hf(state, args, str(tmp_path / "control"), str(tokenizer_dir), eos_id=7)
    assert json.loads((tmp_path / "control" / "config.json").read_text())["eos_token_id"] == 7
    for name in ("config.json", "generation_config.json"):
        saved = json.loads((tmp_path / "eos" / name).read_text())
        assert (saved["eos_token_id"], saved["bos_token_id"]) == (eos, tokenizer.bos_token_id), name
    prompt = tokenizer("The guide explains", return_tensors="pt").input_ids
    for name, expected in (("eos", [eos]), ("control", [eos] * 6)):
        model = AutoModelForCausalLM.from_pretrained(str(tmp_path / name)).eval()
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False)
        assert out[0, prompt.shape[1]:].tolist() == expected, name


def test_export_without_a_tokenizer_names_no_special_ids(tmp_path):
    args = ModelArgs(dim=32, n_layers=1, n_heads=2, vocab_size=50, max_seq_len=64)
    export_hf(Transformer(args).state_dict(), args, str(tmp_path / "hf"))
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert saved.get("eos_token_id") is None and saved.get("bos_token_id") is None


def test_sparse_or_moe_export_is_native_and_says_so(tmp_path):
    args = ModelArgs(dim=32, n_layers=1, n_heads=2, vocab_size=50, attention="lsh", moe_experts=2)
    kind = export_hf(Transformer(args).state_dict(), args, str(tmp_path / "x"))
    assert kind == "native"
    meta = json.loads((tmp_path / "x" / "dsdata_model.json").read_text())
    assert meta["format"] == "native" and meta["model"]["attention"] == "lsh"
    assert (tmp_path / "x" / "model.safetensors").is_file() and not (tmp_path / "x" / "config.json").exists()


def test_moe_routes_top2_respects_capacity_and_balances():
    torch.manual_seed(0)
    moe = MoEFeedForward(dim=16, hidden_dim=32, n_experts=4, top_k=2, capacity_factor=1.0)
    x = torch.randn(3, 20, 16)
    top_e, gates, kept, aux = moe.route(x.reshape(-1, 16))
    assert top_e.shape == (60, 2) and (top_e[:, 0] != top_e[:, 1]).all()
    torch.testing.assert_close(gates.sum(-1), torch.ones(60))
    capacity = 30  # ceil(1.0 · 60 · 2 / 4)
    for e in range(4):
        assert int(((top_e == e) & kept).sum()) <= capacity
    # Uniform router → loss exactly 1; a collapsed router → E (= 4).
    with torch.no_grad():
        moe.router.weight.zero_()
    assert float(moe.route(x.reshape(-1, 16))[3].detach()) == pytest.approx(1.0)
    with torch.no_grad():
        moe.router.weight[0].fill_(0.0)
        moe.router.weight[0, 0] = 1000.0
    x_pos = x.abs() + 0.1
    _, _, kept, aux = moe.route(x_pos.reshape(-1, 16))
    assert float(aux.detach()) == pytest.approx(2.0, rel=1e-3)  # top-1 share 1/2 of assignments, prob 1 → 4·0.5·1
    assert not kept.all()  # expert 0 overflows its capacity: those assignments are dropped


def test_moe_output_matches_per_token_reference():
    torch.manual_seed(1)
    moe = MoEFeedForward(dim=8, hidden_dim=16, n_experts=3, top_k=2, capacity_factor=10.0).double()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    out = moe(x).reshape(-1, 8)
    top_e, gates, kept, _ = moe.route(x.reshape(-1, 8))
    assert kept.all()
    for n, token in enumerate(x.reshape(-1, 8)):
        want = sum(gates[n, c] * moe.experts.expert(int(top_e[n, c]), token[None])[0] for c in range(2))
        torch.testing.assert_close(out[n], want)
    assert moe.aux_loss is not None and moe.aux_loss.requires_grad


def test_pipeline_stage_can_drop_modules_and_layers():
    torch.manual_seed(0)
    args = ModelArgs(dim=32, n_layers=4, n_heads=2, vocab_size=40, max_seq_len=32)
    full = Transformer(args)
    tokens = torch.randint(0, 40, (2, 16))
    first, second = Transformer(args), Transformer(args)
    first.load_state_dict(full.state_dict())
    second.load_state_dict(full.state_dict())
    for name in ("2", "3"):
        del first.layers[name]
    for name in ("0", "1"):
        del second.layers[name]
    first.norm = first.output = None
    second.tok_embeddings = None
    torch.testing.assert_close(second(first(tokens)), full(tokens))


def test_heads_come_from_weight_shapes():
    """A tensor-parallel shard (half the heads in wq/wk/wv, half the rows of wo's input) runs unchanged."""
    torch.manual_seed(0)
    args = ModelArgs(dim=32, n_layers=1, n_heads=4, vocab_size=40, max_seq_len=32)
    model = Transformer(args)
    attn = model.layers["0"].attention
    x = torch.randn(2, 8, 32)
    cos, sin = model.rope_cos[:8], model.rope_sin[:8]
    full = attn(x, cos, sin)
    halves = []
    for part in range(2):
        shard = type(attn)(args, 0)
        rows = slice(part * 16, (part + 1) * 16)
        shard.wq.weight = torch.nn.Parameter(attn.wq.weight[rows])
        shard.wk.weight = torch.nn.Parameter(attn.wk.weight[rows])
        shard.wv.weight = torch.nn.Parameter(attn.wv.weight[rows])
        shard.wo.weight = torch.nn.Parameter(attn.wo.weight[:, rows])
        halves.append(shard(x, cos, sin))
    torch.testing.assert_close(halves[0] + halves[1], full)


@pytest.mark.parametrize("bad,message", [({"attention": "flash"}, "model.attention"),
                                         ({"dim": 30, "n_heads": 4}, "multiple of model.n_heads"),
                                         ({"attention": "dynamic_sparse", "attention_config": {"window": 40, "block": 32}},
                                          "model.attention_config.window"),
                                         ({"sparse_window": 40}, "model.sparse_window is now model.attention_config.window"),
                                         ({"nheads": 4}, r"\[model\] has no parameter 'nheads' .*; did you mean 'n_heads'\?")])
def test_bad_model_config_is_one_clear_error(bad, message):
    from dsdata.core.params import parse

    with pytest.raises(ValueError, match=message):
        parse(ModelArgs, bad, "model")
