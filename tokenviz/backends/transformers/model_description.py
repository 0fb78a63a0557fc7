"""A loaded model described for the model view and every document (contract.records.ModelInfo): its
shape, positions, attention path and experts, as its config says."""

from __future__ import annotations

import shlex
from typing import Any

import torch
import transformers

from tokenviz.backends.shared.parts import kv_heads, layer_configs, text_config
from tokenviz.backends.transformers.attention import IMPLEMENTATION
from tokenviz.contract.records import ModelInfo
from tokenviz.system.paths import BUNDLED_NAME


def _position_scheme(config: Any) -> str:
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta or getattr(config, "rope_theta", None)
    if theta is not None:
        return f"rotary (base {theta:g})"
    n = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    return f"learned absolute ({n} positions)"


ATTENTION_LABELS = {
    True: "sdpa; the weights shown are computed exactly when asked",
    False: "eager: transformers has no fast path for this model's attention",
}


def model_info(
    model: Any,
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    memory: str = "",
    placement: str = "",
    quantization: str = "",
) -> ModelInfo:
    c = model.config
    first = layer_configs(c)[0]  # the runner reads the first layer's cache shape: the same figures
    heads = first.num_attention_heads
    hidden = c.hidden_size
    return ModelInfo(
        name=name,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        layers=c.num_hidden_layers,
        heads=heads,
        kv_heads=kv_heads(first, heads),
        head_dim=getattr(first, "head_dim", None) or hidden // heads,
        hidden=hidden,
        vocab=c.vocab_size,
        context=int(getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None) or 2048),
        architecture=type(model).__name__,
        tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        positions=_position_scheme(c),
        attention=ATTENTION_LABELS[c._attn_implementation == IMPLEMENTATION],
        memory=memory,
        placement=placement,
        quantization=quantization,
        experts=routed_experts(c),
        runtime=f"transformers {transformers.__version__} (PyTorch {torch.__version__.split('+')[0]})",
        reopen="tokenviz" if name == BUNDLED_NAME else f"tokenviz --model {shlex.quote(name)}",
    )


EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")  # as families name it


def routed_experts(config: Any) -> int:
    """The routed experts of each mixture-of-experts layer, as the config says (0 for a dense model)."""
    text = text_config(config)
    for name in EXPERT_COUNTS:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0
