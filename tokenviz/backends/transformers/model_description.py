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

POSITION_EMBEDDINGS = ("wpe", "embed_positions", "position_embeddings")  # learned positions' modules' names


def position_scheme(model: Any) -> str:
    """How the model encodes positions, as its config and its modules say: rotary with each base its config
    gives (one per layer type where they differ: Gemma 3's full and sliding layers), learned absolute (a
    position embedding among its modules), ALiBi; else that its config does not say (never guessed)."""
    config = text_config(model.config)
    bases = rope_bases(config)
    if len(set(bases.values())) == 1:
        return f"rotary (base {next(iter(bases.values())):g})"
    if bases:
        return "rotary (base " + ", ".join(f"{theta:g} {kind.replace('_', ' ')}" for kind, theta in bases.items()) + ")"
    if isinstance(getattr(config, "rotary_dim", None), int):  # (GPT-J, CodeGen: the base is the code's)
        return f"rotary (the first {config.rotary_dim} dimensions of each head)"
    attention = getattr(config, "attn_config", None)
    alibi = getattr(attention, "alibi", None) if not isinstance(attention, dict) else attention.get("alibi")
    if getattr(config, "alibi", False) or alibi or getattr(config, "model_type", "") == "bloom":
        return "ALiBi (linear biases by distance)"
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] not in POSITION_EMBEDDINGS:
            continue
        if isinstance(module, torch.nn.Embedding):
            return f"learned absolute ({module.num_embeddings} positions)"
        if "Sinusoidal" in type(module).__name__:
            return "sinusoidal absolute (fixed)"
    return "not said by its config"


def rope_bases(config: Any) -> dict[str, float]:
    """Each rotary base the config gives, by the layer type it is for ("all" where one serves every layer)."""
    rope = getattr(config, "rope_parameters", None) or {}
    if isinstance(rope, dict) and isinstance(rope.get("rope_theta"), int | float):
        return {"all": float(rope["rope_theta"])}
    nested = {
        kind: float(values["rope_theta"])
        for kind, values in (rope.items() if isinstance(rope, dict) else ())
        if isinstance(values, dict) and isinstance(values.get("rope_theta"), int | float)
    }
    if nested:
        return nested
    theta = getattr(config, "rope_theta", None)
    return {"all": float(theta)} if isinstance(theta, int | float) else {}


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
        positions=position_scheme(model),
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
