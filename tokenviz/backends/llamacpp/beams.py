"""Beam search on a GGUF as llama.cpp runs it (the bookkeeping: tokenviz.decoding.beams), on a context of
its own: each beam is a sequence of one cache whose cells the sequences share, so a beam that goes on
from another is a copy of its sequence (llama_memory_seq_cp, which copies no cell). The journey's cache
is not touched; the interventions in force act as on the journey's steps (control vectors)."""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np
import torch

from tokenviz.backends.llamacpp.runtime import Edits, Runtime
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import BeamResult
from tokenviz.decoding.beams import WIDTHS, beam_search_over


class LlamaBeamPasses:
    """Two banks of `width` sequences: the beams of a step in one, the next step's copied into the other."""

    def __init__(self, journeys: Runtime, edits: Edits, ids: list[int], width: int, steps: int):
        self.runtime = journeys.sibling(sequences=2 * width, context=len(ids) + width * (steps + 1))
        self.runtime.edit(edits)
        self.lib, self.ids, self.width, self.vocab = self.runtime.lib, ids, width, journeys.shape.vocab
        self.memory = self.lib.llama_get_memory(self.runtime.ctx)
        self.beams = [0]  # the sequence of each beam: the context's alone, at first
        self.position = len(ids)
        self.batch = self.lib.llama_batch_init(width, 0, 1)

    def first(self) -> torch.Tensor:
        return torch.from_numpy(self.runtime.decode(self.ids, 0)[-1:].copy())

    def advance(self, source: torch.Tensor, tokens: torch.Tensor, moved: bool) -> torch.Tensor:
        lib, memory, width = self.lib, self.memory, self.width
        bank = width if self.beams[0] < width else 0
        targets = list(range(bank, bank + width))
        for beam, sequence in enumerate(targets):
            lib.llama_memory_seq_rm(memory, sequence, -1, -1)
            lib.llama_memory_seq_cp(memory, self.beams[int(source[beam])], sequence, -1, -1)
        for sequence in set(self.beams):
            lib.llama_memory_seq_rm(memory, sequence, -1, -1)
        batch = self.batch
        batch.n_tokens = width
        for i, token in enumerate(tokens.tolist()):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, self.position, 1, True
            batch.seq_id[i][0] = targets[i]
        code = lib.llama_decode(self.runtime.ctx, batch)
        if code != 0:
            raise TokenvizError(f"llama.cpp could not decode the {width} beams at {self.position} (code {code})")
        self.beams, self.position = targets, self.position + 1
        rows = [
            np.ctypeslib.as_array(lib.llama_get_logits_ith(self.runtime.ctx, i), shape=(self.vocab,))
            for i in range(width)
        ]
        return torch.from_numpy(np.stack(rows))

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.runtime.close()


def beam_search(
    journeys: Runtime,
    edits: Edits,
    eos: Collection[int],
    piece: Callable[[int], str],
    ids: list[int],
    width: int,
    steps: int,
    cancelled: Callable[[], bool],
    progress: Callable[[int, int], None],
) -> BeamResult:
    """A search from `ids` on a context beside the journey's (`journeys`), under the journey's `edits`."""
    if width not in WIDTHS:
        raise TokenvizError(f"beam width must be {WIDTHS.start} to {WIDTHS.stop - 1}, got {width}")
    if edits.writes:
        raise TokenvizError("beam search with a patch in force is not on llama.cpp: take the patch off (I) first")
    if len(ids) + width * (steps + 1) > journeys.context_size:
        raise TokenvizError(f"the search would pass llama.cpp's context of {journeys.context_size:,} tokens")
    passes = LlamaBeamPasses(journeys, edits, ids, width, steps)
    try:
        vocab = journeys.shape.vocab
        return beam_search_over(passes, vocab, eos, piece, width, steps, 1.0, cancelled, progress)
    finally:
        passes.close()
