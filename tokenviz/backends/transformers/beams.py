"""Beam search on a transformers model (the bookkeeping: tokenviz.decoding.beams). It runs on its own
batch-of-k cache, so the journey's cache is untouched; given the runner's cache of the context (a
journey's), it starts from a copy of it instead of feeding the whole context again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch

from tokenviz.backends.transformers.cache import cache_prefix, full_cache, with_cache
from tokenviz.backends.transformers.loaded_model_access import ModelAccess
from tokenviz.contract.results import BeamResult
from tokenviz.decoding.beams import beam_search_over


class _ModelPasses:
    """The passes of a search: the model over a cache of its own, `width` beams wide after the first."""

    def __init__(self, runner: ModelAccess, prompt_ids: list[int], from_cache: bool):
        self.model, self.device = runner.model, runner.device
        self.fed = len(prompt_ids) - 1 if from_cache else 0
        self.cache = cache_prefix(runner.cache, self.fed) if self.fed else full_cache()
        self.prompt_ids = prompt_ids

    def first(self) -> torch.Tensor:
        out = self.model(
            input_ids=torch.tensor([self.prompt_ids[self.fed :]], device=self.device),
            **with_cache(self.model, self.cache),
            use_cache=True,
            logits_to_keep=1,
        )
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits

    def advance(self, source: torch.Tensor, tokens: torch.Tensor, moved: bool) -> torch.Tensor:
        if moved:  # the beams in their places: nothing to move
            self.cache.reorder_cache(cast(torch.LongTensor, source))
        out = self.model(input_ids=tokens.view(-1, 1), **with_cache(self.model, self.cache), use_cache=True)
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits


@torch.inference_mode()
def beam_search(
    runner: ModelAccess,
    prompt_ids: list[int],
    width: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    cancelled: Callable[[], bool] = lambda: False,
    from_cache: bool = False,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> BeamResult:
    """With `from_cache`, the runner's cache holds at least `prompt_ids[:-1]`, and a copy of it is the
    start (see cache_prefix)."""
    passes = _ModelPasses(runner, prompt_ids, from_cache)
    vocab, eos, piece = runner.info.vocab, runner.eos_ids, runner.piece
    return beam_search_over(passes, vocab, eos, piece, width, max_new_tokens, length_penalty, cancelled, progress)
