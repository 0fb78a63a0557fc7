"""Make the example models the docs use, in a folder (default: the current one), so every example runs
as written: `python docs/make_example_models.py [FOLDER]`.

- tiny-llama: a 4-layer Llama with random weights (seeded) and the bundled model's tokenizer;
- tiny-mixtral: the same with two experts a layer, one chosen per token;
- llama-70b: a Llama-3-70B-shaped config, the bundled tokenizer and a weights index whose 30 shards are
  not there (a download cut short): tokenviz refuses it from the config alone, before a weight is read,
  since it does not fit.

No download: the configs are transformers' own classes, the tokenizer the bundled model's (its
converted copy in tokenviz's cache, made here if missing). Seconds on a CPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, MixtralConfig

from tokenviz.backends.transformers.gguf_cache import ensure_converted, gguf_cache_dir
from tokenviz.system.paths import bundled_gguf

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
LLAMA_70B = {
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
}


def bundled_tokenizer():  # type: ignore[no-untyped-def]
    gguf = bundled_gguf()
    directory = gguf_cache_dir(gguf)
    ensure_converted(gguf, directory, lambda message, fraction: None)
    return AutoTokenizer.from_pretrained(directory)


def save_tiny(config, folder: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # random weights give a flat distribution: sharpen it
        model.get_output_embeddings().weight.mul_(8.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def main(where: Path) -> None:
    tokenizer = bundled_tokenizer()
    ids = {"vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id}
    save_tiny(LlamaConfig(**TINY, **ids), where / "tiny-llama", tokenizer)
    save_tiny(
        MixtralConfig(**TINY, **ids, num_local_experts=2, num_experts_per_tok=1), where / "tiny-mixtral", tokenizer
    )
    big = where / "llama-70b"
    LlamaConfig(**LLAMA_70B, vocab_size=128256).save_pretrained(big)
    tokenizer.save_pretrained(big)
    shards = {
        f"model.layers.{i}.mlp.down_proj.weight": f"model-{i % 30 + 1:05d}-of-00030.safetensors" for i in range(80)
    }
    (big / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": shards}))
    print(f"made tiny-llama, tiny-mixtral and llama-70b in {where.resolve()}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("."))
