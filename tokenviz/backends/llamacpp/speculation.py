"""Speculative decoding on a GGUF as llama.cpp runs it (the rounds: tokenviz.decoding.speculation): the
target's passes on a context of its own (the journey's cache is not touched), drafted by prompt lookup.
A drafter that is a model (an early exit, a draft model) is transformers'."""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

from tokenviz.backends.llamacpp.runtime import Edits, Runtime
from tokenviz.contract.commands import DEFAULT_DRAFTER
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.grammar import refuse_grammar
from tokenviz.contract.results import Speculation
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.speculation import PromptLookup, speculate_over


class LlamaTargetPasses:
    """The target's passes on a context of its own, which holds the context but its last token."""

    def __init__(self, runtime: Runtime, ids: list[int]):
        self.runtime = runtime
        if len(ids) > 1:
            runtime.decode(ids[:-1], 0)

    def verify(self, feed: list[int]) -> torch.Tensor:
        return torch.from_numpy(self.runtime.decode(feed, len(self.runtime.held), every_position=True))

    def keep(self, length: int) -> None:
        if len(self.runtime.held) > length:
            self.runtime.cut(length)


def speculate(
    journeys: Runtime,
    edits: Edits,
    eos: Collection[int],
    piece: Callable[[int], str],
    ids: list[int],
    drafter: str,
    steps: int,
    settings: SamplingSettings,
    cancelled: Callable[[], bool],
    progress: Callable[[int, int], None],
) -> Speculation:
    """A run from `ids` on a context beside the journey's (`journeys`), under the journey's `edits`."""
    refuse_grammar(settings.grammar, "speculative decoding")
    if drafter == DEFAULT_DRAFTER:  # (no drafter that is a model here: the prompt's own repeats draft)
        drafter = PromptLookup.name
    if drafter != PromptLookup.name:
        raise TokenvizError(
            f"{drafter}: a drafter that is a model is transformers' (--backend transformers); on llama.cpp, "
            f"{PromptLookup.name}"
        )
    with journeys.beside(edits, "speculative decoding", len(ids) + steps + 1, room=7) as runtime:
        passes = LlamaTargetPasses(runtime, ids)
        return speculate_over(
            passes, ids, PromptLookup(), steps, settings, eos, piece, cancelled=cancelled, progress=progress
        )
