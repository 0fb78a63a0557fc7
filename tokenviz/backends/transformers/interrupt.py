"""One long forward pass that reports its progress and can be cancelled between decoder layers.

A single pass over a long context (gradient × input, the logit-difference split, a recompute) takes
seconds on a CPU; without this, its progress is nothing and Escape waits for the whole pass. An
autoplay step gives way the same way to a key that is waiting (GiveWay). The hooks exist only inside
the context: a plain step runs without them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tokenviz.backends.shared.parts import decoder_layers
from tokenviz.contract.errors import Cancelled


@contextmanager
def layer_by_layer(
    model: torch.nn.Module,
    cancelled: Callable[[], bool],
    progress: Callable[[int, int], None] | None = None,
    what: str = "the computation",
    stop: type[Exception] = Cancelled,
    points: int | None = None,
) -> Iterator[None]:
    """Inside: before each decoder layer runs, `cancelled()` is asked (True raises `stop`; use it only
    for passes whose partial writes to a cache are undone) and `progress(layer, layers)` is told;
    with `points`, before that many layers spread evenly instead (each hook costs a pass its call)."""
    layers = decoder_layers(model)
    every = max(1, -(-len(layers) // points)) if points else 1

    def before(index: int) -> Callable[..., Any]:
        def hook(module: torch.nn.Module, args: Any) -> Any:
            if cancelled():
                raise stop(f"{what} cancelled")
            if progress is not None:
                progress(index, len(layers))

        return hook

    handles = [layer.register_forward_pre_hook(before(i)) for i, layer in enumerate(layers) if i % every == 0]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
