"""The KV cache every tokenviz forward pass uses."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def full_cache() -> DynamicCache:
    """A DynamicCache whose every layer keeps every position, sliding-window layers included.

    transformers' own sliding-window layers drop what falls out of the window, so they cannot be
    cropped back once the window is full (rewind, branches and speculation need that), and their
    attention rows are shorter than the global layers'. Kept whole, any layer crops to any length and
    every layer's row spans the whole context; the model's mask still applies the window, so the
    positions outside it get exactly zero weight and the numbers are the model's own.
    """
    return DynamicCache()


def with_cache(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """`cache` as the keyword argument `model`'s forward takes it by: `cache` from transformers 5.24,
    `past_key_values` before it and in families not yet renamed (5.24 warns at the old name, and it
    goes in 5.40)."""
    return {_cache_keyword(type(model).forward): cache}


@functools.cache
def _cache_keyword(forward: Callable[..., Any]) -> str:
    parameters = inspect.signature(forward).parameters  # (follows the renaming decorator)
    return "cache" if "cache" in parameters else "past_key_values"


def passed_cache(kwargs: dict[str, Any]) -> Any:
    """The cache a forward call was given (a pre-hook's kwargs), by either name, or None."""
    return next((kwargs[k] for k in ("cache", "past_key_values") if kwargs.get(k) is not None), None)


def crop_layers(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions of every layer, each as long as it is: a pass set aside between
    layers (GiveWay) has fed only the layers before it. (transformers 5 wants a negative count.)"""
    layers: list[Any] = list(cache.layers)  # DynamicLayers: see full_cache
    for layer in layers:
        drop = layer.get_seq_length() - length
        if drop > 0:
            layer.crop(-drop)


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys and values live in a buffer with room to grow: a step writes its
    position in place, where a DynamicLayer copies the whole layer to append one (at 2,000 tokens
    that copy, every step, was most of a beam search's cost). `keys` and `values` are views of the
    filled part. Only for a search's own cache (see cache_prefix): the runner's `_cut` swaps a
    journey cache's tensors and relies on every append making new ones."""

    ROOM = 64  # positions reserved past the filled ones

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # (transformers leaves its own untyped)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.filled = 0
        self._keys = key_states.new_empty((*key_states.shape[:2], 0, key_states.shape[-1]))
        self._values = value_states.new_empty((*value_states.shape[:2], 0, value_states.shape[-1]))
        self.is_initialized = True

    def _room_for(self, batch: int, length: int) -> None:
        """Buffers for `batch` rows and at least `length` positions, the filled ones kept."""
        if self._keys.shape[0] == batch and self._keys.shape[2] >= length:
            return
        old = (self._keys[:, :, : self.filled], self._values[:, :, : self.filled])
        buffers = []
        for filled in old:
            buffer = filled.new_empty((batch, filled.shape[1], length + self.ROOM, filled.shape[3]))
            buffer[:, :, : self.filled] = filled.expand(batch, -1, -1, -1) if filled.shape[0] == 1 else filled
            buffers.append(buffer)
        self._keys, self._values = buffers

    def _show(self) -> None:
        self.keys, self.values = self._keys[:, :, : self.filled], self._values[:, :, : self.filled]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        self._room_for(key_states.shape[0], self.filled + new)
        self._keys[:, :, self.filled : self.filled + new] = key_states
        self._values[:, :, self.filled : self.filled + new] = value_states
        self.filled += new
        self._show()
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.filled if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0 and self.is_initialized:  # (transformers 5: a negative count)
            self.filled = max(self.filled + tokens_to_remove, 0)
            self._show()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row i takes row beam_idx[i]'s keys and values. In place, copying only the rows that change
        (a beam that keeps its place costs nothing); a source about to be overwritten is saved first."""
        if not self.filled:
            return
        index = [int(source) for source in beam_idx.tolist()]
        if len(index) != self._keys.shape[0]:  # the batch changes (one beam becomes `width`): new buffers
            rows = (self._keys[index, :, : self.filled], self._values[index, :, : self.filled])
            self._keys, self._values = (
                r.new_empty((len(index), r.shape[1], self.filled + self.ROOM, r.shape[3])) for r in rows
            )
            self._keys[:, :, : self.filled], self._values[:, :, : self.filled] = rows
            self._show()
            return
        moved = [row for row, source in enumerate(index) if source != row]
        overwritten = {index[row] for row in moved} & set(moved)
        for buffer in (self._keys[:, :, : self.filled], self._values[:, :, : self.filled]):
            saved = {row: buffer[row].clone() for row in overwritten}
            for row in moved:
                buffer[row].copy_(saved.get(index[row], buffer[index[row]]))


def cache_prefix(cache: DynamicCache, length: int, batch: int = 1, layers: int | None = None) -> DynamicCache:
    """A new cache holding the first `length` positions of `cache` (a full_cache), repeated `batch`
    times (of its first `layers` layers only, for a model cut short), in GrowingLayers: a search that
    starts where the journey is (beams, speculation) goes on from the journey's own cache instead of
    feeding the whole context again, and leaves it as it was."""
    copy = DynamicCache()
    copy.layers = []
    kept: list[Any] = list(cache.layers[:layers])  # DynamicLayers: see full_cache
    for layer in kept:
        grown = GrowingLayer()
        if length > 0:
            keys, values = layer.keys[..., :length, :], layer.values[..., :length, :]
            grown.update(keys.expand(batch, *keys.shape[1:]), values.expand(batch, *values.shape[1:]))
        copy.layers.append(grown)
    return copy
