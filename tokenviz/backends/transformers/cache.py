"""The KV cache every tokenviz forward pass uses."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def full_cache() -> DynamicCache:
    """The journey's KV cache: a DynamicCache whose every layer keeps every position, sliding-window
    layers included, in GrowingLayers (a step writes its position in place).

    transformers' own sliding-window layers drop what falls out of the window, so they cannot be
    cropped back once the window is full (rewind, branches and speculation need that), and their
    attention rows are shorter than the global layers'. Kept whole, any layer crops to any length and
    every layer's row spans the whole context; the model's mask still applies the window, so the
    positions outside it get exactly zero weight and the numbers are the model's own.
    """
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer  # a layer is made for each layer as the first pass reaches it
    return cache


def with_cache(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """`cache` as the keyword argument `model`'s forward takes it by: `cache` from transformers 5.24,
    `past_key_values` before it and in families not yet renamed (5.24 warns at the old name, and it
    goes in 5.40)."""
    return {_cache_keyword(type(model).forward): cache}


@functools.cache
def _cache_keyword(forward: Callable[..., Any]) -> str:
    parameters = inspect.signature(forward).parameters  # follows the renaming decorator
    return "cache" if "cache" in parameters else "past_key_values"


def passed_cache(kwargs: dict[str, Any]) -> Any:
    """The cache a forward call was given (a pre-hook's kwargs), by either name, or None."""
    return next((kwargs[k] for k in ("cache", "past_key_values") if kwargs.get(k) is not None), None)


def crop_layers(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions of every layer, each as long as it is: a pass set aside between
    layers (GiveWay) has fed only the layers before it. (transformers 5 wants a negative count.)"""
    layers: list[Any] = list(cache.layers)  # GrowingLayers: see full_cache
    for layer in layers:
        drop = layer.get_seq_length() - length
        if drop > 0:
            layer.crop(-drop)


@contextmanager
def cut_cache(cache: DynamicCache, length: int) -> Iterator[None]:
    """Run with `cache` cut to its first `length` positions, then put it back as it was. The cut
    cache's layers are copies viewing those positions: what a pass appends goes to tensors of their own
    (see GrowingLayer), never over the positions the journey holds past the cut."""
    whole: list[Any] = cache.layers  # GrowingLayers: see full_cache
    cache.layers = [cut_view(layer, length) for layer in whole]
    try:
        yield
    finally:
        cache.layers = whole


def cut_view(layer: Any, length: int) -> GrowingLayer:
    """A layer holding the first `length` positions of `layer`: a pass over it appends to tensors of
    its own, and `layer` is left as it was (see cut_cache)."""
    cut = GrowingLayer()
    cut.take(layer.keys[..., :length, :], layer.values[..., :length, :])
    return cut


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys and values live in buffers with room to grow: a step writes its
    position in place, where a DynamicLayer copies the whole layer to append one (the bundled model's
    94 MB, every step, at 2,048 tokens; most of a beam search's cost). `keys` and `values` are views
    of the buffers' filled part.

    Tensors from outside (the compiled step's static buffers, a cut's shorter views) are held by
    `take`, or found set as `keys` and `values`: the next write copies them into buffers of the
    layer's own and never writes into them."""

    ROOM = 64  # positions reserved past the filled ones

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # transformers leaves its own untyped
        self.filled = 0
        self._keys: Any = None  # the buffers (see take and _room_for)
        self._values: Any = None
        self._owned = False  # whether the buffers are this layer's own, to write into
        self._shown: tuple[Any, Any] = (None, None)  # the views last set as keys and values

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.take(key_states[:, :, :0], value_states[:, :, :0])

    def take(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold `keys` and `values`, tensors from outside, as they are (the buffers it had are let go)."""
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._keys, self._values, self.filled, self._owned = keys, values, keys.shape[-2], False
        self._show()

    def _views_intact(self) -> bool:
        """Whether `keys` and `values` are still the views this layer set (nothing replaced them)."""
        return self.keys is self._shown[0] and self.values is self._shown[1]

    def _room_for(self, batch: int, length: int) -> None:
        """Buffers of its own for `batch` rows and at least `length` positions, the filled ones kept."""
        if self._owned and self._keys.shape[0] == batch and self._keys.shape[2] >= length:
            return
        old = (self._keys[:, :, : self.filled], self._values[:, :, : self.filled])
        buffers = []
        for filled in old:
            buffer = filled.new_empty((batch, filled.shape[1], length + self.ROOM, filled.shape[3]))
            buffer[:, :, : self.filled] = filled.expand(batch, -1, -1, -1) if filled.shape[0] == 1 else filled
            buffers.append(buffer)
        self._keys, self._values = buffers
        self._owned = True

    def _show(self) -> None:
        self.keys, self.values = self._keys[:, :, : self.filled], self._values[:, :, : self.filled]
        self._shown = (self.keys, self.values)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.filled, self.filled + key_states.shape[-2]
        keys = self._keys
        if not (  # the usual step, tested inline: every layer runs this each step
            self._owned
            and self.keys is self._shown[0]
            and self.values is self._shown[1]
            and keys.shape[2] >= end
            and keys.shape[0] == key_states.shape[0]
        ):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            elif not self._views_intact():
                self.take(self.keys, self.values)  # type: ignore[arg-type]  # initialized: tensors
            start, end = self.filled, self.filled + key_states.shape[-2]
            self._room_for(key_states.shape[0], end)
            keys = self._keys
        keys[:, :, start:end] = key_states
        self._values[:, :, start:end] = value_states
        self.filled = end
        self.keys, self.values = shown = keys[:, :, :end], self._values[:, :, :end]
        self._shown = shown
        return shown

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0 and self.is_initialized and self._views_intact():  # transformers 5: a negative count
            self.filled = max(self.filled + tokens_to_remove, 0)  # the positions past it are written again
            self._show()
        else:
            super().crop(tokens_to_remove)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row i takes row beam_idx[i]'s keys and values. In place, copying only the rows that change
        (a beam that keeps its place costs nothing); a source about to be overwritten is saved first."""
        if not self.is_initialized or not self.get_seq_length():
            return
        if not self._views_intact():
            self.take(self.keys, self.values)  # type: ignore[arg-type]  # initialized: tensors
        if not self._owned:  # rows are written in buffers of its own
            self._room_for(self._keys.shape[0], self.filled)
            self._show()
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
    prefix = full_cache()
    kept: list[Any] = list(cache.layers[:layers])  # GrowingLayers: see full_cache
    for layer in kept:
        grown = GrowingLayer()
        if length > 0:
            keys, values = layer.keys[..., :length, :], layer.values[..., :length, :]
            grown.update(keys.expand(batch, *keys.shape[1:]), values.expand(batch, *values.shape[1:]))
        prefix.layers.append(grown)
    return prefix
