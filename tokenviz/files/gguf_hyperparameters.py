"""A GGUF's hyperparameters checked against what llama.cpp asserts on as it loads and runs a model:
where llama.cpp's own check is a GGML_ASSERT, a value outside it aborts the process (block_count 0 or
513, expert_used_count above expert_count, an epsilon of NaN), with no chance to say why. What llama.cpp
refuses in a line of its own (a key of the wrong type, a head count that does not divide the width) it
still refuses; these are the ones it cannot.

The bounds are llama.cpp's (src/llama-hparams.h, llama_model::load_hparams, ggml_rms_norm) as of the
llama-cpp-python pinned in pyproject.toml.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.text import safe_text

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
ROPE_SCALINGS = ("none", "linear", "yarn", "longrope")  # LLAMA_ROPE_SCALING_TYPES


def _shown(value: float) -> str:
    return f"{int(value):,}" if math.isfinite(value) and value == int(value) else f"{value:g}"


def check_hyperparameters(
    numbers: Mapping[str, float],
    strings: Mapping[str, str],
    lists: Mapping[str, tuple[float, ...]],
    refuse: Callable[[str], TokenvizError],
) -> None:
    """Refuse (`refuse(why)`, one line) a hyperparameter llama.cpp would abort on, or that no model has: the
    metadata's numbers, short strings and short lists of numbers by key (files.gguf_header reads them)."""
    arch = strings.get("general.architecture")
    if arch is None:
        return  # not a model's GGUF: llama.cpp refuses it in a line of its own
    prefix = f"{arch}."

    def number(name: str, default: float = 0.0) -> float:
        return numbers.get(prefix + name, default)

    def per_layer(name: str) -> tuple[float, ...]:
        """A count llama.cpp takes as one number or one a layer."""
        if prefix + name in lists:
            return lists[prefix + name]
        return (numbers[prefix + name],) if prefix + name in numbers else ()

    for key, value in {**numbers, **{k: v for k, vs in lists.items() for v in vs}}.items():
        if key.startswith(prefix) and not math.isfinite(value):
            raise refuse(f"{safe_text(key)} is {value} (a hyperparameter must be a finite number)")
        if key.startswith(prefix) and "epsilon" in key and value < 0:
            raise refuse(f"{safe_text(key)} is {value:g}: an epsilon is never negative")
    layers = numbers.get(prefix + "block_count")
    if layers is None:
        raise refuse(f"it has no {prefix}block_count (its number of layers)")
    if not 1 <= layers <= MAX_LAYERS:
        raise refuse(f"{prefix}block_count is {_shown(layers)}: llama.cpp takes 1 to {MAX_LAYERS} layers")
    if number("nextn_predict_layers") > layers:
        raise refuse(f"{prefix}nextn_predict_layers is more than its {_shown(layers)} layers")
    _check_experts(prefix, number, per_layer, refuse)
    scaling = strings.get(prefix + "rope.scaling.type")
    if scaling is not None and scaling not in ROPE_SCALINGS:
        raise refuse(f"{prefix}rope.scaling.type is {scaling!r}: llama.cpp knows {', '.join(ROPE_SCALINGS)}")


def _check_experts(
    prefix: str,
    number: Callable[[str], float],
    per_layer: Callable[[str], tuple[float, ...]],
    refuse: Callable[[str], TokenvizError],
) -> None:
    """A mixture of experts' counts, as llama.cpp asserts them: the experts used a token at most the
    experts there are, at least one where there are any, none where there are none; groups likewise."""
    experts, groups, groups_used = (
        number("expert_count"),
        number("expert_group_count"),
        number("expert_group_used_count"),
    )
    used = per_layer("expert_used_count") or (0.0,)
    if experts > MAX_EXPERTS:
        raise refuse(f"{prefix}expert_count is {_shown(experts)}: llama.cpp takes at most {MAX_EXPERTS:,}")
    if max(used) > experts:
        raise refuse(
            f"{prefix}expert_used_count is {_shown(max(used))} of {_shown(experts)} experts "
            f"({prefix}expert_count{'' if experts else ' is missing'})"
        )
    if experts > 0 and min(used) <= 0:
        raise refuse(f"{prefix}expert_used_count is {_shown(min(used))}: a mixture of experts uses at least one")
    if experts > 0 and groups >= experts:
        raise refuse(f"{prefix}expert_group_count is {_shown(groups)} of {_shown(experts)} experts")
    if experts > 0 and groups > 1 and (experts % groups or not 0 < groups_used < groups):
        raise refuse(f"{prefix}expert_group_count {_shown(groups)} and its groups used do not fit the experts")
    if experts == 0 and groups:
        raise refuse(f"{prefix}expert_group_count is {_shown(groups)} with no experts")
