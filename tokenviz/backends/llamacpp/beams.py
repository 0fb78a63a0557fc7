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
from tokenviz.decoding.beams import beam_search_over, check_width


class LlamaBeamPasses:
    """Two banks of `width` sequences: the beams of a step in one, the next step's copied into the other."""

    def __init__(self, runtime: Runtime, ids: list[int], width: int):
        self.runtime, self.lib, self.ids, self.width, self.vocab = runtime, runtime.lib, ids, width, runtime.shape.vocab
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
    check_width(width)  # before a context of 2 × width sequences is made
    needed = len(ids) + width * (steps + 1)
    with journeys.beside(edits, "beam search", needed, sequences=2 * width) as runtime:
        passes = LlamaBeamPasses(runtime, ids, width)
        try:
            return beam_search_over(passes, runtime.shape.vocab, eos, piece, width, steps, 1.0, cancelled, progress)
        finally:
            passes.close()
