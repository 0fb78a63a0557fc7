"""Checkpoints of real models' shapes that cost nothing on disk: a config and a safetensors file
whose header lists every tensor and whose data is a hole (a sparse file). What the memory check
reads of a 70B model is there; nothing else is."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

SHAPES = {  # Llama 3's
    "8B": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32},
    "70B": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64},
}


def sparse_checkpoint(directory: Path, shape: dict) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", vocab_size=128256, num_key_value_heads=8, **shape)
    config.save_pretrained(directory)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    header, offset = {}, 0
    for name, p in model.state_dict().items():
        size = p.numel() * 2
        header[name] = {"dtype": "BF16", "shape": list(p.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(directory / "model.safetensors", "wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw)
        file.truncate(8 + len(raw) + offset)
