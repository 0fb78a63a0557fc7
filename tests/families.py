"""Tiny random-weight models of many families, built from transformers' own config classes.

Sliding windows (6 positions) are shorter than the sequences the tests run, so the window matters;
hybrid families alternate sliding and global layers. No download: configs and random weights only.
"""

from __future__ import annotations

import torch
from tiny import tiny_tokenizer
from transformers import AutoConfig, AutoModelForCausalLM

from tokenviz.backends.transformers.attention import use_fast_attention
from tokenviz.backends.transformers.loading import LoadedModel
from tokenviz.backends.transformers.model_description import model_info

WINDOW = 6
HYBRID = ["sliding_attention", "full_attention"] * 2
COMMON = {
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
}
KV_HEADS = 2  # for the families that share key/value heads (grouped-query attention)
FAMILIES: dict[str, dict] = {
    "llama": {},
    "mistral": {"sliding_window": WINDOW, "head_dim": 8},
    "starcoder2": {"sliding_window": WINDOW},
    "gemma": {"head_dim": 8},
    "gemma2": {"sliding_window": WINDOW, "head_dim": 8, "layer_types": HYBRID},
    "gemma3_text": {"sliding_window": WINDOW, "head_dim": 8, "layer_types": HYBRID},
    "cohere": {"logit_scale": 0.5},
    "cohere2": {"sliding_window": WINDOW, "layer_types": HYBRID},
    "granite": {"logits_scaling": 4.0},
    "qwen2": {},
    "qwen3": {"head_dim": 8},
    "phi": {},
    "phi3": {},
    "gpt2": {},
    "gpt_neo": {"num_layers": 4, "num_heads": 4, "attention_types": [[["global", "local"], 2]], "window_size": WINDOW},
    "gpt_neox": {},
    "gptj": {"n_embd": 32, "n_layer": 4, "n_head": 4, "rotary_dim": 4},
    "opt": {"ffn_dim": 64, "word_embed_proj_dim": 32},
    "bloom": {"n_layer": 4, "n_head": 4},
    "xglm": {"d_model": 32, "ffn_dim": 64, "num_layers": 4, "attention_heads": 4},
    "biogpt": {},
    "mpt": {"d_model": 32, "n_heads": 4, "n_layers": 4, "expansion_ratio": 2},
    "falcon": {"new_decoder_architecture": True, "num_kv_heads": 2},
    "gpt_bigcode": {"n_embd": 32, "n_layer": 4, "n_head": 4},
    "stablelm": {},
    "olmo": {},
    "olmo2": {},
    "codegen": {"n_embd": 32, "n_layer": 4, "n_head": 4, "rotary_dim": 4, "n_ctx": 128},
    "mixtral": {"num_local_experts": 2, "num_experts_per_tok": 1},
    "qwen2_moe": {
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    },
    "qwen3_moe": {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32, "head_dim": 8},
    # Multi-head latent attention: the cache holds a compressed latent and a shared rotary key.
    "deepseek_v3": {
        "num_key_value_heads": 4,
        "kv_lora_rank": 16,
        "q_lora_rank": 16,
        "qk_rope_head_dim": 4,
        "qk_nope_head_dim": 4,
        "v_head_dim": 8,
        "head_dim": 4,
        "n_routed_experts": 2,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
    },
}


def family_config(kind: str):
    tokenizer = tiny_tokenizer()
    eos = tokenizer.eos_token_id
    tokens = {"eos_token_id": eos, "bos_token_id": eos, "pad_token_id": eos}
    config = AutoConfig.for_model(kind, **COMMON, **FAMILIES[kind], **tokens)
    if getattr(config, "num_key_value_heads", None) and "num_key_value_heads" not in FAMILIES[kind]:
        config.num_key_value_heads = KV_HEADS
    return config


def family_model(kind: str, seed: int = 0) -> LoadedModel:
    return model_of(family_config(kind), f"tiny-{kind}", seed)


def model_of(config, name: str, seed: int = 0) -> LoadedModel:
    """A tiny random-weight model of `config` with the tiny tokenizer, as the family matrix builds one."""
    tokenizer = tiny_tokenizer()
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # random weights give a flat distribution: sharpen it
        model.get_output_embeddings().weight.mul_(8.0)
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = None  # run the whole length: random weights hit EOS by chance
    model.eval()
    use_fast_attention(model)  # as load_model does
    return LoadedModel(
        model=model, tokenizer=tokenizer, info=model_info(model, name, torch.device("cpu"), torch.float32)
    )


def gemma3n_config(shared: int = 0):
    """A tiny Gemma 3n: four parallel streams per layer (AltUp), merged after the last layer; its last
    `shared` layers reuse the keys of the last layer of their kind before them."""
    return AutoConfig.for_model(
        "gemma3n_text", **COMMON, num_key_value_heads=KV_HEADS, head_dim=8, vocab_size_per_layer_input=300,
        hidden_size_per_layer_input=8, laurel_rank=4, altup_num_inputs=4, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=shared,
        activation_sparsity_pattern=[0.0] * 4,
    )  # fmt: skip


def gemma4_config(shared: int = 0):
    """A tiny Gemma 4: a heterogeneous config, its global layers' heads twice its sliding layers'; its
    last `shared` layers reuse the keys of the last layer of their kind before them."""
    return AutoConfig.for_model(
        "gemma4_text", **COMMON, num_key_value_heads=KV_HEADS, head_dim=8, vocab_size_per_layer_input=300,
        hidden_size_per_layer_input=8, layer_types=["sliding_attention", "full_attention"] * 2,
        per_layer_config={"1": {"head_dim": 16}, "3": {"head_dim": 16}}, num_kv_shared_layers=shared,
    )  # fmt: skip
