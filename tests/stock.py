"""transformers' own model of the same weights, loaded afresh: the reference the truth tests hold
tokenviz to. The weights are saved once and loaded with `from_pretrained(dir, attn_implementation=...)`
alone, so no reference goes through tokenviz's registered attention, its capture or its mask: a bug in
any of them shows as a difference, not as the same number on both sides."""

from __future__ import annotations

import hashlib
from functools import cache

import torch
from scratch import scratch_dir
from transformers import AutoModelForCausalLM

_SAVED: dict[str, str] = {}  # a model's weights' digest: the directory they were saved to


def saved(model) -> str:
    """The directory holding `model`'s weights and config, saved the first time they are asked for
    (known by a digest of the config and every tensor: two models of one name may differ, and two
    families may hold the same weights)."""
    digest = hashlib.sha256(model.config.to_json_string().encode())  # (two families can share weights)
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    key = digest.hexdigest()[:16]
    if key not in _SAVED:
        directory = scratch_dir(f"tokenviz-stock-{key}-")
        model.save_pretrained(directory)
        _SAVED[key] = directory
    return _SAVED[key]


@cache
def stock(directory: str, attn: str = "eager", device: str = "cpu"):
    """transformers' model from `directory` in float32, in its `attn` attention ("eager", "sdpa")."""
    model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation=attn, dtype=torch.float32)
    return model.eval().to(device)


def stock_forward(directory: str, ids: list[int], device: str = "cpu"):
    """A full forward pass without the cache in transformers' eager attention, weights returned."""
    with torch.inference_mode():
        model = stock(directory, "eager", device)
        return model(torch.tensor([ids], device=device), use_cache=False, output_attentions=True)
