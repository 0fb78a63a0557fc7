"""The KV cache every tokenviz forward pass uses."""

from __future__ import annotations

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
