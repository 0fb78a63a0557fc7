"""A forward pass's time in each place its weights live (a GPU, the CPU, the disk), for a model a
device map spread over more than one.

A forward pre-hook on each part of the map marks where the pass moves on to another part; the time
between marks is the part's, its weights' loading from the disk and its inputs' moving included.
With a GPU in the map every mark is a CUDA event, so timing adds no wait: a part on the CPU or the
disk runs after the device has handed its inputs over (a copy that waits), so the GPU's clock sees
it too. Read the times after the step's transfer. Without a map there are no hooks at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tokenviz.backends.transformers.device_map import places


class PlaceTimes:
    """The marks of one forward pass: (place, mark) each time the pass enters a part of another place."""

    def __init__(self, on_gpu: bool):
        self._on_gpu = on_gpu
        self._marks: list[tuple[str | None, torch.cuda.Event | float]] = []

    def mark(self, place: str | None) -> None:
        if self._marks and self._marks[-1][0] == place:
            return
        if self._on_gpu:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append((place, event))
        else:
            self._marks.append((place, time.perf_counter()))

    @classmethod
    def joined(cls, parts: list[PlaceTimes]) -> PlaceTimes:
        """Several passes' marks as one (a prefill's chunks): each pass ends with a mark of no place."""
        out = cls(parts[0]._on_gpu)
        out._marks = [mark for part in parts for mark in part._marks]
        return out

    def ms(self) -> tuple[tuple[str, float], ...]:
        """Milliseconds in each place, in the order the pass first reached it."""
        totals: dict[str, float] = {}
        for (place, start), (_, end) in zip(self._marks, self._marks[1:]):
            if place is None:
                continue
            if isinstance(start, float) and isinstance(end, float):
                spent = (end - start) * 1000
            else:
                assert isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event)
                spent = start.elapsed_time(end)
            totals[place] = totals.get(place, 0.0) + spent
        return tuple(totals.items())


@contextmanager
def timed_by_place(model: Any) -> Iterator[PlaceTimes | None]:
    """Inside, a spread model's forward passes are timed by place (None for a model in one place)."""
    parts = places(model)
    if not parts:
        yield None
        return
    times = PlaceTimes(on_gpu=any(place.startswith("cuda") for place in parts.values()))

    def entering(place: str) -> Callable[..., Any]:
        return lambda module, args: times.mark(place)

    handles = [model.get_submodule(name).register_forward_pre_hook(entering(place)) for name, place in parts.items()]
    try:
        yield times
        times.mark(None)  # the pass's end
    finally:
        for handle in handles:
            handle.remove()
