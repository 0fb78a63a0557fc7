"""Where a model keeps its parts, which configs and families name in many ways: its decoder layers
(hooks between layers: the lens, progress, cancelling, an autoplay step giving way) and its
key/value heads."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_found: weakref.WeakKeyDictionary[Any, torch.nn.ModuleList] = weakref.WeakKeyDictionary()


def decoder_layers(model: Any) -> torch.nn.ModuleList:
    """The model's list of decoder layers: the ModuleList as long as the config's layer count (found
    once per model; an autoplay step asks for it)."""
    if model not in _found:
        n = model.config.num_hidden_layers
        layers = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n), None)
        if layers is None:
            raise ValueError("cannot find the decoder layers of this model")
        _found[model] = layers
    return _found[model]


def text_config(config: Any) -> Any:
    """The config of the language model inside `config` (a multimodal one's text part), or `config`."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def eos_id_set(eos: int | list[int] | None, tokenizer: Any) -> set[int]:
    """The ids that end generation: `eos` as a config gives it (one id, a list, or None), else the
    tokenizer's own."""
    ids = tokenizer.eos_token_id if eos is None else eos
    if ids is None:
        return set()
    return set(ids) if isinstance(ids, (list, tuple)) else {int(ids)}


def layer_configs(config: Any) -> list[Any]:
    """Each decoder layer's config: a heterogeneous config's own per layer (transformers 5.24 refuses
    to read an attribute that varies by layer, as Gemma 4's head size does, from the whole config),
    else the config itself for every layer."""
    if getattr(config, "is_heterogeneous", False):
        return list(config.per_layer_config)
    return [config] * config.num_hidden_layers


def last_logits(n: int, device: torch.device | str) -> torch.Tensor:
    """`logits_to_keep` for a pass of `n` positions whose hooks or kept queries need every layer at
    every position, though only the last logits are wanted: the last position's index, not the int 1,
    with which Gemma 4 feeds only the kept positions through its KV-shared layers."""
    return torch.tensor([n - 1], device=device)


def kv_heads(config: Any, heads: int) -> int:
    """Key/value heads as the config names them (the runner checks them against its cache)."""
    for name in ("num_key_value_heads", "num_kv_heads"):  # most families; Falcon
        value = getattr(config, name, None)
        if value:
            return int(value)
    return 1 if getattr(config, "multi_query", False) else heads  # GPTBigCode


@contextmanager
def output_layer_input(model: Any) -> Iterator[list[torch.Tensor]]:
    """What a pass's output layer reads, at every position: the base model's last hidden state, before
    the causal LM keeps the positions whose logits it was asked for. Captured into the list yielded
    (empty where the base model's output is not of that shape)."""
    read: list[torch.Tensor] = []

    def hook(module: Any, args: Any, output: Any) -> None:
        state = output[0] if isinstance(output, tuple) else getattr(output, "last_hidden_state", None)
        if isinstance(state, torch.Tensor) and state.dim() == 3:
            read.append(state.detach())

    base = model.base_model
    handle = base.register_forward_hook(hook) if base is not model else None
    try:
        yield read
    finally:
        if handle is not None:
            handle.remove()
