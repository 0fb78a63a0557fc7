"""A prompt fed to an engine chunk by chunk: the last chunk's pass, the model's predictions at every
prompt position (made with each chunk, or deferred and made later a chunk at a time) and the time it
took; its progress told between chunks and within each pass, and cancelling asked between them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tokenviz.contract.engine import Engine
from tokenviz.contract.errors import Cancelled
from tokenviz.decoding.prompt_predictions import PromptPredictions, join

PREFILL_CANCELLED = "prefill cancelled: the journey is as it was"
PROGRESS_PER_PASS = 4  # a prefill's progress told within each of its passes (between layers)


@dataclass
class DeferredPredictions:
    """A prefill's predictions at the prompt's positions not made yet: each chunk's place, its pass (the
    hidden states kept) and the tokens that followed it; `parts` holds every chunk's predictions as they
    are made (an empty dict: still to make)."""

    unscored: list[tuple[int, Any, list[int]]] = field(default_factory=list)
    parts: list[dict[str, torch.Tensor]] = field(default_factory=list)

    @property
    def left(self) -> int:
        """How many prompt positions' predictions are still to be made."""
        return sum(len(next_ids) for _, _, next_ids in self.unscored)

    def make(self, chunks: int | None = None) -> dict[str, torch.Tensor] | None:
        """Make `chunks` chunks' predictions (all: None); once all are made, every chunk's joined, handed
        out once (None before, and after)."""
        while self.unscored and (chunks is None or chunks > 0):
            place, forward, next_ids = self.unscored.pop(0)
            self.parts[place] = forward.predictions(next_ids)
            chunks = None if chunks is None else chunks - 1
        if self.unscored or not self.parts:
            return None
        joined, self.parts = join(self.parts), []
        return joined


def prefill(
    engine: Engine,
    ids: list[int],
    chunk: int,
    progress: Callable[[int, int], None] | None,
    cancelled: Callable[[], bool],
    defer: bool,
) -> tuple[Any, dict[str, torch.Tensor] | None, float, DeferredPredictions]:
    """Feed `ids` `chunk` tokens at a time: (the last chunk's forward pass, every position's prediction on
    the device or, deferred where the engine keeps its hidden states, None, milliseconds in all, what is
    left to make)."""
    n = len(ids)
    parts: list[dict[str, torch.Tensor]] = []
    routes, places, ms = [], [], 0.0
    unscored: list[tuple[int, Any, list[int]]] = []
    for begin in range(0, n, chunk):
        end = min(begin + chunk, n)
        try:
            forward = engine.forward(ids[begin:end], True, cancelled, _between_layers(begin, end, n, progress))
        except Cancelled:
            raise Cancelled(PREFILL_CANCELLED) from None
        following = ids[begin + 1 : end + 1]  # none after a last chunk of one token: nothing to make
        if defer and following and getattr(forward, "hidden", None) is not None:  # its logits made later
            unscored.append((len(parts), forward, following))
            parts.append({})
        else:
            parts.append(forward.predictions(following))
        if forward.routes is not None:
            routes.append(forward.routes)
        if forward.places is not None:
            places.append(forward.places)
        ms += forward.timer.wait().ms()
        if progress is not None:
            progress(end, n)
        if end < n and cancelled():
            raise Cancelled(PREFILL_CANCELLED)
    # every prompt position's routing, where the last chunk's pass has its own; every chunk's time in each place
    last = engine.joined(forward, routes, places)
    if unscored:
        return last, None, ms, DeferredPredictions(unscored, parts)
    return last, join(parts), ms, DeferredPredictions()


def _between_layers(
    begin: int, end: int, n: int, progress: Callable[[int, int], None] | None
) -> Callable[[int, int], None] | None:
    """A chunk's progress within its pass, a few times a pass (each is a frame drawn)."""
    if progress is None:
        return None

    def between(layer: int, layers: int) -> None:
        if layer and layer % max(1, layers // PROGRESS_PER_PASS) == 0:
            progress(begin + (end - begin) * layer // layers, n)

    return between


def prompt_predictions(engine: Engine, host: dict[str, np.ndarray], input_ids: list[int]) -> PromptPredictions:
    """The predictions at every prompt position, their pieces decoded here, in the engine's thread and in
    one call: the records hold plain text, never the tokenizer, and the UI decodes nothing."""
    shown = {*host["prompt.ids"].ravel().tolist(), *input_ids}
    engine.learn_pieces(shown)
    texts = {t: engine.piece(t) for t in shown}
    return PromptPredictions(host, input_ids, texts.__getitem__)
