"""A pass over the cache before it (a prompt's later chunk) has a mask causal from the bottom right: the
attention function marks exactly those masks, so a GPU runs sdpa's flash kernel on them through
torch's causal bias rather than the masked kernel, and every mark is checked here against the mask
transformers builds."""

import pytest
import torch
from families import family_model
from torch.nn.attention.bias import causal_lower_right
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    and_masks,
    causal_mask_function,
    sliding_window_causal_mask_function,
)

from tokenviz.backends.transformers.attention import IMPLEMENTATION, LOWER_RIGHT, _mask
from tokenviz.backends.transformers.runner import ModelRunner


def lower_right(q: int, kv: int) -> torch.Tensor:
    return causal_lower_right(q, kv)._materialize(torch.device("cpu"))


def marked(mask) -> bool:
    return bool(getattr(mask, LOWER_RIGHT, False))


@pytest.mark.parametrize(("q", "kv"), [(2, 2), (3, 8), (4, 4), (7, 30), (16, 17)])
def test_a_plainly_causal_pass_over_the_cache_before_it_is_marked_and_is_the_bottom_right_mask(q, kv):
    mask = _mask(batch_size=1, q_length=q, kv_length=kv, q_offset=kv - q, kv_offset=0, allow_is_causal_skip=False)
    assert marked(mask)
    assert torch.equal(mask[0, 0], lower_right(q, kv))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(q_length=1, kv_length=9, q_offset=8),  # one token: every key (sdpa's plain call serves)
        dict(q_length=3, kv_length=16, q_offset=2),  # a static cache's keys run past the queries
        dict(q_length=3, kv_length=8, q_offset=5, kv_offset=2),  # a window's offset
        dict(q_length=3, kv_length=8, q_offset=5, mask_function=sliding_window_causal_mask_function(4)),
        dict(
            q_length=3, kv_length=8, q_offset=5, mask_function=and_masks(causal_mask_function, lambda b, h, q, k: k > 0)
        ),
        dict(q_length=3, kv_length=8, q_offset=5, attention_mask=torch.ones(1, 8, dtype=torch.bool)),
        dict(q_length=3, kv_length=8, q_offset=torch.tensor(5)),  # a compiled step's offset, never read
    ],
    ids=["one-token", "static-cache", "offset", "window", "own-function", "padding", "tensor-offset"],
)
def test_any_other_mask_is_left_unmarked(kwargs):
    mask = _mask(batch_size=1, allow_is_causal_skip=False, **{"kv_offset": 0, **kwargs})
    assert not marked(mask)


@pytest.mark.parametrize(
    ("kind", "global_layers"), [("llama", True), ("qwen2", True), ("gemma2", True), ("mistral", False)]
)
def test_every_mask_a_chunked_prefill_marks_is_the_bottom_right_mask(kind, global_layers):
    """The masks the models themselves build in passes of 3 tokens over a growing cache (sliding and
    global layers alike): each one marked equals the bottom-right mask, and later passes are marked
    where their layers are plainly causal (a model whose every layer has a window, none)."""
    runner = ModelRunner(family_model(kind))  # (its loading registers the attention's mask function)
    made = []
    own = ALL_MASK_ATTENTION_FUNCTIONS[IMPLEMENTATION]

    def recorded(*args, **kwargs):
        mask = own(*args, **kwargs)
        made.append((kwargs.get("mask_function"), mask))
        return mask

    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, recorded)
    try:
        for start in range(0, 15, 3):
            runner.forward(list(range(start + 5, start + 8)), every_position=True)
    finally:
        ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, own)
    masks = [mask for _, mask in made if isinstance(mask, torch.Tensor)]
    assert any(marked(mask) for mask in masks) == global_layers
    for mask in masks:
        if marked(mask):
            q, kv = mask.shape[-2:]
            assert torch.equal(mask[0, 0], lower_right(q, kv))
