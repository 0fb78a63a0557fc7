"""The KV cache every tokenviz forward pass uses."""

from __future__ import annotations

from typing import Any

from transformers import DynamicCache


def full_cache() -> DynamicCache:
    """A DynamicCache whose every layer keeps every position, sliding-window layers included.

    transformers' own sliding-window layers drop what falls out of the window, so they cannot be
    cropped back once the window is full (rewind, branches and speculation need that), and their
    attention rows are shorter than the global layers'. Kept whole, any layer crops to any length and
    every layer's row spans the whole context; the model's mask still applies the window, so the
    positions outside it get exactly zero weight and the numbers are the model's own.
    """
    return DynamicCache()


def cache_prefix(cache: DynamicCache, length: int, batch: int = 1, layers: int | None = None) -> DynamicCache:
    """A new cache holding the first `length` positions of `cache` (a full_cache), repeated `batch`
    times (of its first `layers` layers only, for a model cut short): a search that starts where the
    journey is (beams, speculation) goes on from the journey's own cache instead of feeding the whole
    context again, and leaves it as it was."""
    copy = DynamicCache()
    if length <= 0:
        return copy
    kept: list[Any] = list(cache.layers[:layers])  # DynamicLayers: see full_cache
    for index, layer in enumerate(kept):
        keys, values = layer.keys[..., :length, :], layer.values[..., :length, :]
        copy.update(keys.expand(batch, *keys.shape[1:]), values.expand(batch, *values.shape[1:]), index)
    return copy
