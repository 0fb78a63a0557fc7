"""transformers' own model of the same weights, loaded afresh: the reference the truth tests hold
tokenviz to. The weights are saved once and loaded with `from_pretrained(dir, attn_implementation=...)`
alone, so no reference goes through tokenviz's registered attention, its capture or its mask: a bug in
any of them shows as a difference, not as the same number on both sides."""

from __future__ import annotations

import tempfile
from functools import cache

import torch
from transformers import AutoModelForCausalLM

_SAVED: dict[str, str] = {}  # a model's key: the directory its weights were saved to


def saved(key: str, model) -> str:
    """The directory holding `model`'s weights and config, saved the first time `key` is asked."""
    if key not in _SAVED:
        directory = tempfile.mkdtemp(prefix=f"tokenviz-stock-{key}-")
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
