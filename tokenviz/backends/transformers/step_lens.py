"""The lens at the step just taken, read in that step's own pass: while the lens is in use (hf.lens_in_use),
a step feeding one token keeps that token's residual stream (the lens's rows: the embeddings, then each
decoder layer's output, lens.layer_streams) and the model's own logits after it, so the lens there costs
the head alone, not a pass over the whole context (whose cost grows with the journey). What is kept is by
position, and forgotten where the cache is cut or changed, as the attention view's queries are."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenviz.backends.shared.lens_in_use import STEPS_KEPT, LensInUse


@dataclass(frozen=True)
class StepStream:
    token: int  # the token the step fed
    stream: torch.Tensor  # (layers + 1, 1, hidden), on the model's devices
    logits: torch.Tensor  # (vocab,): the model's own after it


class StepLens(LensInUse):
    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[int, StepStream] = {}  # by position, the oldest first

    def keep(self, position: int, token: int, stream: torch.Tensor, logits: torch.Tensor) -> None:
        self.kept[position] = StepStream(token, stream, logits)
        while len(self.kept) > STEPS_KEPT:
            del self.kept[next(iter(self.kept))]

    def forget_from(self, length: int) -> None:
        """The cache now holds `length` positions (cut, or another cache): what is past them is gone."""
        self.kept = {p: s for p, s in self.kept.items() if p < length}

    def at(self, ids: Sequence[int], positions: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(stream, logits) a step kept for the lens of `ids` at `positions`: its last position alone."""
        position = len(ids) - 1
        kept = self.kept.get(position)
        if list(positions) != [position] or kept is None or kept.token != ids[position]:
            return None
        return kept.stream, kept.logits
